"""The legacy client's checkpoint and colocation-lifecycle methods (a mixin of
`ArcticRLClient`): each one canonical op, answered in the deployed clients' shapes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, cast

from .._client_base import CallOptions
from .._generated.client import AsyncClient
from .._generated.types import SleepMode
from ..errors import InvalidArgumentError, UnimplementedError, UnsupportedOptionError


class LegacyLifecycle:
    _sdk: AsyncClient

    if TYPE_CHECKING:  # ArcticRLClient's

        @property
        def training_job_id(self) -> str | None: ...

        @property
        def sampling_job_id(self) -> str | None: ...

        @property
        def log_prob_job_id(self) -> str | None: ...

        def _sub(self, role: str) -> CallOptions | None: ...

    # ------------------------------------------------------------------ checkpoints

    async def save_checkpoint(
        self,
        checkpoint_id: str | None = None,
        checkpoint_type: str | None = None,
        path: str | None = None,
        *,
        step: int | None = None,
        export_hf: bool = False,
        save_total_limit: int | None = None,
        stage_info: Any = None,
    ) -> dict[str, Any]:
        refused = [
            n
            for n, v in (("save_total_limit", save_total_limit), ("stage_info", stage_info))
            if v is not None
        ]
        if refused:
            raise UnsupportedOptionError(
                f"save_checkpoint: {refused} cannot be honoured",
                code="unsupported_option",
                details={"options": refused},
            )
        cid = checkpoint_id or (PurePath(path).name if path else None)
        if cid is None and step is not None:
            cid = f"step-{step}"
        fields: dict[str, Any] = {}
        if cid:
            fields["checkpoint_id"] = cid
        if checkpoint_type:
            fields["checkpoint_type"] = checkpoint_type
        result = await self._sdk.save_checkpoint(**fields)
        ck = dict(result.get("checkpoint") or {})
        out = {
            "job_id": self.training_job_id,
            "path": ck.get("checkpoint_id"),
            "global_step": ck.get("global_steps", 0),
            "hf_path": None,
            **result,
        }
        if export_hf:
            exported = await self._sdk.export_checkpoint(
                checkpoint_id=str(ck.get("checkpoint_id") or "")
            )
            out["hf_path"] = exported.get("checkpoint_id")
            out["export"] = exported
        return out

    async def save_weights(self, path: str) -> dict[str, Any]:
        """A weights-only checkpoint named after the last component of `path`."""
        return await self.save_checkpoint(PurePath(path).name, "weights-only")

    async def load_checkpoint(
        self,
        path: str | None = None,
        *,
        step: int | None = None,
    ) -> dict[str, Any]:
        cid = PurePath(path).name if path else (f"step-{step}" if step is not None else None)
        if cid is None:
            listed = (await self._sdk.list_checkpoints()).get("checkpoints") or []
            if not listed:
                raise InvalidArgumentError("load_checkpoint: the job has no checkpoint yet")
            cid = max(listed, key=lambda c: int(c.get("global_steps") or 0))["checkpoint_id"]
        result = await self._sdk.load_checkpoint(checkpoint_id=cid)
        ck = dict(result.get("checkpoint") or {})
        return {
            "job_id": self.training_job_id,
            "path": cid,
            "global_step": ck.get("global_steps", 0),
            **result,
        }

    # ------------------------------------------------------------------ colocation lifecycle

    async def sleep_inference(self, level: int = 1) -> dict[str, Any]:
        result = await self._sdk.sleep_inference(level=int(level))
        return {"job_id": self.sampling_job_id, "sampling": result}

    async def wake_inference(self, tags: Sequence[str] | None = None) -> dict[str, Any]:
        fields = {"tags": list(tags)} if tags else {}
        result = await self._sdk.wake_inference(cast(Any, fields))
        return {"job_id": self.sampling_job_id, "sampling": result}

    async def sleep_log_prob(self) -> dict[str, Any]:
        return await self._log_prob_lifecycle(sleep=True)

    async def wake_log_prob(self) -> dict[str, Any]:
        return await self._log_prob_lifecycle(sleep=False)

    async def _log_prob_lifecycle(self, *, sleep: bool) -> dict[str, Any]:
        opts = self._sub("log_prob")
        if opts is None:
            result: Any = {"applied": False, "reason": "the job has no log-prob sub-job"}
        elif sleep:
            result = await self._sdk.sleep_inference(level=1, options=opts)
        else:
            result = await self._sdk.wake_inference(options=opts)
        return {"job_id": self.log_prob_job_id, "log_prob": result}

    async def sleep_training(self, mode: str = "all") -> dict[str, Any]:
        # a legacy str: the SDK's body check refuses a mode outside the spec's values
        result = await self._sdk.sleep_training(mode=cast(SleepMode, mode))
        return {"job_id": self.training_job_id, "workers": [result]}

    async def wake_training(self) -> dict[str, Any]:
        result = await self._sdk.wake_training()
        return {"job_id": self.training_job_id, "workers": [result]}

    async def empty_training_cache(self) -> dict[str, Any]:
        """Frees the trainer's cached memory (the spec's alias of sleep-training)."""
        return await self.sleep_training()

    async def weight_norm(self) -> dict[str, Any]:
        raise UnimplementedError(
            "weight_norm has no canonical op (neither verl nor SkyRL calls it); export a "
            "checkpoint and compute the norm from its safetensors",
            code="unimplemented",
        )

"""Every Tinker op as a future: its kind, a JSON spec, and the coroutine that runs it — the one
path a submit and a re-drive after a restart (`store.py`) both take, so a re-driven op is the
op the client sent.

`submit_op` queues a checked op (sequenced ones in their model's `seq_id` turn);
`redrive` starts a future the server was running when it stopped. Ops without effects run
again; keyed protocol ops are resent under the key recorded in their spec (the protocol
answers the first execution's result); a forward_backward whose gradients may or may not
have been added fails, saying so, and frees its turn.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable
from typing import Any

import tinker.types as T

from . import wire
from .base import RouteBase
from .catalog import ModelInfo
from .errors import TinkerError
from .sampling import prompt_tokens, sampling_params
from .state import Future, Model, owner_of

__all__ = ["FutureOps"]

SEQUENCED = frozenset({"fwdbwd", "optim_step", "save_state", "save_sampler", "load_state"})


def _dict(v: Any) -> dict[str, str]:
    return {str(k): str(x) for k, x in (v or {}).items()}


class FutureOps(RouteBase):
    def submit_op(
        self,
        token: str | None,
        kind: str,
        spec: dict[str, Any],
        live: Any = None,
        rid: str | None = None,
    ) -> dict[str, Any]:
        """Queue the op `kind` (`live`: its parsed request, when the spec keeps less) as the
        future `rid` (default a new one)."""
        self.state.room()  # before the op takes its turn
        if kind == "optim_step":
            spec = {**spec, "key": f"tinker-step-{uuid.uuid4().hex}"}  # a resend is a replay
        coro = self._coro(token, kind, spec, live)
        return self.state.submit(token, coro, kind, spec, rid)

    def redrive(self, f: Future, token: str | None) -> None:
        """Start the future `f`, running when the server stopped, for its owner `token`."""
        self.state.start(f, self._coro(token, f.kind, f.spec, None))

    def _coro(
        self, token: str | None, kind: str, spec: dict[str, Any], live: Any
    ) -> Awaitable[Any]:
        if kind in SEQUENCED:
            m = self.state.model(spec["model_id"], token, live=False)
            return m.enqueue(spec.get("seq_id"), lambda: self._sequenced(m, kind, spec, live))
        if kind == "sample":
            return self._sample(token, spec, live)
        if kind in ("create_model", "create_from_state"):
            return self._create(token, kind, spec)
        return _fail(f"future of unknown kind {kind!r}")

    # ------------------------------------------------------------------ the ops

    async def _sequenced(self, m: Model, kind: str, spec: dict[str, Any], live: Any) -> Any:
        if kind == "fwdbwd":
            fb = live
            if fb is None and spec.get("body"):  # a forward: no effect, runs again
                fb = wire.decode_forward_backward(base64.b64decode(spec["body"]))
                fb.forward_only = True
            if fb is None:
                raise TinkerError(
                    503,
                    "this forward_backward was running when the server restarted: whether "
                    "its gradients were added is unknown, so it was not run again; run the "
                    "step again from a saved state (load_state_with_optimizer) to be sure",
                    "outcome_unknown",
                    field="seq_id",
                )
            return await self.ops.forward_backward(m, fb)
        if kind == "optim_step":
            return await self.ops.optim_step(m, spec["params"], spec.get("key"))
        if kind == "save_state":
            return await self.ops.save_weights(
                m, spec["name"], spec["overwrite"], spec["ttl"], spec["meta"]
            )
        if kind == "save_sampler":
            return await self.ops.save_for_sampler(
                m,
                spec["path"],
                spec["session_seq"],
                spec["ttl"],
                inflight=spec["inflight"],
                user_metadata=spec["meta"],
            )
        return await self.ops.load_weights(m, spec["path"], self._source(m.owner, spec), True)

    def _source(self, owner: str, spec: dict[str, Any]) -> Model:
        """The model whose checkpoint a load reads (the caller's own, checked at submit)."""
        src = self.state.models.get(spec["source"])
        if src is None or src.owner != owner:
            raise self.state.missing("path", spec["path"])
        return src

    async def _create(self, token: str | None, kind: str, spec: dict[str, Any]) -> Any:
        """create_model, or create_training_client_from_state (a new model, then a load):
        the job is created under a key made of the model id, so a re-driven create finds the
        job the first one made."""
        model_id = spec["model_id"]
        info = await self.ops.model_info(spec["base_model"])
        lora = spec.get("lora")
        body = self.ops.job_body(info, lora, lora.get("seed") if lora else None)
        job_id = await self.ops.backend.create_job(token, body, f"tinker-create-{model_id}")
        m = self.state.models.get(model_id) or self._new_model(
            model_id, spec["session_id"], token, info, lora, job_id, spec.get("user_metadata")
        )
        if kind == "create_model":
            return {"model_id": model_id, "type": "create_model"}
        return await self.ops.load_weights(m, spec["path"], self._source(m.owner, spec), True)

    def _new_model(
        self,
        model_id: str,
        session_id: str,
        token: str | None,
        info: ModelInfo,
        lora: dict[str, Any] | None,
        job_id: str,
        user_metadata: Any,
    ) -> Model:
        m = Model(
            model_id,
            session_id,
            owner_of(token),
            info.name,
            int(lora["rank"]) if lora else None,
            job_id,
            info.context_length,
            user_metadata=_dict(user_metadata),
            lora_config=lora,
            token=token,
        )
        self.state.models[model_id] = m
        self.state.changed()
        return m

    async def _sample(self, token: str | None, spec: dict[str, Any], live: Any) -> bytes:
        req = live or T.SampleRequest.model_validate(spec["request"])
        sid = spec["sampling_session_id"]
        ref = self.state.sampler(sid, token)
        prompt = prompt_tokens(req.prompt)
        params = sampling_params(req, len(prompt), ref.context_length)
        ids = spec["sequence_ids"]
        seqs, extra = await self.sampler.sample(ref, token, prompt, params, req, ids, sid)
        return wire.encode_sample(
            seqs,
            extra.get("prompt_logprobs"),
            topk=params["logprobs"],
            topk_prompt=extra.get("topk_prompt"),
            topk_prompt_k=int(extra.get("k") or 0),
        )


async def _fail(message: str) -> Any:
    raise TinkerError(500, message, "internal")

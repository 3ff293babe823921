"""What each Tinker training op does on our protocol (the routes parse, authorise and answer
futures; sampling is `sampling.py`).

create_model -> a job with a training and a sampling sub-job of `base_model` (its sampler's
`max_seq_len` the model's context window, `catalog.py`); forward_backward / forward -> our
forward-backward / forward (losses mapped by `losses.py`, or decomposed by
`tinker_losses.py`); optim_step -> step with the call's learning rate and Adam
hyper-parameters (`StepRequest.adam`); save_weights -> save (resumable); load_weights -> load;
save_weights_for_sampler -> sync-weights (the sampling session samples that weight version,
or with `kind="inflight"` the model's newest).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any

from ..rules.lora_config import ATTENTION_MODULES, MLP_MODULES
from . import losses, tinker_losses, wire
from .backend import Backend
from .catalog import Catalog, ModelInfo, StaticCatalog
from .errors import TinkerError
from .settings import TinkerSettings
from .state import Model, SamplerRef, Session, State

__all__ = ["ADAM_DEFAULTS", "Ops", "TinkerSettings"]

# Tinker's AdamParams defaults ("identical to torch.optim.AdamW"); grad_clip_norm 0 = off.
ADAM_DEFAULTS = {
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def lora_of(lora: Mapping[str, Any]) -> dict[str, Any]:
    """Tinker's `LoraConfig` as our `training_config.lora` (PROTOCOL.md §3.6): `rank` as is;
    `train_attn` / `train_mlp` choose the target modules; `train_unembed` (Tinker's default) is
    `train_lm_head`, which vLLM cannot serve as an adapter for these models, so such a job's
    syncs merge the adapter and push full weights (PROTOCOL.md §3.6); Tinker has no alpha: ours
    is the default, 2 x rank."""
    modules = [
        *(ATTENTION_MODULES if lora.get("train_attn", True) else ()),
        *(MLP_MODULES if lora.get("train_mlp", True) else ()),
    ]
    if not modules:
        raise TinkerError(
            400,
            "lora_config.train_attn and lora_config.train_mlp are both false: nothing to train",
            "invalid_argument",
            field="lora_config.train_mlp",
        )
    out: dict[str, Any] = {"rank": int(lora["rank"]), "target_modules": modules}
    if lora.get("train_unembed", True):  # merge-and-push syncs (a full-weight sync each)
        out["train_lm_head"] = True
    return out


def context_error(what: str, n: int, limit: int, extra: int | None = None) -> TinkerError:
    """A sequence past the model's context window (every route's one answer: 400, which the SDK
    raises as `tinker.BadRequestError` and does not retry), in Tinker's words."""
    if extra is None:
        msg = f"{what} has {n} tokens, more than the model's context window: {n} > {limit}"
    else:
        msg = (
            "Prompt length plus max_tokens exceeds the model's context window: "
            f"{n} + {extra} > {limit} (the prompt leaves room for {max(limit - n, 0)})"
        )
    room = {} if extra is None else {"room": max(limit - n, 0), "prompt_tokens": n}
    return TinkerError(
        400, msg, "prompt_too_long", field=what, limit=limit, tokens=n + (extra or 0), **room
    )


class Ops:
    def __init__(self, state: State, backend: Backend, settings: TinkerSettings) -> None:
        self.state, self.backend, self.settings = state, backend, settings
        self.catalog: Catalog = settings.catalog or StaticCatalog(settings.models, any_name=True)

    # ------------------------------------------------------------------ models

    def listed(self) -> tuple[str, ...]:
        """The base models `get_server_capabilities` lists: the operator's list, else every
        model the server's engines serve."""
        return tuple(self.settings.models) or tuple(self.catalog.names())

    async def model_info(self, base_model: str) -> ModelInfo:
        """`base_model` as this server serves it, its context window capped by the operator's
        `max_context_length`; refused (naming the served ones) when the server does not."""
        listed = self.listed()
        if self.settings.only_listed and base_model not in listed:
            info = None
        else:
            info = await asyncio.to_thread(self.catalog.info, base_model)
        if info is None:
            raise TinkerError(
                400,
                f"base_model {base_model!r} is not served; served: {list(listed)}",
                "invalid_argument",
                field="base_model",
            )
        cap = int(self.settings.max_context_length or 0)
        window = (
            min(w for w in (info.context_length, cap) if w > 0)
            if (info.context_length or cap)
            else 0
        )
        if window <= 0:
            raise TinkerError(
                400,
                f"base_model {base_model!r}: its config states no context window; the "
                "operator must set one (--tinker-max-context)",
                "failed_precondition",
                field="base_model",
            )
        return ModelInfo(info.name, window, info.tokenizer_dir)

    def job_body(
        self, info: ModelInfo, lora: Mapping[str, Any] | None, seed: int | None
    ) -> dict[str, Any]:
        """A training model's job: the trainer, and a sampler whose `max_seq_len` is the
        model's window (so vLLM's `max_model_len` and the fake's limit are the one the surface
        advertises and checks)."""
        if lora is not None and self.settings.lora == "refuse":
            raise TinkerError(
                400,
                f"lora_config.rank = {lora.get('rank')!r}: this server's operator refuses LoRA "
                "for Tinker clients (lora_rank is not supported here; TinkerSettings lora = "
                "'refuse')",
                "unsupported_option",
                field="lora_config.rank",
            )
        adam = {**ADAM_DEFAULTS, **(self.settings.adam or {})}
        tc: dict[str, Any] = {
            "optimizer": {
                "name": "adamw",
                "betas": [adam["beta1"], adam["beta2"]],
                "eps": adam["eps"],
                "weight_decay": adam["weight_decay"],
            },
            "gradient_clipping": adam["grad_clip_norm"],
            **(self.settings.training_config or {}),
        }
        if lora is not None and self.settings.lora == "lora":
            tc["lora"] = lora_of(lora)
        train: dict[str, Any] = {
            "job_type": "training",
            "model_name": info.name,
            "training_config": tc,
        }
        if seed is not None:
            train["seed"] = int(seed)
        return {
            "sub_job_configs": [train, self.sampler_config(info)],
            "experiment_name": "tinker",
        }

    @staticmethod
    def sampler_config(info: ModelInfo) -> dict[str, Any]:
        return {
            "job_type": "sampling",
            "model_name": info.name,
            "inference_config": {"max_seq_len": info.context_length},
        }

    def end_session(self, s: Session) -> None:
        """An ended session's jobs (its models', its base-model samplers') are cancelled in the
        background (nothing awaits them), and so are its samples still running (their protocol
        requests are cancelled with them: `protocol/inproc.py`)."""
        jobs = {
            (m.token, m.job_id) for m in self.state.models.values() if m.session_id == s.session_id
        }
        jobs |= {
            (r.token, r.job_id)
            for r in self.state.samplers.values()
            if r.session_id == s.session_id and r.model_id is None
        }
        for token, job_id in jobs:
            task = asyncio.ensure_future(self.backend.cancel(token, job_id))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        # its samples too: one on a sampler of another session's model (whose job goes on)
        # would otherwise run to its end for nobody
        for f in self.state.session_samples(s.session_id):
            assert f.task is not None
            f.task.cancel()

    # ------------------------------------------------------------------ training

    def check_context(self, m: Model, fb: wire.FwdBwd) -> None:
        for i, d in enumerate(fb.data):
            if d.tokens.size > m.context_length:
                raise context_error(f"data[{i}].model_input", d.tokens.size, m.context_length)

    async def forward_backward(self, m: Model, fb: wire.FwdBwd) -> bytes:
        if losses.native(fb):
            body, lens = losses.to_protocol(fb)
            res = await self.backend.forward_backward(
                m.token, m.job_id, body, forward_only=fb.forward_only
            )
            lps, metrics = losses.from_protocol(res, lens)
            return wire.encode_output(lps, metrics)
        # Tinker's decomposition (tinker_losses.py): lp from a forward, then the surrogate
        lens = [d.tokens.size for d in fb.data]
        res = await self.backend.forward_backward(
            m.token, m.job_id, losses.surrogate(fb, None), forward_only=True
        )
        lps = losses.logprobs_of(res, lens)
        total, grads = 0.0, []
        for lp, d in zip(lps, fb.data, strict=True):
            loss, g = tinker_losses.loss_and_grad(
                fb.loss_fn, lp.astype("float64"), d.inputs, fb.config
            )
            total += loss
            grads.append(g)
        if not fb.forward_only:
            await self.backend.forward_backward(
                m.token, m.job_id, losses.surrogate(fb, grads), forward_only=False
            )
        return wire.encode_output(lps, {"loss:sum": total, "num_tokens:sum": float(sum(lens))})

    async def optim_step(
        self, m: Model, params: Mapping[str, Any], key: str | None = None
    ) -> dict[str, Any]:
        """Each call's `AdamParams` apply to this step (and later ones), as Tinker's
        `optim_step` promises: the step's `adam` (`StepRequest.adam`)."""
        lr = float(params.get("learning_rate", 1e-4))
        adam = {
            "beta1": float(params.get("beta1", ADAM_DEFAULTS["beta1"])),
            "beta2": float(params.get("beta2", ADAM_DEFAULTS["beta2"])),
            "eps": float(params.get("eps", ADAM_DEFAULTS["eps"])),
            "weight_decay": float(params.get("weight_decay", ADAM_DEFAULTS["weight_decay"])),
            "gradient_clipping": float(params.get("grad_clip_norm") or 0.0),
        }
        res = await self.backend.step(m.token, m.job_id, lr, adam, key)
        metrics = {
            f"{k}:mean": float(v)
            for k, v in (res.get("metrics") or {}).items()
            if isinstance(v, int | float)
        }
        return {"metrics": metrics, "type": "optim_step"}

    def path(self, m: Model, kind: str, name: str) -> str:
        if not NAME.match(name):
            raise TinkerError(
                400,
                f"path {name!r}: expected a name of letters, digits, '.', '_' or '-'",
                "invalid_argument",
                field="path",
            )
        return f"tinker://{m.model_id}/{kind}/{name}"

    @staticmethod
    def live(m: Model) -> dict[str, dict[str, Any]]:
        """The model's checkpoints whose ttl_seconds (if any) has not run out."""
        now = time.time()
        return {
            p: i
            for p, i in m.checkpoints.items()
            if not i.get("expires_at") or i["expires_at"] > now
        }

    async def save_weights(
        self,
        m: Model,
        name: str,
        overwrite: bool,
        ttl: float | None = None,
        user_metadata: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        path = self.path(m, "weights", name)
        if path in m.checkpoints and not overwrite:
            raise TinkerError(
                409, f"checkpoint {path!r} exists (overwrite=false)", "already_exists", field="path"
            )
        res = await self.backend.save(m.token, m.job_id, f"tinker-{name}")
        ck = dict(res.get("checkpoint") or {})
        m.checkpoints[path] = {
            "checkpoint_id": ck.get("checkpoint_id") or f"tinker-{name}",
            "type": "training",
            "size_bytes": ck.get("size_bytes"),
            "job_id": m.job_id,
            "created": time.time(),
            "expires_at": time.time() + ttl if ttl else None,
            "user_metadata": dict(user_metadata or {}) or None,
        }
        self.state.changed()
        # "save_weights" is the Tinker reply type the SDK expects, not our op alias
        return {"path": path, "type": "save_weights"}  # not-an-op

    async def load_weights(
        self, m: Model, path: str, source: Model, optimizer: bool
    ) -> dict[str, Any]:
        info = self.live(source).get(path)
        if info is None or info["type"] != "training":
            raise TinkerError(
                404, f"path {path!r} is not a saved training checkpoint", "not_found", field="path"
            )
        await self.backend.load(m.token, m.job_id, info["checkpoint_id"], info["job_id"])
        return {"path": path, "model_id": m.model_id, "type": "load_weights"}

    async def save_for_sampler(
        self,
        m: Model,
        name: str | None,
        session_seq: int | None,
        ttl: float | None = None,
        inflight: bool = False,
        user_metadata: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        m.weight_version = await self.backend.sync(m.token, m.job_id)
        self.state.changed()
        if name is None:
            sid = f"{m.session_id}:sample:{session_seq}"
            self.state.samplers[sid] = SamplerRef(
                m.owner,
                m.session_id,
                m.job_id,
                m.base_model,
                m.context_length,
                model_id=m.model_id,
                weight_version=m.weight_version,
                inflight=inflight,
            )
            return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}
        path = self.path(m, "sampler_weights", name)
        m.checkpoints[path] = {
            "type": "sampler",
            "weight_version": m.weight_version,
            "job_id": m.job_id,
            "created": time.time(),
            "expires_at": time.time() + ttl if ttl else None,
            "user_metadata": dict(user_metadata or {}) or None,
        }
        return {"path": path, "type": "save_weights_for_sampler"}

    def sampler_for_path(self, path: str, token: str | None, session_id: str) -> SamplerRef:
        rest = path.removeprefix("tinker://")
        model_id = rest.split("/", 1)[0]
        m = self.state.model(model_id, token, live=False)
        info = self.live(m).get(path)
        if info is None or info["type"] != "sampler":
            raise TinkerError(
                404,
                f"model_path {path!r} is not a saved sampler checkpoint",
                "not_found",
                field="model_path",
            )
        return SamplerRef(
            m.owner,
            session_id,
            m.job_id,
            m.base_model,
            m.context_length,
            model_id=m.model_id,
            weight_version=int(info["weight_version"]),
            path=path,
        )

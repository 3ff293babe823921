"""What each Tinker op does on our protocol (the routes parse, authorise and answer futures).

create_model -> a job with a training and a sampling sub-job of `base_model`; forward_backward /
forward -> our forward-backward / forward (losses mapped by `losses.py`); optim_step -> step
(learning rate per step; the other Adam parameters are the job's, fixed at create_model);
save_weights -> save (resumable); load_weights -> load; save_weights_for_sampler -> sync-weights
(the sampling session samples that weight version); asample -> generate.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from ..protocol.lora_config import ATTENTION_MODULES, MLP_MODULES
from . import losses, wire
from .backend import Backend
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


def _version_error(ref: SamplerRef, now: int) -> TinkerError:
    return TinkerError(
        409,
        f"the weights of this sampling session (weight version {ref.weight_version}) are no "
        f"longer loaded: model {ref.model_id!r}'s sampler holds version {now}; create a new "
        "sampling client with save_weights_for_sampler",
        "failed_precondition",
        field="sampling_session_id",
    )


class Ops:
    def __init__(self, state: State, backend: Backend, settings: TinkerSettings) -> None:
        self.state, self.backend, self.settings = state, backend, settings
        self.versions: dict[str, int] = {}  # model_id -> the sampler's weight version

    # ------------------------------------------------------------------ models

    def job_body(
        self, base_model: str, lora: Mapping[str, Any] | None, seed: int | None
    ) -> dict[str, Any]:
        if self.settings.only_listed and base_model not in self.settings.models:
            raise TinkerError(
                400,
                f"base_model {base_model!r} is not served; served: {list(self.settings.models)}",
                "invalid_argument",
                field="base_model",
            )
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
            "model_name": base_model,
            "training_config": tc,
        }
        if seed is not None:
            train["seed"] = int(seed)
        return {
            "sub_job_configs": [train, {"job_type": "sampling", "model_name": base_model}],
            "experiment_name": "tinker",
        }

    def end_session(self, s: Session) -> None:
        """An expired session's jobs are cancelled (in the background: nothing awaits them)."""
        for m in self.state.models.values():
            if m.session_id == s.session_id:
                task = asyncio.ensure_future(self.backend.cancel(m.token, m.job_id))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def adam(self) -> dict[str, float]:
        return {**ADAM_DEFAULTS, **(self.settings.adam or {})}

    # ------------------------------------------------------------------ training

    async def forward_backward(self, m: Model, fb: wire.FwdBwd) -> bytes:
        body, lens = losses.to_protocol(fb)
        res = await self.backend.forward_backward(
            m.token, m.job_id, body, forward_only=fb.forward_only
        )
        lps, metrics = losses.from_protocol(res, lens)
        return wire.encode_output(lps, metrics)

    async def optim_step(self, m: Model, params: Mapping[str, Any]) -> dict[str, Any]:
        for k, want in m.adam.items():
            got = params.get(k)
            if got is not None and not math.isclose(float(got), want, rel_tol=1e-9, abs_tol=0):
                raise TinkerError(
                    400,
                    f"adam_params.{k} = {got!r}, but this model's optimizer was created with "
                    f"{k} = {want!r} (our jobs fix Adam's {sorted(m.adam)} at create_model; "
                    "only learning_rate may change per step)",
                    "invalid_argument",
                    field=f"adam_params.{k}",
                )
        lr = float(params.get("learning_rate", 1e-4))
        res = await self.backend.step(m.token, m.job_id, lr)
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
        self, m: Model, name: str, overwrite: bool, ttl: float | None = None
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
            "expires_at": time.time() + ttl if ttl else None,
        }
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
        session_id: str,
        ttl: float | None = None,
    ) -> dict[str, Any]:
        version = await self.backend.sync(m.token, m.job_id)
        self.versions[m.model_id] = version
        if name is None:
            sid = f"{session_id}:sample:{session_seq}"
            self.state.samplers[sid] = SamplerRef(m.model_id, version)
            return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}
        path = self.path(m, "sampler_weights", name)
        m.checkpoints[path] = {
            "type": "sampler",
            "weight_version": version,
            "job_id": m.job_id,
            "expires_at": time.time() + ttl if ttl else None,
        }
        return {"path": path, "type": "save_weights_for_sampler"}

    # ------------------------------------------------------------------ sampling

    def sampler_for_path(self, path: str, token: str | None) -> SamplerRef:
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
        return SamplerRef(m.model_id, int(info["weight_version"]), path)

    async def sample(self, ref: SamplerRef, req: Any) -> bytes:
        m = self.state.models[ref.model_id]
        now = self.versions.get(m.model_id, 0)
        if now != ref.weight_version:
            raise _version_error(ref, now)
        params = sampling_params(req)
        prompt = prompt_tokens(req.prompt)
        res = await self.backend.generate(m.token, m.job_id, prompt, params)
        if int(res.get("weight_version") or 0) != ref.weight_version:
            raise _version_error(ref, int(res.get("weight_version") or 0))
        comp = res["results"][0]
        seqs = []
        for s in comp.get("samples") or []:
            reason = s.get("finish_reason") or "stop"
            if reason == "abort":
                raise TinkerError(503, "the sampler aborted the request", "unavailable")
            seqs.append((s.get("token_ids") or [], s.get("logprobs"), reason))
        plp = None
        if req.prompt_logprobs:
            raw = list(comp.get("prompt_logprobs") or [])
            plp = [None, *raw[1:]] if raw else None
        return wire.encode_sample(seqs, plp)


def prompt_tokens(prompt: Any) -> list[int]:
    out: list[int] = []
    for i, c in enumerate(prompt.chunks):
        if getattr(c, "type", "") != "encoded_text":
            raise TinkerError(
                400,
                f"prompt.chunks[{i}] is a {getattr(c, 'type', '?')} chunk; "
                "this server samples text (encoded_text) only",
                "unsupported_option",
                field=f"prompt.chunks[{i}]",
            )
        out.extend(int(t) for t in c.tokens)
    if not out:
        raise TinkerError(400, "prompt is empty", "invalid_argument", field="prompt")
    return out


REFUSED_SAMPLE = {
    "topk_prompt_logprobs": 0,
    "topk_sample_logprobs": 0,
    "prompt_alt_tokens_k": 0,
    "record_stability_info": False,
    "target_prompt_logprobs": None,
    "prompt_logprobs_last_n": None,
}


def sampling_params(req: Any) -> dict[str, Any]:
    for k, neutral in REFUSED_SAMPLE.items():
        v = getattr(req, k, neutral)
        if v not in (neutral, None, 0, False):
            raise TinkerError(
                400, f"{k} = {v!r} is not supported by this server", "unsupported_option", field=k
            )
    sp = req.sampling_params
    out: dict[str, Any] = {
        "n": int(req.num_samples),
        "logprobs": 0,
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
    }
    if sp.max_tokens is not None:
        out["max_tokens"] = int(sp.max_tokens)
    if sp.seed is not None:
        out["seed"] = int(sp.seed)
    if sp.top_k is not None and int(sp.top_k) > 0:
        out["top_k"] = int(sp.top_k)
    stop = sp.stop
    if isinstance(stop, str):
        stop = [stop]
    if stop:
        if all(isinstance(s, int) for s in stop):
            out["stop_token_ids"] = [int(s) for s in stop]
        else:
            out["stop"] = [str(s) for s in stop]
    if req.prompt_logprobs:
        out["prompt_logprobs"] = 0
    return out

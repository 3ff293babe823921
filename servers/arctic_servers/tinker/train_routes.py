"""The training routes of the Tinker surface: create_model, get_info, forward_backward /
forward, optim_step, save_weights, save_weights_for_sampler, load_weights (each a future whose
op runs in the model's `seq_id` order; `ops.py` says what each does on our protocol).

Whatever refuses a sequenced call before it is queued, the turn it took is freed
(`RouteBase.wrap`), so a refusal never holds the model's later calls."""

from __future__ import annotations

import base64
from typing import Any

import tinker.types as T
from aiohttp import web

from . import losses, wire
from .base import ttl_s
from .errors import TinkerError
from .futures import FutureOps, _dict
from .state import Model

__all__ = ["TrainRoutes"]


class TrainRoutes(FutureOps):
    def _optimizer(self, opt: Any) -> None:
        if opt is not None and getattr(opt, "type", "adamw") != "adamw":
            raise TinkerError(
                400,
                f"optimizer_config.type = {opt.type!r}; served: adamw",
                "unsupported_option",
                field="optimizer_config.type",
            )

    def _new_model_spec(
        self, session_id: str, req: Any, base_model: str, lora: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The spec of a new model `<session>:train:<model_seq_id>` (409 when it exists)."""
        model_id = f"{session_id}:train:{req.model_seq_id}"
        if model_id in self.state.models:
            raise TinkerError(
                409,
                f"model_seq_id {req.model_seq_id} exists",
                "already_exists",
                field="model_seq_id",
            )
        return {
            "model_id": model_id,
            "session_id": session_id,
            "base_model": base_model,
            "lora": lora,
            "user_metadata": _dict(req.user_metadata),
        }

    async def create_model(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.CreateModelRequest)
        s = self.state.session(req.session_id, token)
        self._optimizer(req.optimizer_config)
        lora = req.lora_config.model_dump() if req.lora_config is not None else None
        info = await self.ops.model_info(req.base_model)
        self.ops.job_body(info, lora, None)  # refused at submit (LoRA settings)
        spec = self._new_model_spec(s.session_id, req, info.name, lora)
        return web.json_response(self.submit_op(token, "create_model", spec))

    async def get_info(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.GetInfoRequest)
        m = self.state.model(req.model_id, token)
        lora = self.settings.lora != "full_finetune" and m.lora_rank is not None
        return web.json_response(
            {
                "model_id": m.model_id,
                "type": "get_info",
                "is_lora": lora,
                "lora_rank": m.lora_rank if lora else None,
                "model_name": m.base_model,
                "model_data": {
                    "arch": "unknown",
                    "model_name": m.base_model,
                    # the name the server's /hf/ files answer to (hf_files.py), or the
                    # local model directory a client on this host loads as is
                    "tokenizer_id": m.base_model,
                },
            }
        )

    async def forward_backward(self, request: web.Request, token: str | None) -> web.Response:
        enc = request.headers.get("Content-Encoding", "identity").strip().lower()[:16]
        raw = await self.body(request)
        fb = wire.decode_forward_backward(raw)
        self.encodings[enc] += 1  # what the SDK sent (zstd once /client/config asks for it)
        m = self.state.model(fb.model_id, token)
        losses.check(fb)
        self.ops.check_context(m, fb)
        fb.forward_only = fb.forward_only or request.path.endswith("/forward")
        spec: dict[str, Any] = {"model_id": m.model_id, "seq_id": fb.seq_id}
        if fb.forward_only:  # kept: a forward runs again after a restart (futures.py)
            spec["body"] = base64.b64encode(raw).decode()
        fut = self.submit_op(token, "fwdbwd", spec, fb)
        return web.json_response({**fut, "model_id": m.model_id})

    async def optim_step(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.OptimStepRequest)
        m = self.state.model(req.model_id, token)
        p = req.optim_params
        if not isinstance(p, T.AdamParams):
            raise TinkerError(
                400,
                f"optim_params of type {getattr(p, 'type', '?')!r}; served: adam (AdamParams)",
                "unsupported_option",
                field="optim_params",
            )
        spec = {"model_id": m.model_id, "seq_id": req.seq_id, "params": p.model_dump()}
        return web.json_response(self.submit_op(token, "optim_step", spec))

    async def save_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsRequest)
        m = self.state.model(req.model_id, token)
        name = req.path or f"step-{req.seq_id}"
        ttl = ttl_s(req.ttl_seconds)
        self.ops.path(m, "weights", name)  # refused at submit when not a plain name
        spec = {
            "model_id": m.model_id,
            "seq_id": req.seq_id,
            "name": name,
            "overwrite": bool(req.overwrite),
            "ttl": ttl,
            "meta": _dict(req.user_metadata),
        }
        return web.json_response(self.submit_op(token, "save_state", spec))

    async def save_for_sampler(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsForSamplerRequest)
        m = self.state.model(req.model_id, token)
        ttl = ttl_s(req.ttl_seconds)
        if req.path is not None:
            self.ops.path(m, "sampler_weights", req.path)
            if req.kind == "inflight":
                raise TinkerError(
                    400,
                    "kind='inflight' names no path: it publishes the model's mutable sampler "
                    "weights to sampling sessions (send sampling_session_seq_id)",
                    "invalid_argument",
                    field="kind",
                )
        if req.path is None and req.sampling_session_seq_id is None:
            raise TinkerError(
                400, "send path or sampling_session_seq_id", "missing_field", field="path"
            )
        spec = {
            "model_id": m.model_id,
            "seq_id": req.seq_id,
            "path": req.path,
            "session_seq": req.sampling_session_seq_id,
            "ttl": ttl,
            "inflight": req.kind == "inflight",
            "meta": _dict(req.user_metadata),
        }
        return web.json_response(self.submit_op(token, "save_sampler", spec))

    def _load_source(self, req: Any, token: str | None) -> Model:
        path = str(req.path)
        if not req.optimizer:  # load_state / create_training_client_from_state
            raise TinkerError(
                400,
                "optimizer=false (weights only): our checkpoints restore weights and "
                "optimizer state together; use load_state_with_optimizer / "
                "create_training_client_from_state_with_optimizer",
                "unsupported_option",
                field="optimizer",
            )
        if req.weights_access_token:
            raise TinkerError(
                400,
                "weights_access_token: another account's weights are not served here (a "
                "tinker:// path of this token's own models loads without one)",
                "unsupported_option",
                field="weights_access_token",
            )
        self._optimizer(req.optimizer_config)
        run_id = path.removeprefix("tinker://").split("/", 1)[0]
        src = self.state.model(run_id, token, live=False)  # an ended session's too
        if self.ops.live(src).get(path, {}).get("type") != "training":
            raise TinkerError(
                404, f"path {path!r} is not a saved training checkpoint", "not_found", field="path"
            )
        if req.base_model is not None and req.base_model != src.base_model:
            raise TinkerError(
                400,
                f"base_model {req.base_model!r}: the checkpoint {path!r} is of {src.base_model!r}",
                "invalid_argument",
                field="base_model",
            )
        return src

    async def load_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.LoadWeightsRequest)
        path = str(req.path)
        if req.model_id is not None:  # TrainingClient.load_state*: into this model
            m = self.state.model(req.model_id, token)
            source = self._load_source(req, token)
            spec = {
                "model_id": m.model_id,
                "seq_id": req.seq_id,
                "path": path,
                "source": source.model_id,
            }
            return web.json_response(self.submit_op(token, "load_state", spec))
        source = self._load_source(req, token)
        s = self.state.session(str(req.session_id), token)
        spec = self._new_model_spec(s.session_id, req, source.base_model, source.lora_config)
        spec.update(path=path, source=source.model_id)
        return web.json_response(self.submit_op(token, "create_from_state", spec))

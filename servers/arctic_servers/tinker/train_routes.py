"""The training routes of the Tinker surface: create_model, get_info, forward_backward /
forward, optim_step, save_weights, save_weights_for_sampler, load_weights (each a future whose
op runs in the model's `seq_id` order; `ops.py` says what each does on our protocol).

Whatever refuses a sequenced call before it is queued, the turn it took is freed
(`RouteBase.wrap`), so a refusal never holds the model's later calls."""

from __future__ import annotations

from typing import Any

import tinker.types as T
from aiohttp import web

from . import losses, wire
from .base import RouteBase, ttl_s
from .catalog import ModelInfo
from .errors import TinkerError
from .state import Model, owner_of

__all__ = ["TrainRoutes"]


def _dict(v: Any) -> dict[str, str]:
    return {str(k): str(x) for k, x in (v or {}).items()}


class TrainRoutes(RouteBase):
    def _optimizer(self, opt: Any) -> None:
        if opt is not None and getattr(opt, "type", "adamw") != "adamw":
            raise TinkerError(
                400,
                f"optimizer_config.type = {opt.type!r}; served: adamw",
                "unsupported_option",
                field="optimizer_config.type",
            )

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

    async def create_model(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.CreateModelRequest)
        s = self.state.session(req.session_id, token)
        self._optimizer(req.optimizer_config)
        lora = req.lora_config.model_dump() if req.lora_config is not None else None
        info = await self.ops.model_info(req.base_model)
        body = self.ops.job_body(info, lora, lora.get("seed") if lora else None)
        model_id = f"{s.session_id}:train:{req.model_seq_id}"
        if model_id in self.state.models:
            raise TinkerError(
                409,
                f"model_seq_id {req.model_seq_id} exists",
                "already_exists",
                field="model_seq_id",
            )
        key = f"tinker-create-{model_id}"  # a re-driven create (store.py) finds the same job

        async def run() -> dict[str, Any]:
            job_id = await self.ops.backend.create_job(token, body, key)
            self._new_model(model_id, s.session_id, token, info, lora, job_id, req.user_metadata)
            return {"model_id": model_id, "type": "create_model"}

        return web.json_response(self.state.submit(token, run()))

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
        fb = wire.decode_forward_backward(await self.body(request))
        self.encodings[enc] += 1  # what the SDK sent (zstd once /client/config asks for it)
        m = self.state.model(fb.model_id, token)
        losses.check(fb)
        self.ops.check_context(m, fb)
        fb.forward_only = fb.forward_only or request.path.endswith("/forward")
        coro = m.enqueue(fb.seq_id, lambda: self.ops.forward_backward(m, fb))
        return web.json_response({**self.state.submit(token, coro), "model_id": m.model_id})

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
        params = p.model_dump()
        coro = m.enqueue(req.seq_id, lambda: self.ops.optim_step(m, params))
        return web.json_response(self.state.submit(token, coro))

    async def save_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsRequest)
        m = self.state.model(req.model_id, token)
        name = req.path or f"step-{req.seq_id}"
        ttl = ttl_s(req.ttl_seconds)
        self.ops.path(m, "weights", name)  # refused at submit when not a plain name
        meta = _dict(req.user_metadata)
        coro = m.enqueue(
            req.seq_id, lambda: self.ops.save_weights(m, name, bool(req.overwrite), ttl, meta)
        )
        return web.json_response(self.state.submit(token, coro))

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
        meta = _dict(req.user_metadata)
        coro = m.enqueue(
            req.seq_id,
            lambda: self.ops.save_for_sampler(
                m,
                req.path,
                req.sampling_session_seq_id,
                ttl,
                inflight=req.kind == "inflight",
                user_metadata=meta,
            ),
        )
        return web.json_response(self.state.submit(token, coro))

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
            coro = m.enqueue(
                req.seq_id, lambda: self.ops.load_weights(m, path, source, bool(req.optimizer))
            )
            return web.json_response(self.state.submit(token, coro))
        source = self._load_source(req, token)
        s = self.state.session(str(req.session_id), token)
        model_id = f"{s.session_id}:train:{req.model_seq_id}"
        info = await self.ops.model_info(source.base_model)
        body = self.ops.job_body(info, source.lora_config, None)
        key = f"tinker-create-{model_id}"

        async def run() -> dict[str, Any]:
            job_id = await self.ops.backend.create_job(token, body, key)
            meta = req.user_metadata
            m = self._new_model(
                model_id, s.session_id, token, info, source.lora_config, job_id, meta
            )
            return await self.ops.load_weights(m, path, source, bool(req.optimizer))

        return web.json_response(self.state.submit(token, run()))

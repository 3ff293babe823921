"""The training routes of the Tinker surface: create_model, get_info, forward_backward /
forward, optim_step, save_weights, save_weights_for_sampler, load_weights (each a future whose
op runs in the model's `seq_id` order; `ops.py` says what each does on our protocol)."""

from __future__ import annotations

from typing import Any

import tinker.types as T
from aiohttp import web

from . import losses, wire
from .base import RouteBase, ttl_s
from .errors import TinkerError
from .state import Model

__all__ = ["TrainRoutes"]


class TrainRoutes(RouteBase):
    async def create_model(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.CreateModelRequest)
        s = self.state.session(req.session_id, token)
        opt = req.optimizer_config
        if opt is not None and getattr(opt, "type", "adamw") != "adamw":
            raise TinkerError(
                400,
                f"optimizer_config.type = {opt.type!r}; served: adamw",
                "unsupported_option",
                field="optimizer_config.type",
            )
        lora = req.lora_config.model_dump() if req.lora_config is not None else None
        body = self.ops.job_body(req.base_model, lora, lora.get("seed") if lora else None)
        model_id = f"{s.session_id}:train:{req.model_seq_id}"
        if model_id in self.state.models:
            raise TinkerError(
                409,
                f"model_seq_id {req.model_seq_id} exists",
                "already_exists",
                field="model_seq_id",
            )

        async def run() -> dict[str, Any]:
            job_id = await self.ops.backend.create_job(token, body)
            self.state.models[model_id] = Model(
                model_id,
                s.session_id,
                token,
                req.base_model,
                int(lora["rank"]) if lora else None,
                job_id,
                self.ops.adam(),
                user_metadata=dict(req.user_metadata or {}),
                lora_config=lora,
            )
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
                    "tokenizer_id": m.base_model,
                },
            }
        )

    async def forward_backward(self, request: web.Request, token: str | None) -> web.Response:
        enc = request.headers.get("Content-Encoding", "identity").strip().lower()[:16]
        fb = wire.decode_forward_backward(await self.body(request))
        self.encodings[enc] += 1  # what the SDK sent (zstd once /client/config asks for it)
        m = self.state.model(fb.model_id, token)
        async with m.submitting(fb.seq_id):
            losses.check(fb)
        fb.forward_only = fb.forward_only or request.path.endswith("/forward")
        coro = m.in_turn(fb.seq_id, lambda: self.ops.forward_backward(m, fb))
        return web.json_response({**self.state.submit(token, coro), "model_id": m.model_id})

    async def optim_step(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.OptimStepRequest)
        m = self.state.model(req.model_id, token)
        p = req.optim_params
        async with m.submitting(req.seq_id):
            if not isinstance(p, T.AdamParams):
                raise TinkerError(
                    400,
                    f"optimizer_params of type {getattr(p, 'type', '?')!r}; served: adam_params",
                    "unsupported_option",
                    field="optim_params",
                )
        params = p.model_dump()
        coro = m.in_turn(req.seq_id or m.next_seq, lambda: self.ops.optim_step(m, params))
        return web.json_response(self.state.submit(token, coro))

    async def save_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsRequest)
        m = self.state.model(req.model_id, token)
        name = req.path or f"step-{req.seq_id}"
        async with m.submitting(req.seq_id):
            ttl = ttl_s(req.ttl_seconds)
            self.ops.path(m, "weights", name)  # refused at submit when not a plain name
        coro = m.in_turn(
            req.seq_id or m.next_seq,
            lambda: self.ops.save_weights(m, name, bool(req.overwrite), ttl),
        )
        return web.json_response(self.state.submit(token, coro))

    async def save_for_sampler(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsForSamplerRequest)
        m = self.state.model(req.model_id, token)
        async with m.submitting(req.seq_id):
            ttl = ttl_s(req.ttl_seconds)
            if req.path is not None:
                self.ops.path(m, "sampler_weights", req.path)
            if req.path is None and req.sampling_session_seq_id is None:
                raise TinkerError(
                    400, "send path or sampling_session_seq_id", "missing_field", field="path"
                )
        coro = m.in_turn(
            req.seq_id or m.next_seq,
            lambda: self.ops.save_for_sampler(
                m, req.path, req.sampling_session_seq_id, m.session_id, ttl
            ),
        )
        return web.json_response(self.state.submit(token, coro))

    async def load_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.LoadWeightsRequest)
        path = str(req.path)
        target = self.state.model(req.model_id, token) if req.model_id is not None else None

        def check() -> Model:
            if not req.optimizer:  # load_state / create_training_client_from_state
                raise TinkerError(
                    400,
                    "optimizer=false (weights only): our checkpoints restore weights and "
                    "optimizer state together; use load_state_with_optimizer / "
                    "create_training_client_from_state_with_optimizer",
                    "unsupported_option",
                    field="optimizer",
                )
            run_id = path.removeprefix("tinker://").split("/", 1)[0]
            src = self.state.model(run_id, token, live=False)  # an ended session's too
            if self.ops.live(src).get(path, {}).get("type") != "training":
                raise TinkerError(
                    404,
                    f"path {path!r} is not a saved training checkpoint",
                    "not_found",
                    field="path",
                )
            return src

        if target is not None:  # TrainingClient.load_state*: into this model
            m = target
            async with m.submitting(req.seq_id):
                source = check()
            coro = m.in_turn(
                req.seq_id or m.next_seq,
                lambda: self.ops.load_weights(m, path, source, bool(req.optimizer)),
            )
            return web.json_response(self.state.submit(token, coro))
        source = check()
        s = self.state.session(str(req.session_id), token)
        model_id = f"{s.session_id}:train:{req.model_seq_id}"
        body = self.ops.job_body(source.base_model, source.lora_config, None)

        async def run() -> dict[str, Any]:
            job_id = await self.ops.backend.create_job(token, body)
            m = Model(
                model_id,
                s.session_id,
                token,
                source.base_model,
                source.lora_rank,
                job_id,
                self.ops.adam(),
                lora_config=source.lora_config,
            )
            self.state.models[model_id] = m
            return await self.ops.load_weights(m, path, source, bool(req.optimizer))

        return web.json_response(self.state.submit(token, run()))

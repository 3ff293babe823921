"""Tinker's REST listings (`RestClient`): training runs, their checkpoints, `weights_info` of a
`tinker://` path and a sampling session's `GET /samplers/{id}` — the caller's own only (another
token's ids answer 404 as ids that do not exist)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .base import RouteBase, iso
from .errors import TinkerError
from .state import Model, owner_of

__all__ = ["RestRoutes"]


class RestRoutes(RouteBase):
    async def get_sampler(self, request: web.Request, token: str | None) -> web.Response:
        sid = request.match_info["sampler_id"]
        ref = self.state.sampler(sid, token, live=False)
        return web.json_response(
            {"sampler_id": sid, "base_model": ref.base_model, "model_path": ref.path}
        )

    def _run(self, m: Model) -> dict[str, Any]:
        live = self.ops.live(m)
        ck = [p for p, i in live.items() if i["type"] == "training"]
        sk = [p for p, i in live.items() if i["type"] == "sampler"]
        return {
            "training_run_id": m.model_id,
            "base_model": m.base_model,
            "model_owner": "",
            "is_lora": m.lora_rank is not None and self.settings.lora != "full_finetune",
            "lora_rank": m.lora_rank,
            "corrupted": False,
            "last_request_time": iso(m.last_request),
            "last_checkpoint": self._ckpt(m, ck[-1]) if ck else None,
            "last_sampler_checkpoint": self._ckpt(m, sk[-1]) if sk else None,
            "user_metadata": m.user_metadata or None,
        }

    def _ckpt(self, m: Model, path: str) -> dict[str, Any]:
        info = m.checkpoints[path]
        return {
            "checkpoint_id": path.split("/", 3)[3],
            "checkpoint_type": info["type"],
            "time": iso(info.get("created") or m.last_request),
            "tinker_path": path,
            "size_bytes": info.get("size_bytes"),
            "expires_at": iso(info["expires_at"]) if info.get("expires_at") else None,
            "public": False,
            "user_metadata": info.get("user_metadata"),
        }

    async def training_runs(self, request: web.Request, token: str | None) -> web.Response:
        runs = [m for m in self.state.models.values() if m.owner == owner_of(token)]
        try:
            limit = int(request.query.get("limit", "20"))
            offset = int(request.query.get("offset", "0"))
        except ValueError:
            raise TinkerError(
                400, "limit and offset must be integers", "invalid_argument", field="limit"
            ) from None
        page = runs[max(offset, 0) : max(offset, 0) + max(min(limit, 1000), 0)]
        return web.json_response(
            {
                "training_runs": [self._run(m) for m in page],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)},
            }
        )

    async def training_run(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response(
            self._run(self.state.model(request.match_info["run_id"], token, live=False))
        )

    async def run_checkpoints(self, request: web.Request, token: str | None) -> web.Response:
        m = self.state.model(request.match_info["run_id"], token, live=False)
        return web.json_response(
            {"checkpoints": [self._ckpt(m, p) for p in self.ops.live(m)], "cursor": None}
        )

    async def weights_info(self, request: web.Request, token: str | None) -> web.Response:
        """`RestClient.get_weights_info_by_tinker_path`: `{"tinker_path"}` -> its info."""
        try:
            body = json.loads(await self.body(request, 1 << 16) or b"{}")
        except ValueError:
            body = None
        path = body.get("tinker_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or set(body) - {"tinker_path"}:
            raise TinkerError(
                400,
                f'expected {{"tinker_path": "tinker://..."}}, got {str(body)[:200]}',
                "invalid_argument",
                field="tinker_path",
            )
        m = self.state.model(path.removeprefix("tinker://").split("/", 1)[0], token, live=False)
        if path not in self.ops.live(m):
            raise TinkerError(
                404, f"tinker_path {path!r} does not exist", "not_found", field="tinker_path"
            )
        lora = self.settings.lora != "full_finetune" and m.lora_config is not None
        cfg = m.lora_config or {}
        return web.json_response(
            {
                "base_model": m.base_model,
                "is_lora": lora,
                **(
                    {
                        "lora_rank": m.lora_rank,
                        "train_unembed": bool(cfg.get("train_unembed", True)),
                        "train_mlp": bool(cfg.get("train_mlp", True)),
                        "train_attn": bool(cfg.get("train_attn", True)),
                    }
                    if lora
                    else {}
                ),
            }
        )

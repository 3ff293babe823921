"""Checkpoint ops of the gateway: the trainer's worker saves and loads; the files live under the
gateway's data directory (`{root}/checkpoints/{job}/{checkpoint}`, with a `meta.json`), so they
can be listed, exported, downloaded and deleted after the job's workers are gone. (With Ray
workers on other nodes that directory must be shared storage.)"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..protocol.context import CallContext
from ..protocol.errors import ProtocolError
from ..protocol.jobs import rfc3339
from .base import GatewayBase

PUBLIC = ("checkpoint_id", "checkpoint_type", "global_steps", "avg_loss", "created_at")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _filename(value: Any) -> str:
    name = str(value or "")
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ProtocolError(
            "invalid_argument",
            f"field filename: {name!r} is not a file name",
            field="filename",
            expected="a plain file name",
        )
    return name


class Checkpoints(GatewayBase):
    def ckpt_root(self, job_id: str) -> Path:
        return self.settings.checkpoint_root / job_id

    def ckpt_meta(self, job_id: str, ckpt: str) -> dict[str, Any]:
        f = self.ckpt_root(job_id) / ckpt / "meta.json"
        try:
            return dict(json.loads(f.read_text()))
        except (OSError, ValueError):
            raise ProtocolError(
                "checkpoint_not_found",
                f"no checkpoint {ckpt!r} in job {job_id}",
                checkpoint_id=ckpt,
                job_id=job_id,
            ) from None

    @staticmethod
    def public(meta: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: meta[k] for k in PUBLIC if k in meta}
        out["size_bytes"] = int(meta.get("size_bytes") or 0)
        return out

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = self.begin(ctx)
        ckpt = str(body.get("checkpoint_id") or f"step-{job.global_step}")
        ctype = str(body.get("checkpoint_type") or "resumable")
        root = self.ckpt_root(job.job_id) / ckpt
        if root.exists() and not ctx.recovered:
            await asyncio.to_thread(shutil.rmtree, root, True)
        now = time.time()
        res = await self.call(
            ctx,
            sub,
            # the engine command (op_save, DeepSpeed's save_checkpoint), not the op's name
            "save",  # not-an-op
            directory=str(root),
            tag="ds",
            checkpoint_type=ctype,
            client_state={"job_id": job.job_id, "checkpoint_id": ckpt, "created_at": rfc3339(now)},
        )
        meta = {
            "checkpoint_id": ckpt,
            "checkpoint_type": ctype,
            "global_steps": int(res.get("global_steps", job.global_step)),
            "avg_loss": job.last_loss,
            "created_at": rfc3339(now),
            "size_bytes": int(res.get("size_bytes", 0)),
            "model_dir": str((sub.worker.get("info") or {}).get("model_dir") or ""),
            "dtype": sub.dtype,
        }
        root.mkdir(parents=True, exist_ok=True)
        (root / "meta.json").write_text(json.dumps(meta))
        return {"checkpoint": self.public(meta)}

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        self.require_running(job, ctx.method)
        tid = body.get("target_sub_job_id")
        sub = job.find_sub_job(str(tid)) if tid else self.target(job, ctx)
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found", f"no sub-job {tid!r} in job {job.job_id}", sub_job_id=tid
            )
        ckpt = str(body["checkpoint_id"])
        source = str(body.get("source_job_id") or job.job_id)
        if source != job.job_id and not ctx.resumed:
            self.jobs.visible(source, self.owner(ctx))  # the same token's jobs only
        meta = self.ckpt_meta(source, ckpt)
        res = await self.call(
            ctx,
            sub,
            # the engine command (op_load, DeepSpeed's load_checkpoint), not the op's name
            "load",  # not-an-op
            directory=str(self.ckpt_root(source) / ckpt),
            tag="ds",
            checkpoint_type=str(meta.get("checkpoint_type") or "resumable"),
        )
        if sub.role == "training":
            job.global_step = int(res.get("global_steps", job.global_step))
            self.jobs.save(job)
        return {"checkpoint": self.public(meta)}

    async def list_checkpoints(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        root = self.ckpt_root(job.job_id)
        out = []
        if root.is_dir():
            for d in sorted(root.iterdir()):
                with contextlib.suppress(ProtocolError):
                    out.append(self.public(self.ckpt_meta(job.job_id, d.name)))
        out.sort(key=lambda c: (c.get("created_at", ""), c.get("checkpoint_id", "")))
        return {"checkpoints": out}

    async def export_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        ckpt = str(body["checkpoint_id"])
        meta = self.ckpt_meta(job.job_id, ckpt)
        root = self.ckpt_root(job.job_id) / ckpt
        out = root / "export"
        if not out.is_dir() or not any(out.iterdir()):
            await self.profile.export(root, meta, out)
        files = []
        for f in sorted(out.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                files.append(
                    {
                        "filename": f.name,
                        "url": f"/{job.job_id}/checkpoints/{ckpt}/files/{f.name}",
                        "size_bytes": f.stat().st_size,
                        "sha256": await asyncio.to_thread(_sha256, f),
                    }
                )
        return {"checkpoint_id": ckpt, "files": files, "expires_at": ""}

    async def download_checkpoint_file(self, ctx: CallContext, body: dict[str, Any]) -> bytes:
        job = self.job(ctx)
        ckpt = str(body["checkpoint_id"])
        self.ckpt_meta(job.job_id, ckpt)
        name = _filename(body.get("filename"))
        f = self.ckpt_root(job.job_id) / ckpt / "export" / name
        if not f.is_file():
            raise ProtocolError(
                "not_found",
                f"checkpoint {ckpt} has no exported file {name!r} (export it first)",
                checkpoint_id=ckpt,
                filename=name,
            )
        return await asyncio.to_thread(f.read_bytes)

    async def delete_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        ckpt = str(body["checkpoint_id"])
        self.ckpt_meta(job.job_id, ckpt)
        await asyncio.to_thread(shutil.rmtree, self.ckpt_root(job.job_id) / ckpt, True)
        return {"deleted": True}

"""Checkpoint ops of the gateway: the trainer's worker saves and loads; the files live under the
gateway's data directory (`{root}/checkpoints/{job}/{checkpoint}`, with a `meta.json`), so they
can be listed, exported, downloaded and deleted after the job's workers are gone. (With Ray
workers on other nodes that directory must be shared storage.) The directory layout and answers
are `serving/checkpoint_files.py`, shared with the on-prem server."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..protocol.context import CallContext
from ..rules import checkpoint_ids
from ..rules.lora_config import export_format
from ..serving import checkpoint_files as cf
from ..serving import forwarding
from . import lora
from .base import GatewayBase


class Checkpoints(GatewayBase):
    def ckpt_root(self, job_id: str) -> Path:
        return self.settings.checkpoint_root / job_id

    @property
    def ckpts(self) -> cf.CheckpointDirs:
        return cf.CheckpointDirs(self.ckpt_root, url_prefix="/")

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = self.begin(ctx)
        save = functools.partial(self.call, ctx, sub)
        _, meta = await self.ckpts.save(job, body, save, fresh=not ctx.recovered)
        meta["model_dir"] = str((sub.worker.get("info") or {}).get("model_dir") or "")
        meta["dtype"] = sub.dtype
        if job_lora := lora.lora_of(job):
            meta["lora"] = job_lora
        self.ckpts.write_meta(job.job_id, meta["checkpoint_id"], meta)
        return {"checkpoint": cf.public(meta)}

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub, ckpt, source = self.load_source(ctx, body)
        meta = self.ckpts.meta(source, ckpt)
        root = self.ckpts.path(source, ckpt)
        await forwarding.load_checkpoint(
            job,
            sub,
            root,
            meta,
            functools.partial(self.call, ctx),
            ckpt=ckpt,
            adapter_job=lora.adapter_job(job),
            export=lambda: self._export(root, meta),
            any_role=self.profile.name == "fake",  # fake workers load any role
        )
        self.jobs.save(job)
        return {"checkpoint": cf.public(meta)}

    async def _export(self, root: Path, meta: dict[str, Any]) -> Path:
        """The checkpoint's HF export directory, made on first use."""
        out = root / "export"
        if not out.is_dir() or not any(out.iterdir()):
            await self.profile.export(root, meta, out)
        return out

    async def list_checkpoints(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return {"checkpoints": self.ckpts.listing(self.job(ctx).job_id)}

    async def export_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        ckpt = str(body["checkpoint_id"])
        meta = self.ckpts.meta(job.job_id, ckpt)
        root = self.ckpts.path(job.job_id, ckpt)
        if export_format(body, lora.is_lora_checkpoint(meta)) == "peft":  # PROTOCOL.md §3.6
            files = await self.ckpts.exported(
                job.job_id, ckpt, await lora.export_peft(self.profile, root, meta)
            )
            return {"checkpoint_id": ckpt, "files": files, "expires_at": ""}
        await self._export(root, meta)
        files = await self.ckpts.exported(job.job_id, ckpt)
        return {"checkpoint_id": ckpt, "files": files, "expires_at": ""}

    async def download_checkpoint_file(self, ctx: CallContext, body: dict[str, Any]) -> bytes:
        job = self.job(ctx)
        ckpt = str(body["checkpoint_id"])
        meta = self.ckpts.meta(job.job_id, ckpt)
        name = checkpoint_ids.check_filename(body.get("filename"))
        return await self.ckpts.read_exported(job.job_id, ckpt, name, lora.file_dir(meta, name))

    async def delete_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        await self.ckpts.delete(job.job_id, str(body["checkpoint_id"]))
        return {"deleted": True}

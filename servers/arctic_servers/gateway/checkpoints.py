"""Checkpoint ops of the gateway: the trainer's worker saves and loads; the files live under the
gateway's data directory (`{root}/checkpoints/{job}/{checkpoint}`, with a `meta.json`), so they
can be listed, exported, downloaded and deleted after the job's workers are gone. (With Ray
workers on other nodes that directory must be shared storage.) The directory layout and answers
are `protocol/checkpoint_files.py`, shared with the on-prem server."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from ..protocol import checkpoint_files as cf
from ..protocol import checkpoint_ids
from ..protocol.context import CallContext
from ..protocol.jobs import sub_job_by_id
from ..protocol.lora_config import export_format
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
        ckpt = str(body.get("checkpoint_id") or f"step-{job.global_step}")
        ctype = str(body.get("checkpoint_type") or "resumable")
        root = self.ckpts.path(job.job_id, ckpt)
        if root.exists() and not ctx.recovered:
            await asyncio.to_thread(shutil.rmtree, root, True)
        now = time.time()
        args = cf.save_args(root, job.job_id, ckpt, ctype, now)
        # the engine command (op_save, DeepSpeed's save_checkpoint), not the op's name
        res = await self.call(ctx, sub, "save", **args)  # not-an-op
        meta = {
            **cf.new_meta(job, ckpt, ctype, res, now),
            "model_dir": str((sub.worker.get("info") or {}).get("model_dir") or ""),
            "dtype": sub.dtype,
            **({"lora": job_lora} if (job_lora := lora.lora_of(job)) else {}),
        }
        self.ckpts.write_meta(job.job_id, ckpt, meta)
        return {"checkpoint": cf.public(meta)}

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(ctx)
        self.require_running(job, ctx.method)
        tid = body.get("target_sub_job_id")
        sub = sub_job_by_id(job, tid) if tid else self.target(job, ctx)
        ckpt = str(body["checkpoint_id"])
        source = str(body.get("source_job_id") or job.job_id)
        if not ctx.resumed:  # checked when accepted too (check_request), with the token
            checkpoint_ids.check_source_job(
                body, job.job_id, lambda s: self.jobs.visible(s, self.owner(ctx))
            )
        meta = self.ckpts.meta(source, ckpt)
        root = self.ckpts.path(source, ckpt)
        if sub.role == "training" or self.profile.name == "fake":  # fake workers load any role
            args = cf.load_args(root, meta)
            # the engine command (op_load, DeepSpeed's load_checkpoint), not the op's name
            res = await self.call(ctx, sub, "load", **args)  # not-an-op
        else:  # a vLLM sampler or scorer takes the checkpoint's exported HF weights
            load = lora.sampler_load_args(job, root, ckpt) if sub.role == "sampling" else None
            if load is None:  # (an adapter job's sampler: the adapter, a new version)
                load = {"path": str((await self._export(root, meta)) / cf.EXPORT_WEIGHTS)}
            # the version its results report from now on (the worker's own, since issue 21)
            res = await self.call(
                ctx, sub, "load_weights", **load, weight_version=job.weight_version + 1
            )
        if sub.role == "training":
            job.global_step = int(res.get("global_steps", job.global_step))
        else:  # a sampler's weights changed: its generates report a new weight version
            job.weight_version += 1
            sub.weight_version = job.weight_version
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

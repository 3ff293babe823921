"""Checkpoint ops of the on-prem server: the trainer's worker saves and loads; the files live under
`--data-dir/jobs/{job}/checkpoints/{checkpoint}` (with a `meta.json`), so they can be listed,
exported to an HF directory (a subprocess), downloaded and deleted after the workers are gone.
The directory layout and answers are `serving/checkpoint_files.py`, shared with the gateway."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engines import checks
from ..engines.config import servers_dir, thread_env
from ..protocol.context import CallContext
from ..rules.lora_config import PEFT_EXPORT, PEFT_FILES, export_format
from ..serving import checkpoint_files as cf
from ..serving import forwarding
from ..serving.checkpoint_files import copy_tree as _copy_tree
from .base import OnpremBase
from .jobs import SubJob


class Checkpoints(OnpremBase):
    # ------------------------------------------------------------------ checkpoints

    def _ckpt_root(self, job_id: str) -> Path:
        return self.settings.data_dir / "jobs" / job_id / "checkpoints"

    @property
    def _ckpts(self) -> cf.CheckpointDirs:
        return cf.CheckpointDirs(self._ckpt_root)

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        root, meta = await self._ckpts.save(job, body, functools.partial(self._call, sub))
        ckpt = str(meta["checkpoint_id"])
        meta["model_dir"] = str(sub.model_dir or "")
        meta["dtype"] = sub.spec.dtype
        meta["zero_stage"] = (sub.worker.info if sub.worker else {}).get("zero_stage")
        self._ckpts.write_meta(job.job_id, ckpt, meta)
        keep = sub.spec.config.get("checkpoint_path")
        if keep:  # train_options.py: also kept where a later sub-job resumes from
            dest = Path(str(keep)) / ckpt
            await asyncio.to_thread(_copy_tree, root, dest)
        return {"checkpoint": cf.public(meta)}

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub, ckpt, source = self.load_source(ctx, body)
        meta = self._ckpts.meta(source, ckpt)
        await forwarding.load_checkpoint(
            job,
            sub,
            self._ckpts.path(source, ckpt),
            meta,
            self._call,
            ckpt=ckpt,
            adapter_job=job.syncs_adapter,
            export=lambda: self._export(source, ckpt, meta),
        )
        return {"checkpoint": cf.public(meta)}

    async def list_checkpoints(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return {"checkpoints": self._ckpts.listing(self._job(ctx).job_id)}

    async def export_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        meta = self._ckpts.meta(job.job_id, ckpt)
        adapter = self._ckpts.path(job.job_id, ckpt) / cf.ENGINE_TAG / "adapter"
        if export_format(body, adapter.is_dir()) == "peft":  # PROTOCOL.md §3.6
            await asyncio.to_thread(_copy_tree, adapter, adapter.parents[1] / PEFT_EXPORT)
            files = await self._ckpts.exported(job.job_id, ckpt, PEFT_EXPORT)
        else:
            await self._export(job.job_id, ckpt, meta)
            files = await self._ckpts.exported(job.job_id, ckpt)
        return {"checkpoint_id": ckpt, "files": files, "expires_at": ""}

    async def _export(self, job_id: str, ckpt: str, meta: Mapping[str, Any]) -> Path:
        """The checkpoint's HF export directory, made once (a subprocess) on first use."""
        root = self._ckpts.path(job_id, ckpt)
        out = root / "export"
        lock = self._exports.setdefault((job_id, ckpt), asyncio.Lock())
        async with lock:
            if not (out / cf.EXPORT_WEIGHTS).is_file():
                await self._run_export(root, meta, out)
        return out

    async def _run_export(self, root: Path, meta: Mapping[str, Any], out: Path) -> None:
        env = dict(os.environ)
        env.update(thread_env(self.settings.threads.threads("training")))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(servers_dir()), env.get("PYTHONPATH", "")) if p
        )
        env.pop("PYTHONWARNINGS", None)
        await cf.run_export(self.settings.worker_python, env, root, meta, out)

    async def download_checkpoint_file(self, ctx: CallContext, body: dict[str, Any]) -> bytes:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        self._ckpts.meta(job.job_id, ckpt)
        name = checks.filename(body.get("filename"))
        if name in PEFT_FILES:  # a LoRA checkpoint's PEFT export
            return await self._ckpts.read_exported(job.job_id, ckpt, name, PEFT_EXPORT)
        return await self._ckpts.read_exported(job.job_id, ckpt, name)

    async def delete_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        await self._ckpts.delete(job.job_id, str(body["checkpoint_id"]))
        return {"deleted": True}


async def resume(sub: SubJob, root: Path) -> dict[str, Any] | None:
    """A training sub-job's `checkpoint_path` at start: load the newest resumable checkpoint
    saved there (most global steps, then the latest); None when it holds none."""
    dirs = cf.CheckpointDirs(lambda _job: root)
    found = [c for c in dirs.listing("") if c.get("checkpoint_type") == "resumable"]
    if not found:
        return None
    newest = max(found, key=lambda c: (int(c.get("global_steps") or 0), c.get("created_at", "")))
    ckpt = str(newest["checkpoint_id"])
    meta = dirs.meta("", ckpt)
    assert sub.worker is not None
    res = await sub.worker.call("load", **cf.load_args(root / ckpt, meta))  # not-an-op
    return {"checkpoint_id": ckpt, "path": str(root / ckpt), **dict(res)}

"""Checkpoint ops of the on-prem server: the trainer's worker saves and loads; the files live under
`--data-dir/jobs/{job}/checkpoints/{checkpoint}` (with a `meta.json`), so they can be listed,
exported to an HF directory (a subprocess), downloaded and deleted after the workers are gone."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..protocol.context import CallContext
from ..protocol.errors import ProtocolError
from ..protocol.jobs import rfc3339
from . import checks
from .base import OnpremBase
from .settings import servers_dir, thread_env


class Checkpoints(OnpremBase):
    # ------------------------------------------------------------------ checkpoints

    def _ckpt_root(self, job_id: str) -> Path:
        return self.settings.data_dir / "jobs" / job_id / "checkpoints"

    def _ckpt_meta(self, job_id: str, ckpt: str) -> dict[str, Any]:
        f = self._ckpt_root(job_id) / ckpt / "meta.json"
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
    def _public(meta: Mapping[str, Any]) -> dict[str, Any]:
        keys = (
            "checkpoint_id",
            "checkpoint_type",
            "global_steps",
            "avg_loss",
            "created_at",
            "size_bytes",
        )
        return {k: meta[k] for k in keys if k in meta}

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub = await self._begin(ctx)
        ckpt = str(body.get("checkpoint_id") or f"step-{job.global_step}")
        ctype = str(body.get("checkpoint_type") or "resumable")
        root = self._ckpt_root(job.job_id) / ckpt
        if root.exists():
            await asyncio.to_thread(shutil.rmtree, root, True)
        now = time.time()
        res = await self._call(
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
            "model_dir": str(sub.model_dir or ""),
            "dtype": sub.spec.dtype,
            "zero_stage": (sub.worker.info if sub.worker else {}).get("zero_stage"),
        }
        (root / "meta.json").write_text(json.dumps(meta))
        return {"checkpoint": self._public(meta)}

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        tid = body.get("target_sub_job_id")
        sub = job.find_sub_job(str(tid)) if tid else self.target(job, ctx)
        if sub is None:
            raise ProtocolError(
                "sub_job_not_found", f"no sub-job {tid!r} in job {job.job_id}", sub_job_id=tid
            )
        ckpt = str(body["checkpoint_id"])
        source = str(body.get("source_job_id") or job.job_id)
        if source != job.job_id:
            self.jobs.visible(source, self._owner(ctx))  # same token only
        meta = self._ckpt_meta(source, ckpt)
        res = await self._call(
            sub,
            # the engine command (op_load, DeepSpeed's load_checkpoint), not the op's name
            "load",  # not-an-op
            directory=str(self._ckpt_root(source) / ckpt),
            tag="ds",
            checkpoint_type=str(meta.get("checkpoint_type") or "resumable"),
        )
        job.global_step = int(res.get("global_steps", job.global_step))
        return {"checkpoint": self._public(meta)}

    async def list_checkpoints(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        root = self._ckpt_root(job.job_id)
        out = []
        if root.is_dir():
            for d in sorted(root.iterdir()):
                with contextlib.suppress(ProtocolError):
                    out.append(self._public(self._ckpt_meta(job.job_id, d.name)))
        out.sort(key=lambda c: (c.get("created_at", ""), c.get("checkpoint_id", "")))
        return {"checkpoints": out}

    async def export_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        meta = self._ckpt_meta(job.job_id, ckpt)
        root = self._ckpt_root(job.job_id) / ckpt
        out = root / "export"
        lock = self._exports.setdefault((job.job_id, ckpt), asyncio.Lock())
        async with lock:
            if not (out / "model.safetensors").is_file():
                await self._run_export(root, meta, out)
        files = []
        for f in sorted(out.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                digest = await asyncio.to_thread(_sha256, f)
                files.append(
                    {
                        "filename": f.name,
                        "url": f"{job.job_id}/checkpoints/{ckpt}/files/{f.name}",
                        "size_bytes": f.stat().st_size,
                        "sha256": digest,
                    }
                )
        return {"checkpoint_id": ckpt, "files": files, "expires_at": ""}

    async def _run_export(self, root: Path, meta: Mapping[str, Any], out: Path) -> None:
        tmp = out.with_name(".export-tmp")
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        env = dict(os.environ)
        env.update(thread_env(self.settings.threads.threads("training")))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(servers_dir()), env.get("PYTHONPATH", "")) if p
        )
        env.pop("PYTHONWARNINGS", None)
        proc = await asyncio.create_subprocess_exec(
            self.settings.worker_python,
            "-m",
            "arctic_servers.onprem.export",
            "--checkpoint",
            str(root / "ds"),
            "--type",
            str(meta.get("checkpoint_type") or "resumable"),
            "--model-dir",
            str(meta.get("model_dir") or ""),
            "--dtype",
            str(meta.get("dtype") or "float32"),
            "--out",
            str(tmp),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = output.decode("utf-8", "replace").strip().splitlines()[-5:]
            raise ProtocolError(
                "internal",
                f"export of {root.name} failed (exit {proc.returncode}): {' | '.join(tail)}",
            )
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)

    async def download_checkpoint_file(self, ctx: CallContext, body: dict[str, Any]) -> bytes:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        self._ckpt_meta(job.job_id, ckpt)
        name = checks.filename(body.get("filename"))
        f = self._ckpt_root(job.job_id) / ckpt / "export" / name
        if not f.is_file():
            raise ProtocolError(
                "not_found",
                f"checkpoint {ckpt} has no exported file {name!r} (export it first)",
                checkpoint_id=ckpt,
                filename=name,
            )
        return await asyncio.to_thread(f.read_bytes)

    async def delete_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        ckpt = str(body["checkpoint_id"])
        self._ckpt_meta(job.job_id, ckpt)
        await asyncio.to_thread(shutil.rmtree, self._ckpt_root(job.job_id) / ckpt, True)
        return {"deleted": True}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

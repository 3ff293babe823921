"""Checkpoints kept as directories, as the on-prem server and the Cortex gateway keep them: one
directory a checkpoint under a job's checkpoint root, holding the trainer's DeepSpeed files
(`ds/`), a `meta.json` and, once exported, an `export/` Hugging Face directory. They outlive the
job's workers, so they can be listed, exported, downloaded and deleted after the job ends.

Each server says where a job's root is and runs the engine commands; this module has the
directory layout (an id becomes a path through `checkpoint_ids.resolve` only), the `Checkpoint`
answers, the engine's save and load arguments, and the export subprocess
(`arctic_servers.engines.deepspeed.export`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rules import checkpoint_ids
from ..rules.errors import ProtocolError
from ..rules.jobs import JobRecord, rfc3339

PUBLIC = ("checkpoint_id", "checkpoint_type", "global_steps", "avg_loss", "created_at")
ENGINE_TAG = "ds"  # the DeepSpeed tag (subdirectory) the trainer saves under
EXPORT_WEIGHTS = "model.safetensors"  # the weights file of an `export/` directory


def public(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The `Checkpoint` answer (training.proto) of a checkpoint's `meta.json`."""
    out = {k: meta[k] for k in PUBLIC if k in meta}
    out["size_bytes"] = int(meta.get("size_bytes") or 0)
    return out


def save_args(directory: Path, job_id: str, ckpt: str, ctype: str, now: float) -> dict[str, Any]:
    """The arguments of the trainer's `save` engine command."""
    return {
        "directory": str(directory),
        "tag": ENGINE_TAG,
        "checkpoint_type": ctype,
        "client_state": {"job_id": job_id, "checkpoint_id": ckpt, "created_at": rfc3339(now)},
    }


def load_args(directory: Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of the trainer's `load` engine command."""
    return {
        "directory": str(directory),
        "tag": ENGINE_TAG,
        "checkpoint_type": str(meta.get("checkpoint_type") or "resumable"),
    }


def new_meta(
    job: JobRecord[Any], ckpt: str, ctype: str, saved: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The `meta.json` of a checkpoint just saved (`saved`: the `save` command's answer); the
    server adds what its export needs (`model_dir`, `dtype`)."""
    return {
        "checkpoint_id": ckpt,
        "checkpoint_type": ctype,
        "global_steps": int(saved.get("global_steps", job.global_step)),
        "avg_loss": job.last_loss,
        "created_at": rfc3339(now),
        "size_bytes": int(saved.get("size_bytes", 0)),
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class CheckpointDirs:
    """A server's checkpoint directories: `root(job_id)` is a job's root; file URLs are
    `{url_prefix}{job_id}/checkpoints/{checkpoint}/files/{name}`."""

    root: Callable[[str], Path]
    url_prefix: str = ""

    def path(self, job_id: str, ckpt: str) -> Path:
        """The checkpoint's directory, inside the job's own root (`checkpoint_ids.resolve`)."""
        return checkpoint_ids.resolve(self.root(job_id), ckpt)

    def meta(self, job_id: str, ckpt: str) -> dict[str, Any]:
        """A checkpoint's `meta.json`, or `checkpoint_not_found`."""
        f = self.path(job_id, ckpt) / "meta.json"
        try:
            return dict(json.loads(f.read_text()))
        except (OSError, ValueError):
            raise ProtocolError(
                "checkpoint_not_found",
                f"no checkpoint {ckpt!r} in job {job_id}",
                checkpoint_id=ckpt,
                job_id=job_id,
            ) from None

    async def save(
        self,
        job: JobRecord[Any],
        body: Mapping[str, Any],
        save: Callable[..., Awaitable[Any]],
        *,
        fresh: bool = True,
    ) -> tuple[Path, dict[str, Any]]:
        """SaveCheckpoint on the trainer: `save` runs the engine command `save` (not the op's
        name: DeepSpeed's save_checkpoint) into the checkpoint's directory, which a re-save of
        the same id first empties (`fresh`; a gateway's recovered call keeps what its engine
        wrote). Answers the directory and the new `meta.json`, to which the server adds what
        its export needs before `write_meta`."""
        ckpt = str(body.get("checkpoint_id") or f"step-{job.global_step}")
        ctype = str(body.get("checkpoint_type") or "resumable")
        root = self.path(job.job_id, ckpt)
        if root.exists() and fresh:
            await asyncio.to_thread(shutil.rmtree, root, True)
        now = time.time()
        res = await save("save", **save_args(root, job.job_id, ckpt, ctype, now))  # not-an-op
        return root, new_meta(job, ckpt, ctype, res, now)

    def write_meta(self, job_id: str, ckpt: str, meta: Mapping[str, Any]) -> None:
        directory = self.path(job_id, ckpt)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "meta.json").write_text(json.dumps(meta))

    def listing(self, job_id: str) -> list[dict[str, Any]]:
        """The `ListCheckpoints` answer's checkpoints, oldest first."""
        root = self.root(job_id)
        out = []
        if root.is_dir():
            for d in sorted(root.iterdir()):
                with contextlib.suppress(ProtocolError):  # not a checkpoint (or not an id)
                    out.append(public(self.meta(job_id, d.name)))
        out.sort(key=lambda c: (c.get("created_at", ""), c.get("checkpoint_id", "")))
        return out

    async def exported(self, job_id: str, ckpt: str, sub: str = "export") -> list[dict[str, Any]]:
        """The files of a checkpoint's export (`ExportCheckpoint`'s `files`; `sub`: the export
        directory, a LoRA checkpoint's PEFT one is `export-peft`)."""
        files = []
        for f in sorted((self.path(job_id, ckpt) / sub).iterdir()):
            if f.is_file() and not f.name.startswith("."):
                files.append(
                    {
                        "filename": f.name,
                        "url": f"{self.url_prefix}{job_id}/checkpoints/{ckpt}/files/{f.name}",
                        "size_bytes": f.stat().st_size,
                        "sha256": await asyncio.to_thread(sha256, f),
                    }
                )
        return files

    async def read_exported(self, job_id: str, ckpt: str, name: str, sub: str = "export") -> bytes:
        """One exported file of folder `sub` (`name`: a plain file name under the spec's rule)."""
        self.meta(job_id, ckpt)
        export = self.path(job_id, ckpt) / sub
        f = checkpoint_ids.resolve_file(export, name) if export.is_dir() else export / name
        if not f.is_file():
            raise ProtocolError(
                "not_found",
                f"checkpoint {ckpt} has no exported file {name!r} (export it first)",
                checkpoint_id=ckpt,
                filename=name,
            )
        return await asyncio.to_thread(f.read_bytes)

    async def delete(self, job_id: str, ckpt: str) -> None:
        self.meta(job_id, ckpt)
        await asyncio.to_thread(shutil.rmtree, self.path(job_id, ckpt), True)


async def run_export(
    python: str, env: Mapping[str, str], ckpt_dir: Path, meta: Mapping[str, Any], out: Path
) -> None:
    """Export a checkpoint as a Hugging Face directory `out`, in a subprocess of `python`
    (`arctic_servers.engines.deepspeed.export`), written beside it first, then moved into place."""
    tmp = out.with_name(".export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "arctic_servers.engines.deepspeed.export",
        "--checkpoint",
        str(ckpt_dir / ENGINE_TAG),
        "--type",
        str(meta.get("checkpoint_type") or "resumable"),
        "--model-dir",
        str(meta.get("model_dir") or ""),
        "--dtype",
        str(meta.get("dtype") or "float32"),
        "--out",
        str(tmp),
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await proc.communicate()
    if proc.returncode != 0:
        tail = " | ".join(output.decode("utf-8", "replace").strip().splitlines()[-5:])
        raise ProtocolError(
            "internal", f"export of {ckpt_dir.name} failed (exit {proc.returncode}): {tail}"
        )
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def copy_tree(src: Path, dest: Path) -> None:
    """`dest` becomes a copy of the directory `src` (whatever was there is replaced)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest)

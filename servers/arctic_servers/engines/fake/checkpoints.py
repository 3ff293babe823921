"""Checkpoints of the fake engine: save, load, list, export as real files, download, delete.

A checkpoint is a snapshot of the job's fake training state (NUMERICS.md §6). Export produces
three small real files: `model.safetensors` (one F32 tensor computed from the snapshot),
`config.json` and `tokenizer_config.json`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ...rules import checkpoint_ids
from ...rules.errors import ProtocolError
from ...rules.jobs import rfc3339
from ...rules.lora_config import export_format, job_lora
from . import tokenizer
from .numerics import token_logprob
from .state import Checkpoint, Job, SubJob

FILES = ("model.safetensors", "config.json", "tokenizer_config.json")
EXPORT_TTL_S = 3600


class Jobs(Protocol):
    """What `load` needs of its server's jobs: another job, as the caller's token may see it."""

    def visible(self, job_id: str, owner: str | None) -> Job: ...


def not_found(job_id: str, checkpoint_id: str) -> ProtocolError:
    return ProtocolError(
        "checkpoint_not_found",
        f"no checkpoint {checkpoint_id!r} in job {job_id}",
        job_id=job_id,
        checkpoint_id=checkpoint_id,
    )


def get(job: Job, checkpoint_id: str) -> Checkpoint:
    ckpt = job.checkpoints.get(checkpoint_id)
    if ckpt is None:
        raise not_found(job.job_id, checkpoint_id)
    return ckpt


def check_id(checkpoint_id: Any, field: str = "checkpoint_id") -> None:
    """The spec's checkpoint-id rule (`arctic_servers.rules.checkpoint_ids`)."""
    checkpoint_ids.check_id(checkpoint_id, field)


def check_save(body: Mapping[str, Any]) -> None:
    if body.get("checkpoint_id"):
        check_id(str(body["checkpoint_id"]))


def to_json(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": ckpt.checkpoint_id,
        "checkpoint_type": ckpt.checkpoint_type,
        "global_steps": ckpt.global_step,
        "avg_loss": ckpt.avg_loss,
        "created_at": rfc3339(ckpt.created_at),
        "size_bytes": sum(len(v) for v in files(ckpt).values()),
    }


def save(job: Job, train: SubJob, body: Mapping[str, Any]) -> dict[str, Any]:
    check_save(body)
    cid = str(body.get("checkpoint_id") or f"step-{job.global_step}")
    ckpt = Checkpoint(
        checkpoint_id=cid,
        checkpoint_type=str(body.get("checkpoint_type") or "resumable"),
        global_step=job.global_step,
        model_step=train.model_step,
        lr=job.trainer.lr,
        avg_loss=job.trainer.last_loss,
        created_at=time.time(),
        model_name=train.model_name,
    )
    job.checkpoints.pop(cid, None)  # a re-save replaces it (and moves it to the end)
    job.checkpoints[cid] = ckpt
    return {"checkpoint": to_json(ckpt)}


def load(jobs: Jobs, job: Job, token: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """Restore a snapshot into the target sub-job (NUMERICS.md §6)."""
    cid = str(body.get("checkpoint_id") or "")
    if not cid:
        raise ProtocolError(
            "missing_field", "field checkpoint_id: is required", field="checkpoint_id"
        )
    source = job
    if body.get("source_job_id"):
        checkpoint_ids.check_source_job(body, job.job_id, lambda s: jobs.visible(s, token))
        source = jobs.visible(str(body["source_job_id"]), token)
    ckpt = get(source, cid)
    target = job.sub_job("training")
    if body.get("target_sub_job_id"):
        target = job.find_sub_job(str(body["target_sub_job_id"]))
        if target is None:
            raise ProtocolError(
                "sub_job_not_found",
                f"no sub-job {body['target_sub_job_id']!r} in job {job.job_id}",
                sub_job_id=body["target_sub_job_id"],
                job_id=job.job_id,
            )
    assert target is not None
    resumable = ckpt.checkpoint_type == "resumable"
    target.engine.restore(ckpt.model_step, ckpt.global_step, ckpt.lr, resumable)
    if target.role != "training":  # a sampler's weights changed: generates say so
        job.weight_version += 1
    if target.role == "training" and resumable:
        job.global_step = ckpt.global_step
    return {"checkpoint": to_json(ckpt)}


def list_all(job: Job) -> dict[str, Any]:
    return {"checkpoints": [to_json(c) for c in job.checkpoints.values()]}


def delete(job: Job, checkpoint_id: str) -> dict[str, Any]:
    get(job, checkpoint_id)
    del job.checkpoints[checkpoint_id]
    return {"deleted": True}


def file_url(job_id: str, checkpoint_id: str, filename: str) -> str:
    return f"/{job_id}/checkpoints/{checkpoint_id}/files/{filename}"


def export(job: Job, checkpoint_id: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    ckpt = get(job, checkpoint_id)
    lora = _lora(job)
    fmt = export_format(body or {}, lora is not None)
    out = []
    chosen = files(ckpt) if fmt == "hf" else peft_files(ckpt, lora or {})
    for name, data in chosen.items():
        out.append(
            {
                "filename": name,
                "url": file_url(job.job_id, checkpoint_id, name),
                "size_bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    return {
        "checkpoint_id": checkpoint_id,
        "files": out,
        "expires_at": rfc3339(time.time() + EXPORT_TTL_S),
    }


def download(job: Job, checkpoint_id: str, filename: str) -> bytes:
    ckpt = get(job, checkpoint_id)
    lora = _lora(job)
    data = files(ckpt).get(filename)
    if data is None and lora is not None:
        data = peft_files(ckpt, lora).get(filename)
    if data is None:
        raise ProtocolError(
            "not_found",
            f"checkpoint {checkpoint_id!r} has no file {filename!r}; files: {list(FILES)}",
            filename=filename,
            checkpoint_id=checkpoint_id,
        )
    return data


def files(ckpt: Checkpoint) -> dict[str, bytes]:
    """The exported files of a checkpoint (deterministic bytes)."""
    bias = np.asarray(
        token_logprob(np.arange(tokenizer.VOCAB_SIZE), 0, 0, ckpt.model_step), np.float32
    )
    config = {
        "architectures": ["ArcticFakeByteLM"],
        "model_type": "arctic-fake",
        "vocab_size": tokenizer.VOCAB_SIZE,
        "model_name": ckpt.model_name,
        "checkpoint_type": ckpt.checkpoint_type,
        "global_step": ckpt.global_step,
        "model_step": ckpt.model_step,
        "torch_dtype": "float32",
    }
    tok = {
        "tokenizer_class": "ArcticFakeByteTokenizer",
        "byte_offset": tokenizer.BYTE_OFFSET,
        "pad_token_id": tokenizer.PAD_ID,
        "bos_token_id": tokenizer.BOS_ID,
        "eos_token_id": tokenizer.EOS_ID,
        "vocab_size": tokenizer.VOCAB_SIZE,
    }
    return {
        "model.safetensors": safetensors_bytes(
            {"lm_head.bias": bias}, {"model_step": str(ckpt.model_step)}
        ),
        "config.json": json.dumps(config, indent=2, sort_keys=True).encode(),
        "tokenizer_config.json": json.dumps(tok, indent=2, sort_keys=True).encode(),
    }


def _lora(job: Job) -> dict[str, Any] | None:
    return job_lora([(s.role, s.config) for s in job.sub_jobs])


def peft_files(ckpt: Checkpoint, lora: Mapping[str, Any]) -> dict[str, bytes]:
    """A LoRA checkpoint's PEFT export (NUMERICS.md §6): the adapter's config, and B A of the
    259-wide model with B = 0 and A = the model step (deterministic bytes)."""
    r = int(lora.get("rank") or 8)
    config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": lora.get("alpha"),
        "lora_dropout": lora.get("dropout"),
        "target_modules": lora.get("target_modules"),
        "base_model_name_or_path": ckpt.model_name,
    }
    tensors = {
        "lm_head.lora_A.weight": np.full((r, 259), float(ckpt.model_step), np.float32),
        "lm_head.lora_B.weight": np.zeros((259, r), np.float32),
    }
    return {
        "adapter_config.json": json.dumps(config, indent=2, sort_keys=True).encode(),
        "adapter_model.safetensors": safetensors_bytes(
            tensors, {"model_step": str(ckpt.model_step)}
        ),
    }


_ST_DTYPES = {"float32": "F32", "float64": "F64", "int64": "I64", "int32": "I32"}


def safetensors_bytes(
    tensors: Mapping[str, np.ndarray[Any, Any]], metadata: Mapping[str, str]
) -> bytes:
    """A plain safetensors file (8-byte header length, JSON header padded to 8, data)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **metadata}}
    data = bytearray()
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": _ST_DTYPES[str(arr.dtype)],
            "shape": list(arr.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data)

"""The weight-sync vocabulary every server and engine shares (PROTOCOL.md §3.4): the methods a
`SyncWeightsRequest` may name, the bucket and timeout defaults every member of a weight group
keeps, and the result of a sync that moves one file (`shm`, `safetensors`, `cuda_ipc`). How a
server picks a method and runs the collective one: `serving/collective_sync.py`."""

from __future__ import annotations

from typing import Any

SYNC_METHODS = ("auto", "collective", "nccl", "shm", "safetensors", "cuda_ipc")
GROUP_METHODS = ("collective", "nccl")
# `auto` for workers on one host, by host kind: what bench/weight_sync.py measured faster there
# (CPU: the 0.5B model, 12.4 s by the weight group against 16.6 s by /dev/shm, bench/README
# "weight_sync.py"; GPU: not measured yet — workers on their own GPUs take the bucketed NCCL
# broadcast, workers sharing one GPU CUDA IPC)
AUTO_SAME_HOST = {"cpu": "collective", "cuda": "collective", "shared_gpu": "cuda_ipc"}

DEFAULT_BUCKET_BYTES = 256 << 20
JOIN_TIMEOUT_S = 120.0  # every member joins the group within this
START_TIMEOUT_S = 600.0  # the trainer waits this long for every target to reach a sync
GRACE_S = 10.0  # after one member failed, how long the others get to end their part


def file_sync_result(method: str, exported: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The result of a `shm`, `safetensors` or `cuda_ipc` sync: one export, one "bucket"."""
    n = int(exported.get("num_bytes", 0))
    return {
        "method": method,
        "backend": "",
        "num_tensors": int(exported.get("num_tensors", 0)),
        "num_bytes": n,
        "num_buckets": 1 if n else 0,
        "bucket_bytes": n,
        "setup_seconds": 0.0,
        "seconds": seconds,
        "source_peak_bytes": 0,
        "target_peak_bytes": 0,
        "load_seconds": 0.0,
    }

"""An engine process's environment, set before its engine is built: torch's thread pools and
where DeepSpeed's JIT-built ops are cached. Used by the on-prem worker, a multi-rank trainer's
followers and the gateway's worker hosts alike."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys


def set_threads(n: int) -> None:
    """Pin torch's intra-op pool to `n` threads (vLLM's CPU worker forbids changing it later)."""
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set (a parallel region ran first)
        torch.set_num_interop_threads(1)


def torch_extensions_dir() -> str:
    """Where DeepSpeed's JIT-built ops are cached: one directory per interpreter prefix.

    torch's default (`~/.cache/torch_extensions/py311_cpu`) is shared by every environment of
    the same Python and torch build; two venvs then rebuild each other's ops (about 30-60 s a
    time). `tools/install_engines.sh` prebuilds into this same directory.
    """
    tag = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arctic", "torch_extensions", tag)


def use_op_cache() -> None:
    """Every process that builds an engine (on-prem and gateway workers, Ray-placed ones, their
    rank followers, which inherit it) loads DeepSpeed's JIT ops from this interpreter's cache."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir())

"""A worker's Hugging Face model files: loading a causal LM, its vocabulary size, copying
safetensors weights into it, and writing a Hugging Face directory from a state dict."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import WorkerError

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_model(model_dir: str, dtype: str, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=_TORCH_DTYPES[dtype], attn_implementation=resolve_attn(attn)
    )


def resolve_attn(requested: str) -> str:
    """The attention implementation this host runs for `requested`: a flash kernel needs CUDA
    and its package, else `sdpa` (the same attention maths) is used (train_options.py)."""
    import importlib.util

    from .train_options import FLASH_PACKAGES

    package = FLASH_PACKAGES.get(requested)
    if package is None:
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec(package) is not None:
        return requested
    return "sdpa"


def enable_determinism(conf: Mapping[str, Any], seed: int) -> bool:
    """`full_determinism`: transformers' full determinism (deterministic algorithms, seeded
    RNGs) before the model is built; whether it is on."""
    if not conf.get("full_determinism"):
        return False
    from transformers import enable_full_determinism

    enable_full_determinism(seed)
    return bool(torch.are_deterministic_algorithms_enabled())


def _read_vocab(model_dir: str) -> int:
    with open(Path(model_dir) / "config.json") as f:
        return int(json.load(f)["vocab_size"])


def load_state_file(model: Any, *, path: str | None = None, blob: bytes | None = None) -> int:
    """Copy safetensors weights (HF names) into a plain module's parameters."""
    from safetensors.torch import load, load_file

    sd = load_file(path) if path else load(blob or b"")
    params = dict(model.named_parameters())
    missing = [n for n in params if n not in sd]
    if missing:
        raise WorkerError(
            "invalid_argument", f"weights lack {len(missing)} tensors, e.g. {missing[:3]}"
        )
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(sd[n].to(p.dtype))
    return len(sd)


def write_hf_dir(sd: Mapping[str, torch.Tensor], model_dir: str, out: Path) -> list[Path]:
    """A Hugging Face directory: model.safetensors + the source model's config and tokenizer."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in sd.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    files = [out / "model.safetensors"]
    for name in MODEL_FILES:
        src = Path(model_dir) / name
        if src.is_file():
            shutil.copyfile(src, out / name)
            files.append(out / name)
    return files

"""Build a tiny Qwen2-architecture checkpoint and byte-level BPE tokenizer, deterministically.

No model hub is reachable on the on-prem CPU machines, so the default model of the on-prem server is
built here: an HF directory that ``transformers`` (``AutoConfig``/``AutoTokenizer``/
``Qwen2ForCausalLM.from_pretrained``) and vLLM both load.

Configurations (``CONFIGS``, by name): ``tiny`` is the default model (2 layers, hidden 128, a
random model whose logits are far from uniform, so log-prob checks have signal; ``tiny-8k`` is
the same model with 8,192 positions instead of 1,024, for agents' long prompts); ``tiny-4l`` is
the main job's trainable model (4 layers, hidden 128, initialised as Hugging Face initialises
Qwen2 but with N(0, 0.08) weights, zero biases); ``qwen2.5-0.5b-shape`` has Qwen2.5-0.5B's shape
(24 layers, hidden 896, 14 heads, 2 key-value heads, MLP 4864, vocabulary 151,936, tied
embeddings, rope theta 1e6, 32k positions: 494 M parameters, 1.98 GB in fp32) with HF-initialised
random weights: the real-size model of the benchmarks (bench/weight_sync.py,
bench/real_size.py), not of the test suite. All share the tokenizer of
:mod:`~arctic_servers.engines.tiny_tokenizer` (padded with never-produced tokens up to a larger
model's vocabulary, so every id the model can sample decodes).

Determinism: every file is written from explicit Python data (``json.dumps`` of dicts built here,
weights from a seeded ``numpy`` PCG64 stream, ``safetensors`` with fixed metadata), not through
``save_pretrained`` of the installed library versions, so the same config, ``seed`` and builder
version give byte-identical files on any machine.

Cache: the directory holds ``MARKER_NAME`` with the build spec and the sha256 of every file;
:func:`build_tiny_model` returns at once when the spec matches and every hash verifies. A model
above ``STREAM_ABOVE`` parameters has its weights written tensor by tensor (a safetensors file
of this module's own layout), never whole in memory.

Needs ``numpy``, ``safetensors`` and ``tokenizers`` (no torch, no transformers).

CLI::

    python -m arctic_servers.engines.tiny_model OUT_DIR [--config tiny] [--seed 0] [--force]
                                                        [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tiny_tokenizer import (
    ENDOFTEXT,
    IM_END,
    NUM_BPE_TOKENS,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    tokenizer_files,
)

BUILDER_VERSION = 2  # 2: the chat template renders tools, tool calls and tool messages
MARKER_NAME = ".arctic_tiny_model.json"

# --- architecture -------------------------------------------------------------------------------
MAX_POSITIONS = 1024
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-6
TIE_WORD_EMBEDDINGS = False  # keeps lm_head a separate tensor: weight sync must carry it
INITS = ("sharp", "normal")


@dataclass(frozen=True)
class TinyConfig:
    """The architecture and initialisation of one named tiny model.

    `init`: ``"sharp"`` scales the random weights so the logits have std ~2 (the default model:
    log-prob comparisons and "weights changed" checks then have signal); ``"normal"`` is Hugging
    Face's Qwen2 scheme (N(0, `init_std`) weights and embeddings, zero biases, unit norms; HF's
    default `initializer_range` is 0.02) — a model that starts near-uniform and trains.
    """

    name: str
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64  # vLLM's CPU attention backend needs head_dim >= 64
    intermediate_size: int = 256
    init: str = "sharp"
    init_std: float = 0.02  # "normal" only
    vocab_size: int = VOCAB_SIZE  # above the tokenizer's: padded with never-produced tokens
    tie_word_embeddings: bool = TIE_WORD_EMBEDDINGS
    rope_theta: float = ROPE_THETA
    max_positions: int = MAX_POSITIONS

    @property
    def num_params(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in _param_specs(self))


DEFAULT_CONFIG = "tiny"
CONFIGS: dict[str, TinyConfig] = {
    "tiny": TinyConfig("tiny"),
    # std 0.08 ~ 1/sqrt(hidden): with HF's 0.02 the attention logits start so small that learning
    # addition sat on a plateau for 600+ steps in most seeds; at 0.08 it left it within ~200
    # 2 key-value heads (no GQA): with one shared key-value head, learning addition was slower
    "tiny-4l": TinyConfig("tiny-4l", num_layers=4, num_kv_heads=2, init="normal", init_std=0.08),
    # the default model with 8k positions (its weights are the default's): agents whose prompts
    # pass 1,024 tokens, e.g. Harbor's terminus-2 (~1.9k tokens before its first reply)
    "tiny-8k": TinyConfig("tiny-8k", max_positions=8192),
    # Qwen2.5-0.5B's config.json (hidden, layers, heads, MLP, vocabulary, tying, rope, positions)
    "qwen2.5-0.5b-shape": TinyConfig(
        "qwen2.5-0.5b-shape",
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=4864,
        init="normal",
        init_std=0.02,
        vocab_size=151_936,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        max_positions=32_768,
    ),
}
STREAM_ABOVE = 50_000_000  # parameters: a larger model's weights are written tensor by tensor


def get_config(name: str) -> TinyConfig:
    """The named configuration; a `KeyError` naming the known ones otherwise."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown tiny model config {name!r}; known: {sorted(CONFIGS)}") from None


def cache_dir_name(config: str = DEFAULT_CONFIG, seed: int = 0) -> str:
    """The directory name a server caches a build under (the default keeps its old name)."""
    if config == DEFAULT_CONFIG:
        return f"tiny-qwen2-seed{seed}"
    return f"tiny-qwen2-{get_config(config).name}-seed{seed}"


# --- model construction ---------------------------------------------------------------------------


def _config_files(c: TinyConfig) -> dict[str, bytes]:
    eos = [
        NUM_BPE_TOKENS + SPECIAL_TOKENS.index(IM_END),
        NUM_BPE_TOKENS + SPECIAL_TOKENS.index(ENDOFTEXT),
    ]
    pad = NUM_BPE_TOKENS + SPECIAL_TOKENS.index(ENDOFTEXT)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": pad,
        "eos_token_id": eos[0],
        "pad_token_id": pad,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "head_dim": c.head_dim,
        "initializer_range": c.init_std,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_positions,
        "max_window_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_hidden_layers": c.num_layers,
        "num_key_value_heads": c.num_kv_heads,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": c.vocab_size,
    }
    generation_config = {
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
    }
    return {"config.json": _dumps(config), "generation_config.json": _dumps(generation_config)}


def _param_specs(c: TinyConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init kind) of every Qwen2ForCausalLM tensor, in HF naming."""
    h, ff = c.hidden_size, c.intermediate_size
    q_out = c.num_heads * c.head_dim
    kv_out = c.num_kv_heads * c.head_dim
    specs: list[tuple[str, tuple[int, ...], str]] = [
        ("model.embed_tokens.weight", (c.vocab_size, h), "embed"),
    ]
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (q_out, h), "linear"),
            (p + "self_attn.q_proj.bias", (q_out,), "bias"),
            (p + "self_attn.k_proj.weight", (kv_out, h), "linear"),
            (p + "self_attn.k_proj.bias", (kv_out,), "bias"),
            (p + "self_attn.v_proj.weight", (kv_out, h), "linear"),
            (p + "self_attn.v_proj.bias", (kv_out,), "bias"),
            (p + "self_attn.o_proj.weight", (h, q_out), "linear"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate_proj.weight", (ff, h), "linear"),
            (p + "mlp.up_proj.weight", (ff, h), "linear"),
            (p + "mlp.down_proj.weight", (h, ff), "linear"),
        ]
    specs.append(("model.norm.weight", (h,), "norm"))
    if not c.tie_word_embeddings:
        specs.append(("lm_head.weight", (c.vocab_size, h), "head"))
    return specs


def _scale(kind: str, shape: tuple[int, ...], c: TinyConfig) -> float:
    """Standard deviation of a tensor's N(0, s) init (norms are ones, not drawn)."""
    if c.init == "normal":  # transformers' Qwen2 _init_weights: initializer_range, zero biases
        return 0.0 if kind == "bias" else c.init_std
    # "sharp": far from uniform (logit std ~2), so log-prob comparisons have signal
    if kind == "embed":
        return 1.0
    if kind == "bias":
        return 0.02
    if kind == "head":
        return 2.0 / math.sqrt(shape[1])
    return 1.0 / math.sqrt(shape[1])  # linear: 1/sqrt(fan_in)


def _tensors(c: TinyConfig, seed: int) -> Iterator[tuple[str, Any]]:
    """(name, fp32 array) of every weight, drawn in order from one seeded stream."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(seed))
    for name, shape, kind in _param_specs(c):
        if kind == "norm":
            arr = np.ones(shape, dtype=np.float32)
        else:
            # every tensor draws from the stream, so each keeps its values whatever the scale
            arr = rng.standard_normal(shape, dtype=np.float32)
            arr *= np.float32(_scale(kind, shape, c))
        yield name, arr


def _weights_file(c: TinyConfig, seed: int) -> bytes:
    from safetensors.numpy import save

    return save(dict(_tensors(c, seed)), metadata={"format": "pt"})


def _write_weights_streaming(c: TinyConfig, seed: int, path: Path) -> None:
    """A safetensors file written tensor by tensor (`safetensors_stream`: the header first)."""
    from .safetensors_stream import write

    specs = [(name, "float32", shape) for name, shape, _ in _param_specs(c)]
    write(path, specs, (arr for _, arr in _tensors(c, seed)))


# --- build / cache ------------------------------------------------------------------------------


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _spec(c: TinyConfig, seed: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "builder": "arctic_servers.engines.tiny_model",
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "hidden_size": c.hidden_size,
        "num_layers": c.num_layers,
        "num_heads": c.num_heads,
        "num_kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_positions,
        "tie_word_embeddings": c.tie_word_embeddings,
    }
    if c.name != DEFAULT_CONFIG:  # the default's spec (and its caches' markers) stay as they were
        spec.update(config=c.name, init=c.init, init_std=c.init_std)
    if c.rope_theta != ROPE_THETA:
        spec["rope_theta"] = c.rope_theta
    return spec


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def build_files(*, seed: int = 0, config: str = DEFAULT_CONFIG) -> dict[str, bytes]:
    """Every file of the checkpoint, name -> bytes (no marker); a model above `STREAM_ABOVE`
    parameters without its weights (`build_tiny_model` streams them to disk)."""
    c = get_config(config)
    if c.init not in INITS:
        raise ValueError(f"config {c.name!r}: init {c.init!r} is not one of {INITS}")
    if c.num_heads * c.head_dim != c.hidden_size:
        # vLLM 0.32's CPU Qwen2 then computes another model than transformers (measured: log-probs
        # differ by up to 2.5 nats with 4 heads x 64 on hidden 128; equal to 1e-6 when it matches)
        raise ValueError(
            f"config {c.name!r}: num_heads x head_dim = {c.num_heads * c.head_dim} must equal "
            f"hidden_size {c.hidden_size}"
        )
    if c.num_heads % c.num_kv_heads:
        raise ValueError(f"config {c.name!r}: num_heads must be a multiple of num_kv_heads")
    files: dict[str, bytes] = {}
    files.update(_config_files(c))
    files.update(tokenizer_files(c.max_positions, c.vocab_size))
    if c.num_params <= STREAM_ABOVE:
        files["model.safetensors"] = _weights_file(c, seed)
    return dict(sorted(files.items()))


def content_hash(file_hashes: dict[str, str]) -> str:
    """One hash over (name, sha256) of every file, in name order."""
    h = hashlib.sha256()
    for name in sorted(file_hashes):
        h.update(name.encode() + b"\0" + file_hashes[name].encode() + b"\n")
    return h.hexdigest()


def check_tiny_model(out_dir: Path, *, seed: int = 0, config: str = DEFAULT_CONFIG) -> bool:
    """True when `out_dir` holds a complete build of this spec, every file matching the marker."""
    marker = Path(out_dir) / MARKER_NAME
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if meta.get("spec") != _spec(get_config(config), seed):
        return False
    files = meta.get("files") or {}
    if not files or content_hash(files) != meta.get("content_hash"):
        return False
    for name, digest in files.items():
        try:
            if _file_sha256(Path(out_dir) / name) != digest:
                return False
        except OSError:
            return False
    return True


def build_tiny_model(
    out_dir: Path, *, seed: int = 0, force: bool = False, config: str = DEFAULT_CONFIG
) -> Path:
    """Build (or reuse) the tiny Qwen2 checkpoint `config` in `out_dir`; returns `out_dir`.

    Reuses the directory when its marker matches this spec and every file hash verifies. Otherwise
    builds into a temporary sibling directory and renames it into place, so a reader never sees a
    half-written checkpoint (two concurrent builders produce identical bytes; the loser's copy is
    discarded).
    """
    out_dir = Path(out_dir)
    if not force and check_tiny_model(out_dir, seed=seed, config=config):
        return out_dir
    c = get_config(config)
    files = build_files(seed=seed, config=config)
    hashes = {name: _sha256(data) for name, data in files.items()}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if "model.safetensors" not in files:  # a large model: its weights streamed to disk
            _write_weights_streaming(c, seed, tmp / "model.safetensors")
            hashes["model.safetensors"] = _file_sha256(tmp / "model.safetensors")
            hashes = dict(sorted(hashes.items()))
        spec = _spec(c, seed)
        meta = {"spec": spec, "files": hashes, "content_hash": content_hash(hashes)}
        (tmp / MARKER_NAME).write_bytes(_dumps(meta))
        if out_dir.exists():
            # another builder may have won the race
            if not force and check_tiny_model(out_dir, seed=seed, config=config):
                return out_dir
            shutil.rmtree(out_dir, ignore_errors=True)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if check_tiny_model(out_dir, seed=seed, config=config):
                return out_dir
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def tiny_model_content_hash(out_dir: Path) -> str:
    """The content hash recorded in a built directory's marker."""
    meta = json.loads((Path(out_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    return str(meta["content_hash"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m arctic_servers.engines.tiny_model", description=__doc__.split("\n")[0]
    )
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--config", default=DEFAULT_CONFIG, choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache marker matches")
    ap.add_argument("--check", action="store_true", help="only verify; exit 1 if missing or stale")
    args = ap.parse_args(argv)
    if args.check:
        ok = check_tiny_model(args.out_dir, seed=args.seed, config=args.config)
        print("ok" if ok else "missing or stale")
        return 0 if ok else 1
    out = build_tiny_model(args.out_dir, seed=args.seed, force=args.force, config=args.config)
    print(f"{out} {tiny_model_content_hash(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

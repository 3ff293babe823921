"""Build a tiny Qwen2-architecture checkpoint and byte-level BPE tokenizer, deterministically.

No model hub is reachable on the on-prem CPU machines, so the default model of the on-prem server is
built here: an HF directory that ``transformers`` (``AutoConfig``/``AutoTokenizer``/
``Qwen2ForCausalLM.from_pretrained``) and vLLM both load.

Determinism: every file is written from explicit Python data (``json.dumps`` of dicts built here,
weights from a seeded ``numpy`` PCG64 stream, ``safetensors`` with fixed metadata), not through
``save_pretrained`` of the installed library versions, so the same ``seed`` and builder version give
byte-identical files on any machine. The BPE merges are learnt by a small deterministic Python loop
(ties broken by the pair's text) over a built-in corpus; only the pre-tokenizer of the
``tokenizers`` library is used, to split the corpus exactly as the finished tokenizer will.

Cache: the directory holds ``MARKER_NAME`` with the build spec and the sha256 of every file;
:func:`build_tiny_model` returns at once when the spec matches and every hash verifies.

Needs ``numpy``, ``safetensors`` and ``tokenizers`` (no torch, no transformers).

CLI::

    python -m arctic_servers.engines.tiny_model OUT_DIR [--seed 0] [--force] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

BUILDER_VERSION = 1
MARKER_NAME = ".arctic_tiny_model.json"

# --- architecture -------------------------------------------------------------------------------
HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 2
NUM_KV_HEADS = 1
HEAD_DIM = 64  # vLLM's CPU attention backend needs head_dim >= 64
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 1024
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-6
TIE_WORD_EMBEDDINGS = False  # keeps lm_head a separate tensor: weight sync must carry it

# --- tokenizer ----------------------------------------------------------------------------------
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
VOCAB_SIZE = 512  # 256 byte tokens + learnt merges + the 3 special tokens at the end
NUM_BPE_TOKENS = VOCAB_SIZE - len(SPECIAL_TOKENS)

# Same pre-tokenizer regex as Qwen2's (transformers' tokenization_qwen2.PRETOKENIZE_REGEX).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A tiny model is built on this machine, for tests only.
It has two layers, two attention heads of sixty-four dimensions, and a vocabulary of five hundred
and twelve tokens. The trainer computes the log-probabilities of the sampled tokens; the sampler
returns its own. After every weight sync the two agree within a small tolerance.
User: What is two plus two? Assistant: Two plus two is four.
User: Write a haiku about the sea. Assistant: Grey waves fold and break, the tide forgets what it
took, salt wind keeps the rest.
The server answers each request with a future; the client polls until the result is ready.
Reinforcement learning from human feedback samples completions, scores them with a reward, and
updates the policy with a clipped objective and a penalty on the divergence from a reference model.
def forward_backward(batch, loss_fn="cross_entropy"):
    loss = model(batch).loss
    loss.backward()
    return {"loss": float(loss)}
for step in range(10):
    result = client.forward_backward(data, "importance_sampling")
    client.optim_step(learning_rate=1e-5)
0 1 2 3 4 5 6 7 8 9 10 11 12 16 32 64 128 256 512 1024 2048 3.14159 2.71828 1e-3 0.5
The numbers are: one, two, three, four, five, six, seven, eight, nine, ten.
{"role": "user", "content": "hello"} {"role": "assistant", "content": "Hello! How can I help?"}
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Tell me a story about a robot who learns to paint.<|im_end|>
<|im_start|>assistant
Once upon a time there was a small robot that wanted to paint the morning light. Every day it mixed
colors, and every day the paint came out grey, until it learnt to look before it painted.<|im_end|>
The weather today is sunny with a light breeze; tomorrow there will be rain in the afternoon.
Questions and answers, prompts and completions, tokens and weights, checkpoints and samplers.
"""


# --- tokenizer construction -----------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (what ByteLevel pre-tokenizers emit)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _normalizer_json() -> dict[str, Any]:
    return {"type": "NFC"}


def _pre_tokenizer_json() -> dict[str, Any]:
    return {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": PRETOKENIZE_REGEX},
                "behavior": "Isolated",
                "invert": False,
            },
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": False,
                "use_regex": False,
            },
        ],
    }


def _pretokenize(text: str) -> list[str]:
    """Split `text` exactly as the finished tokenizer will (NFC + Qwen2 regex + byte-level map)."""
    from tokenizers import Tokenizer  # type: ignore[import-not-found, unused-ignore]

    probe: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": _normalizer_json(),
        "pre_tokenizer": _pre_tokenizer_json(),
        "post_processor": None,
        "decoder": None,
        "model": {"type": "BPE", "vocab": {}, "merges": []},
    }
    tok = Tokenizer.from_str(json.dumps(probe))
    assert tok.normalizer is not None and tok.pre_tokenizer is not None
    normalized = tok.normalizer.normalize_str(text)
    return [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]


def _learn_merges(corpus: str, num_tokens: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Plain BPE on the corpus; ties broken by the pair's text, so the result is determined."""
    byte_map = _bytes_to_unicode()
    vocab: dict[str, int] = {byte_map[b]: i for i, b in enumerate(sorted(byte_map))}
    # The special tokens are split out of the text first, as the tokenizer's added tokens are.
    text = corpus
    for special in SPECIAL_TOKENS:
        text = text.replace(special, "\n")
    words = Counter(_pretokenize(text))
    seqs: dict[tuple[str, ...], int] = {tuple(w): c for w, c in sorted(words.items())}
    merges: list[tuple[str, str]] = []
    while len(vocab) < num_tokens:
        pairs: Counter[tuple[str, str]] = Counter()
        for seq, count in seqs.items():
            for a, b in pairwise(seq):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        merged = best[0] + best[1]
        if merged not in vocab:
            vocab[merged] = len(vocab)
        new_seqs: dict[tuple[str, ...], int] = {}
        for seq, count in seqs.items():
            out: list[str] = []
            i = 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            key = tuple(out)
            new_seqs[key] = new_seqs.get(key, 0) + count
        seqs = new_seqs
    if len(vocab) < num_tokens:  # corpus exhausted (cannot happen with the built-in corpus)
        raise RuntimeError(f"corpus too small: {len(vocab)} < {num_tokens} BPE tokens")
    return vocab, merges


def _tokenizer_files() -> dict[str, bytes]:
    vocab, merges = _learn_merges(_CORPUS, NUM_BPE_TOKENS)
    specials = {tok: NUM_BPE_TOKENS + i for i, tok in enumerate(SPECIAL_TOKENS)}
    added_tokens = [
        {
            "id": idx,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for tok, idx in specials.items()
    ]
    merges_txt = [f"{a} {b}" for a, b in merges]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": _normalizer_json(),
        "pre_tokenizer": _pre_tokenizer_json(),
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges_txt,
        },
    }
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(idx): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for tok, idx in specials.items()
        },
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
    }
    special_tokens_map = {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
    }
    return {
        "tokenizer.json": _dumps(tokenizer_json),
        "tokenizer_config.json": _dumps(tokenizer_config),
        "special_tokens_map.json": _dumps(special_tokens_map),
        "vocab.json": _dumps(vocab),
        "merges.txt": ("#version: 0.2\n" + "\n".join(merges_txt) + "\n").encode("utf-8"),
    }


# --- model construction ---------------------------------------------------------------------------


def _config_files() -> dict[str, bytes]:
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
        "hidden_size": HIDDEN_SIZE,
        "head_dim": HEAD_DIM,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": TIE_WORD_EMBEDDINGS,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": VOCAB_SIZE,
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


def _param_specs() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init kind) of every Qwen2ForCausalLM tensor, in HF naming."""
    q_out = NUM_HEADS * HEAD_DIM
    kv_out = NUM_KV_HEADS * HEAD_DIM
    specs: list[tuple[str, tuple[int, ...], str]] = [
        ("model.embed_tokens.weight", (VOCAB_SIZE, HIDDEN_SIZE), "embed"),
    ]
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (HIDDEN_SIZE,), "norm"),
            (p + "self_attn.q_proj.weight", (q_out, HIDDEN_SIZE), "linear"),
            (p + "self_attn.q_proj.bias", (q_out,), "bias"),
            (p + "self_attn.k_proj.weight", (kv_out, HIDDEN_SIZE), "linear"),
            (p + "self_attn.k_proj.bias", (kv_out,), "bias"),
            (p + "self_attn.v_proj.weight", (kv_out, HIDDEN_SIZE), "linear"),
            (p + "self_attn.v_proj.bias", (kv_out,), "bias"),
            (p + "self_attn.o_proj.weight", (HIDDEN_SIZE, q_out), "linear"),
            (p + "post_attention_layernorm.weight", (HIDDEN_SIZE,), "norm"),
            (p + "mlp.gate_proj.weight", (INTERMEDIATE_SIZE, HIDDEN_SIZE), "linear"),
            (p + "mlp.up_proj.weight", (INTERMEDIATE_SIZE, HIDDEN_SIZE), "linear"),
            (p + "mlp.down_proj.weight", (HIDDEN_SIZE, INTERMEDIATE_SIZE), "linear"),
        ]
    specs.append(("model.norm.weight", (HIDDEN_SIZE,), "norm"))
    if not TIE_WORD_EMBEDDINGS:
        specs.append(("lm_head.weight", (VOCAB_SIZE, HIDDEN_SIZE), "head"))
    return specs


def _weights_file(seed: int) -> bytes:
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.Generator(np.random.PCG64(seed))
    tensors: dict[str, Any] = {}
    # Scales chosen so the random model is far from uniform (logit std ~2): log-prob comparisons
    # and "weights changed" checks then have signal.
    for name, shape, kind in _param_specs():
        if kind == "norm":
            arr = np.ones(shape, dtype=np.float32)
        else:
            z = rng.standard_normal(shape, dtype=np.float32)
            if kind == "embed":
                arr = z
            elif kind == "bias":
                arr = z * np.float32(0.02)
            elif kind == "head":
                arr = z * np.float32(2.0 / np.sqrt(shape[1]))
            else:  # linear: 1/sqrt(fan_in)
                arr = z * np.float32(1.0 / np.sqrt(shape[1]))
        tensors[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return save(tensors, metadata={"format": "pt"})


# --- build / cache ------------------------------------------------------------------------------


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _spec(seed: int) -> dict[str, Any]:
    return {
        "builder": "arctic_servers.engines.tiny_model",
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "hidden_size": HIDDEN_SIZE,
        "num_layers": NUM_LAYERS,
        "num_heads": NUM_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE_SIZE,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": TIE_WORD_EMBEDDINGS,
    }


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_files(*, seed: int = 0) -> dict[str, bytes]:
    """Every file of the checkpoint, name -> bytes (no marker)."""
    files: dict[str, bytes] = {}
    files.update(_config_files())
    files.update(_tokenizer_files())
    files["model.safetensors"] = _weights_file(seed)
    return dict(sorted(files.items()))


def content_hash(file_hashes: dict[str, str]) -> str:
    """One hash over (name, sha256) of every file, in name order."""
    h = hashlib.sha256()
    for name in sorted(file_hashes):
        h.update(name.encode() + b"\0" + file_hashes[name].encode() + b"\n")
    return h.hexdigest()


def check_tiny_model(out_dir: Path, *, seed: int = 0) -> bool:
    """True when `out_dir` holds a complete build of this spec, every file matching the marker."""
    marker = Path(out_dir) / MARKER_NAME
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if meta.get("spec") != _spec(seed):
        return False
    files = meta.get("files") or {}
    if not files or content_hash(files) != meta.get("content_hash"):
        return False
    for name, digest in files.items():
        try:
            if _sha256((Path(out_dir) / name).read_bytes()) != digest:
                return False
        except OSError:
            return False
    return True


def build_tiny_model(out_dir: Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build (or reuse) the tiny Qwen2 checkpoint in `out_dir`; returns `out_dir`.

    Reuses the directory when its marker matches this spec and every file hash verifies. Otherwise
    builds into a temporary sibling directory and renames it into place, so a reader never sees a
    half-written checkpoint (two concurrent builders produce identical bytes; the loser's copy is
    discarded).
    """
    out_dir = Path(out_dir)
    if not force and check_tiny_model(out_dir, seed=seed):
        return out_dir
    files = build_files(seed=seed)
    hashes = {name: _sha256(data) for name, data in files.items()}
    meta = {"spec": _spec(seed), "files": hashes, "content_hash": content_hash(hashes)}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / MARKER_NAME).write_bytes(_dumps(meta))
        if out_dir.exists():
            if not force and check_tiny_model(out_dir, seed=seed):  # another builder won the race
                return out_dir
            shutil.rmtree(out_dir, ignore_errors=True)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if check_tiny_model(out_dir, seed=seed):
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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache marker matches")
    ap.add_argument("--check", action="store_true", help="only verify; exit 1 if missing or stale")
    args = ap.parse_args(argv)
    if args.check:
        ok = check_tiny_model(args.out_dir, seed=args.seed)
        print("ok" if ok else "missing or stale")
        return 0 if ok else 1
    out = build_tiny_model(args.out_dir, seed=args.seed, force=args.force)
    print(f"{out} {tiny_model_content_hash(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

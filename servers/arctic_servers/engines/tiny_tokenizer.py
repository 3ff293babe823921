"""The embedded tiny model's tokenizer: byte-level BPE learnt deterministically (no hub, no torch).

The BPE merges are learnt by a small deterministic Python loop (ties broken by the pair's text)
over a built-in corpus; only the pre-tokenizer of the ``tokenizers`` library is used, to split the
corpus exactly as the finished tokenizer will. Every file is written from explicit Python data
(``json.dumps`` of dicts built here), so the bytes are the same on every machine. Every
:mod:`~arctic_servers.engines.tiny_model` configuration shares this tokenizer (digits are single
tokens: the Qwen2 pre-tokenizer splits numbers into digits).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from itertools import pairwise
from typing import Any

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

# Qwen2-style ChatML with hermes tool calling (the format of vLLM's `hermes` tool parser): plain
# messages render as `<|im_start|>{role}\n{content}<|im_end|>\n`; with `tools`, a system turn lists
# them in <tools></tools>; an assistant's `tool_calls` render as `<tool_call>\n{"name": ...,
# "arguments": {...}}\n</tool_call>` after its content; consecutive `tool` messages render as one
# user turn of <tool_response> blocks. `arctic_servers.openai.fake.render_qwen_chat` is the same
# template in Python (the fake engine's, no jinja2); a test holds the two equal.
TOOLS_PREAMBLE = "# Tools\n<tools>\n"
TOOLS_POSTAMBLE = (
    "</tools>\nTo call a function, reply <tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '" + TOOLS_POSTAMBLE.replace("\n", "\\n") + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first and tools %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{{- fn['arguments'] | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
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


def _padding(vocab: dict[str, int], vocab_size: int) -> dict[str, int]:
    """Tokens for the ids from `VOCAB_SIZE` up to `vocab_size` (a larger model's vocabulary):
    two- then three-symbol byte-level strings not in `vocab`. No merge makes them, so encoding
    never produces one; each decodes to its bytes, so any id a model samples has a token."""
    syms = sorted(_bytes_to_unicode().values())
    out: dict[str, int] = {}
    nxt = VOCAB_SIZE
    for width in (2, 3):
        for combo in itertools.product(syms, repeat=width):
            if nxt >= vocab_size:
                return out
            tok = "".join(combo)
            if tok not in vocab:
                out[tok] = nxt
                nxt += 1
    raise ValueError(f"vocab_size {vocab_size} is too large to pad")


def tokenizer_files(model_max_length: int, vocab_size: int = VOCAB_SIZE) -> dict[str, bytes]:
    """Every tokenizer file of the checkpoint, name -> bytes (`vocab_size` above `VOCAB_SIZE`:
    padded with tokens no text encodes to, `_padding`)."""
    vocab, merges = _learn_merges(_CORPUS, NUM_BPE_TOKENS)
    if vocab_size > VOCAB_SIZE:
        vocab = {**vocab, **_padding(vocab, vocab_size)}
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
        "model_max_length": model_max_length,
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


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

"""Deterministic fake numerics of the fake gateway: pure functions, specified in NUMERICS.md.

Nothing here holds state: every value is a fixed function of the request and of the job's step
counters, so tests can assert exact numbers. Log-probs and entropies are multiples of 1/16 and
1/32 and therefore exact in float32.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

# training.proto's LossConfig (names, defaults) as the on-prem trainer reads it; torch-free
from ..losses import reference
from ..losses.table import AGG_MODES, IGNORE_INDEX, KL_TYPES, LOSS_FNS, LossSettings

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- log-probs, entropy


def token_logprob(token: Any, position: Any, prev: Any, step: int) -> Any:
    """NUMERICS.md §2: `-(((31 t + 13 prev + 17 p + 7 s) mod 97) + 1) / 16`, always < 0."""
    k = (
        np.asarray(token, np.int64) * 31
        + np.asarray(prev, np.int64) * 13
        + np.asarray(position, np.int64) * 17
        + step * 7
    ) % 97
    return -(k + 1) / 16.0


_INV31 = pow(31, -1, 97)


def top_logprobs(prev: int, position: int, step: int, k: int) -> dict[str, list[Any]]:
    """NUMERICS.md §5: the k most likely tokens at a position, most likely first. Residue r of
    `31 t + 13 prev + 17 p + 7 s` (mod 97) has log-prob `-(r + 1) / 16`; the token of residue
    r = 0, 1, ..., k - 1 is the smallest id with it, `(r - 13 prev - 17 p - 7 s) / 31` mod 97."""
    c = 13 * int(prev) + 17 * int(position) + 7 * int(step)
    ids = [((r - c) * _INV31) % 97 for r in range(k)]
    return {"token_ids": ids, "logprobs": [-(r + 1) / 16.0 for r in range(k)]}


def token_entropy(prev: Any, position: Any, step: int) -> Any:
    """NUMERICS.md §2: `(((7 prev + 3 p + 5 s) mod 64) + 1) / 32`, always > 0."""
    k = (np.asarray(prev, np.int64) * 7 + np.asarray(position, np.int64) * 3 + step * 5) % 64
    return (k + 1) / 32.0


def default_positions(mask: I64) -> I64:
    """`cumsum(attention_mask) - 1`, clamped at 0 (the spec's default `position_ids`)."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int64)


@dataclass
class Batch:
    """The token-level view of a batch: ids, 0/1 mask and positions, all [B, S] int64."""

    ids: I64
    mask: I64
    pos: I64

    @property
    def pair(self) -> I64:
        """[B, S-1]: 1 where column j (the context) and column j+1 (the prediction) are real."""
        return self.mask[:, :-1] * self.mask[:, 1:]


def make_batch(ids: Any, mask: Any = None, pos: Any = None) -> Batch:
    ids64 = np.asarray(ids).astype(np.int64)
    m = np.ones_like(ids64) if mask is None else (np.asarray(mask) != 0).astype(np.int64)
    p = default_positions(m) if pos is None else np.asarray(pos).astype(np.int64)
    return Batch(ids64, m, p)


def shifted_logprobs(b: Batch, step: int, targets: I64 | None = None) -> F64:
    """[B, S]: column j = log-prob of token j+1 (or `targets[:, j+1]`); last column, padding 0."""
    out = np.zeros(b.ids.shape, np.float64)
    if b.ids.shape[1] < 2:
        return out
    tgt = b.ids if targets is None else targets
    lp = token_logprob(tgt[:, 1:], b.pos[:, 1:], b.ids[:, :-1], step)
    out[:, :-1] = np.where(b.pair != 0, lp, 0.0)
    return out


def shifted_entropy(b: Batch, step: int) -> F64:
    """[B, S]: column j = entropy of the distribution predicting token j+1; padding 0."""
    out = np.zeros(b.ids.shape, np.float64)
    if b.ids.shape[1] < 2:
        return out
    ent = token_entropy(b.ids[:, :-1], b.pos[:, 1:], step)
    out[:, :-1] = np.where(b.pair != 0, ent, 0.0)
    return out


def token_aligned(shifted: F64) -> F64:
    """Shifted [B, S] -> token-aligned [B, S]: column i holds `shifted[:, i-1]`, column 0 is 0."""
    out = np.zeros_like(shifted)
    out[:, 1:] = shifted[:, :-1]
    return out


# --------------------------------------------------------------------------- losses


LossSpec = LossSettings  # `processing` of a call, with defaults applied (NUMERICS.md §3)


@dataclass
class LossInputs:
    """Token-aligned [B, S] float64 arrays of the loss context (None when absent)."""

    loss_mask: F64 | None = None
    labels: I64 | None = None
    advantages: F64 | None = None
    weights: F64 | None = None
    old_shifted: F64 | None = None
    ref_shifted: F64 | None = None


@dataclass
class LossResult:
    loss: float
    metrics: dict[str, Any]
    # Gradient contributions by target token id (NUMERICS.md §4); sum of values = loss.
    grad: dict[int, float] = field(default_factory=dict)


def loss_mask(b: Batch, spec: LossSpec, x: LossInputs) -> F64:
    """Token-aligned mask m: column 0 and tokens without a real predecessor are 0."""
    if x.loss_mask is not None:
        base = x.loss_mask.astype(np.float64)
    elif x.labels is not None:
        base = (x.labels != IGNORE_INDEX).astype(np.float64)
    else:
        base = np.ones(b.ids.shape, np.float64)
    m = np.zeros(b.ids.shape, np.float64)
    m[:, 1:] = base[:, 1:] * b.pair
    return m


def loss_targets(b: Batch, spec: LossSpec, x: LossInputs) -> I64 | None:
    """The tokens a call scores, token-aligned: a cross_entropy call's `labels` where they are
    not -100 (its input tokens elsewhere); None = the input tokens."""
    if spec.loss_fn == "cross_entropy" and x.labels is not None:
        return np.where(x.labels == IGNORE_INDEX, b.ids, x.labels).astype(np.int64)
    return None


def compute_loss(b: Batch, step: int, spec: LossSpec, x: LossInputs) -> LossResult:
    """Loss, metrics and gradient contributions of one call (NUMERICS.md §3-§4): the fake
    model's log-probs through the loss table's NumPy reference (`losses/reference.py`)."""
    targets = loss_targets(b, spec, x)
    lp = token_aligned(shifted_logprobs(b, step, targets)) / spec.temperature
    m = loss_mask(b, spec, x)
    on = m != 0
    terms = reference.LossTerms(
        old=None if x.old_shifted is None else token_aligned(x.old_shifted),
        advantages=x.advantages,
        weights=x.weights,
        ref=None if x.ref_shifted is None else token_aligned(x.ref_shifted),
        entropy=token_aligned(shifted_entropy(b, step)) if spec.needs_entropy else None,
    )
    contrib, metrics = reference.token_losses(lp, m, spec, terms)
    loss = float(contrib.sum())
    metrics.update(loss=loss, num_tokens=int(on.sum()), num_sequences=int(b.ids.shape[0]))
    tgt = b.ids if targets is None else targets
    grad: dict[int, float] = {}
    for t, c in zip(tgt[on].tolist(), contrib[on].tolist(), strict=True):
        grad[t] = grad.get(t, 0.0) + c
    return LossResult(loss, metrics, grad)


def grad_norm(grad: Mapping[int, float]) -> float:
    """NUMERICS.md §4: the L2 norm of the accumulated per-token-id gradient vector."""
    return math.sqrt(sum(v * v for v in grad.values()))


# --------------------------------------------------------------------------- generation

_MASK64 = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """One SplitMix64 step: (next state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def generation_seed(seed: int, sample_idx: int, weight_version: int, prompt: Sequence[int]) -> int:
    """NUMERICS.md §5: first 8 bytes (little-endian) of sha256("seed|idx|version|ids")."""
    text = f"{seed}|{sample_idx}|{weight_version}|{','.join(str(int(t)) for t in prompt)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


#: The ids generation draws from: printable ASCII bytes 32..126 as tokenizer ids (byte + 3).
PRINTABLE_IDS = tuple(range(35, 130))


def draws(
    seed: int, sample_idx: int, weight_version: int, prompt: Sequence[int], count: int
) -> list[int]:
    """The SplitMix64 outputs `z_1 .. z_count` of one sample (NUMERICS.md §5)."""
    state = generation_seed(seed, sample_idx, weight_version, prompt)
    out = []
    for _ in range(count):
        state, z = splitmix64(state)
        out.append(z)
    return out


def token_stream(
    seed: int, sample_idx: int, weight_version: int, prompt: Sequence[int], count: int
) -> list[int]:
    """`count` sampled token ids: printable ASCII bytes 32..126, as tokenizer ids (byte + 3)."""
    return [PRINTABLE_IDS[z % 95] for z in draws(seed, sample_idx, weight_version, prompt, count)]


def min_p_candidates(prev: int, position: int, step: int, min_p: float) -> tuple[int, ...]:
    """NUMERICS.md §5: the printable ids whose log-prob is at least the best one's plus
    `ln(min_p)` (probability >= min_p x the most likely one's), ascending."""
    lps = token_logprob(np.asarray(PRINTABLE_IDS), position, prev, step)
    keep = lps >= float(lps.max()) + math.log(min_p)
    return tuple(t for t, k in zip(PRINTABLE_IDS, keep.tolist(), strict=True) if k)


__all__ = [
    "AGG_MODES",
    "IGNORE_INDEX",
    "KL_TYPES",
    "LOSS_FNS",
    "PRINTABLE_IDS",
    "Batch",
    "LossInputs",
    "LossResult",
    "LossSettings",
    "LossSpec",
    "compute_loss",
    "default_positions",
    "draws",
    "generation_seed",
    "grad_norm",
    "loss_targets",
    "make_batch",
    "min_p_candidates",
    "shifted_entropy",
    "shifted_logprobs",
    "splitmix64",
    "token_entropy",
    "token_logprob",
    "token_stream",
    "top_logprobs",
]

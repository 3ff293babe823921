"""Batches and comparisons shared by the on-prem tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..rawwire import pad

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "User: What is two plus two? Assistant: Two plus two is four.",
    "The weather today is sunny with a light breeze.",
    "Questions and answers, prompts and completions, tokens and weights.",
)
# Token-id rows of the tiny model's vocabulary (512 ids), different lengths.
ROWS = (
    [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114],
    [10, 20, 30, 40, 50, 60, 70, 80],
    [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313],
    [5, 6, 7, 8, 9, 10],
)


def sft_body(
    rows: Sequence[Sequence[int]] = ROWS, *, left: bool = False, **processing: Any
) -> dict[str, Any]:
    ids, mask = pad(rows, left=left)
    return {
        "kwargs": {"input_ids": ids, "attention_mask": mask},
        "processing": {"loss_fn": "cross_entropy", **processing},
    }


def sampled(gen: dict[str, Any]) -> tuple[list[list[int]], list[int], list[list[float]]]:
    """(prompt + completion rows, prompt lengths, the sampler's log-prob per completion token)."""
    rows, plens, lps = [], [], []
    for r in gen["results"]:
        for s in r["samples"]:
            rows.append(list(r["prompt_token_ids"]) + list(s["token_ids"]))
            plens.append(len(r["prompt_token_ids"]))
            lps.append(list(s["logprobs"]))
    return rows, plens, lps


def trainer_vs_sampler(
    lp_shifted: np.ndarray,
    rows: Sequence[Sequence[int]],
    plens: Sequence[int],
    lps: Sequence[Sequence[float]],
    *,
    left: bool,
) -> np.ndarray:
    """|trainer - sampler| for every sampled token (trainer log-probs in the caller's columns)."""
    width = lp_shifted.shape[1]
    out = []
    for b, (row, pl, lp) in enumerate(zip(rows, plens, lps, strict=True)):
        off = width - len(row) if left else 0
        for j, v in enumerate(lp):
            out.append(abs(float(lp_shifted[b, off + pl + j - 1]) - v))
    return np.asarray(out)

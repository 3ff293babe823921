"""Which rows of a forward-backward call each data-parallel rank runs (torch-free).

Two assignments (`processing.balance_rows`, training.proto `Processing`):

- contiguous (default): W slices in row order whose sizes differ by at most one;
- token-balanced (ZoRRO's load balancer): rows by real-token count, longest first, each to the
  rank with the fewest real tokens so far (ties: the lower rank); a rank's rows keep their
  order. The busiest rank then carries at most the mean load plus one row.

Each rank runs its rows on the columns that hold their real tokens only (`window`), so a rank
given short rows does less work. The assignment decides cost, not the result: rank 0 gathers
every rank's log-probs back into the caller's rows and columns before the loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.int64]


def row_tokens(mask: npt.NDArray[np.integer]) -> Rows:
    """Real (attention_mask) tokens of each row."""
    return np.asarray((np.asarray(mask) != 0).sum(axis=1), dtype=np.int64)


def contiguous(n_rows: int, world: int) -> list[Rows]:
    return [np.asarray(s, np.int64) for s in np.array_split(np.arange(n_rows), world)]


def balanced(tokens: Sequence[int] | Rows, world: int) -> list[Rows]:
    """Longest-first greedy assignment of rows to the least-loaded rank (deterministic)."""
    toks = np.asarray(tokens, np.int64)
    order = sorted(range(len(toks)), key=lambda i: (-int(toks[i]), i))
    load = [0] * world
    owned: list[list[int]] = [[] for _ in range(world)]
    for i in order:
        r = min(range(world), key=lambda k: (load[k], k))
        owned[r].append(i)
        load[r] += int(toks[i])
    return [np.asarray(sorted(rows), np.int64) for rows in owned]


def assign(mask: npt.NDArray[np.integer], world: int, balance: bool) -> list[Rows]:
    """The rows of each of `world` ranks."""
    n = int(np.asarray(mask).shape[0])
    return balanced(row_tokens(mask), world) if balance else contiguous(n, world)


def window(mask: npt.NDArray[np.integer], rows: Rows) -> tuple[int, int]:
    """The columns [lo, hi) holding every real token of `rows` ((0, 0) for no rows)."""
    if not len(rows):
        return 0, 0
    real = (np.asarray(mask)[rows] != 0).any(axis=0)
    if not real.any():
        return 0, 1  # padding only: one column keeps the forward well-formed
    cols = np.flatnonzero(real)
    return int(cols[0]), int(cols[-1]) + 1


def rank_tokens(mask: npt.NDArray[np.integer], parts: Sequence[Rows]) -> list[int]:
    """Real tokens of each rank's rows."""
    toks = row_tokens(mask)
    return [int(toks[p].sum()) if len(p) else 0 for p in parts]

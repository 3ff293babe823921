"""The multi-rank trainer's row assignment (`engines/deepspeed/row_balance.py`), no engines."""

from __future__ import annotations

import numpy as np
import pytest

from arctic_servers.engines.deepspeed import row_balance as rb


def _mask(lengths: list[int], width: int, left: bool = False) -> np.ndarray:
    m = np.zeros((len(lengths), width), np.int64)
    for i, n in enumerate(lengths):
        if left:
            m[i, width - n :] = 1
        else:
            m[i, :n] = 1
    return m


def test_contiguous_is_the_default_split() -> None:
    parts = rb.assign(_mask([3, 3, 3, 3, 3], 4), 2, balance=False)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4]]
    assert [p.tolist() for p in rb.assign(_mask([1], 2), 3, balance=False)] == [[0], [], []]


def test_balanced_evens_out_real_tokens() -> None:
    lengths = [40, 38, 35, 6, 5, 4, 3, 2]  # SkyRL-like: long rows first, then short ones
    mask = _mask(lengths, 40)
    plain = rb.assign(mask, 2, balance=False)
    even = rb.assign(mask, 2, balance=True)
    assert rb.rank_tokens(mask, plain) == [119, 14]
    tok = rb.rank_tokens(mask, even)
    assert sum(tok) == sum(lengths) and max(tok) - min(tok) <= max(lengths)
    assert max(tok) < max(rb.rank_tokens(mask, plain))
    assert sorted(np.concatenate(even).tolist()) == list(range(len(lengths)))  # every row once
    assert all((np.diff(p) > 0).all() for p in even)  # a rank's rows keep their order


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_balanced_is_a_partition_and_deterministic(world: int) -> None:
    rng = np.random.default_rng(world)
    lengths = rng.integers(1, 30, size=13).tolist()
    mask = _mask(lengths, 30)
    a, b = rb.assign(mask, world, True), rb.assign(mask, world, True)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert sorted(np.concatenate(a).tolist()) == list(range(13))
    tok = rb.rank_tokens(mask, a)
    assert max(tok) <= sum(lengths) / world + max(lengths)  # LPT bound
    if world == 1:
        assert a[0].tolist() == list(range(13))  # one rank: nothing to balance


def test_window_holds_every_real_token() -> None:
    right, left = _mask([2, 5, 3], 8), _mask([2, 5, 3], 8, left=True)
    assert rb.window(right, np.asarray([0, 2])) == (0, 3)
    assert rb.window(left, np.asarray([0, 2])) == (5, 8)
    assert rb.window(right, np.asarray([], np.int64)) == (0, 0)
    assert rb.window(np.zeros((2, 4), np.int64), np.asarray([0, 1])) == (0, 1)

"""The main job's task (examples/addition.py): format, checker, split, determinism."""

from __future__ import annotations

import pytest
from addition import AdditionTask, Problem, accuracy, is_correct, prompts


def test_format_and_checker() -> None:
    p = Problem(7, 58, 2)
    assert (p.prompt, p.answer) == ("07+58=", "065")
    assert Problem(99, 99, 2).answer == "198"
    assert Problem(123, 4, 3).prompt == "123+004="
    assert is_correct(p, "065") and is_correct(p, " 065 ")
    assert not is_correct(p, "65") and not is_correct(p, "0650") and not is_correct(p, "")
    assert accuracy([p, Problem(1, 1, 2)], ["065", "003"]) == 0.5
    with pytest.raises(ValueError, match="completions"):
        accuracy([p], [])


def test_held_out_split_is_closed_under_swap_and_never_trained() -> None:
    task = AdditionTask(digits=2, held_out=200, seed=0)
    held = {(p.a, p.b) for p in task.held_out}
    assert len(task.held_out) == 200 == len(held)
    assert all((b, a) in held for a, b in held)
    train = task.train_batch(5000)
    assert len(train) == 5000
    assert not any((p.a, p.b) in held for p in train)
    assert all(0 <= p.a < 100 and 0 <= p.b < 100 and p.digits == 2 for p in train)
    assert len(set(prompts(train))) > 3000  # a stream, not a few repeated problems


def test_validation_split_is_disjoint_closed_and_never_trained() -> None:
    """SFT's stopping rule reads the validation split, never the reported held-out one."""
    task = AdditionTask(digits=2, held_out=200, seed=0, validation=200)
    held = {(p.a, p.b) for p in task.held_out}
    val = {(p.a, p.b) for p in task.validation}
    assert len(task.validation) == 200 == len(val)
    assert not held & val
    assert all((b, a) in val for a, b in val)
    train = {(p.a, p.b) for p in task.train_batch(5000)}
    assert not train & val and not train & held
    assert all(task.is_held_out(p) for p in task.validation)
    # the held-out split does not depend on whether a validation split is drawn
    assert AdditionTask(digits=2, held_out=200, seed=0).held_out == task.held_out
    assert AdditionTask(digits=2, held_out=200, seed=0).validation == []


def test_seeded_and_deterministic() -> None:
    a, b, c = (AdditionTask(2, 64, s) for s in (0, 0, 1))
    assert a.held_out == b.held_out and a.held_out != c.held_out
    assert a.train_batch(32) == b.train_batch(32)
    assert a.train_batch(32) != c.train_batch(32)


@pytest.mark.parametrize(
    "bad",
    [
        {"digits": 0},
        {"held_out": 0},
        {"digits": 1, "held_out": 26},
        {"validation": -1},
        {"digits": 1, "validation": 26},
    ],
)
def test_refuses_bad_sizes(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        AdditionTask(**bad)

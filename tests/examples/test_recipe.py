"""The main job's `--set KNOB=VALUE` (`Recipe.override`, examples/sft_rl.py): typed or refused."""

from __future__ import annotations

import pytest
from sft_rl import Recipe


def test_set_types_each_knob_as_its_default() -> None:
    r = Recipe()
    r.override(["rl_lr=2e-3", "group=16", "temperature=1", "rl_steps=70"])
    assert (r.rl_lr, r.group, r.temperature, r.rl_steps) == (2e-3, 16, 1.0, 70)
    assert type(r.group) is int and type(r.temperature) is float
    assert Recipe() == Recipe(), "override changed the class defaults"
    assert Recipe().rl_lr == 1e-3


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("bogus=1", r"--set 'bogus=1': expected KNOB=VALUE with KNOB one of .*rl_lr"),
        ("rl_lr", r"--set 'rl_lr': expected KNOB=VALUE"),
        ("seed=3", r"--set 'seed=3': expected KNOB=VALUE"),  # --seed has its own flag
        ("group=1.5", r"--set 'group=1.5': '1.5' is not a int"),
        ("rl_lr=fast", r"--set 'rl_lr=fast': 'fast' is not a float"),
    ],
)
def test_set_refuses_by_name(item: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        Recipe().override([item])


def test_sft_stops_on_a_run_of_evaluations_at_the_target() -> None:
    from sft_rl import reached

    assert reached([0.1, 0.35], 0.3, 1)
    assert not reached([0.1, 0.35], 0.3, 2)  # one evaluation at the target is not a run of two
    assert not reached([0.35, 0.25, 0.31], 0.3, 2)  # the run restarts after a dip
    assert reached([0.35, 0.25, 0.31, 0.3], 0.3, 2)
    assert not reached([], 0.3, 1)
    with pytest.raises(ValueError, match="sft_target_evals must be >= 1, not 0"):
        reached([0.5], 0.3, 0)

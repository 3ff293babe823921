"""The main job's `--set KNOB=VALUE` (`Recipe.override`, examples/sft_rl.py): typed or refused."""

from __future__ import annotations

import itertools

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


def test_sft_stops_on_a_window_mean_at_the_target() -> None:
    from sft_rl import reached

    assert reached([0.1, 0.35], 0.3, 1)
    assert not reached([0.1, 0.35], 0.3, 2)  # mean 0.225: one lucky evaluation is not enough
    assert reached([0.25, 0.35], 0.3, 2)  # mean 0.3
    assert reached([0.0, 0.5, 0.3, 0.1], 0.3, 3)  # mean exactly 0.3 (0.29999... in floats)
    assert not reached([0.0, 0.5, 0.3, 0.095], 0.3, 3)
    assert reached([0.0, 0.3, 0.3, 0.3], 0.3, 3)
    assert not reached([0.9, 0.9], 0.3, 3)  # fewer evaluations than the window
    assert not reached([], 0.3, 1)
    with pytest.raises(ValueError, match="sft_window must be >= 1, not 0"):
        reached([0.5], 0.3, 0)


def test_rl_learning_rate_warms_up_then_decays() -> None:
    from sft_rl import lr_factor

    r = Recipe()
    r.override(["rl_steps=60", "rl_warmup=10", "rl_final_lr=0.1"])
    f = [lr_factor(r, s) for s in range(1, 61)]
    assert f[0] == 0.1 and f[9] == 1.0  # linear warm-up over 10 steps
    assert all(a >= b for a, b in itertools.pairwise(f[9:]))  # then never rises
    assert f[-1] == pytest.approx(0.1)  # down to rl_final_lr at the last step
    assert f[34] == pytest.approx(0.55)  # half-way through the decay: the mean of 1 and 0.1
    r.override(["rl_final_lr=1"])
    assert {lr_factor(r, s) for s in range(10, 61)} == {1.0}  # no decay


def test_checks_name_each_guarantee_and_fail_outside_it() -> None:
    from sft_rl import Curve, checks

    def run(a1: float, a2: float, a3: float) -> list[bool]:
        c = {k: Curve(steps=[0, 1], accuracy=[0.0, a]) for k, a in (("sft", a1), ("rl", a2))}
        c["control"] = Curve(steps=[0, 1], accuracy=[a1, a3])
        return [ok for _, ok in checks(c)]

    assert run(0.4, 0.55, 0.4) == [True, True, True]
    assert run(0.2, 0.35, 0.22) == [True, True, True]  # every edge is inside
    assert run(0.6, 0.9, 0.58) == [True, True, True]
    assert run(0.61, 0.9, 0.61) == [False, True, True]  # SFT left too little room
    assert run(0.19, 0.5, 0.19) == [False, True, True]
    assert run(0.4, 0.545, 0.4) == [True, False, True]  # RL gained 0.145
    assert run(0.4, 0.6, 0.425) == [True, True, False]  # the control moved
    texts = [t for t, _ in checks({"sft": Curve(accuracy=[0.0, 0.4]),
                                   "rl": Curve(accuracy=[0.4, 0.6]),
                                   "control": Curve(accuracy=[0.4, 0.4])})]  # fmt: skip
    assert texts[0] == "SFT leaves room: A1 0.400 in [0.2, 0.6]"
    assert texts[1] == "RL gains: A2 0.600 >= A1 + 0.15 = 0.550"
    assert texts[2] == "control flat: |A3 - A1| = 0.000 <= 0.02"

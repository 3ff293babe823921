"""The unmodified `tinker` 0.38 client against the Tinker routes over the fake gateway:
sessions, capabilities, auth, models, training ops, futures, sampling, REST listings and the
refusals' shapes (each scenario in `scenarios.py`, run in a child process)."""

from __future__ import annotations

import pytest

from .conftest import TinkerServer, run_scenario

SCENARIOS = [
    "capabilities_and_auth",
    "unknown_base_model_is_refused",
    "sft_loop_sample_and_listing",
    "rl_step_importance_sampling",
    "refusals_reach_the_client",
]


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario(tinker_fake: TinkerServer, name: str) -> None:
    run_scenario(name, tinker_fake.url)


def test_lora_rank_is_refused_by_default(tinker_refusing: TinkerServer) -> None:
    run_scenario("lora_rank_is_refused_by_default", tinker_refusing.url)

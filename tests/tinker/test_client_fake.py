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


def test_lora_rank_is_refused_when_set_to(tinker_refusing: TinkerServer) -> None:
    run_scenario("lora_rank_is_refused_by_default", tinker_refusing.url)


def test_lora_client_trains_an_adapter(tinker_lora: TinkerServer) -> None:
    """A LoRA client on the default settings: the job the server made is a LoRA job (its
    training sub-job's training_config.lora, rank 4 and Tinker's default lm_head adapter);
    its session's end cancelled it."""
    out = run_scenario("lora_adapter_trains", tinker_lora.url)
    job = tinker_lora.fake.servicer.jobs.jobs[
        tinker_lora.routes.state.models[out["model_id"]].job_id
    ]
    (train,) = [s for s in job.sub_jobs if s.role == "training"]
    assert train.config["lora"]["rank"] == 4 and train.config["lora"]["train_lm_head"], train.config
    assert job.state == "cancelled"


def test_load_state_weights_info_and_sampler(tinker_fake: TinkerServer) -> None:
    out = run_scenario("load_state_and_weights_info", tinker_fake.url)
    assert out["loaded"] == pytest.approx(out["at_save"], rel=1e-5)


def test_session_without_heartbeats_expires(tinker_expiring: TinkerServer) -> None:
    run_scenario("session_expires", tinker_expiring.url)
    # its jobs were cancelled when it expired
    models = list(tinker_expiring.routes.state.models.values())
    assert models and all(
        tinker_expiring.routes.state.sessions[m.session_id].expired for m in models
    )


def test_zstd_forward_backward_bodies(tinker_fake: TinkerServer) -> None:
    before = tinker_fake.routes.encodings["zstd"]
    run_scenario("zstd_bodies", tinker_fake.url)
    assert tinker_fake.routes.encodings["zstd"] > before, tinker_fake.routes.encodings

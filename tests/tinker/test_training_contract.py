"""Issue 31, training side, with the unmodified `tinker` 0.38 client over the fake gateway:
a refusal by any route (the catch-all included) frees the model's turn; each RL loss and its
defaults are Tinker's documented ones; per-call AdamParams reach the trainer; the context
window advertised is the one every training and sampling route enforces; custom-target
log-probs are the targets'."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import TinkerServer, run_scenario, scenario_env, spawn_scenario, wait_signal


def _run(name: str, server: TinkerServer, **extra: str) -> dict:
    return run_scenario(name, server.url, module="scenarios_training", timeout=300, **extra)


def test_refused_calls_free_their_turn(tinker_fake: TinkerServer) -> None:
    """Item 1: save_weights_external (not served: the catch-all's 404) wedged the training
    client for good; now every sequenced route refused at submit frees its turn."""
    out = _run("refused_calls_free_their_turn", tinker_fake)
    assert out["refused"][0] == "save_weights_external" and len(out["refused"]) == 7


def test_losses_are_tinkers_with_tinkers_defaults(tinker_fake: TinkerServer) -> None:
    """Item 3 (CISPO's default clip is Tinker's [0, 4], not [0.8, 1.2]) and the losses 0.38
    added (dro, gspo): each loss equals Tinker's documented formula, written in the scenario
    with the docs' constants."""
    out = _run("tinker_losses_and_defaults", tinker_fake)
    assert set(out) == {"cispo", "ppo", "importance_sampling", "dro", "gspo"}


def test_custom_target_logprobs_are_the_targets(tinker_fake: TinkerServer) -> None:
    """Item 8: the fake answered the input tokens' log-probs for targets that are not the
    next inputs (its loss used the targets)."""
    _run("custom_target_logprobs", tinker_fake, TINKER_TEST_FAKE_NUMERICS="1")


def test_context_window_is_enforced_by_every_route(tinker_fake: TinkerServer) -> None:
    """Item 4 on the fake: the window capabilities advertise is the fake model's
    (`FAKE_CONTEXT_LENGTH`), and training, sampling and compute_logprobs all stop at it."""
    out = _run("context_window", tinker_fake)
    from arctic_servers.tinker.catalog import FAKE_CONTEXT_LENGTH

    assert out["window"] == FAKE_CONTEXT_LENGTH


def test_per_call_adam_params_reach_the_trainer(tinker_fake: TinkerServer, tmp_path: Path) -> None:
    """Item 9: one server serves the cookbook's eps=1e-8 and a script's default AdamParams;
    each step's hyper-parameters are the trainer's after it (the fake records them)."""
    sig = tmp_path / "sig"
    sig.mkdir()
    env = scenario_env(TINKER_TEST_SIGNALS=str(sig))
    child = spawn_scenario("scenarios_training", "per_call_adam_params", tinker_fake.url, env)
    try:
        wait_signal(child, sig / "ready", 240)
        model = max(tinker_fake.routes.state.models.values(), key=lambda m: m.created)
        state = tinker_fake.fake.call(tinker_fake.fake.servicer.job_state, model.job_id)
        (sig / "done").write_text("")
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, out[-4000:]
    assert state["adam"] == pytest.approx(
        {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1, "gradient_clipping": 0.5}
    ), state["adam"]

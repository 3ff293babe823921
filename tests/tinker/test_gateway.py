"""The unmodified `tinker` 0.38 client against the Cortex gateway (`python -m
arctic_servers.gateway --engine fake`, a subprocess): the SFT loop, save for sampler + sample,
an RL step, load_state, zstd bodies and a LoRA adapter that trains, all on the default settings
(a LoRA client's job is a LoRA job on the gateway's data plane; the operator's `full_finetune`
opt-in is proven on the fake and on-prem, tests/tinker/conftest.py); a `--tinker-*` flag taking
effect; and a real restart of the gateway process under a live client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..gateway.harness import Gateway
from .conftest import scenario_env, spawn_scenario, wait_signal

MODEL = "fake-model"
KEY = "tml-pat-1"  # the harness's token, with the SDK's required prefix


def _gateway(tmp: Path, *args: str, gpus: int = 8) -> Iterator[Gateway]:
    tmp.mkdir(parents=True, exist_ok=True)
    g = Gateway(tmp, args=("--gpus", str(gpus), *args))
    g.start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway on the default settings for every scenario of this module. The SDK does not
    finish its sessions when a script ends: their jobs hold their GPUs until the session expires
    (`--tinker-session-timeout`, 180 s), so this gateway has room for every scenario's jobs
    (each model a training and a sampling sub-job) instead of queueing the later ones."""
    yield from _gateway(tmp_path_factory.mktemp("tinker-gw"), "--tinker-models", MODEL, gpus=32)


def _run(name: str, g: Gateway, timeout: float = 300) -> dict:
    from .conftest import run_scenario

    return run_scenario(name, g.base_url, model=MODEL, key=KEY, timeout=timeout, lora=True)


@pytest.mark.parametrize(
    "name",
    [
        "sft_loop_sample_and_listing",
        "rl_step_importance_sampling",
        "load_state_and_weights_info",
        "zstd_bodies",
        "lora_adapter_trains",
    ],
)
def test_scenario_on_gateway(gw: Gateway, name: str) -> None:
    _run(name, gw)


def test_lora_flag_refuse_takes_effect(tmp_path: Path) -> None:
    """`--tinker-lora refuse`: a LoRA client is refused, naming lora_config.rank."""
    for g in _gateway(tmp_path, "--tinker-lora", "refuse", "--tinker-models", MODEL):
        _run("lora_rank_is_refused_by_default", g)


def test_tinker_flags_in_help() -> None:
    for mod in (["arctic_servers.gateway"], ["arctic_servers.onprem", "serve"]):
        out = subprocess.run(
            [sys.executable, "-m", *mod, "--help"], capture_output=True, text=True, timeout=120
        ).stdout
        for flag in ("--tinker-lora", "--tinker-models", "--tinker-adam", "--tinker-session"):
            assert flag in out, (mod, flag)


def test_sessions_and_futures_survive_a_restart(tmp_path: Path) -> None:
    """A real restart (kill -9, start on the same state file and port) under a live client
    with an optim_step running: the client goes on (scenarios.py `restart`), and the step
    ran exactly once (the fake worker's applied steps)."""
    import requests

    sig = tmp_path / "signals"
    sig.mkdir()
    for g in _gateway(tmp_path / "gw", "--tinker-models", MODEL, "--fake-latency", "step=4"):
        env = {**scenario_env(MODEL, key=KEY), "TINKER_TEST_SIGNALS": str(sig)}
        child = spawn_scenario("scenarios", "restart", g.base_url, env)
        try:
            wait_signal(child, sig / "ready", 180)
            g.kill9()
            g.start()
            (sig / "restarted").write_text("")
            wait_signal(child, sig / "after", 300)
            model_id = (sig / "ready").read_text()
            jobs = requests.get(
                f"{g.base_url}/_admin/jobs/{_job_of(g, model_id)}/stats",
                headers={"Authorization": "Bearer pat-1"},
                timeout=30,
            ).json()
            (sig / "done").write_text("")
            out, _ = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert child.returncode == 0, out[-6000:] + g.tail()
        assert "workers" in jobs, jobs
        trainer = [w for k, w in jobs["workers"].items() if ":training:" in k]
        assert [w["applied_steps"] for w in trainer] == [1], jobs


def _job_of(g: Gateway, model_id: str) -> str:
    import sqlite3

    db = sqlite3.connect(g.root / "state-data" / "tinker_state.sqlite")
    (body,) = db.execute(
        "SELECT body FROM objects WHERE kind = 'model' AND id = ?", (model_id,)
    ).fetchone()
    return str(json.loads(body)["job_id"])


@pytest.mark.skipif(
    not os.environ.get("ARCTIC_GATEWAY_ENGINES"),
    reason="the gateway on the real engines takes minutes: ARCTIC_GATEWAY_ENGINES=1",
)
def test_cookbook_rl_reward_rises_on_the_gateways_engines(tmp_path: Path) -> None:
    """tinker-cookbook's rl.train, default loss, tiny local task (test_onprem.py's), on the
    gateway over the real engines (`--engine onprem`: DeepSpeed and vLLM workers): the
    recipe's reward rises. Opt-in (by hand, not CI): about the on-prem test's time."""
    from .test_onprem import _recipe, rewards_rise

    for g in _gateway(
        tmp_path / "gw", "--engine", "onprem", "--tinker-lora", "full_finetune", gpus=4
    ):
        first, last = rewards_rise(_recipe("rl", g.base_url, tmp_path / "rl", "8", key=KEY))
        print(f"cookbook rl.train on the gateway's engines: reward {first:.3f} -> {last:.3f}")

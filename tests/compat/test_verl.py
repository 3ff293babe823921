"""verl's Arctic remote backend, replayed call by call (`verl_replay.py`): PR #6422's
`ArcticRLClientWrapper` on `arctic_platform.rl` and the current Arctic-Platform plugin on
`arctic_platform.client` (through the opt-in alias, `compat-alias/`), each with the stock
`remote_backend/arctic.yaml`, against the fake and the on-prem server. Invariants:

- the first, fully on-policy update: `actor/ppo_kl == 0` and `actor/pg_clipfrac == 0`, with
  `zorro_train.enable` off (stock) and on, verl's own worker / trainer slicing the answers;
- the reference model (the log-prob sub-job) is unchanged by `update_weights`, and the sampler's
  log-probs equal the trainer's after it;
- `grad_norm` a per-rank list, every reduced metric a number; `mfu` present.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import numpy as np
import pytest

from arctic_sdk.compat import LegacyConfigWarning, create_arctic_rl_client

from . import verl_replay as V
from .conftest import TOKEN, Server

torch = pytest.importorskip("torch")

ROWS = ([11, 12, 13, 14], [15, 16], [17, 18, 19], [20])
REWARDS = [1.0, 0.0, 0.5, 0.0]


def _yaml(zorro: bool) -> dict[str, Any]:
    y = V.arctic_yaml()
    y["train"]["zorro_train"]["enable"] = zorro
    return y


def _make(server: Server, flavour: str, yaml: dict[str, Any]) -> Any:
    with pytest.warns(LegacyConfigWarning) as rec:
        if flavour == "pr":
            client = create_arctic_rl_client(V.pr_client_config(server, yaml))
        else:
            from arctic_platform.client import create_arctic_rl_client as plugin_create

            client = plugin_create(V.plugin_client_config(server, yaml))
    text = " | ".join(str(w.message) for w in rec)
    assert "colocate" in text and "train_batch_size" in text, text  # named, never dropped
    return client


@pytest.fixture(scope="module")
def verl_jobs(server: Server, alias: None, request: pytest.FixtureRequest) -> Any:
    """PR #6422's job (stock arctic.yaml) and the plugin's: on the fake each built from its own
    config; on-prem (engine start-ups cost minutes) the session's stock job
    (`onprem_stock_job`), the plugin attached through its reconnect path
    (`from_config(handle=...)`)."""
    from arctic_platform.client import create_arctic_rl_client as plugin_create

    with pytest.MonkeyPatch.context() as mp:
        # the plugin's OnPremConfig has no token field: a deployment puts it in the environment
        mp.setenv("ARCTIC_CORTEX_PAT", TOKEN)
        if server.kind == "fake":
            pr = _make(server, "pr", _yaml(False))
            plugin = _make(server, "plugin", _yaml(False))
        else:
            pr = request.getfixturevalue("onprem_stock_job")
            plugin = plugin_create(pr.reconnect_config())
        try:
            yield {"pr": pr, "plugin": plugin}
        finally:
            asyncio.run(plugin.shutdown())
            if server.kind == "fake":
                asyncio.run(pr.shutdown())


@pytest.fixture(
    params=[("pr", False), ("pr", True), ("plugin", False)],
    ids=["pr6422", "pr6422-zorro", "plugin"],
)
def verl(request: pytest.FixtureRequest, verl_jobs: dict[str, Any]) -> Any:
    flavour, zorro = request.param
    client = verl_jobs[flavour]
    client.yaml, client.flavour = _yaml(zorro), flavour
    return client


async def _rollouts(client: Any) -> V.VerlData:
    """Responses of the sampler for ROWS (the agent loop's rollouts), as verl holds them."""
    outs = await asyncio.gather(
        *(
            client.generate(prompts=[r], sampling_params={"max_tokens": 6, "temperature": 1.0})
            for r in ROWS
        )
    )
    responses = [list(o[0]["token_ids"]) for o in outs]
    mean = sum(REWARDS) / len(REWARDS)
    return V.verl_data([list(r) for r in ROWS], responses, [x - mean for x in REWARDS])


async def test_first_update_is_on_policy(verl: Any, server: Server) -> None:
    """compute_log_prob (actor) → verl's slicing → update_actor (fwd_bwd + step)."""
    d = await _rollouts(verl)
    out = await V.compute_log_prob(verl, verl.yaml, d, ref=False, calculate_entropy=True)
    assert out["metrics"]["mfu"] == 0.0
    old = V.worker_response_log_probs(verl.yaml, d, out["model_output"]["log_probs"])
    assert (old[d.response_mask == 1] < 0).all() and (old[d.response_mask == 0] == 0).all()
    res = await V.update_actor(verl, verl.yaml, d, old)
    m = res["metrics"]
    assert m["actor/ppo_kl"] == 0.0 and m["actor/pg_clipfrac"] == 0.0, m
    assert m["actor/pg_clipfrac_lower"] == 0.0
    assert m["grad_norm"] > 0 and m["lr"] > 0 and "mfu" in m
    assert all(isinstance(v, float) and np.isfinite(v) for v in m.values()), m
    grad = res["raw_step"]["metrics"]["grad_norm"]
    assert isinstance(grad, list) and len(grad) == verl.yaml["training_gpus"]
    # verl's rename and pop: KeyError if `mfu` were missing
    actor = {k if k.startswith("actor/") else f"actor/{k}": v for k, v in m.items()}
    actor["perf/mfu/actor"] = actor.pop("actor/mfu")


async def test_reference_model_is_frozen_across_update_weights(verl: Any, server: Server) -> None:
    d = await _rollouts(verl)
    ref0 = await V.compute_log_prob(verl, verl.yaml, d, ref=True, calculate_entropy=False)
    ref0_lp = V.worker_response_log_probs(verl.yaml, d, ref0["model_output"]["log_probs"])
    actor = await V.compute_log_prob(verl, verl.yaml, d, ref=False, calculate_entropy=False)
    old = V.worker_response_log_probs(verl.yaml, d, actor["model_output"]["log_probs"])
    # a KL-regularised update (use_kl_loss, the reference's log-probs) that moves the policy
    await V.update_actor(verl, verl.yaml, d, old, ref_log_prob=ref0_lp, kl_coef=0.01)
    if verl.flavour == "pr":  # PR #6422's update_weights
        await verl.sync_weights(cuda_ipc=False, low_memory=False)
    else:  # the plugin's: job defaults
        await verl.sync_weights()
    ref1 = await V.compute_log_prob(verl, verl.yaml, d, ref=True, calculate_entropy=False)
    ref1_lp = V.worker_response_log_probs(verl.yaml, d, ref1["model_output"]["log_probs"])
    now = await V.compute_log_prob(verl, verl.yaml, d, ref=False, calculate_entropy=False)
    now_lp = V.worker_response_log_probs(verl.yaml, d, now["model_output"]["log_probs"])
    assert torch.equal(ref1_lp, ref0_lp)  # the reference model did not move
    assert not torch.equal(now_lp, ref0_lp)  # the policy did
    # the sampler now scores the trainer's weights
    tol = 0.0 if server.kind == "fake" else 2e-5
    for row, resp in zip(ROWS, d.responses.tolist(), strict=True):
        got = (
            await verl.generate(
                prompts=[list(row)], sampling_params={"max_tokens": 4, "logprobs": True}
            )
        )[0]
        scored = V.verl_data([list(row)], [got["token_ids"]], [0.0])
        lp = await V.compute_log_prob(verl, verl.yaml, scored, ref=False, calculate_entropy=False)
        mine = V.worker_response_log_probs(verl.yaml, scored, lp["model_output"]["log_probs"])
        n = len(got["token_ids"])
        assert np.abs(mine[0, :n].numpy() - np.asarray(got["logprobs"])).max() <= tol
        del resp


async def test_generate_lifecycle_and_reconnect(verl: Any, server: Server) -> None:
    results = await V.generate(verl, "Once upon", max_tokens=12)
    (res,) = results
    assert isinstance(res["text"], str) and 0 < len(res["token_ids"]) <= 12
    assert len(res["logprobs"]) == len(res["token_ids"])  # logprobs=True: the sampled token's
    assert {"stop": "completed", "length": "completed"}[res["finish_reason"]] == "completed"
    await verl.wake_inference(tags=["kv_cache", "weights"])  # ArcticLLMServer.wake_up
    await verl.reset_prefix_cache()
    await verl.sleep_inference(level=1)
    saved = await verl.save_checkpoint()
    assert saved["path"]
    # reconnect_handle -> from_config(handle=...) in the forwarder worker / rollout replica
    if verl.flavour == "pr":
        handle = {
            "rl_client_reconnect_config": verl.reconnect_config(),
            "rl_server_state": verl.get_server_state(),
        }
    else:
        get_state = getattr(verl.transport, "get_server_state", None)
        handle = {
            "rl_client_reconnect_config": verl.reconnect_config(),
            "rl_server_state": get_state() if get_state is not None else None,
        }
    handle = pickle.loads(pickle.dumps(handle))  # wg_kwargs["backend_handle"] travels by Ray
    if verl.flavour == "pr":
        worker = create_arctic_rl_client(
            handle["rl_client_reconnect_config"], handle["rl_server_state"]
        )
    else:
        from arctic_platform.client import create_arctic_rl_client as plugin_create

        worker = plugin_create(
            handle["rl_client_reconnect_config"], server_state=handle["rl_server_state"]
        )
    assert worker.job_id == verl.job_id and worker.training_job_id == verl.training_job_id
    await worker.shutdown()  # destroy() of a copy: the job lives on
    d = await _rollouts(verl)
    out = await V.compute_log_prob(verl, verl.yaml, d, ref=False, calculate_entropy=False)
    assert tuple(out["model_output"]["log_probs"].shape) == tuple(d.input_ids.shape)

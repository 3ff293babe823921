"""The stock SkyRL config (ZoRRO on) and the stock verl `arctic.yaml` through multi-step loops on
the on-prem server with a W = 2 rank trainer (one job, shared; CPU, gloo, float32):

- SkyRL (`_ArcticDispatch`, creating the job from `build_rl_config` with `training_gpus` 2 and a
  DeepSpeed log-prob sub-job): generate → old log-probs → forward-backward → step → sync, 3
  steps with ZoRRO on; then the same steps again from the same checkpoint with ZoRRO off. The
  two equal within 1e-5 (loss, grad_norm, log-probs after the loop), ZoRRO's token-balanced
  rows showing in the rank token counts;
- verl PR #6422 (`ArcticRLClientWrapper`, stock arctic.yaml: `load_balancer` on), attached the
  way verl's forwarder does: compute_ref_log_prob, compute_log_prob, a KL-regularised
  update_actor, update_weights, twice; the reference model frozen, the sampler equal to the
  trainer after each sync.

`bf16` is the one value changed from SkyRL's stock config (it hard-codes bf16; these proofs run
float32, the tolerances of the fp32 proofs), and the learning rate (1e-6 would move nothing).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from arctic_sdk.compat import LegacyConfigWarning, create_arctic_rl_client

from . import skyrl_replay as S
from . import verl_replay as V
from .conftest import Server

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
# two long prompts then two short ones: contiguous slices put both long rows on rank 0
LONG = "count to three, slowly, then say hello to everyone in the room"
PROMPTS = [CHAT.format(t) for t in (LONG, LONG + " again", "hi", "yo")]
REWARDS = ([1.0, 0.0, 0.2, 0.9], [0.0, 1.0, 0.7, 0.1], [0.5, 0.0, 0.0, 1.0])
LR = 5e-4
TOL = 1e-5


@pytest.fixture(scope="module")
def w2(onprem_server: Server) -> Any:
    cfg = S.build_rl_config(onprem_server, training_gpus=2, lr=LR, bf16=False, log_prob_gpus=1)
    with pytest.warns(LegacyConfigWarning):
        client = create_arctic_rl_client(cfg)
    try:
        yield client
    finally:
        S.run(client.shutdown())


def _skyrl_loop(client: Any, rollouts: list[S.Rollouts] | None, zorro: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"loss": [], "grad_norm": [], "rollouts": [], "ranks": [], "kl": []}
    for k, rewards in enumerate(REWARDS):
        r = rollouts[k] if rollouts else S.run(S.generate(client, PROMPTS))
        step = S.forward_backward_and_step(
            client, r, S.grpo_advantages(list(rewards)), use_zorro=zorro, training_gpus=2
        )
        m = step.metrics
        assert all(S.is_number(v) for v in m.values()), m
        grad = step.step_metrics["grad_norm"]
        assert isinstance(grad, list) and len(grad) == 2 and grad[0] == grad[1] > 0
        out["loss"].append(float(m["loss"]))
        out["grad_norm"].append(float(grad[0]))
        out["ranks"].append((int(m["rank_tokens_max"]), int(m["rank_tokens_min"])))
        out["kl"].append((float(m["actor/ppo_kl"]), float(m["actor/pg_clipfrac"])))
        out["rollouts"].append(r)
        if rollouts is None:
            S.run(S.save_weights_for_sampler(client))
    out["final"] = _probe(client, out["rollouts"][0])
    return out


def _probe(client: Any, r: S.Rollouts) -> np.ndarray:
    probe = S.repack(r, use_zorro=False, advantages=[0.0] * len(r.prompt_ids))
    body = {
        "batch": {k: probe[k] for k in ("input_ids", "attention_mask", "prompts")},
        "meta": {"pad_token_id": S.PAD},
        "processing": {"post": ["compute_entropy_and_logprobs"], "loss_fn": None},
    }
    return np.asarray(S.run(client.fwd_no_grad(body))["batch"]["logprobs"].numpy())


def test_skyrl_zorro_on_equals_off_with_two_ranks(w2: Any) -> None:
    S.run(w2.save_checkpoint("w2-start"))
    on = _skyrl_loop(w2, None, zorro=True)
    S.run(w2.load_checkpoint(path="w2-start"))
    start = _probe(w2, on["rollouts"][0])
    off = _skyrl_loop(w2, on["rollouts"], zorro=False)
    d_loss = max(abs(a - b) for a, b in zip(on["loss"], off["loss"], strict=True))
    d_gn = max(abs(a - b) / b for a, b in zip(on["grad_norm"], off["grad_norm"], strict=True))
    d_lp = float(np.abs(on["final"] - off["final"]).max())
    print(
        f"\nW=2 SkyRL loop, 3 steps: loss {on['loss']} vs {off['loss']} (max|d| {d_loss:.2g}); "
        f"grad_norm {on['grad_norm']} (max rel d {d_gn:.2g}); log-probs after max|d| {d_lp:.2g}; "
        f"rank tokens (max, min) ZoRRO on {on['ranks']} off {off['ranks']}; "
        f"(ppo_kl, clipfrac) of step 1: on {on['kl'][0]} off {off['kl'][0]}"
    )
    assert d_loss <= TOL and d_gn <= TOL and d_lp <= TOL
    assert np.abs(on["final"] - start).max() > 1e-3  # the three steps moved the policy
    for kl, clip in (on["kl"][0], off["kl"][0]):  # the first step is on-policy
        assert abs(kl) <= 1e-6 and clip == 0.0
    lengths = [
        len(p) + len(x)
        for r in on["rollouts"]
        for p, x in zip(r.prompt_ids, r.response_ids, strict=True)
    ]
    for mx, mn in on["ranks"]:  # token-balanced: within one row of each other
        assert mx - mn <= max(lengths)
    gap_on = max(mx - mn for mx, mn in on["ranks"])
    assert gap_on < min(mx - mn for mx, mn in off["ranks"])  # balanced beats contiguous


async def test_verl_arctic_yaml_loop_with_two_ranks(w2: Any) -> None:
    yaml = V.arctic_yaml(training_gpus=2)
    verl = create_arctic_rl_client(w2.reconnect_config(), w2.get_server_state())
    try:
        rows = ([11, 12, 13, 14, 15], [16, 17], [18, 19, 20], [21])
        for k in range(2):
            outs = await asyncio.gather(
                *(verl.generate(prompts=[list(r)], sampling_params={"max_tokens": 6}) for r in rows)
            )
            responses = [list(o[0]["token_ids"]) for o in outs]
            d = V.verl_data([list(r) for r in rows], responses, [0.8, -0.4, 0.1, -0.5])
            ref = await V.compute_log_prob(verl, yaml, d, ref=True, calculate_entropy=False)
            ref_lp = V.worker_response_log_probs(yaml, d, ref["model_output"]["log_probs"])
            act = await V.compute_log_prob(verl, yaml, d, ref=False, calculate_entropy=True)
            old = V.worker_response_log_probs(yaml, d, act["model_output"]["log_probs"])
            res = await V.update_actor(verl, yaml, d, old, ref_log_prob=ref_lp, kl_coef=0.05)
            m = res["metrics"]
            assert abs(m["actor/ppo_kl"]) <= 1e-6 and m["actor/pg_clipfrac"] == 0.0, m
            assert (
                m["kl_loss"] >= 0
                and m["grad_norm"] > 0
                and len(res["raw_step"]["metrics"]["grad_norm"]) == 2
            )
            await verl.sync_weights(cuda_ipc=False, low_memory=False)  # update_weights
            again = await V.compute_log_prob(verl, yaml, d, ref=True, calculate_entropy=False)
            assert torch.equal(
                V.worker_response_log_probs(yaml, d, again["model_output"]["log_probs"]), ref_lp
            )
            got = (
                await verl.generate(
                    prompts=[list(rows[0])], sampling_params={"max_tokens": 5, "logprobs": True}
                )
            )[0]
            scored = V.verl_data([list(rows[0])], [got["token_ids"]], [0.0])
            lp = await V.compute_log_prob(verl, yaml, scored, ref=False, calculate_entropy=False)
            mine = V.worker_response_log_probs(yaml, scored, lp["model_output"]["log_probs"])
            n = len(got["token_ids"])
            assert np.abs(mine[0, :n].numpy() - np.asarray(got["logprobs"])).max() <= 2e-5, k
    finally:
        await verl.shutdown()

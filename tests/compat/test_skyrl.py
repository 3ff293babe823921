"""SkyRL's Arctic integration (NovaSky-AI/SkyRL `integrations/arctic_rl`), replayed call by call
with its own config, body shapes and keyword arguments (`skyrl_replay.py`) against the fake and
the on-prem server, and the invariants a trainer relies on:

- the first, fully on-policy step: `actor/ppo_kl == 0` and `actor/pg_clipfrac == 0`, with ZoRRO
  on (SkyRL's default) and off — `batch.logprobs` from `fwd_no_grad` goes straight back as
  `old_log_probs`;
- `grad_norm` a per-rank list, every metric a number;
- after `save_weights_for_sampler`, the sampler's log-probs equal the trainer's.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from arctic_sdk.compat import LegacyConfigWarning, create_arctic_rl_client

from . import skyrl_replay as S
from .conftest import Server, free_port

torch = pytest.importorskip("torch")

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
# two groups of n_samples_per_prompt = 2 (SkyRL repeats a prompt n times; the fake samples a
# repeated prompt of one request alike, so each slot's text differs by a word)
PROMPTS = [CHAT.format(t) for t in ("count to three", "count to 3", "say hi", "say hello")]
REWARDS = [1.0, 0.0, 0.25, 0.75]
# on-prem: the log-probs of forward (eval, one pass) and of forward-backward (train mode, the
# graph kept) are the same computation on one rank
EXACT = {"fake": 0.0, "onprem": 0.0}


def _client(server: Server, **over: Any) -> Any:
    with pytest.warns(LegacyConfigWarning) as rec:
        client = create_arctic_rl_client(S.build_rl_config(server, bf16=False, **over))
    text = " | ".join(str(w.message) for w in rec)
    # every stock field the server cannot use is named, none silently dropped
    for name in ("use_liger", "forest_cascade_attn_configs", "train_batch_size"):
        assert name in text, (name, text)
    return client


@pytest.fixture(scope="module")
def skyrl_job(server: Server, request: pytest.FixtureRequest) -> Any:
    """The fake: a job from SkyRL's stock config (ZoRRO on; ZoRRO is per call, so the ZoRRO-off
    runs share it). On-prem, where engine start-ups cost minutes: SkyRL's entrypoint re-attach
    (`ArcticRLExp`: `create_arctic_rl_client(reconnect_config, server_state)`) onto the
    session's stock job (SkyRL's own config creates the W = 2 job of test_onprem_w2.py)."""
    if server.kind == "fake":
        client = _client(server, use_zorro=True)
    else:
        shared = request.getfixturevalue("onprem_stock_job")
        client = create_arctic_rl_client(shared.reconnect_config(), shared.get_server_state())
    try:
        yield client
    finally:
        S.run(client.shutdown())


@pytest.fixture(params=[True, False], ids=["zorro-on", "zorro-off"])
def skyrl(request: pytest.FixtureRequest, skyrl_job: Any) -> Any:
    skyrl_job.use_zorro = request.param
    return skyrl_job


def test_first_step_is_on_policy(skyrl: Any, server: Server) -> None:
    """`ArcticGenerator.generate` → `_compute_old_log_probs` → `forward_backward` →
    `optim_step` → `save_weights_for_sampler`, with SkyRL's stock config (ZoRRO on / off)."""
    zorro = skyrl.use_zorro
    r = S.run(S.generate(skyrl, PROMPTS))
    assert all(0 < len(x) <= S.MAX_RESP for x in r.response_ids)
    step = S.forward_backward_and_step(skyrl, r, S.grpo_advantages(REWARDS), use_zorro=zorro)
    m = step.metrics
    assert m["actor/ppo_kl"] == pytest.approx(0.0, abs=EXACT[server.kind])
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/pg_clipfrac_lower"] == 0.0
    assert m["num_tokens"] == sum(len(x) for x in r.response_ids)
    assert all(S.is_number(v) for v in m.values()), m  # SkyRL's reduce_metrics needs numbers
    grad = step.step_metrics["grad_norm"]
    assert isinstance(grad, list) and len(grad) == 1 and step.grad_norm == grad[0] > 0
    assert all(
        S.is_number(v) for k, v in step.step_metrics.items() if k not in ("grad_norm", "last_lr")
    )
    # the alignment of what fwd_no_grad answered, per the deployed contract
    lp = step.old_log_probs.numpy()
    attn = step.fwd_bwd_payload["batch"]["attention_mask"].numpy()
    p = step.fwd_bwd_payload["batch"]["prompts"].shape[1]
    if zorro:  # response-aligned: column P + j = response token j; nothing on the prompt
        assert (lp[:, :p] == 0).all() and (lp[:, p][attn[:, p] == 1] < 0).all()
    else:  # predict-next: column P - 1 predicts response token 0
        assert (lp[:, p - 1] < 0).all()


def test_sampler_equals_trainer_after_save_weights_for_sampler(skyrl: Any, server: Server) -> None:
    S.run(S.save_weights_for_sampler(skyrl))  # non-colocated branch (SkyRL's default)
    r = S.run(S.generate(skyrl, PROMPTS[:1]))
    repacked = S.repack(r, use_zorro=False, advantages=[0.0] * len(r.prompt_ids))
    body = {
        "batch": {k: repacked[k] for k in ("input_ids", "attention_mask", "prompts")},
        "meta": {"pad_token_id": S.PAD, "zorro_train_enable": False},
        "processing": {"post": ["compute_entropy_and_logprobs"], "loss_fn": None},
    }
    lp = S.run(skyrl.fwd_no_grad(body))["batch"]["logprobs"].numpy()
    p = repacked["prompts"].shape[1]
    diffs = [
        abs(float(lp[b, p - 1 + j]) - v)
        for b, sampled in enumerate(r.logprobs)
        for j, v in enumerate(sampled)
    ]
    assert diffs and max(diffs) <= (0.0 if server.kind == "fake" else 2e-5), max(diffs)


def test_colocated_branch_and_inference_stub(skyrl: Any) -> None:
    """The colocated branch of `save_weights_for_sampler` and `_ArcticInferenceEngineStub`."""
    out = S.run(S.save_weights_for_sampler(skyrl, colocate=True))
    assert out["weight_version"] >= 1
    slept = S.run(skyrl.sleep_inference(level=2))
    woke = S.run(skyrl.wake_inference(tags=None))
    assert "applied" in slept["sampling"] and "applied" in woke["sampling"]
    S.run(skyrl.sync_weights())  # the fully-async trainer's call: the job's defaults
    saved = S.run(skyrl.save_checkpoint())  # `ckpt_dir` is ignored, as upstream
    assert saved["path"]


def test_entrypoint_creates_then_reattaches(server: Server) -> None:
    cfg = S.build_rl_config(server, bf16=False)
    if server.kind == "onprem":  # nothing answers here: "ray" launches the server, as deployed
        cfg["port"] = free_port()
    cfg["sampling_gpus"] = 0
    with pytest.warns(LegacyConfigWarning):
        pre_client = create_arctic_rl_client(cfg)
    try:
        launched = pre_client.launched_server
        assert (launched is not None) == (server.kind == "onprem")
        reconnect_cfg = pre_client.reconnect_config()
        server_state = pre_client.get_server_state()  # comm_protocol == "ray"
        exp_client = create_arctic_rl_client(reconnect_cfg, server_state)  # ArcticRLExp
        assert exp_client.job_id == pre_client.job_id
        job = pre_client.job_id
        assert exp_client.training_job_id == f"{job}:training:0"
        assert exp_client.sampling_job_id is None and exp_client.log_prob_job_id is None
        S.run(exp_client.shutdown())  # a re-attached copy only closes its connections
        r = S.Rollouts([[11, 12, 13]], [[21, 22]], [[]])
        rep = S.repack(r, use_zorro=True, advantages=[0.0])
        out = S.run(
            pre_client.fwd_no_grad(
                {
                    "batch": {k: rep[k] for k in ("input_ids", "attention_mask", "prompts")},
                    "meta": {"zorro_train_enable": True},
                }
            )
        )
        assert tuple(out["batch"]["logprobs"].shape) == tuple(rep["input_ids"].shape)
    finally:
        S.run(pre_client.shutdown())
        S.run(pre_client.shutdown())  # idempotent
    if launched is not None:
        assert launched.proc.poll() is not None  # the creating client stopped its server


def test_stock_sampling_params_are_honoured(skyrl: Any, server: Server) -> None:
    """`min_p` and `include_stop_str_in_output` (SkyRL sends both on every rollout)."""
    raw = S.run(skyrl.generate(prompts=[PROMPTS[0]], sampling_params=S.stock_sampling_params(24)))
    text = raw[0]["text"]
    assert text and raw[0]["finish_reason"] in ("stop", "length")
    stop = text[2:4]
    params = {**S.stock_sampling_params(24), "stop": [stop], "seed": 5}
    on = S.run(skyrl.generate(prompts=[PROMPTS[0]], sampling_params=params))[0]
    off = S.run(
        skyrl.generate(
            prompts=[PROMPTS[0]], sampling_params={**params, "include_stop_str_in_output": False}
        )
    )[0]
    if on["finish_reason"] == "stop":
        assert on["text"].endswith(on["stop_reason"]) and not off["text"].endswith(
            on["stop_reason"]
        )
        assert on["token_ids"] == off["token_ids"]
    greedy = S.run(
        skyrl.generate(prompts=[PROMPTS[0]], sampling_params={**params, "min_p": 1.0, "stop": None})
    )[0]
    again = S.run(
        skyrl.generate(
            prompts=[PROMPTS[0]], sampling_params={**params, "min_p": 1.0, "stop": None, "seed": 6}
        )
    )[0]
    assert greedy["token_ids"] == again["token_ids"]  # min_p 1: only the most likely token
    assert math.isfinite(sum(greedy["logprobs"]))

"""Every op of the on-prem server on real engines: shapes, alignment, options and errors.

All tests share one server and one job (training + sampling + an HF log-prob sub-job). Tests
that accumulate gradients finish with a step, so none leaves gradients behind for the next.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo
from .helpers import CHAT, ROWS, TEXTS, pad, sft_body
from .raw import CallError, Grpc, Http

pytestmark = pytest.mark.slow


async def test_capabilities_and_job_api(http: Http, shared_job: str) -> None:
    caps = await http.control(M.GET_CAPABILITIES)
    assert caps["server"] == "onprem"
    for op in (
        "forward-backward",
        "forward",
        "step",
        "generate",
        "log-probs",
        "sync-weights",
        "save",
        "export-checkpoint",
        "sleep-inference",
    ):
        assert op in caps["routes"], op
    assert caps["features"]["grpc"] and caps["features"]["grpc_port"] > 0
    assert set(caps["operation_types"]) >= {
        "weight-sync",
        "reset-prefix-cache",
        "forward",
        "tail-logs",
        "cancel-request",
    }
    job = await http.get_job(shared_job)
    assert job["state"] == "running"
    assert [s["sub_job_id"] for s in job["sub_jobs"]] == [
        f"{shared_job}:training:0",
        f"{shared_job}:sampling:0",
        f"{shared_job}:log_prob:0",
    ]
    assert all(s["state"] == "running" for s in job["sub_jobs"])
    listed = await http.control(M.LIST_JOBS)
    assert shared_job in [j["job_id"] for j in listed["jobs"]]
    cap = await http.control(M.GET_CAPACITY)
    assert cap["in_use_gpus"] >= 3


async def test_generate_text_and_tokens(http: Http, shared_job: str) -> None:
    body = {
        "prompts": [CHAT.format(TEXTS[0]), list(ROWS[1])],
        "sampling_params": {
            "n": 3,
            "max_tokens": 8,
            "seed": 7,
            "logprobs": 0,
            "top_p": 0.95,
            "top_k": 50,
        },
    }
    gen = await http.run(M.GENERATE, shared_job, body)
    assert isinstance(gen["weight_version"], int)
    assert len(gen["results"]) == 2
    assert gen["results"][1]["prompt_token_ids"] == list(ROWS[1])
    for r in gen["results"]:
        assert len(r["samples"]) == 3
        for s in r["samples"]:
            assert 1 <= len(s["token_ids"]) <= 8
            assert len(s["logprobs"]) == len(s["token_ids"]) and all(
                lp <= 0 for lp in s["logprobs"]
            )
            assert s["finish_reason"] in ("stop", "length") and isinstance(s["text"], str)
    again = await http.run(M.GENERATE, shared_job, body)
    assert [s["token_ids"] for r in again["results"] for s in r["samples"]] == [
        s["token_ids"] for r in gen["results"] for s in r["samples"]
    ], "the same seed must give the same samples"
    plain = await http.run(
        M.GENERATE,
        shared_job,
        {"prompts": ["hello"], "sampling_params": {"max_tokens": 5, "temperature": 0}},
    )
    assert "logprobs" not in plain["results"][0]["samples"][0]


async def test_generate_stop_strings(http: Http, shared_job: str) -> None:
    gen = await http.run(
        M.GENERATE,
        shared_job,
        {
            "prompts": ["The quick"],
            "sampling_params": {"max_tokens": 32, "temperature": 0, "ignore_eos": True},
        },
    )
    text = gen["results"][0]["samples"][0]["text"]
    assert len(text) > 4
    stop = text[2:4]
    cut = await http.run(
        M.GENERATE,
        shared_job,
        {
            "prompts": ["The quick"],
            "sampling_params": {
                "max_tokens": 32,
                "temperature": 0,
                "ignore_eos": True,
                "stop": [stop],
            },
        },
    )
    s = cut["results"][0]["samples"][0]
    assert s["finish_reason"] == "stop" and s["stop_reason"] == stop
    assert stop not in s["text"] and text.startswith(s["text"])


async def test_forward_alignment_left_and_right_padding(http: Http, shared_job: str) -> None:
    rows = [list(r) for r in ROWS]
    outs = {}
    for left in (False, True):
        ids, mask = pad(rows, left=left)
        res = await http.run(
            M.FORWARD,
            shared_job,
            {
                "kwargs": {"input_ids": ids, "attention_mask": mask},
                "processing": {"post": ["compute_entropy"]},
            },
        )
        lp, ent = res["outputs"]["logprobs_shifted"], res["outputs"]["entropy"]
        assert lp.dtype == np.float32 and lp.shape == ids.shape and ent.shape == ids.shape
        assert np.all(lp[:, -1] == 0) and np.all(lp[mask == 0] == 0) and np.all(ent[mask == 0] == 0)
        assert res["metrics"]["num_tokens"] == sum(len(r) - 1 for r in rows)
        outs[left] = [
            (
                lp[b, ids.shape[1] - len(r) : ids.shape[1] - 1] if left else lp[b, : len(r) - 1],
                ent[b],
            )
            for b, r in enumerate(rows)
        ]
    for (a, _), (b, _) in zip(outs[False], outs[True], strict=True):
        assert np.abs(a - b).max() < 1e-5
    # single rows without padding give the same numbers
    one = await http.run(
        M.FORWARD, shared_job, {"kwargs": {"input_ids": np.asarray([rows[2]], np.int64)}}
    )
    assert np.abs(one["outputs"]["logprobs_shifted"][0, :-1] - outs[False][2][0]).max() < 1e-5


async def test_log_probs_on_the_log_prob_sub_job(http: Http, shared_job: str) -> None:
    ids, mask = pad([list(r) for r in ROWS])
    res = await http.run(
        M.LOG_PROBS, shared_job, {"input_ids": ids, "attention_mask": mask, "entropy": True}
    )
    assert set(res["outputs"]) == {"logprobs_shifted", "entropy"}
    ref = await http.run(
        M.FORWARD,
        shared_job,
        {"kwargs": {"input_ids": ids, "attention_mask": mask}},
        headers={"X-Arctic-Sub-Job": f"{shared_job}:log_prob:0"},
    )
    assert (
        np.abs(ref["outputs"]["logprobs_shifted"] - res["outputs"]["logprobs_shifted"]).max() < 1e-6
    )


async def test_losses_and_loss_mask(http: Http, shared_job: str) -> None:
    ids, attn = pad([list(r) for r in ROWS])
    rng = np.random.default_rng(0)
    mask = np.zeros(ids.shape, np.float32)
    mask[:, 4:] = attn[:, 4:]  # train only tokens 4.. of each row
    adv = rng.normal(size=ids.shape).astype(np.float32)
    weights = rng.uniform(0.5, 1.5, size=ids.shape).astype(np.float32)
    base = await http.run(
        M.FORWARD, shared_job, {"kwargs": {"input_ids": ids, "attention_mask": attn}}
    )
    lp = base["outputs"]["logprobs_shifted"]
    pred = np.zeros(ids.shape, np.float32)
    pred[:, :-1] = mask[:, 1:]  # the loss of token i uses the prediction in column i - 1
    n = int((pred > 0).sum())
    ctx = {"loss_mask": mask, "advantages": adv, "weights": weights, "old_log_probs_shifted": lp}
    # each loss is sent only the context fields it reads: the servers refuse the others by name
    reads = {
        "cross_entropy": ("loss_mask",),
        "weighted_logprob": ("loss_mask", "weights"),
        "grpo": ("loss_mask", "advantages", "old_log_probs_shifted"),
        "ppo": ("loss_mask", "advantages", "old_log_probs_shifted"),
        "importance_sampling": ("loss_mask", "advantages", "old_log_probs_shifted"),
        "cispo": ("loss_mask", "advantages", "old_log_probs_shifted"),
    }
    losses: dict[str, Any] = {}
    for fn, fields in reads.items():
        res = await http.run(
            M.FORWARD,
            shared_job,
            {
                "kwargs": {"input_ids": ids, "attention_mask": attn},
                "context": {k: ctx[k] for k in fields},
                "processing": {"loss_fn": fn},
            },
        )
        assert res["metrics"]["num_tokens"] == n, fn
        losses[fn] = res
    w_pred = np.zeros(ids.shape, np.float32)
    w_pred[:, :-1] = weights[:, 1:]
    a_pred = np.zeros(ids.shape, np.float32)
    a_pred[:, :-1] = adv[:, 1:]
    assert losses["cross_entropy"]["loss"] == pytest.approx(-(lp * pred).sum() / n, rel=1e-5)
    assert losses["weighted_logprob"]["loss"] == pytest.approx(
        -(w_pred * lp * pred).sum() / n, rel=1e-5
    )
    # on-policy (old = current): ratio 1, so grpo/ppo/IS are -mean(A) over the trained tokens
    for fn in ("grpo", "ppo", "importance_sampling"):
        assert losses[fn]["loss"] == pytest.approx(
            -(a_pred * pred).sum() / n, rel=1e-4, abs=1e-6
        ), fn
    assert losses["grpo"]["metrics"]["clip_fraction"] == 0.0
    # forward-backward computes the same loss, and a step consumes the gradient
    fb = await http.run(
        M.FORWARD_BACKWARD,
        shared_job,
        {
            "kwargs": {"input_ids": ids, "attention_mask": attn},
            "context": {k: ctx[k] for k in reads["grpo"]},
            "processing": {"loss_fn": "grpo", "post": ["compute_logprobs"]},
        },
    )
    assert fb["loss"] == pytest.approx(losses["grpo"]["loss"], rel=1e-5, abs=1e-6)
    assert np.abs(fb["outputs"]["logprobs_shifted"] - lp).max() < 1e-5
    st = await http.run(M.STEP, shared_job, {})
    assert st["metrics"]["num_tokens"] == n and st["metrics"]["grad_norm"] > 0
    # a mask of zeros trains nothing
    zero = await http.run(
        M.FORWARD,
        shared_job,
        {
            "kwargs": {"input_ids": ids, "attention_mask": attn},
            "context": {"loss_mask": 0 * mask},
            "processing": {"loss_fn": "cross_entropy"},
        },
    )
    assert zero["loss"] == 0.0 and zero["metrics"]["num_tokens"] == 0


async def test_step_learning_rate_override(http: Http, shared_job: str) -> None:
    ids, mask = pad([list(r) for r in ROWS])
    fwd = {"kwargs": {"input_ids": ids, "attention_mask": mask}}
    before = (await http.run(M.FORWARD, shared_job, fwd))["outputs"]["logprobs_shifted"]
    await http.run(M.FORWARD_BACKWARD, shared_job, sft_body())
    st = await http.run(M.STEP, shared_job, {"learning_rate": 0.0})
    assert st["metrics"]["lr"] == 0.0 and st["metrics"]["grad_norm"] > 0
    after = (await http.run(M.FORWARD, shared_job, fwd))["outputs"]["logprobs_shifted"]
    assert np.abs(after - before).max() == 0.0, "lr 0 must not move the weights"
    await http.run(M.FORWARD_BACKWARD, shared_job, sft_body())
    st = await http.run(M.STEP, shared_job, {"learning_rate": 1e-3})
    assert st["metrics"]["lr"] == pytest.approx(1e-3)
    moved = (await http.run(M.FORWARD, shared_job, fwd))["outputs"]["logprobs_shifted"]
    assert np.abs(moved - before).max() > 1e-3


async def test_cache_lifecycle_and_operation_envelope(http: Http, shared_job: str) -> None:
    assert await http.run(M.RESET_PREFIX_CACHE, shared_job, {}) == {"reset": True}
    for method, body in (
        (M.SLEEP_INFERENCE, {"level": 1}),
        (M.WAKE_INFERENCE, {}),
        (M.SLEEP_TRAINING, {}),
        (M.WAKE_TRAINING, {}),
    ):
        res = await http.run(method, shared_job, body)
        assert res["applied"] is False and "CPU" in res["reason"], (method.name, res)
    job = await http.get_job(shared_job)
    op = await http.run(
        M.OPERATION,
        shared_job,
        {"operation_type": "weight-sync", "payload": {"method": "safetensors"}},
    )
    assert (
        op["result"]["weight_version"] == job["weight_version"] + 1
        and op["result"]["method"] == "safetensors"
    )
    op = await http.run(
        M.OPERATION,
        shared_job,
        {"operation_type": "reset-prefix-cache", "sub_job_type": "sampling"},
    )
    assert op["result"] == {"reset": True}
    logs = await http.run(
        M.OPERATION, shared_job, {"operation_type": "tail-logs", "payload": {"limit": 5}}
    )
    assert len(logs["result"]["entries"]) == 5
    fwd = await http.run(
        M.OPERATION,
        shared_job,
        {"operation_type": "forward", "payload": {"kwargs": {"input_ids": [list(ROWS[0])]}}},
    )
    assert len(fwd["result"]["outputs"]["logprobs_shifted"][0]) == len(ROWS[0])


@pytest.mark.parametrize(
    ("method", "body", "code"),
    [
        (
            M.FORWARD,
            {"kwargs": {"input_ids": np.array([[1, 2, 600]], np.int64)}},
            "invalid_argument",
        ),
        (
            M.FORWARD_BACKWARD,
            {
                "kwargs": {"input_ids": np.array([[1, 2, 3]], np.int64)},
                "processing": {"loss_fn": "nope"},
            },
            "invalid_argument",
        ),
        (
            M.FORWARD_BACKWARD,
            {
                "kwargs": {"input_ids": np.array([[1, 2, 3]], np.int64)},
                "processing": {"loss_fn": "grpo"},
            },
            "missing_field",
        ),
        (
            M.FORWARD,
            {
                "kwargs": {"input_ids": np.array([[1, 2, 3]], np.int64)},
                "processing": {"loss_fn": "grpo", "config": {"clip_ratio": 0.2}},
            },
            "unsupported_option",
        ),
        (M.GENERATE, {"prompts": ["x"], "sampling_params": {"n": 0}}, "invalid_argument"),
        (M.GENERATE, {"prompts": [[1, 999]]}, "invalid_argument"),
        (M.STEP, {"learning_rate": -1.0}, "invalid_argument"),
        (M.SYNC_WEIGHTS, {"method": "nccl"}, "unsupported_option"),
        (M.SAVE_CHECKPOINT, {"checkpoint_id": "../x"}, "invalid_argument"),
    ],
    ids=lambda v: v.name if hasattr(v, "name") else None,
)
async def test_bad_input_is_refused_before_it_runs(
    http: Http, shared_job: str, method: Any, body: Any, code: str
) -> None:
    with pytest.raises(CallError) as err:
        await http.run(method, shared_job, body)
    assert err.value.code == code, err.value.body
    assert err.value.status == 400  # refused at submission, not a failed request
    assert err.value.body["details"].get("field")


async def test_unknown_sub_job_and_grpc(http: Http, onprem: ServerInfo, shared_job: str) -> None:
    with pytest.raises(CallError) as err:
        await http.run(
            M.FORWARD,
            shared_job,
            sft_body(),
            headers={"X-Arctic-Sub-Job": f"{shared_job}:training:7"},
        )
    assert err.value.code == "sub_job_not_found"
    ids, mask = pad([list(r) for r in ROWS])
    fwd = {"kwargs": {"input_ids": ids, "attention_mask": mask}}
    ref = await http.run(M.FORWARD, shared_job, fwd)
    async with grpc.aio.insecure_channel(onprem.grpc_target) as channel:
        rpc = Grpc(channel)
        res = await rpc.run(M.FORWARD, shared_job, fwd)
        gen = await rpc.run(
            M.GENERATE, shared_job, {"prompts": ["hi"], "sampling_params": {"max_tokens": 3}}
        )
    assert (
        np.abs(res["outputs"]["logprobs_shifted"] - ref["outputs"]["logprobs_shifted"]).max() == 0.0
    )
    assert len(gen["results"][0]["samples"][0]["token_ids"]) >= 1


async def test_generate_max_tokens_against_vllms_context(http: Http, shared_job: str) -> None:
    """Issue 37 on vLLM: 0 refused naming the field; past the room the prompt leaves under
    `max_model_len` refused at submission naming the room (it was clamped silently); the edge
    itself samples; `clamp_max_tokens` lowers it and the Completion says so; a text prompt (the
    engine tokenizes it) is refused the same way, as a failed request."""
    with pytest.raises(CallError) as err:
        await http.run(
            M.GENERATE, shared_job, {"prompts": [[5, 6]], "sampling_params": {"max_tokens": 0}}
        )
    assert (
        err.value.status == 400
        and err.value.body["details"]["field"] == "sampling_params.max_tokens"
    )
    with pytest.raises(CallError) as err:
        await http.run(
            M.GENERATE,
            shared_job,
            {"prompts": [[5] * 10], "sampling_params": {"max_tokens": 10**9}},
        )
    assert err.value.status == 400, err.value.body
    d = err.value.body["details"]
    limit = d["max_model_len"]
    assert d["field"] == "sampling_params.max_tokens" and d["prompt_tokens"] == 10
    assert d["room"] == limit - 10 and limit >= 64
    prompt = [5] * (limit - 3)
    edge = {"max_tokens": 3, "ignore_eos": True, "seed": 1}
    got = await http.run(M.GENERATE, shared_job, {"prompts": [prompt], "sampling_params": edge})
    assert len(got["results"][0]["samples"][0]["token_ids"]) == 3
    assert not got["results"][0].get("clamped_max_tokens")
    body = {
        "prompts": [prompt, [5, 6]],
        "sampling_params": {"max_tokens": 6, "ignore_eos": True, "seed": 1},
        "clamp_max_tokens": True,
    }
    got = await http.run(M.GENERATE, shared_job, body)
    long, short = got["results"]
    assert long["clamped_max_tokens"] == 3 and len(long["samples"][0]["token_ids"]) == 3
    assert not short.get("clamped_max_tokens") and len(short["samples"][0]["token_ids"]) == 6
    with pytest.raises(CallError) as err:
        await http.run(
            M.GENERATE, shared_job, {"prompts": ["hello"], "sampling_params": {"max_tokens": limit}}
        )
    assert err.value.code == "invalid_argument" and err.value.body["details"]["room"] < limit

"""Sampling, weight sync, /operation, checkpoints and the lifecycle ops over HTTP."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load as st_load

import dssst1
from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines.fake import numerics as nx
from arctic_servers.engines.fake import tokenizer

from .raw import Http, batch
from .test_numerics import lp_ref


def gen(prompts: list[Any], **sp: Any) -> dict[str, Any]:
    return {"prompts": prompts, "sampling_params": sp}


async def test_generate_is_a_function_of_its_inputs(http: Http, job: str) -> None:
    res = await http.run(
        M.GENERATE, job, gen(["hi", [5, 6, 7]], n=2, max_tokens=6, seed=42, logprobs=0)
    )
    assert res["weight_version"] == 0
    first, second = res["results"]
    assert first["prompt_token_ids"] == tokenizer.encode("hi")
    assert second["prompt_token_ids"] == [5, 6, 7]
    for comp in res["results"]:
        p = comp["prompt_token_ids"]
        for k, sample in enumerate(comp["samples"]):
            want = nx.token_stream(42, k, 0, p, 6)
            assert sample["token_ids"] == want
            assert sample["text"] == tokenizer.decode(want)
            assert sample["finish_reason"] == "length"
            full = p + want
            assert sample["logprobs"] == [
                lp_ref(full[len(p) + j], len(p) + j, full[len(p) + j - 1], 0) for j in range(6)
            ]
    again = await http.run(
        M.GENERATE, job, gen(["hi", [5, 6, 7]], n=2, max_tokens=6, seed=42, logprobs=0)
    )
    assert again == res
    default = await http.run(M.GENERATE, job, gen(["hi"]))
    sample = default["results"][0]["samples"][0]
    assert len(sample["token_ids"]) == 16 and "logprobs" not in sample
    seed = (await http.state(job))["execution_log"][-1]["seed"]
    assert sample["token_ids"] == nx.token_stream(seed, 0, 0, tokenizer.encode("hi"), 16)
    greedy = await http.run(M.GENERATE, job, gen(["hi"], n=3, temperature=0.0, max_tokens=4))
    samples = greedy["results"][0]["samples"]
    assert samples[0] == samples[1] == samples[2]


async def test_generate_stops(http: Http, job: str) -> None:
    p = tokenizer.encode("x")
    stream = nx.token_stream(7, 0, 0, p, 40)
    text = tokenizer.decode(stream)
    stop = text[10:12]
    res = await http.run(M.GENERATE, job, gen(["x"], seed=7, max_tokens=40, stop=[stop, "\x00"]))
    s = res["results"][0]["samples"][0]
    cut = text.find(stop)
    assert (s["finish_reason"], s["stop_reason"], s["text"]) == ("stop", stop, text[:cut])
    assert s["token_ids"] == stream[: cut + len(stop)]
    tok = stream[5]
    res = await http.run(M.GENERATE, job, gen(["x"], seed=7, max_tokens=40, stop_token_ids=[tok]))
    s = res["results"][0]["samples"][0]
    upto = stream.index(tok) + 1
    assert s["finish_reason"] == "stop" and s["token_ids"] == stream[:upto]
    assert s["text"] == tokenizer.decode(stream[: upto - 1]) and "stop_reason" not in s
    res = await http.run(
        M.GENERATE, job, gen(["x"], seed=7, max_tokens=40, min_tokens=30, stop_token_ids=[tok])
    )
    assert len(res["results"][0]["samples"][0]["token_ids"]) >= 30


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (gen([]), "invalid_argument", "prompts"),
        (gen([""]), "invalid_argument", "prompts[0]"),
        (gen([[]]), "invalid_argument", "prompts[0]"),
        (gen([[1, -2]]), "invalid_argument", "prompts[0]"),
        (gen(["a"], n=0), "invalid_argument", "sampling_params.n"),
        (gen(["a"], n=10**30), "invalid_argument", "sampling_params.n"),
        (
            gen(["a", "b"], n=1024, max_tokens=1024),
            "invalid_argument",
            "sampling_params.max_tokens",
        ),
        (gen(["a"], max_tokens=-1), "invalid_argument", "sampling_params.max_tokens"),
        (gen(["a"], logprobs=99), "invalid_argument", "sampling_params.logprobs"),
        (gen(["a"], temperature=-1.0), "invalid_argument", "sampling_params.temperature"),
        (gen(["a"], stop=[""]), "invalid_argument", "sampling_params.stop[0]"),
        (gen(["a"], best_of=2), "invalid_argument", "sampling_params.best_of"),
        (gen(["a"], n="2"), "invalid_argument", "sampling_params.n"),
        (
            {**gen(["a"], top_p=0.5, presence_penalty=1.0), "strict": True},
            "unsupported_option",
            "sampling_params.top_p=0.5",
        ),
        ({"sampling_params": {}}, "missing_field", "prompts"),
    ],
)
async def test_generate_refuses_bad_input(
    http: Http, job: str, body: Any, code: str, field: str
) -> None:
    resp = await http.dss(M.GENERATE, job, body)
    assert resp.status == 400 and resp.code == code, resp.data
    details = resp.error["details"]
    assert details.get("field") == field or field in details.get("options", [])


async def test_sync_weights_bumps_version_and_aligns_sampler(http: Http, job: str) -> None:
    ids, mask = batch([[3, 4, 5]])
    await http.run(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": ids, "attention_mask": mask}})
    await http.run(M.STEP, job, {})
    res = await http.run(M.GENERATE, job, gen([[3, 4]], seed=1, max_tokens=3, logprobs=0))
    s = res["results"][0]["samples"][0]
    assert s["logprobs"][0] == lp_ref(s["token_ids"][0], 2, 4, 0)  # sampler still at step 0
    sync = await http.run(M.SYNC_WEIGHTS, job, {"method": "safetensors"})
    assert sync["weight_version"] == 1 and sync["method"] == "safetensors"
    res = await http.run(M.GENERATE, job, gen([[3, 4]], seed=1, max_tokens=3, logprobs=0))
    assert res["weight_version"] == 1
    s = res["results"][0]["samples"][0]
    assert s["token_ids"] == nx.token_stream(1, 0, 1, [3, 4], 3)
    full = np.array([[3, 4, *s["token_ids"]]])
    fwd = await http.run(M.FORWARD, job, {"kwargs": {"input_ids": full}})
    assert fwd["outputs"]["logprobs_shifted"][0, 1:4].tolist() == s["logprobs"]
    assert (await http.run(M.SYNC_WEIGHTS, job, {}))["weight_version"] == 2
    for body, code in (
        ({"method": "carrier-pigeon"}, "invalid_argument"),
        ({"target_sub_job_ids": [f"{job}:training:0"]}, "invalid_argument"),
        ({"source_sub_job_id": f"{job}:sampling:9"}, "sub_job_not_found"),
        ({"cuda_ipc": "yes"}, "invalid_argument"),
    ):
        resp = await http.call(M.SYNC_WEIGHTS, body, job_id=job)
        assert resp.code == code, (body, resp.data)
    assert (await http.state(job))["weight_version"] == 2


async def test_reset_prefix_cache_and_lifecycle(http: Http, job: str) -> None:
    assert await http.run(M.RESET_PREFIX_CACHE, job, {"drain": True}) == {"reset": True}
    resp = await http.call(M.RESET_PREFIX_CACHE, {"timeout_s": -1}, job_id=job)
    assert resp.code == "invalid_argument" and resp.error["details"]["field"] == "timeout_s"
    noop = {"applied": False, "reason": "fake gateway: nothing to offload"}
    for method, body in (
        (M.SLEEP_INFERENCE, {"level": 2}),
        (M.WAKE_INFERENCE, {"tags": ["weights"]}),
        (M.SLEEP_TRAINING, {"mode": "optimizer"}),
        (M.WAKE_TRAINING, {}),
    ):
        assert await http.run(method, job, body) == noop
    bad: list[tuple[Any, dict[str, Any], str]] = [
        (M.SLEEP_INFERENCE, {"level": 3}, "level"),
        (M.WAKE_INFERENCE, {"tags": ["gpu"]}, "tags[0]"),
        (M.SLEEP_TRAINING, {"mode": "deep"}, "mode"),
        (M.WAKE_TRAINING, {"now": True}, "now"),
    ]
    for method, body, field in bad:
        resp = await http.call(method, body, job_id=job)
        assert resp.status == 400 and resp.error["details"]["field"] == field, resp.data
    trainer_only = await http.create_job([{"job_type": "training", "model_name": "m"}])
    resp = await http.call(M.SLEEP_INFERENCE, {}, job_id=trainer_only)
    assert resp.code == "sub_job_not_found"


async def test_operation_envelope(http: Http, job: str) -> None:
    op = M.OPERATION
    res = await http.run(
        op,
        job,
        {
            "operation_type": "weight-sync",
            "sub_job_type": "training",
            "payload": {"weight_format": "vllm"},
        },
    )
    assert res["result"]["weight_version"] == 1
    res = await http.run(
        op, job, {"operation_type": "reset-prefix-cache", "sub_job_id": f"{job}:sampling:0"}
    )
    assert res == {"result": {"reset": True}}
    ids = np.array([[7, 8, 9]])
    frame = dssst1.dumps({"kwargs": {"input_ids": ids}})
    for payload in (
        {
            "payload_b64": base64.b64encode(frame).decode(),
            "content_type": "application/octet-stream",
        },
        {"kwargs": {"input_ids": [[7, 8, 9]]}},
    ):
        res = await http.run(op, job, {"operation_type": "forward", "payload": payload})
        got = res["result"]["outputs"]["logprobs_shifted"]
        assert got[0, :2].tolist() == [lp_ref(8, 1, 7, 0), lp_ref(9, 2, 8, 0)]
    logs = await http.run(op, job, {"operation_type": "tail-logs", "payload": {"limit": 2}})
    assert len(logs["result"]["entries"]) == 2 and logs["result"]["next_cursor"] == "2"
    assert logs["result"]["entries"][0].startswith("#0 operation")
    rest = await http.run(op, job, {"operation_type": "tail-logs", "payload": {"cursor": 2}})
    assert rest["result"]["eof"] is True
    cases = [
        ({"operation_type": "explode"}, "unknown_operation_type", "operation_type"),
        ({}, "missing_field", "operation_type"),
        (
            {
                "operation_type": "reset-prefix-cache",
                "sub_job_id": f"{job}:sampling:0",
                "sub_job_type": "training",
            },
            "invalid_argument",
            "sub_job_type",
        ),
        (
            {"operation_type": "reset-prefix-cache", "sub_job_id": "x:sampling:0"},
            "sub_job_not_found",
            None,
        ),
        (
            {"operation_type": "tail-logs", "payload": {"limit": 0}},
            "invalid_argument",
            "payload.limit",
        ),
        (
            {"operation_type": "cancel-request", "payload": {}},
            "missing_field",
            "payload.request_id",
        ),
        (
            {"operation_type": "weight-sync", "payload": {"foo": 1}},
            "invalid_argument",
            "payload.foo",
        ),
        (
            {"operation_type": "forward", "payload": {"kwargs": {"input_ids": [[1.5]]}}},
            "dtype_mismatch",
            "payload.kwargs.input_ids",
        ),
        (
            {"operation_type": "forward", "payload": {"payload_b64": "!!"}},
            "base64_invalid",
            "payload.payload_b64",
        ),
    ]
    for body, code, field in cases:
        resp = await http.call(op, body, job_id=job)
        assert resp.status in (400, 404) and resp.code == code, (body, resp.data)
        if field:
            assert resp.error["details"]["field"] == field, resp.data


async def test_checkpoint_lifecycle(http: Http, job: str) -> None:
    ids = np.array([[4, 5, 6]])
    await http.run(M.FORWARD_BACKWARD, job, {"kwargs": {"input_ids": ids}})
    await http.run(M.STEP, job, {"learning_rate": 0.25})
    saved = (await http.run(M.SAVE_CHECKPOINT, job, {}))["checkpoint"]
    assert (saved["checkpoint_id"], saved["checkpoint_type"], saved["global_steps"]) == (
        "step-1",
        "resumable",
        1,
    )
    await http.run(
        M.SAVE_CHECKPOINT, job, {"checkpoint_id": "w", "checkpoint_type": "weights-only"}
    )
    listed = (await http.run(M.LIST_CHECKPOINTS, job))["checkpoints"]
    assert [c["checkpoint_id"] for c in listed] == ["step-1", "w"]
    await http.run(M.STEP, job, {"learning_rate": 1.0})
    loaded = await http.run(M.LOAD_CHECKPOINT, job, {"checkpoint_id": "step-1"})
    assert loaded["checkpoint"]["checkpoint_id"] == "step-1"
    state = await http.state(job)
    assert (state["global_step"], state["applied_steps"], state["lr"]) == (1, 2, 0.25)
    exported = await http.run(M.EXPORT_CHECKPOINT, job, checkpoint_id="step-1")
    assert [f["filename"] for f in exported["files"]] == [
        "model.safetensors",
        "config.json",
        "tokenizer_config.json",
    ]
    for f in exported["files"]:
        resp = await http.request("GET", http.fake.prefix_url + f["url"])
        assert resp.status == 200 and len(resp.data) == f["size_bytes"]
        assert hashlib.sha256(resp.data).hexdigest() == f["sha256"]
        if f["filename"] == "model.safetensors":
            bias = st_load(resp.data)["lm_head.bias"]
            assert bias[10] == lp_ref(10, 0, 0, 1)
        if f["filename"] == "config.json":
            assert json.loads(resp.data)["global_step"] == 1
    resp = await http.call(
        M.DOWNLOAD_CHECKPOINT_FILE, job_id=job, checkpoint_id="step-1", filename="secrets.txt"
    )
    assert (resp.status, resp.code) == (404, "not_found")
    deleted = await http.call(M.DELETE_CHECKPOINT, job_id=job, checkpoint_id="w")
    assert deleted.data["result"] == {"deleted": True}
    again = await http.call(M.DELETE_CHECKPOINT, job_id=job, checkpoint_id="w")
    assert again.data["status"] == "failed"
    assert again.data["error"]["code"] == "checkpoint_not_found"
    for method, body, code in (
        (M.LOAD_CHECKPOINT, {}, "missing_field"),
        (M.LOAD_CHECKPOINT, {"checkpoint_id": "../etc"}, "invalid_argument"),
        (M.SAVE_CHECKPOINT, {"checkpoint_type": "full"}, "invalid_argument"),
        (
            M.LOAD_CHECKPOINT,
            {"checkpoint_id": "step-1", "target_sub_job_id": "z"},
            "sub_job_not_found",
        ),
    ):
        resp = await http.call(method, body, job_id=job)
        assert resp.code == code, resp.data
    missing = await http.call(M.LOAD_CHECKPOINT, {"checkpoint_id": "nope"}, job_id=job)
    assert missing.data["error"]["code"] == "checkpoint_not_found"
    other = await http.create_job()
    cross = await http.run(
        M.LOAD_CHECKPOINT, other, {"checkpoint_id": "step-1", "source_job_id": job}
    )
    assert cross["checkpoint"]["global_steps"] == 1
    assert (await http.state(other))["global_step"] == 1
    exp = await http.call(M.EXPORT_CHECKPOINT, job_id=job, checkpoint_id="nope")
    assert exp.data["error"]["code"] == "checkpoint_not_found"


async def test_generate_respects_the_samplers_max_seq_len(http: Http) -> None:
    job = await http.create_job(
        [{"job_type": "sampling", "model_name": "m", "inference_config": {"max_seq_len": 8}}]
    )
    resp = await http.dss(M.GENERATE, job, gen([[5] * 8]))
    assert resp.status == 400 and resp.error["details"]["field"] == "prompts[0]"
    # past the room a prompt leaves: refused, naming the room (never clamped silently)
    resp = await http.dss(M.GENERATE, job, gen([[5] * 5], max_tokens=4, seed=1))
    assert resp.status == 400 and resp.error["code"] == "invalid_argument"
    d = resp.error["details"]
    assert d["field"] == "sampling_params.max_tokens" and d["expected"] == "1..3"
    assert (d["prompt_tokens"], d["max_model_len"], d["room"]) == (5, 8, 3)
    # the edge itself: exactly the room
    res = await http.run(M.GENERATE, job, gen([[5] * 5], max_tokens=3, seed=1))
    assert len(res["results"][0]["samples"][0]["token_ids"]) == 3
    assert "clamped_max_tokens" not in res["results"][0]
    # clamping on request: lowered to the room, and the reply says so, per prompt
    body = {**gen([[5] * 5, [5] * 2], max_tokens=4, seed=1), "clamp_max_tokens": True}
    res = await http.run(M.GENERATE, job, body)
    first, second = res["results"]
    assert len(first["samples"][0]["token_ids"]) == 3 and first["clamped_max_tokens"] == 3
    assert first["samples"][0]["finish_reason"] == "length"
    assert len(second["samples"][0]["token_ids"]) == 4 and "clamped_max_tokens" not in second
    # absent: the default 16, capped by the room (a default is not the caller's ask)
    res = await http.run(M.GENERATE, job, gen([[5] * 5], seed=1))
    assert len(res["results"][0]["samples"][0]["token_ids"]) == 3

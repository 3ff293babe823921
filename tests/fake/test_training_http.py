"""Training ops over HTTP (forward-backward, forward, log-probs, step): exact values, bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines.fake import numerics as nx

from .raw import OCTET, Http, batch
from .test_numerics import ent_ref, lp_ref

ROWS = [[10, 11, 12, 13, 14], [20, 21, 22]]


def fb_body(ids: Any, mask: Any, **processing: Any) -> dict[str, Any]:
    return {
        "args": [],
        "kwargs": {"input_ids": ids, "attention_mask": mask},
        "processing": {"post": ["compute_logprobs"], **processing},
    }


def expected_shifted(rows: list[list[int]], s: int, *, pad_left: bool) -> np.ndarray:
    width = max(len(r) for r in rows)
    out = np.zeros((len(rows), width))
    for b, r in enumerate(rows):
        off = width - len(r) if pad_left else 0
        for j in range(len(r) - 1):
            out[b, off + j] = lp_ref(r[j + 1], j + 1, r[j], s)
    return out


@pytest.mark.parametrize("pad_left", [False, True])
async def test_forward_backward_exact_logprobs_and_loss(
    http: Http, job: str, pad_left: bool
) -> None:
    ids, mask = batch(ROWS, left=pad_left)
    res = await http.run(M.FORWARD_BACKWARD, job, fb_body(ids, mask))
    got = res["outputs"]["logprobs_shifted"]
    assert got.dtype == np.float32 and got.shape == ids.shape
    want = expected_shifted(ROWS, 0, pad_left=pad_left)
    assert np.array_equal(got, want.astype(np.float32))
    assert (got <= 0).all() and (got[:, -1] == 0).all()
    scored = [lp_ref(r[j + 1], j + 1, r[j], 0) for r in ROWS for j in range(len(r) - 1)]
    assert res["loss"] == pytest.approx(-sum(scored) / len(scored), rel=1e-12)
    assert res["metrics"]["num_tokens"] == len(scored) == 6
    assert res["metrics"]["global_step"] == 0


async def test_accumulate_then_step_changes_logprobs(http: Http, job: str) -> None:
    ids, mask = batch(ROWS)
    body = fb_body(ids, mask)
    r1 = await http.run(M.FORWARD_BACKWARD, job, body)
    r2 = await http.run(M.FORWARD_BACKWARD, job, body)
    b = nx.make_batch(ids, mask)
    one = nx.compute_loss(b, 0, nx.LossSpec(), nx.LossInputs())
    step = await http.run(M.STEP, job, {"learning_rate": 0.5})
    m = step["metrics"]
    assert m["grad_norm"] == pytest.approx(2 * nx.grad_norm(one.grad), rel=1e-12)
    assert m["loss"] == pytest.approx(r1["loss"] + r2["loss"], rel=1e-12)
    assert (m["lr"], m["global_step"], m["num_tokens"]) == (0.5, 1, 12)
    m2 = (await http.run(M.STEP, job, {}))["metrics"]
    assert (m2["lr"], m2["grad_norm"], m2["global_step"]) == (0.5, 0.0, 2)  # lr remembered
    after = await http.run(M.FORWARD, job, fb_body(ids, mask))
    want = expected_shifted(ROWS, 2, pad_left=False).astype(np.float32)
    assert np.array_equal(after["outputs"]["logprobs_shifted"], want)
    state = await http.state(job)
    assert (state["applied_steps"], state["global_step"]) == (2, 2)


async def test_rl_loss_entropy_and_kl(http: Http, job: str) -> None:
    ids, mask = batch([[5, 6, 7, 8], [9, 10, 11, 12]])
    adv = np.array([[0, 1, -1, 2], [0, 0.5, 0.5, 0.5]], np.float32)
    lmask = np.array([[0, 1, 1, 1], [0, 0, 1, 1]], np.int64)
    ref = np.full((2, 4), -1.0, np.float32)
    body = fb_body(ids, mask, loss_fn="grpo", config={"kl_coeff": 0.1, "entropy_coeff": 0.01})
    body["processing"]["post"].append("compute_entropy")
    body["context"] = {
        "input_ids": ids,
        "advantages": adv,
        "loss_mask": lmask,
        "ref_log_probs_shifted": ref,
    }
    res = await http.run(M.FORWARD_BACKWARD, job, body)
    want = nx.compute_loss(
        nx.make_batch(ids, mask),
        0,
        nx.LossSpec(loss_fn="grpo", kl_coeff=0.1, entropy_coeff=0.01),
        nx.LossInputs(
            loss_mask=lmask.astype(float),
            advantages=adv.astype(float),
            ref_shifted=ref.astype(float),
        ),
    )
    assert res["loss"] == pytest.approx(want.loss, rel=1e-12)
    assert res["metrics"]["clip_fraction"] == 0.0 and res["metrics"]["approx_kl"] == 0.0
    assert res["metrics"]["kl"] == pytest.approx(want.metrics["kl"], rel=1e-12)
    ent = res["outputs"]["entropy"]
    assert ent[0, 0] == ent_ref(5, 1, 0) and ent[0, 3] == 0


async def test_log_probs_uses_the_log_prob_sub_job(http: Http) -> None:
    job = await http.create_job(
        [{"job_type": "training", "model_name": "m"}, {"job_type": "log_prob", "model_name": "m"}]
    )
    ids, mask = batch([[3, 4, 5]])
    await http.run(M.FORWARD_BACKWARD, job, fb_body(ids, mask))
    await http.run(M.STEP, job, {})
    ref = await http.run(
        M.LOG_PROBS, job, {"input_ids": ids, "attention_mask": mask, "entropy": True}
    )
    assert ref["outputs"]["logprobs_shifted"][0, 0] == lp_ref(4, 1, 3, 0)  # not synced: step 0
    assert ref["outputs"]["entropy"][0, 1] == ent_ref(4, 2, 0)
    trainer = await http.run(M.FORWARD, job, fb_body(ids, mask))
    assert trainer["outputs"]["logprobs_shifted"][0, 0] == lp_ref(4, 1, 3, 1)
    via = await http.run(
        M.FORWARD, job, fb_body(ids, mask), headers={"X-Arctic-Sub-Job": f"{job}:log_prob:0"}
    )
    assert via["outputs"]["logprobs_shifted"][0, 0] == lp_ref(4, 1, 3, 0)
    # the default sync targets the sampling sub-jobs only: the reference model stays frozen
    await http.run(M.SYNC_WEIGHTS, job, {})
    ref = await http.run(M.LOG_PROBS, job, {"input_ids": ids})
    assert ref["outputs"]["logprobs_shifted"][0, 0] == lp_ref(4, 1, 3, 0)
    await http.run(M.SYNC_WEIGHTS, job, {"target_sub_job_ids": [f"{job}:log_prob:0"]})
    ref = await http.run(M.LOG_PROBS, job, {"input_ids": ids})
    assert ref["outputs"]["logprobs_shifted"][0, 0] == lp_ref(4, 1, 3, 1)


def _bad_bodies() -> list[tuple[str, Any, str, str]]:
    ids, mask = batch([[1, 2, 3]])
    ok = fb_body(ids, mask)

    def with_(path: str, value: Any) -> dict[str, Any]:
        body = {"args": [], "kwargs": dict(ok["kwargs"]), "processing": dict(ok["processing"])}
        head, _, leaf = path.rpartition(".")
        node: dict[str, Any] = body
        for part in head.split(".") if head else []:
            node = node.setdefault(part, {})
        node[leaf] = value
        return body

    grpo = with_("processing.loss_fn", "grpo")
    grpo["context"] = {"advantages": np.zeros((1, 3), np.float32)}
    nan = with_("processing.loss_fn", "importance_sampling")
    nan["context"] = {
        "advantages": np.full((1, 3), np.nan, np.float32),
        "loss_mask": np.ones((1, 3), np.int64),
    }
    no_kw = dict(ok)
    del no_kw["kwargs"]
    return [
        ("missing kwargs", no_kw, "missing_field", "kwargs"),
        (
            "float ids",
            with_("kwargs.input_ids", ids.astype(np.float32)),
            "dtype_mismatch",
            "kwargs.input_ids",
        ),
        (
            "mask shape",
            with_("kwargs.attention_mask", np.ones((1, 4), np.int64)),
            "shape_mismatch",
            "kwargs.attention_mask",
        ),
        (
            "rank 1",
            with_("kwargs.input_ids", np.array([1, 2, 3])),
            "shape_mismatch",
            "kwargs.input_ids",
        ),
        (
            "vocab",
            with_("kwargs.input_ids", np.array([[1, -5, 3]])),
            "invalid_argument",
            "kwargs.input_ids",
        ),
        (
            "mask values",
            with_("kwargs.attention_mask", np.array([[1, 2, 1]])),
            "invalid_argument",
            "kwargs.attention_mask",
        ),
        ("loss fn", with_("processing.loss_fn", "dpo"), "invalid_argument", "processing.loss_fn"),
        ("no loss_mask", grpo, "missing_field", "context.loss_mask"),
        ("nan", nan, "invalid_argument", "context.advantages"),
        (
            "agg",
            with_("processing.config", {"loss_agg_mode": "mean"}),
            "invalid_argument",
            "processing.config.loss_agg_mode",
        ),
        (
            "knobs",
            with_("processing.config", {"clip_ratio": 1, "eps": 2}),
            "unsupported_option",
            "processing.config.clip_ratio",
        ),
        (
            "post",
            with_("processing.post", ["compute_values"]),
            "unsupported_option",
            "processing.post",
        ),
        ("args", with_("args", [1]), "invalid_argument", "args"),
        ("unknown", with_("kwargs.pixel_values", 1), "invalid_argument", "kwargs.pixel_values"),
        (
            "context ids",
            with_("context.input_ids", np.array([[1, 2, 4]])),
            "invalid_argument",
            "context.input_ids",
        ),
        (
            "temperature",
            with_("processing.config", {"temperature": 0.0}),
            "invalid_argument",
            "processing.config.temperature",
        ),
    ]


@pytest.mark.parametrize(
    ("name", "body", "code", "field"), _bad_bodies(), ids=[b[0] for b in _bad_bodies()]
)
async def test_forward_backward_refuses_bad_input(
    http: Http, job: str, name: str, body: Any, code: str, field: str
) -> None:
    resp = await http.dss(M.FORWARD_BACKWARD, job, body)
    assert resp.status == 400 and resp.code == code, resp.data
    assert resp.error["details"]["field"] == field
    if code == "unsupported_option":
        assert len(resp.error["details"]["options"]) >= 1
    assert (await http.state(job))["execution_log"] == []


async def test_bad_transport_bodies(http: Http, job: str) -> None:
    url = http.fake.prefix_url + f"/{job}/forward-backward"
    resp = await http.request("POST", url, json={"kwargs": {}})
    assert (resp.status, resp.code) == (415, "unsupported_media_type")
    resp = await http.request(
        "POST", url, data=b"\x80\x04" + b"junk" * 8, headers={"Content-Type": OCTET}
    )
    assert (resp.status, resp.code) == (400, "pickle_refused")
    resp = await http.request("POST", url, data=b"abc", headers={"Content-Type": OCTET})
    assert (resp.status, resp.code) == (400, "frame_too_short")
    step = http.fake.prefix_url + f"/{job}/step"
    resp = await http.request(
        "POST", step, data=b"[1]", headers={"Content-Type": "application/json"}
    )
    assert (resp.status, resp.code) == (400, "invalid_json")
    resp = await http.request("POST", step, data=b"x", headers={"Content-Type": OCTET})
    assert (resp.status, resp.code) == (415, "unsupported_media_type")
    for body, field in (
        ({"learning_rate": -1}, "learning_rate"),
        ({"lr": 1}, "lr"),
        ({"learning_rate": "a"}, "learning_rate"),
    ):
        resp = await http.call(M.STEP, body, job_id=job)
        assert resp.status == 400 and resp.error["details"]["field"] == field, resp.data
    resp = await http.dss(M.LOG_PROBS, job, {"input_ids": np.array([[1, 300_000]])})
    assert resp.code == "invalid_argument" and resp.error["details"]["field"] == "input_ids"
    resp = await http.dss(M.LOG_PROBS, job, {"attention_mask": np.ones((1, 2), np.int64)})
    assert resp.code == "missing_field"


async def test_sub_job_targeting_errors(http: Http, job: str) -> None:
    other = await http.create_job()
    ids, mask = batch([[1, 2]])
    for sub, code in (
        (f"{other}:training:0", "sub_job_not_found"),
        (f"{job}:training:7", "sub_job_not_found"),
        (f"{job}:sampling:0", "invalid_argument"),
    ):
        resp = await http.dss(
            M.FORWARD_BACKWARD, job, fb_body(ids, mask), headers={"X-Arctic-Sub-Job": sub}
        )
        assert resp.code == code, (sub, resp.data)
    sampler_only = await http.create_job([{"job_type": "sampling", "model_name": "m"}])
    resp = await http.call(M.STEP, {}, job_id=sampler_only)
    assert (resp.status, resp.code) == (404, "sub_job_not_found")
    resp = await http.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "0"})
    assert resp.code == "invalid_argument" and resp.error["details"]["field"] == "X-Arctic-Seq"

"""The async request queue (fake workers): 202 and inline answers, sequence order, CancelRequest
of queued and running requests, per-token limits (429 with Retry-After and queue position),
size limits, the retention window, and tokens kept out of the state file and the logs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from arctic_sdk.spec.tables import methods as M

from .harness import SAMPLE, TRAIN, Client, Gateway, fb_body

GEN = {"prompts": ["hi"], "sampling_params": {"max_tokens": 2, "seed": 1}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(
        tmp_path_factory.mktemp("gw-requests"),
        args=(
            "--max-inflight-per-token", "4", "--fake-latency", "generate=0.8",
            "--max-body-mib", "1", "--retention-seconds", "2", "--sweep-interval", "0.5",
        ),
    )  # fmt: skip
    g.start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture(scope="module")
def job(gw: Gateway) -> str:
    c = Client(gw.prefix_url)
    j = c.create_job(TRAIN, SAMPLE)
    c.wait_job(j)
    return j


def test_async_answers_and_sequence_order(client: Client, job: str) -> None:
    r = client.dss(M.FORWARD_BACKWARD, job, fb_body())
    assert r.status == 202 and set(r.data) == {"request_id", "job_id"}
    assert r.headers["X-Arctic-Request-Id"] == r.data["request_id"]
    assert client.result(job, r)["metrics"]["num_tokens"] == 14
    small = client.call(M.RESET_PREFIX_CACHE, {}, job_id=job)
    assert small.status == 200 and small.data["status"] == "completed"  # inline: a small op
    # sent in the order 3, 2, 1: they run 1, 2, 3 (the global_step each step saw)
    base = client.job(job)["global_step"]
    seqs = [base + 3, base + 2, base + 1]
    with ThreadPoolExecutor(3) as pool:
        futs = [
            pool.submit(client.call, M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": str(s)})
            for s in seqs
        ]
        answers = [f.result() for f in futs]
    steps = [client.result(job, a)["metrics"]["global_step"] for a in answers]
    assert steps == [base + 3, base + 2, base + 1]


def test_cancel_queued_and_running_requests(client: Client, job: str) -> None:
    running = client.dss(M.GENERATE, job, GEN)
    queued = client.dss(M.GENERATE, job, GEN)
    assert (running.status, queued.status) == (202, 202)
    time.sleep(0.2)
    rid = queued.data["request_id"]
    c = client.call(M.CANCEL_REQUEST, job_id=job, request_id=rid).data
    assert c == {"request_id": rid, "cancelled": True, "status": "cancelled"}
    rid = running.data["request_id"]
    c = client.call(M.CANCEL_REQUEST, job_id=job, request_id=rid).data
    assert c == {"request_id": rid, "cancelled": True, "status": "cancelled"}
    st = client.poll(job, rid).data
    assert st["status"] == "cancelled" and st["error"]["code"] == "request_cancelled"
    # a request that completed first stays completed
    done = client.call(M.RESET_PREFIX_CACHE, {}, job_id=job).data["request_id"]
    c = client.call(M.CANCEL_REQUEST, job_id=job, request_id=done).data
    assert (c["cancelled"], c["status"]) == (False, "completed")


def test_per_token_limit_is_429_with_retry_after_and_queue_position(
    client: Client, job: str
) -> None:
    answers = [client.dss(M.GENERATE, job, GEN) for _ in range(6)]
    limited = [a for a in answers if a.status == 429]
    assert [a.status for a in answers[:4]] == [202] * 4 and len(limited) == 2
    err = limited[0].data["error"]
    assert err["code"] == "rate_limited" and err["details"]["queue_position"] == 1
    assert int(limited[0].headers["Retry-After"]) >= 1
    # another token has its own budget
    assert Client(client.prefix, token="pat-2").call(M.LIST_JOBS).status == 200
    for a in answers[:4]:
        client.wait(job, a)
    assert client.dss(M.GENERATE, job, GEN).status == 202  # room again


def test_request_size_limit(client: Client, job: str) -> None:
    r = client.request(
        "POST",
        client.prefix + f"/{job}/forward-backward",
        headers={"Content-Type": "application/octet-stream"},
        data=b"\0" * (1024 * 1024 + 10),
    )
    assert r.status == 413 and r.code == "body_too_large"


def test_results_expire_after_the_retention_window(client: Client, job: str) -> None:
    r = client.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": "ret-1"})
    status = client.wait(job, r)
    assert status["status"] == "completed"
    rid = status["request_id"]
    assert client.poll(job, rid).status == 200  # fetched: the window runs from now
    deadline = time.monotonic() + 10
    while client.poll(job, rid).status == 200:
        assert time.monotonic() < deadline, "the result was never dropped"
        time.sleep(0.25)
    gone = client.poll(job, rid)
    assert gone.code == "request_not_found" and gone.data["error"]["details"]["expired"]
    # the key is still known: a retry is refused, never run again
    again = client.call(M.STEP, {}, job_id=job, headers={"Idempotency-Key": "ret-1"})
    assert again.code == "request_not_found"


def test_tokens_are_not_stored_or_logged(gw: Gateway, job: str) -> None:
    for path in [gw.db, gw.log, *gw.root.rglob("*.log")]:
        data = path.read_bytes()
        assert b"pat-1" not in data and b"pat-2" not in data, path
    wal = gw.db.with_name(gw.db.name + "-wal")
    if wal.exists():
        assert b"pat-1" not in wal.read_bytes()

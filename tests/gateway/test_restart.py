"""Durable state across gateway restarts (fake workers): workers re-attached, results pollable,
replays answered from the store without running again, a running request completed by its
worker, queued jobs and leases kept, and SIGTERM draining before exit."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import requests

from arctic_sdk.spec.tables import methods as M

from .harness import SAMPLE, TRAIN, Client, Gateway, fb_body
from .test_jobs import admin


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = Gateway(
        tmp_path_factory.mktemp("gw-restart"),
        args=("--gpus", "2", "--fake-latency", "forward_backward=1.5", "--drain-timeout", "10"),
    )
    g.start()
    try:
        yield g
    finally:
        g.cleanup()


def test_kill9_restart_keeps_jobs_results_and_replays(gw: Gateway, client: Client) -> None:
    j1 = client.create_job(TRAIN, SAMPLE, lease_seconds=3600)
    client.wait_job(j1)
    j2 = client.create_job(TRAIN)  # no GPU left: queued
    pids = [w["pid"] for w in admin(client, gw, j1)["workers"]]
    group = str(uuid.uuid4())
    fb = client.dss(M.FORWARD_BACKWARD, j1, fb_body(), group=group)
    fb_status = client.wait(j1, fb)
    step = client.call(M.STEP, {}, job_id=j1, headers={"Idempotency-Key": "k1"})
    step_status = client.wait(j1, step)
    lease = client.job(j1)["lease_expires_at"]

    gw.kill9()
    restored = gw.start()["restored"]
    assert restored["jobs"] == {"running": 1, "starting": 0, "pending": 1, "failed": 0}
    assert [w["pid"] for w in admin(client, gw, j1)["workers"]] == pids  # re-attached
    assert client.job(j1)["lease_expires_at"] == lease
    assert client.job(j2)["state"] == "pending"
    # a completed result is still there; a replayed group / keyed call answers it again
    again = client.poll(j1, fb.data["request_id"]).data
    assert (again["status"], again["result"]) == ("completed", fb_status["result"])
    replay = client.dss(M.FORWARD_BACKWARD, j1, fb_body(), group=group)
    assert replay.data["request_id"] == fb.data["request_id"]
    replay = client.call(M.STEP, {}, job_id=j1, headers={"Idempotency-Key": "k1"})
    assert replay.data["request_id"] == step.data["request_id"]
    assert replay.data["result"] == step_status["result"]
    stats = client.stats(gw.base_url, j1)[f"{j1}:training:0"]
    assert stats["applied_steps"] == 1 and stats["executed"][fb.data["request_id"]] == 1
    # and the job goes on
    assert client.result(j1, client.dss(M.FORWARD, j1, fb_body()))["metrics"]["global_step"] == 1
    client.call(M.CANCEL_JOB, job_id=j1)
    client.wait_job(j2)
    client.call(M.CANCEL_JOB, job_id=j2)


def test_a_request_running_at_the_crash_is_completed_by_its_worker(
    gw: Gateway, client: Client
) -> None:
    job = client.create_job(TRAIN)
    client.wait_job(job)
    group = str(uuid.uuid4())
    r = client.dss(M.FORWARD_BACKWARD, job, fb_body(), group=group)
    assert r.status == 202  # 1.5 s of fake latency: still running
    time.sleep(0.3)
    gw.kill9()  # the worker goes on with it
    assert gw.start()["restored"]["requests"]["running"] == 1
    assert client.result(job, r)["metrics"]["num_tokens"] == 14
    replay = client.dss(M.FORWARD_BACKWARD, job, fb_body(), group=group)
    assert replay.data["request_id"] == r.data["request_id"]
    stats = client.stats(gw.base_url, job)[f"{job}:training:0"]
    assert stats["executed"] == {r.data["request_id"]: 1}
    client.call(M.CANCEL_JOB, job_id=job)


def test_sigterm_drains_and_hands_off_queued_work(gw: Gateway, client: Client) -> None:
    job = client.create_job(TRAIN)
    client.wait_job(job)
    running = client.dss(M.FORWARD_BACKWARD, job, fb_body(), headers={"X-Arctic-Seq": "1"})
    queued = client.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "3"})  # waits for 2
    assert (running.status, queued.status) == (202, 202)
    assert gw.proc is not None
    gw.proc.send_signal(15)
    time.sleep(0.3)
    try:  # draining: no new work is accepted (or the listener is already closed)
        r = client.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "2"})
        assert r.status == 503 and r.code == "unavailable"
    except requests.ConnectionError:
        pass
    assert gw.wait_exit(30) == 0
    assert "1 unfinished requests handed to the next start" in gw.tail()
    gw.start()
    assert client.poll(job, running.data["request_id"]).data["status"] == "completed"
    assert client.poll(job, queued.data["request_id"]).data["status"] == "pending"
    second = client.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "2"})
    assert client.result(job, second)["metrics"]["global_step"] == 1
    assert client.result(job, queued)["metrics"]["global_step"] == 2
    client.call(M.CANCEL_JOB, job_id=job)


def test_a_refused_seq_is_not_waited_for_after_a_restart(gw: Gateway, client: Client) -> None:
    """Seq 2 refused (an invalid body: never run), the gateway killed -9 and restarted: seq 3
    runs at once, not after the 60 s gap timeout for a number that will never run."""
    job = client.create_job(TRAIN)
    client.wait_job(job)
    first = client.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "1"})
    assert client.wait(job, first)["status"] == "completed"
    bad = client.call(M.STEP, {"bogus": 1}, job_id=job, headers={"X-Arctic-Seq": "2"})
    assert (bad.status, bad.code) == (400, "invalid_argument"), bad.data
    gw.kill9()
    gw.start()
    t0 = time.monotonic()
    third = client.call(M.STEP, {}, job_id=job, headers={"X-Arctic-Seq": "3"})
    status = client.wait(job, third, timeout=20)
    took = time.monotonic() - t0
    assert status["status"] == "completed", status
    assert status["result"]["metrics"]["global_step"] == 2
    assert took < 10, f"seq 3 waited {took:.1f} s for the refused seq 2"
    client.call(M.CANCEL_JOB, job_id=job)

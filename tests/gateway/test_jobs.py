"""Jobs on the gateway (fake workers): states and reasons, labels and comment, capacity (queued
or refused with a reason), cancel stopping the workers and freeing capacity, leases, tail-logs,
a dead worker failing its job, auth and isolation."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from .harness import SAMPLE, TRAIN, Client, Gateway, fb_body


def admin(c: Client, gw: Gateway, job: str) -> dict[str, Any]:
    r = c.request("GET", f"{gw.base_url}/_admin/jobs/{job}")
    assert r.status == 200, r.data
    out: dict[str, Any] = r.data
    return out


def pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def pids_gone_wait(pids: list[int], timeout: float = 30.0) -> None:
    wait_for(lambda: all(pid_gone(p) for p in pids), timeout, "worker processes to exit")


def wait_for(cond: Any, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_lifecycle_labels_comment_and_isolation(gw: Gateway, client: Client) -> None:
    job = client.create_job(
        TRAIN, SAMPLE, labels={"team": "rl", "run": "a1"}, comment="owner: ana", experiment_name="e"
    )
    j = client.wait_job(job)
    assert [s["sub_job_id"] for s in j["sub_jobs"]] == [f"{job}:training:0", f"{job}:sampling:0"]
    states = [h["state"] for h in admin(client, gw, job)["history"]]
    assert states == ["pending", "placing", "initializing", "running"]
    listed = client.call(M.LIST_JOBS, query={"label": ["team=rl", "run=a1"]}).data["jobs"]
    assert [(x["job_id"], x["comment"], x["labels"]) for x in listed] == [
        (job, "owner: ana", {"team": "rl", "run": "a1"})
    ]
    # another token (pat-2, configured only as its sha256) sees nothing of it
    other = Client(gw.prefix_url, token="pat-2")
    assert other.call(M.GET_JOB, job_id=job).code == "job_not_found"
    assert other.call(M.LIST_JOBS).data["jobs"] == []
    assert other.dss(M.FORWARD_BACKWARD, job, fb_body()).status == 404
    assert Client(gw.prefix_url, token=None).call(M.LIST_JOBS).status == 401
    assert Client(gw.prefix_url, token="nope").call(M.LIST_JOBS).code == "unauthenticated"
    # the same CreateJob Idempotency-Key is the same job
    body = {"sub_job_configs": [TRAIN]}
    h = {"Idempotency-Key": "create-1"}
    a = client.call(M.CREATE_JOB, body, headers=h).data["job_id"]
    assert client.call(M.CREATE_JOB, body, headers=h).data["job_id"] == a
    for jid in (job, a):
        assert client.call(M.CANCEL_JOB, job_id=jid).data["job"]["state"] == "cancelled"
    assert client.call(M.CANCEL_JOB, job_id=job).code == "job_terminal"
    wait_for(lambda: client.call(M.GET_CAPACITY).data["in_use_gpus"] == 0, what="capacity")


def test_capacity_queues_refuses_and_cancel_frees(gw: Gateway, client: Client) -> None:
    big = {"job_type": "training", "model_name": "m", "training_config": {"n_gpus": 3}}
    a = client.create_job(big)
    client.wait_job(a)
    pids = [w["pid"] for w in admin(client, gw, a)["workers"]]
    b = client.create_job({**big, "training_config": {"n_gpus": 2}})
    jb = client.job(b)
    assert jb["state"] == "pending"
    assert "waiting for capacity: needs 2 GPUs, 1 of 4 free" in jb["reason"]
    cap = client.call(M.GET_CAPACITY).data
    assert (cap["in_use_gpus"], cap["available_gpus"], cap["queued_jobs"]) == (3, 1, 1)
    r = client.dss(M.FORWARD, b, fb_body())
    assert r.code == "job_not_running" and r.data["error"]["details"]["state"] == "pending"
    # a job that can never fit is refused at once, with the reason
    r = client.call(M.CREATE_JOB, {"sub_job_configs": [{**big, "training_config": {"n_gpus": 5}}]})
    assert r.status == 400 and "exceeds" in r.data["error"]["message"]
    two = [{**big, "training_config": {"n_gpus": 3}}, {**SAMPLE, "inference_config": {"n_gpus": 2}}]
    r = client.call(M.CREATE_JOB, {"sub_job_configs": two})
    assert r.status == 400 and "could never run" in r.data["error"]["message"]
    # cancelling a stops its worker processes and frees its GPUs for b
    client.call(M.CANCEL_JOB, job_id=a)
    wait_for(lambda: all(pid_gone(p) for p in pids), what="a's workers to exit")
    client.wait_job(b)
    cap = client.call(M.GET_CAPACITY).data
    assert (cap["in_use_gpus"], cap["queued_jobs"]) == (2, 0)
    client.call(M.CANCEL_JOB, job_id=b)
    wait_for(lambda: client.call(M.GET_CAPACITY).data["in_use_gpus"] == 0, what="capacity")


def test_lease_renewed_then_expired(gw: Gateway, client: Client) -> None:
    # a first lease long enough for the job to start on a loaded machine (it counts from create)
    job = client.create_job(TRAIN, lease_seconds=30)
    client.wait_job(job)
    first = client.job(job)["lease_expires_at"]
    r = client.call(M.RENEW_JOB_LEASE, {"lease_seconds": 60}, job_id=job)
    assert r.status == 200 and r.data["lease_expires_at"] > first
    assert client.job(job)["lease_expires_at"] == r.data["lease_expires_at"]
    pid = admin(client, gw, job)["workers"][0]["pid"]
    # the driver stops renewing: a short last lease runs out
    assert client.call(M.RENEW_JOB_LEASE, {"lease_seconds": 2}, job_id=job).status == 200
    wait_for(lambda: client.job(job)["state"] == "cancelled", timeout=30, what="lease expiry")
    assert client.job(job)["reason"] == "lease expired"
    wait_for(lambda: pid_gone(pid), what="the worker to exit")
    assert client.call(M.RENEW_JOB_LEASE, {}, job_id=job).code == "job_terminal"


def test_tail_logs_pages_through_a_sub_job_log(gw: Gateway, client: Client) -> None:
    job = client.create_job(TRAIN, SAMPLE)
    client.wait_job(job)
    lines, cursor = [], "0"
    for _ in range(20):
        body = {
            "operation_type": "tail-logs",
            "sub_job_type": "sampling",
            "payload": {"cursor": int(cursor), "limit": 1},
        }
        page = client.result(job, client.call(M.OPERATION, body, job_id=job))["result"]
        lines += page["entries"]
        assert len(page["entries"]) <= 1
        cursor = page["next_cursor"]
        if page["eof"]:
            break
    assert len(lines) >= 2 and all(ln.startswith(f"[{job}:sampling:0] ") for ln in lines)
    assert any("listening on" in ln for ln in lines) and any("ready" in ln for ln in lines)
    client.call(M.CANCEL_JOB, job_id=job)


def test_a_dead_worker_fails_its_job_with_the_reason(gw: Gateway, client: Client) -> None:
    job = client.create_job(TRAIN, SAMPLE)
    client.wait_job(job)
    worker = admin(client, gw, job)["workers"][1]
    os.kill(worker["pid"], signal.SIGKILL)
    wait_for(lambda: client.job(job)["state"] == "failed", what="the job to fail")
    j = client.job(job)
    assert f"sub-job {job}:sampling:0 failed" in j["reason"] and "SIGKILL" in j["reason"]
    assert j["sub_jobs"][1]["state"] == "failed"
    assert client.dss(M.FORWARD_BACKWARD, job, fb_body()).code == "job_terminal"
    wait_for(lambda: client.call(M.GET_CAPACITY).data["in_use_gpus"] == 0, what="capacity")

"""Restarts, issue 14 §5 (fake workers, the SDK as drivers use it):

- SIGTERM while a request body is still arriving: that request is answered 503 `unavailable`
  with the spec's body (it got EOF), and the gateway exits within its drain timeout plus the
  listener's 2 s (it took ~60 s, whatever --drain-timeout said);
- a request marked running that never reached its worker fails `not_executed` (it was
  `internal`), and the SDK resubmits it under the same identity: it runs once;
- after an outage, "gateway ready -> first call succeeds" is bounded the same on HTTP and gRPC:
  gRPC's own reconnect backoff no longer stacks on the SDK's (a 17 s outage: gRPC ~7-11 s,
  HTTP ~1-2 s, with the SDK's retry backoff capped at 1 s).

The time bounds are generous (several times what is measured here) and compare a transport
against the same limit, so load on the machine does not make them flaky.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from arctic_sdk import Client

from .harness import TRAIN, Gateway
from .harness import Client as Raw

RETRY = {"retry": {"max_retries": 200, "initial_backoff": 0.2, "max_backoff": 1.0}}
OUTAGE_S = 17.0  # gRPC's default reconnect schedule: attempts at ~15.8 s, then ~26.3 s
BOUND_S = 5.0  # SDK backoff cap (1 s x 1.25 jitter) + channel reconnect cap (1 s) + slack


def _job(g: Gateway) -> str:
    raw = Raw(g.prefix_url)
    job = raw.create_job(TRAIN)
    raw.wait_job(job)
    return job


def test_sigterm_answers_a_body_in_flight_503_and_exits_in_time(tmp_path: Path) -> None:
    g = Gateway(tmp_path, args=("--drain-timeout", "5"))
    g.start()
    try:
        job = _job(g)
        port = int(g.base_url.rsplit(":", 1)[1])
        path = g.prefix_url.split(str(port), 1)[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            head = (
                f"POST {path}/{job}/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer pat-1"
                "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            s.sendall(head.encode())
            time.sleep(0.5)
            assert g.proc is not None
            t0 = time.monotonic()
            g.proc.send_signal(signal.SIGTERM)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status_line, _, rest = data.partition(b"\r\n")
        assert b" 503 " in status_line, data[:300]
        body = json.loads(rest.partition(b"\r\n\r\n")[2])
        assert body["error"]["code"] == "unavailable", body
        assert g.proc.wait(30) == 0
        took = time.monotonic() - t0
        assert took < 5 + 2 + 3, f"the gateway took {took:.1f} s to exit (drain timeout 5 s)"
    finally:
        g.cleanup()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_not_executed_is_resubmitted_by_the_sdk(
    tmp_path: Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway dies right after marking the step running, before its worker got it; after
    the restart the step fails not_executed and the SDK runs it again under the same key."""
    caplog.set_level(logging.INFO, logger="arctic_sdk")
    g = Gateway(tmp_path)
    info = g.start()
    try:
        job = _job(g)
        g.kill9()
        info = g.start(crash_at="request_started:1")
        target = info["grpc_target"] if transport == "grpc" else None
        client = Client(g.base_url, token="pat-1", transport=transport, grpc_target=target,
                        job_id=job, timeout=120, config=RETRY)  # fmt: skip
        out: dict[str, object] = {}

        def step() -> None:
            try:
                out["result"] = client.step()
            except Exception as exc:  # reported below
                out["error"] = exc

        t = threading.Thread(target=step)
        t.start()
        assert g.proc is not None
        assert g.proc.wait(60) == 137, g.tail()  # the crash point
        g.start()  # same state; the restart finds the step running, never sent
        t.join(120)
        assert "error" not in out, out
        raw = Raw(g.prefix_url)
        stats = raw.stats(g.base_url, job)[f"{job}:training:0"]
        assert stats["applied_steps"] == 1, stats  # run once, by the resubmission
        assert list(stats["executed"].values()) == [1], stats
        # the first request was answered not_executed (never internal) and its identity ran
        # once more: by the SDK's resubmission, or by its retry of the cut-off POST
        with sqlite3.connect(f"file:{g.db}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT status, error FROM requests WHERE job_id = ? AND op = 'step'", (job,)
            ).fetchall()
        codes = sorted(json.loads(e)["code"] if e else st for st, e in rows)
        assert codes == ["completed", "not_executed"], rows
        resubmits = [r for r in caplog.records if "resubmitting step" in r.getMessage()]
        assert len(resubmits) <= 1, [r.getMessage() for r in resubmits]
        client.close()
    finally:
        g.cleanup()


def test_reconnect_is_bounded_the_same_on_both_transports(tmp_path: Path) -> None:
    g = Gateway(tmp_path)
    info = g.start()
    try:
        job = _job(g)
        ready = threading.Event()
        firsts: dict[str, float] = {}
        errors: dict[str, BaseException] = {}
        warm = threading.Barrier(3)

        def driver(transport: str) -> None:
            target = info["grpc_target"] if transport == "grpc" else None
            with Client(g.base_url, token="pat-1", transport=transport, grpc_target=target,
                        job_id=job, timeout=120, config=RETRY) as c:  # fmt: skip
                c.get_job(job_id=job)  # the channel / connection is up before the outage
                warm.wait(30)
                warm.wait(30)  # the gateway is down now
                try:
                    c.get_job(job_id=job)
                    firsts[transport] = time.monotonic()
                except BaseException as exc:
                    errors[transport] = exc

        threads = [threading.Thread(target=driver, args=(t,)) for t in ("http", "grpc")]
        for t in threads:
            t.start()
        warm.wait(30)
        g.kill9()
        warm.wait(30)
        time.sleep(OUTAGE_S)
        g.start()
        ready.set()
        t_ready = time.monotonic()
        for t in threads:
            t.join(120)
        assert not errors, errors
        after = {k: round(v - t_ready, 2) for k, v in firsts.items()}
        print(f"first call after the gateway was ready: {after}")
        assert set(after) == {"http", "grpc"}
        assert all(v < BOUND_S for v in after.values()), after
    finally:
        g.cleanup()

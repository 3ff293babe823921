"""A crash-tolerant driver: retries every call through gateway restarts, the way the SDK does
(same chunk group id, same Idempotency-Key, same X-Arctic-Seq; a group the gateway lost is
replayed from chunk 0; a request that failed `not_executed` -- it never reached its worker --
is resubmitted under the same identity), and records what it was answered, for the
kill-matrix invariants."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import requests

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M

from .harness import OCTET, TERMINAL, Client, Resp, chunks_of, fb_body, path_of

RETRYABLE = (requests.ConnectionError, requests.Timeout)
FB_CHUNK = 4000  # bytes per chunk frame: a [2, 512] I64 batch is 3 chunks


@dataclass
class Op:
    """One logical call and everything the gateway answered about it."""

    name: str
    seq: int
    identity: str  # chunk group id or Idempotency-Key
    request_ids: set[str] = field(default_factory=set)
    status: str = ""
    error: dict[str, Any] | None = None
    restarts: int = 0  # chunk_group_restart_required replays
    resubmits: int = 0  # resubmissions after not_executed (each a new request id)


class Driver:
    def __init__(self, client: Client, job: str, deadline_s: float = 90.0) -> None:
        self.c = client
        self.job = job
        self.deadline = time.monotonic() + deadline_s

    def _retry(self, fn: Callable[[], Resp]) -> Resp:
        while True:
            assert time.monotonic() < self.deadline, "the gateway did not come back"
            try:
                r = fn()
            except RETRYABLE:
                time.sleep(0.05)
                continue
            if r.status in (502, 503, 504):
                time.sleep(0.05)
                continue
            return r

    def _chunks(self, method: MethodInfo, op: Op, value: Any, max_bytes: int) -> Resp:
        url = self.c.prefix + path_of(method, job_id=self.job)
        h = {"Content-Type": OCTET, "X-Arctic-Seq": str(op.seq)}
        chunks = chunks_of(method, value, op.identity, max_bytes)
        i = 0
        while True:
            r = self._retry(partial(self.c.request, "POST", url, headers=h, data=chunks[i]))
            if r.status == 409 and r.code == "chunk_group_restart_required":
                op.restarts += 1
                i = 0
                continue
            if r.status == 200 and isinstance(r.data, dict) and r.data.get("chunk_cached"):
                i += 1
                continue
            return r

    def forward_backward(self, seq: int) -> Op:
        """A [2, 512] batch sent as a group of 3 chunks."""
        op = Op("forward-backward", seq, str(uuid.uuid4()))

        def send() -> Resp:
            return self._chunks(M.FORWARD_BACKWARD, op, fb_body(2, 512, seed=seq), FB_CHUNK)

        return self._finish(op, send)

    def step(self, seq: int) -> Op:
        op = Op("step", seq, f"step-{uuid.uuid4()}")
        h = {"Idempotency-Key": op.identity, "X-Arctic-Seq": str(seq)}
        return self._finish(
            op, lambda: self._retry(lambda: self.c.call(M.STEP, {}, job_id=self.job, headers=h))
        )

    def _finish(self, op: Op, send: Callable[[], Resp]) -> Op:
        while True:
            r = send()
            assert r.status in (200, 202), (op, r.status, r.data)
            status: dict[str, Any] = r.data
            op.request_ids.add(status["request_id"])
            while status.get("status") not in TERMINAL:
                time.sleep(0.02)
                rid = status["request_id"]
                p = self._retry(partial(self.c.poll, self.job, rid))
                assert p.status == 200, (op, p.status, p.data)
                status = p.data
            op.status, op.error = status["status"], status.get("error")
            if (op.error or {}).get("code") != "not_executed" or op.resubmits >= 3:
                return op
            op.resubmits += 1  # it never ran: the same identity runs it now

    def replay(self, op: Op) -> str:
        """Ask again for a finished op (same identity): the request id it is answered with."""
        if op.name == "step":
            h = {"Idempotency-Key": op.identity, "X-Arctic-Seq": str(op.seq)}
            r = self._retry(lambda: self.c.call(M.STEP, {}, job_id=self.job, headers=h))
        else:
            r = self._chunks(M.FORWARD_BACKWARD, op, fb_body(2, 512, seed=op.seq), FB_CHUNK)
        assert r.status == 200, (op, r.status, r.data)
        return str(r.data["request_id"])

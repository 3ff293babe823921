"""The kill -9 matrix on fake workers: 20 gateway crashes at named points, each restarted on the
same SQLite file while a driver keeps retrying, then the invariants:

- every logical call was answered with exactly one request id (retries and replays included);
- every acknowledged request ended completed or failed with a reason, never lost;
- no request ran twice on its worker, a completed one ran exactly once, a failed one never;
- optimizer steps applied by the trainer == step requests completed == the job's global_step.

Crash points (`ARCTIC_CRASH_AT`): a chunk accepted before it is stored; a request recorded
before it is acknowledged, with a backlog of sequenced requests queued; a command sent to the
worker and not yet answered; a result computed before it is stored; a request marked running
and not yet sent to its worker (it then fails `not_executed`: it never ran, and the driver
resubmits it under the same identity, as the SDK does, which runs it once, as a new request).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .driver import Driver, Op
from .harness import TRAIN, Client, Gateway

ITERATIONS = 20
SCENARIOS = [
    ("chunk_accepted", (1, 7), False),
    ("request_recorded", (2, 7), True),  # with a backlog of sequenced requests queued
    ("worker_dispatched", (1, 5), False),
    ("request_executed", (1, 5), False),
    ("request_started", (1, 5), False),  # running, not yet sent: not_executed, resubmitted
]
PAIRS = 3  # forward-backward + step pairs per iteration


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("kill-matrix"))
    try:
        yield gw
    finally:
        gw.cleanup()


def _run_ops(driver: Driver, first_seq: int, backlog: bool) -> list[Op]:
    seqs = list(range(first_seq, first_seq + 2 * PAIRS))
    if not backlog:
        ops = []
        for s in seqs:
            ops.append(driver.forward_backward(s) if s % 2 else driver.step(s))
        return ops
    # every call at once, newest first: the later ones wait in the queue for their turn
    with ThreadPoolExecutor(max_workers=len(seqs)) as pool:
        futs = [
            pool.submit(driver.forward_backward if s % 2 else driver.step, s)
            for s in reversed(seqs)
        ]
        return sorted((f.result() for f in futs), key=lambda o: o.seq)


def _check(ops: list[Op], stats: dict[str, Any], replayed: dict[str, str]) -> tuple[int, int]:
    executed: dict[str, int] = stats["executed"]
    completed_steps = failed = 0
    for op in ops:
        n_ids = 1 + op.resubmits  # a not_executed request is resubmitted as a new request
        assert len(op.request_ids) == n_ids, f"{op.name} seq {op.seq}: answered {op.request_ids}"
        rid = replayed[op.identity]
        assert rid in op.request_ids, f"{op.name} seq {op.seq}: a replay got another id"
        others = op.request_ids - {rid}
        assert all(executed.get(r, 0) == 0 for r in others), f"a not_executed request ran: {op}"
        assert op.status in ("completed", "failed"), op
        if op.status == "completed":
            assert executed.get(rid) == 1, f"{op.name} {rid} ran {executed.get(rid)} times"
            completed_steps += op.name == "step"
        else:
            assert op.error and op.error.get("message"), f"failed without a reason: {op}"
            assert executed.get(rid, 0) == 0, f"a failed request ran: {op}"
            failed += 1
    assert all(n == 1 for n in executed.values()), "a request ran twice"
    assert all(n == 1 for n in stats["keys"].values()), "an idempotency key ran twice"
    return completed_steps, failed


def test_kill_matrix(gateway: Gateway) -> None:
    rng = random.Random(20261129)
    gateway.start()
    c = Client(gateway.prefix_url)
    job = c.create_job(TRAIN)
    c.wait_job(job)
    train = f"{job}:training:0"
    seq, total_completed_steps, crashes, report = 1, 0, 0, []
    for it in range(ITERATIONS):
        point, (lo, hi), backlog = SCENARIOS[it % len(SCENARIOS)]
        n = rng.randrange(lo, hi)
        gateway.kill9()
        gateway.start(crash_at=f"{point}:{n}")
        driver = Driver(Client(gateway.prefix_url), job)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=1) as pool:
            fut = pool.submit(_run_ops, driver, seq, backlog)
            crashed = False
            while not fut.done():
                assert gateway.proc is not None
                if not crashed and gateway.proc.poll() is not None:
                    assert gateway.proc.returncode == 137, gateway.tail()
                    crashed = True
                    gateway.start()  # same state file, no crash point
                time.sleep(0.02)
            ops = fut.result()
        crashes += crashed
        replayed = {op.identity: driver.replay(op) for op in ops}
        stats = c.stats(gateway.base_url, job)[train]
        steps, failed = _check(ops, stats, replayed)
        total_completed_steps += steps
        assert stats["applied_steps"] == total_completed_steps, (stats, ops)
        assert c.job(job)["global_step"] == total_completed_steps
        assert c.job(job)["state"] == "running"
        report.append(
            {
                "iteration": it,
                "crash_at": f"{point}:{n}",
                "crashed": crashed,
                "ops": len(ops),
                "failed_with_reason": failed,
                "resubmitted": sum(op.resubmits for op in ops),
                "errors": sorted({str(op.error.get("message")) for op in ops if op.error}),
                "group_replays": sum(op.restarts for op in ops),
                "seconds": round(time.monotonic() - t0, 2),
            }
        )
        seq += 2 * PAIRS
    out = Path(gateway.root) / "kill_matrix.json"
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    assert crashes >= ITERATIONS - 2, f"only {crashes} of {ITERATIONS} iterations crashed: {report}"

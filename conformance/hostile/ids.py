"""Hostile ids (issue 37): every request and sub-job id — in a route's path or body, and inside an
`/operation` envelope or payload — follows the spec's id rule (PROTOCOL.md §13,
`^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$`). A path, a NUL, a space or 256 characters is refused
with `invalid_argument` naming the field, never looked up (`cancel-request` with a `request_id`
of `../../..` used to answer `request_not_found`).
"""

from __future__ import annotations

from typing import Any

from arctic_sdk.spec.tables import methods as M

from .run import Run, routes
from .wire import Answer

BAD_IDS = {
    "dotdot": "../../..",
    "slash": "job-1/../job-2",
    "absolute": "/etc/passwd",
    "leading-dot": ".hidden",
    "nul": "req\x00",
    "space": "re q",
    "newline": "req\n",
    "non-ascii": "requête",
    "too-long": "r" * 256,
}


def _named(ans: Answer, field: str) -> str:
    """'' when `ans` is `invalid_argument` naming `field`; otherwise what is wrong."""
    problem = ans.refusal()
    if problem:
        return problem
    err = ans.body["error"]
    named = (err.get("details") or {}).get("field")
    if err["code"] != "invalid_argument" or named != field:
        return f"{err['code']} naming {named!r}, not invalid_argument naming {field!r}"
    return ""


def ids(run: Run) -> None:
    """Hostile ids in `/operation` payloads and envelopes, and on the routes that take ids."""
    job, b = run.job_b, run.b
    have = routes(run)
    for name, bad in BAD_IDS.items():
        cases: list[tuple[str, Any, dict[str, Any], str]] = []  # (attack, method, body, field)
        if M.OPERATION.name in have:
            op = M.OPERATION
            cancel_op = M.CANCEL_REQUEST.operation_type
            sync_op = M.SYNC_WEIGHTS.operation_type
            cancel = {"operation_type": cancel_op, "payload": {"request_id": bad}}
            sync = {"operation_type": sync_op, "payload": {"target_sub_job_ids": [bad]}}
            source = {"operation_type": sync_op, "payload": {"source_sub_job_id": bad}}
            reset = {"operation_type": M.RESET_PREFIX_CACHE.operation_type, "sub_job_id": bad}
            cases += [
                ("operation-cancel-request", op, cancel, "payload.request_id"),
                ("operation-weight-sync-targets", op, sync, "payload.target_sub_job_ids[0]"),
                ("operation-weight-sync-source", op, source, "payload.source_sub_job_id"),
                ("operation-sub-job-id", op, reset, "sub_job_id"),
            ]
        if M.SYNC_WEIGHTS.name in have:
            body: dict[str, Any] = {"target_sub_job_ids": [bad]}
            cases.append(("sync-weights-targets", M.SYNC_WEIGHTS, body, "target_sub_job_ids[0]"))
        if M.LOAD_CHECKPOINT.name in have:
            body = {"checkpoint_id": "victim", "source_job_id": bad}
            cases.append(("load-source-job", M.LOAD_CHECKPOINT, body, "source_job_id"))
            body = {"checkpoint_id": "victim", "target_sub_job_id": bad}
            cases.append(("load-target-sub-job", M.LOAD_CHECKPOINT, body, "target_sub_job_id"))
        for attack, method, body, field in cases:
            where = f"id/{name}/{attack}"
            _note(run, where, "http", _named(b.wait(job, b.call(method, body, job=job)), field))
            if run.gb is not None:
                _note(run, where, "grpc", _named(run.gb.frames(method, job, body), field))
        if M.CANCEL_REQUEST.name in have and "/" not in bad:  # a path segment cannot hold a /
            ans = b.call(M.CANCEL_REQUEST, job=job, request_id=bad)
            _note(run, f"id/{name}/cancel-request-path", "http", _named(ans, "request_id"))


def _note(run: Run, attack: str, transport: str, problem: str) -> None:
    run.note(attack, transport, problem)

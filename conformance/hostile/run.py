"""The attack run's state: the target, the two tokens' clients and jobs, and the findings.

`start` creates one job per token (the attacks use token B against job A), `finish` cancels every
job an attack created; an attack records a `Finding` per hostile input through `Run.check`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from arctic_sdk.spec.tables import methods as M

from .wire import Answer, Grpc, Http


@dataclass
class Finding:
    attack: str
    transport: str
    problem: str  # '' = the server held

    @property
    def ok(self) -> bool:
        return not self.problem


@dataclass
class Target:
    prefix_url: str
    token: str
    alt_token: str
    job_config: dict[str, Any]
    grpc_target: str = ""
    server_pid: int = 0  # local servers: the process whose memory the burst must not grow
    openai_url: str = ""  # the root the OpenAI routes are served at ('' = not tested)


@dataclass
class Run:
    target: Target
    a: Http
    b: Http
    caps: dict[str, Any]
    job_a: str = ""
    job_b: str = ""
    ga: Grpc | None = None
    gb: Grpc | None = None
    findings: list[Finding] = field(default_factory=list)
    created: list[tuple[Http, str]] = field(default_factory=list)

    def check(self, attack: str, ans: Answer, *, openai: bool = False) -> None:
        problem = _openai_refusal(ans) if openai else ans.refusal()
        if not problem and ans.transport == "http" and ans.status == 200:
            problem = "accepted"
        self.findings.append(Finding(attack, ans.transport, problem))
        if ans.status == 200 and isinstance(ans.body, dict) and ans.body.get("job_id"):
            self.created.append((self.a, str(ans.body["job_id"])))

    def note(self, attack: str, transport: str, problem: str) -> None:
        self.findings.append(Finding(attack, transport, problem))

    @property
    def limits(self) -> dict[str, Any]:
        return dict(self.caps.get("limits") or {})


def _openai_refusal(ans: Answer) -> str:
    err = ans.body.get("error") if isinstance(ans.body, dict) else None
    if not isinstance(ans.status, int) or not 400 <= ans.status < 500:
        return f"HTTP {ans.status}, not a 4xx"
    if not isinstance(err, dict) or "message" not in err:
        return f"{ans.status} without an OpenAI error body: {str(ans.body)[:120]!r}"
    return ""


def start(target: Target) -> Run:
    a, b = Http(target.prefix_url, target.token), Http(target.prefix_url, target.alt_token)
    caps = a.call(M.GET_CAPABILITIES).body
    run = Run(target, a, b, caps)
    if target.grpc_target:
        run.ga, run.gb = (
            Grpc(target.grpc_target, target.token),
            Grpc(target.grpc_target, target.alt_token),
        )
    run.job_a, run.job_b = _job(run, a), _job(run, b)
    return run


def _job(run: Run, http: Http) -> str:
    ans = http.call(M.CREATE_JOB, run.target.job_config)
    assert ans.status == 200, f"CreateJob failed: {ans.status} {ans.body}"
    job = str(ans.body["job_id"])
    run.created.append((http, job))
    deadline = time.monotonic() + 900
    while (state := http.call(M.GET_JOB, job=job).body["job"]["state"]) != "running":
        assert state not in ("failed", "cancelled", "terminated"), f"job {job} is {state}"
        assert time.monotonic() < deadline, f"job {job} did not start"
        time.sleep(0.2)
    return job


def finish(run: Run) -> None:
    for http, job in run.created:
        http.call(M.CANCEL_JOB, job=job)
    for g in (run.ga, run.gb):
        if g is not None:
            g.close()


def routes(run: Run) -> set[str]:
    return set(run.caps.get("routes") or ())

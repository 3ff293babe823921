"""The server under test: its capabilities and derived features, the wire, jobs and polls.

One `Session` per run. It reads `GET {prefix}/capabilities` once (always over HTTP), derives the
features cases can require, opens the transport, creates the shared job lazily, answers polls
and cancels every job the run created at the end.
"""

from __future__ import annotations

import copy
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import requests

import dssst1
from arctic_sdk.spec.tables import methods as M

from .http_wire import HttpWire
from .wire import Call, Reply

if TYPE_CHECKING:  # grpc is imported only for --transport grpc: HTTP runs without it
    from .grpc_wire import GrpcWire

DEFAULT_PREFIX = "/api/v2/databases/conformance/schemas/conformance/cortex-training"
DEFAULT_JOB_CONFIG: dict[str, Any] = {
    "experiment_name": "arctic-conformance",
    "comment": "created by the arctic.v1 conformance suite; cancelled when it ends",
    "labels": {"arctic-conformance": "1"},
    "sub_job_configs": [
        {"job_type": "training", "model_name": "Qwen/Qwen2.5-0.5B-Instruct"},
        {"job_type": "sampling", "model_name": "Qwen/Qwen2.5-0.5B-Instruct"},
    ],
}
TERMINAL_JOB = ("cancelled", "terminated", "failed")
AUTH_CODES = ("unauthenticated", "permission_denied")
NOTICE_EVERY_S = 30.0  # a pending job's reason is repeated this often while it waits
JOB_ORDER = ("pending", "placing", "initializing", "running")
_LIMIT = re.compile(r"^limit:(\w+)(<=|>=|==)(\d+)$")


class SetupError(Exception):
    """The run cannot go on (no capabilities, no job, no grpc for --transport grpc)."""


GRPC_MISSING = (
    "--transport grpc needs the grpc package (grpcio), which is not installed in this "
    'environment: pip install "arctic-sdk[grpc]" (the HTTP suite runs without it)'
)


def _grpc_wire_class() -> type[GrpcWire]:
    try:
        from .grpc_wire import GrpcWire
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "grpc":
            raise
        raise SetupError(f"{GRPC_MISSING} [{exc}]") from exc
    return GrpcWire


@dataclass
class RunConfig:
    target: str
    transport: str = "http"
    token: str | None = None
    alt_token: str | None = None
    grpc_target: str | None = None
    job_id: str | None = None
    job_config: dict[str, Any] | None = None
    admin: bool | None = None  # None: use the fake's admin API when the target has one
    timeout: float = 60.0
    job_timeout: float = 600.0
    max_wait: float = 10.0  # the longest a case may wait on a server timer (gap timeout)
    poll_interval: float = 0.05


def prefix_url(target: str) -> str:
    parts = urllib.parse.urlsplit(target)
    if parts.path in ("", "/"):
        return target.rstrip("/") + DEFAULT_PREFIX
    return target.rstrip("/")


@dataclass
class Job:
    job_id: str
    sub: dict[str, str] = field(default_factory=dict)
    states: list[str] = field(default_factory=list)


class Session:
    def __init__(self, cfg: RunConfig, notice: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.notice = notice or (lambda text: None)  # progress lines (pending reasons)
        self.prefix = prefix_url(cfg.target)
        self.http = HttpWire(self.prefix, timeout=cfg.timeout)
        self.capabilities: dict[str, Any] = {}
        self.features: set[str] = set()
        self.limits: dict[str, int] = {}
        self.capacity: dict[str, Any] = {}
        self.unlisted: list[str] = []
        self.wire: HttpWire | GrpcWire = self.http
        self.created: list[str] = []
        self._shared: Job | None = None
        self._shared_error: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ setup

    def start(self) -> None:
        grpc_wire = _grpc_wire_class() if self.cfg.transport == "grpc" else None
        reply = self.http.send(Call(M.GET_CAPABILITIES, timeout=self.cfg.timeout))[0]
        if reply.is_error or not isinstance(reply.body, Mapping):
            raise SetupError(
                f"GET {self.prefix}/capabilities: {reply.describe_status()} {reply.received}"
            )
        caps = dict(reply.body)
        self.capabilities = caps
        feats = caps.get("features") or {}
        self.limits = {
            k: int(v) for k, v in (caps.get("limits") or {}).items() if isinstance(v, int | float)
        }
        f = self.features
        f.update(f"route:{r}" for r in caps.get("routes") or [])
        f.update(f"operation_type:{t}" for t in caps.get("operation_types") or [])
        f.update(k for k, v in feats.items() if v is True)
        lora = caps.get("lora") or {}  # LoraSupport (PROTOCOL.md §3.6)
        f.update(f"lora:{k}" for k, v in lora.items() if v is True)
        if lora.get("training") and lora.get("sampling") and not lora.get("sampler_embeddings"):
            # such adapters are refused with a sampler, unless syncs merge and push them
            f.add("lora:no_sampler_embeddings" if not lora.get("merged_sync") else "lora:merged")
        if not lora.get("training"):
            f.add("lora:none")
        listed = {r.removeprefix("route:") for r in f if r.startswith("route:")}
        self.unlisted = [m.name for m in M.METHODS if m.name not in listed]
        if self.unlisted:
            f.add("unlisted_route")
        self._check_token()
        if self.cfg.token:
            f.add("auth")
        if self.cfg.alt_token:
            f.add("alt_token")
        gap = self.limits.get("sequence_gap_timeout_seconds", 0)
        if 0 < gap <= self.cfg.max_wait:
            f.add("short_gap_timeout")
        if self._admin_available():
            f.add("admin")
        if f"route:{M.GET_CAPACITY.name}" in f:
            cap = self.http.send(
                Call(M.GET_CAPACITY, headers=self.auth_headers("default"), timeout=self.cfg.timeout)
            )[0]
            if not cap.is_error and isinstance(cap.body, Mapping):
                self.capacity = dict(cap.body)
                if cap.body.get("has_reservation") and int(cap.body.get("max_total_gpus") or 0):
                    f.add("capacity")
        if grpc_wire is not None:
            self.wire = grpc_wire(self._grpc_target(feats), timeout=self.cfg.timeout)

    def _check_token(self) -> None:
        """Stop at once, naming `--token`, when the server refuses the run's token (or wants one
        and none was given): every case would fail with its own HTTP 401 otherwise."""
        headers = self.auth_headers("default")
        reply = self.http.send(Call(M.LIST_JOBS, headers=headers, timeout=self.cfg.timeout))[0]
        if reply.status not in (401, 403) and reply.code not in AUTH_CODES:
            return
        said = f"{reply.describe_status()} to {M.LIST_JOBS.http_method} {M.LIST_JOBS.http_path}"
        if not self.cfg.token:
            raise SetupError(
                f"the server wants a token ({said} without one): pass --token PAT, a token it "
                "accepts (for the fake: the --token it was started with)"
            )
        raise SetupError(
            f"the server refused --token ({said}): pass --token with a token it accepts"
        )

    def _grpc_target(self, feats: Mapping[str, Any]) -> str:
        if self.cfg.grpc_target:
            return self.cfg.grpc_target
        port = int(feats.get("grpc_port") or 0)
        if not feats.get("grpc") or not port:
            raise SetupError(
                "--transport grpc: the capabilities advertise no grpc_port; "
                "pass --grpc-target HOST:PORT"
            )
        host = urllib.parse.urlsplit(self.prefix).hostname or "127.0.0.1"
        return f"{host}:{port}"

    def origin(self) -> str:
        parts = urllib.parse.urlsplit(self.prefix)
        return f"{parts.scheme}://{parts.netloc}"

    def _admin_available(self) -> bool:
        if self.cfg.admin is False:
            return False
        if self.cfg.admin is None and self.capabilities.get("server") != "fake":
            return False
        try:
            r = requests.get(
                self.origin() + "/_admin/jobs", headers=self.auth_headers("default"), timeout=5
            )
            return r.status_code == 200 and "jobs" in r.json()
        except (requests.RequestException, ValueError):
            return False

    def has(self, feature: str) -> bool:
        m = _LIMIT.match(feature)
        if m:
            value = self.limits.get(m.group(1))
            if value is None:
                return False
            bound = int(m.group(3))
            return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[m.group(2)]
        return feature in self.features

    def close(self) -> None:
        self.wire.close()
        if self.wire is not self.http:
            self.http.close()

    # ------------------------------------------------------------------ auth

    def auth_headers(self, mode: str) -> dict[str, str]:
        token = {
            "default": self.cfg.token,
            "alt": self.cfg.alt_token,
            "wrong": "conformance-wrong-token",
            "none": None,
        }[mode]
        return {"authorization": f"Bearer {token}"} if token else {}

    # ------------------------------------------------------------------ calls and polls

    def send(self, call: Call) -> list[Reply]:
        return self.wire.send(call)

    def poll(
        self,
        job_id: str,
        request_id: str,
        headers: Mapping[str, str],
        query: Mapping[str, Any] | None = None,
        accept: str | None = None,
    ) -> Reply:
        """GetRequest for `request_id`; `accept` repeats the original call's Accept header, so a
        call that asked for octet results gets them on its polls too (PROTOCOL.md §3.3)."""
        call = Call(
            M.GET_REQUEST,
            job_id=job_id,
            params={"request_id": request_id},
            headers=dict(headers),
            query=dict(query or {}),
            timeout=self.cfg.timeout,
            accept=accept,
        )
        return normalize(self.send(call)[-1])

    def wait_terminal(
        self,
        job_id: str,
        first: Reply,
        headers: Mapping[str, str],
        deadline: float | None = None,
        accept: str | None = None,
    ) -> Reply:
        """Poll a submitted or running request until its status is terminal."""
        reply = first
        rid = request_id_of(first)
        delay = self.cfg.poll_interval
        end = deadline or (time.monotonic() + self.cfg.timeout)
        while rid and not reply.is_error and not is_terminal(reply):
            if time.monotonic() > end:
                reply.decode_error = f"still {status_of(reply)} after {self.cfg.timeout:g} s"
                return reply
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
            reply = self.poll(job_id, rid, headers, accept=accept)
        return reply

    # ------------------------------------------------------------------ jobs

    def job_body(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = copy.deepcopy(self.cfg.job_config or DEFAULT_JOB_CONFIG)
        for key, value in (overrides or {}).items():
            if key in ("sub_jobs", "training_sub_job"):  # merged into sub-job configs
                for sub in body.get("sub_job_configs", []):
                    training = str(sub.get("job_type", "")).lower().endswith("training")
                    if key == "training_sub_job" and not training:
                        continue
                    own = "training_config" if training else "inference_config"
                    sub.setdefault(own, {}).update(value)
            else:
                body[key] = value
        return body

    def create_job(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Reply:
        call = Call(
            M.CREATE_JOB,
            headers=dict(headers),
            json_body=dict(body),
            has_json=True,
            timeout=self.cfg.timeout,
        )
        reply = self.send(call)[-1]
        if not reply.is_error and isinstance(reply.body, Mapping) and reply.body.get("job_id"):
            with self._lock:
                self.created.append(str(reply.body["job_id"]))
        return reply

    def get_job(self, job_id: str, headers: Mapping[str, str]) -> Reply:
        return self.send(
            Call(M.GET_JOB, job_id=job_id, headers=dict(headers), timeout=self.cfg.timeout)
        )[-1]

    def wait_job(
        self,
        job_id: str,
        headers: Mapping[str, str],
        until: str = "running",
        timeout: float | None = None,
    ) -> tuple[Reply, list[str]]:
        """Poll GetJob until the job is `until` (or terminal); answer the last reply and the
        states seen, in order, without repeats."""
        seen: list[str] = []
        start = time.monotonic()
        end = start + (timeout or self.cfg.job_timeout)
        delay = self.cfg.poll_interval
        said, said_at = "", 0.0
        while True:
            reply = self.get_job(job_id, headers)
            state = job_state(reply)
            if state and (not seen or seen[-1] != state):
                seen.append(state)
            reason = job_reason(reply)
            now = time.monotonic()
            due = reason != said or now - said_at >= NOTICE_EVERY_S
            if state == "pending" and reason and due:
                self.notice(f"job {job_id} pending ({now - start:.0f} s): {reason}")
                said, said_at = reason, now
            if reply.is_error or state == until or state in TERMINAL_JOB:
                return reply, seen
            if time.monotonic() > end:
                why = f" ({reason})" if reason else ""
                reply.decode_error = f"job {job_id} still {state} after {end - start:g} s{why}"
                return reply, seen
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def running_job(self, job_id: str, headers: Mapping[str, str]) -> Job:
        reply, seen = self.wait_job(job_id, headers)
        if job_state(reply) != "running":
            raise SetupError(
                f"job {job_id} did not reach running: {reply.describe_status()} "
                f"{reply.decode_error or reply.received}"
            )
        job = Job(job_id, states=seen)
        for sub in (reply.body.get("job") or {}).get("sub_jobs") or []:
            role = str(sub.get("job_type", "")).lower().removeprefix("sub_job_type_")
            job.sub.setdefault(role, str(sub.get("sub_job_id", "")))
        return job

    def new_job(self, overrides: Mapping[str, Any] | None = None) -> Job:
        headers = self.auth_headers("default")
        reply = self.create_job(self.job_body(overrides), headers)
        if reply.is_error or not isinstance(reply.body, Mapping):
            raise SetupError(f"CreateJob: {reply.describe_status()} {reply.received}")
        return self.running_job(str(reply.body["job_id"]), headers)

    def shared_job(self) -> Job:
        with self._lock:
            if self._shared is not None:
                return self._shared
            if self._shared_error is not None:
                raise SetupError(self._shared_error)
        try:
            job = (
                self.running_job(self.cfg.job_id, self.auth_headers("default"))
                if self.cfg.job_id
                else self.new_job()
            )
        except SetupError as exc:
            self._shared_error = f"the shared job: {exc}"
            raise SetupError(self._shared_error) from None
        self._shared = job
        return job

    def cancel(self, job_id: str, auth: str = "default") -> Reply:
        return self.send(
            Call(
                M.CANCEL_JOB,
                job_id=job_id,
                headers=self.auth_headers(auth),
                timeout=self.cfg.timeout,
            )
        )[-1]

    def cleanup(self) -> list[str]:
        """Cancel every job this run created; answer the problems."""
        problems = []
        for job_id in dict.fromkeys(self.created):
            reply = self.cancel(job_id)
            if reply.code == "job_not_found" and self.cfg.alt_token:  # a job of the alt token
                reply = self.cancel(job_id, "alt")
            if reply.is_error and reply.code not in ("job_terminal", "job_not_found"):
                problems.append(f"cancel {job_id}: {reply.describe_status()}")
        return problems

    def admin(self, path: str) -> Reply:
        url = self.origin() + "/_admin" + path
        reply = Reply("http", sent=f"GET {url}")
        try:
            r = requests.get(url, headers=self.auth_headers("default"), timeout=self.cfg.timeout)
        except requests.RequestException as exc:
            reply.transport_error = str(exc)
            return reply
        reply.status = r.status_code
        try:
            reply.body = r.json()
        except ValueError:
            reply.body = r.content
        return reply


# ---------------------------------------------------------------------------- RequestStatus


def is_envelope(value: Any) -> bool:
    return isinstance(value, Mapping) and "payload_b64" in value and "wire_format" in value


def normalize(reply: Reply) -> Reply:
    """Decode an inline result envelope in place (HTTP JSON answers)."""
    body = reply.body
    if reply.is_error or not isinstance(body, dict) or not is_envelope(body.get("result")):
        return reply
    try:
        body["result"] = dssst1.loads(dssst1.decode_inline_envelope(body["result"]))
    except (dssst1.DSSError, ValueError) as exc:
        reply.decode_error = f"result envelope does not decode: {exc}"
    return reply


def request_id_of(reply: Reply) -> str:
    body = reply.body
    return str(body.get("request_id") or "") if isinstance(body, Mapping) else ""


def status_of(reply: Reply) -> str:
    body = reply.body
    if reply.status == 202:
        return "pending"
    return str(body.get("status", "")) if isinstance(body, Mapping) else ""


def is_terminal(reply: Reply) -> bool:
    return reply.status != 202 and status_of(reply) in ("completed", "failed", "cancelled")


def job_reason(reply: Reply) -> str:
    """The job's `reason` (why it is pending, failed or cancelled), "" when none."""
    if reply.is_error or not isinstance(reply.body, Mapping):
        return ""
    job = reply.body.get("job")
    return str(job.get("reason") or "") if isinstance(job, Mapping) else ""


def job_state(reply: Reply) -> str:
    body = reply.body
    if reply.is_error or not isinstance(body, Mapping):
        return ""
    job = body["job"] if isinstance(body.get("job"), Mapping) else body
    return str(job.get("state", "")).lower().removeprefix("job_state_")

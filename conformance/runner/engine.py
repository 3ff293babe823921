"""Running one case: its job, its steps (call, join, admin, create_job, wait_job, sleep), and
the checks of every step's `expect`. The first failed check ends the case with its difference
and the request and response that showed it.
"""

from __future__ import annotations

import time
import traceback
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import dssst1
from arctic_sdk.spec.model import BodyKind, GrpcShape, MethodInfo
from arctic_sdk.spec.tables import methods as M

from . import matchers
from .expectations import check_reply
from .model import SAVE, Case, Step
from .openai_wire import refusal_of_any
from .session import Job, Session, SetupError, job_state, normalize
from .values import CaseDataError, Scope, build, get_path, summarize
from .vectors import rename_groups
from .wire import Call, ChunkPlan, Reply, build_frame, chunk_frames


class CaseFailed(Exception):
    def __init__(self, difference: str, detail: str = "") -> None:
        super().__init__(difference)
        self.difference = difference
        self.detail = detail


class CaseSkipped(Exception):
    pass


REFUSED_NOTE = "refused by name"  # the note of a case passed by an `or_refuses` refusal


class RefusedByName(Exception):
    """A step's `or_refuses` field was refused by name: the server does not offer it, and says
    so; the case passes without its remaining steps (a note says which field)."""


@dataclass
class CaseResult:
    case: Case
    transport: str
    outcome: str  # pass | fail | skip | error (known-failing turns fail/pass into xfail/xpass)
    difference: str = ""
    detail: str = ""
    duration: float = 0.0
    step: int | None = None
    notes: tuple[str, ...] = ()


def _whole(value: Any) -> Any:
    """A float var that is a whole number (`${limit / 512 + 1}`) as an int (a dimension)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class CaseRun:
    def __init__(self, session: Session, case: Case, pool: ThreadPoolExecutor) -> None:
        self.s = session
        self.case = case
        self.pool = pool
        self.background: dict[str, Future[Reply]] = {}
        self.notes: list[str] = []
        self.scope = Scope(
            case.vars,
            {
                "prefix": session.prefix,
                "token": session.cfg.token or "",
                "limits": dict(session.limits),
                "capacity": dict(session.capacity),
                "op_names": sorted(M.BY_NAME),
                "transport": session.cfg.transport,
                "unlisted_op": session.unlisted[0] if session.unlisted else "",
                "prefix_path": urllib.parse.urlsplit(session.prefix).path,
            },
        )
        # vars may be templates on the server's limits (`${limits.max_inline_result_bytes / 512}`)
        self.vars = {k: _whole(self.scope.expand(v)) for k, v in case.vars.items()}
        for k, v in self.vars.items():
            self.scope.set(k, v)

    # ------------------------------------------------------------------ case

    def run(self) -> CaseResult:
        start = time.monotonic()
        case, transport = self.case, self.s.cfg.transport
        missing = [f for f in case.features if not self.s.has(f)]
        if transport not in case.transports:
            return CaseResult(case, transport, "skip", f"not run over {transport}")
        if missing:
            return CaseResult(case, transport, "skip", f"needs {', '.join(missing)}")
        fresh: Job | None = None
        index = 0
        try:
            if case.job == "shared":
                self._use_job(self.s.shared_job())
            elif case.job == "fresh":
                fresh = self.s.new_job()
                self._use_job(fresh)
            for step in case.steps:
                index += 1
                self.step(step)
            for fut in self.background.values():  # never leave a call running
                fut.result(timeout=self.s.cfg.timeout * 2)
            outcome, diff, detail = "pass", "", ""
        except CaseFailed as exc:
            outcome, diff, detail = "fail", exc.difference, exc.detail
        except CaseSkipped as exc:
            outcome, diff, detail = "skip", str(exc), ""
        except RefusedByName as exc:
            outcome, diff, detail = "pass", "", ""
            self.notes.append(str(exc))
        except SetupError as exc:
            outcome, diff, detail = "error", str(exc), ""
        except CaseDataError as exc:
            outcome, diff, detail = "error", f"case data: {exc}", ""
        except Exception as exc:  # a runner bug or an answer it cannot read: never stop the run
            outcome, diff = "error", f"runner error: {type(exc).__name__}: {exc}"
            detail = traceback.format_exc(limit=6)
        finally:
            if fresh is not None:
                self.s.cancel(fresh.job_id)
        step_no = index if outcome in ("fail", "error", "skip") and index else None
        return CaseResult(
            case,
            transport,
            outcome,
            diff,
            detail,
            time.monotonic() - start,
            step_no,
            tuple(self.notes),
        )

    def _use_job(self, job: Job) -> None:
        self.scope.set("job", job.job_id)
        self.scope.set("sub", dict(job.sub))
        self.scope.set("job_states", list(job.states))

    # ------------------------------------------------------------------ steps

    def step(self, step: Step) -> None:
        spec = step.spec
        if step.kind == "sleep":
            time.sleep(float(spec["sleep"]))
            return
        if step.kind == "join":
            fut = self.background.pop(str(spec["join"]))
            reply = fut.result(timeout=self.s.cfg.timeout * 2)
            self.finish(spec, reply)
            return
        if step.kind == "admin":
            if not self.s.has("admin"):
                self.notes.append("admin checks skipped (no admin API)")
                return
            job = self.scope.expand(spec.get("job", "${job}"))
            self.finish(spec, self.s.admin(f"/jobs/{job}/{spec['admin']}"))
            return
        if step.kind == "create_job":
            self.create_job(spec)
            return
        if step.kind == "wait_job":
            job_id = str(self.scope.expand(spec["wait_job"]))
            until = str(spec.get("state", "running"))
            timeout = float(spec.get("timeout") or self.s.cfg.job_timeout)
            reply, seen = self.s.wait_job(job_id, self.s.auth_headers("default"), until, timeout)
            self.scope.set("states", seen)
            self.finish(spec, reply)
            return
        call = self.build_call(spec)
        if spec.get("background"):
            self.background[str(spec["background"])] = self.pool.submit(self.execute, call, spec)
            time.sleep(0.05)  # let it reach the server before the next step
            return
        self.finish(spec, self.execute(call, spec))

    def finish(self, spec: Mapping[str, Any], reply: Reply) -> None:
        field = (spec.get("expect") or {}).get("or_refuses")
        if field and reply.transport_error is None and 400 <= (reply.status or 0) < 500:
            problem = refusal_of_any(reply, field)
            if problem is not None:
                raise CaseFailed(
                    f"neither honoured nor refused by name: {problem}", reply.display()
                )
            message = str((reply.error or {}).get("message", ""))[:160]
            raise RefusedByName(f"{REFUSED_NOTE}: {field} ({message})")
        difference = self.check(spec.get("expect") or {}, reply)
        if difference is not None:
            raise CaseFailed(difference, reply.display())
        skip = spec.get("skip_unless")
        if skip:
            unmet = matchers.check_fields(skip["fields"], reply.body, self.scope, self.vars)
            if unmet is not None:
                reason = skip.get("reason", "the server did not set up the condition")
                raise CaseSkipped(f"{reason} ({unmet})")
        for name, path in (spec.get(SAVE) or {}).items():
            self.scope.set(str(name), self._saved(reply, str(self.scope.expand(path))))

    def _saved(self, reply: Reply, path: str) -> Any:
        if path == "$body":
            return reply.body
        if path.startswith("$header."):
            return reply.headers.get(path[8:].lower())
        found = get_path(reply.body, path)
        if not found:
            raise CaseFailed(f"save: {path} is not in the answer", reply.display())
        return found[0]

    def create_job(self, spec: Mapping[str, Any]) -> None:
        overrides = self.scope.expand(spec.get("overrides") or {})
        headers = self.s.auth_headers(str(spec.get("auth", "default")))
        for k, v in self.scope.expand(spec.get("headers") or {}).items():
            headers[str(k).lower()] = str(v)
        reply = self.s.create_job(self.s.job_body(overrides), headers)
        name = str(spec["create_job"])
        if not reply.is_error and isinstance(reply.body, Mapping):
            job_id = str(reply.body.get("job_id", ""))
            self.scope.set(name, job_id)
            if spec.get("wait", "running") == "running":
                wait_reply, seen = self.s.wait_job(job_id, headers)
                self.scope.set(f"{name}_states", seen)
                if job_state(wait_reply) != "running":
                    raise CaseFailed(
                        f"job {job_id} did not reach running (states {seen})", wait_reply.display()
                    )
        self.finish(spec, reply)

    # ------------------------------------------------------------------ calls

    def build_call(self, spec: Mapping[str, Any]) -> Call:
        grpc = self.s.cfg.transport == "grpc"
        raw_http = spec.get("http")
        op = str(self.scope.expand(spec["call"]))
        if not raw_http and op not in M.BY_NAME:
            raise CaseDataError(f"call: {op!r} is not an op of the method table")
        method: MethodInfo | None = None if raw_http else M.BY_NAME[op]
        if raw_http and grpc:
            raise CaseDataError("a step with `http:` runs over HTTP only (transports: [http])")
        job = spec.get("job", "${job}" if method is None or method.job_scoped else "none")
        job_id = None if job == "none" else str(self.scope.expand(job))
        headers = self.s.auth_headers(str(spec.get("auth", "default")))
        for k, v in self.scope.expand(spec.get("headers") or {}).items():
            headers[str(k).lower()] = str(v)
        params = self.scope.expand(spec.get("params") or {})
        call = Call(
            method,
            job_id=job_id,
            headers=headers,
            params={k: str(v) for k, v in params.items()},
            query=dict(self.scope.expand(spec.get("query") or {})),
            timeout=float(spec.get("timeout") or self.s.cfg.timeout),
            accept=spec.get("accept"),
            content_type=spec.get("content_type"),
            grpc_path=spec.get("grpc_path"),
        )
        if raw_http:
            call.http_method = str(raw_http["method"])
            call.http_path = str(self.scope.expand(raw_http["path"]))
        if "content_length" in spec:
            call.content_length = int(self.scope.expand(spec["content_length"]))
        if "raw" in spec:
            self._raw(call, spec["raw"])
        elif "body" in spec and method is None:  # a raw route's body is JSON (openai/*)
            call.json_body = build(self.scope.expand(spec["body"]), self.vars)
            call.has_json = True
        elif "body" in spec or method is not None:
            self._body(call, method, spec)
        return call

    def _raw(self, call: Call, raw: Mapping[str, Any]) -> None:
        if "frames" in raw:
            call.frames = rename_groups([bytes(f) for f in raw["frames"]])
            return
        if "socket" in raw:  # HTTP only: these exact bytes on a fresh connection
            if self.s.cfg.transport == "grpc":
                raise CaseDataError("raw: {socket} runs over HTTP only (transports: [http])")
            call.socket_bytes = str(self.scope.expand(raw["socket"])).encode("latin-1")
            return
        if "hex" in raw:
            data = bytes.fromhex(str(raw["hex"]))
        elif "text" in raw:
            data = str(self.scope.expand(raw["text"])).encode()
        elif "zeros" in raw:
            data = bytes(int(self.scope.expand(raw["zeros"])))
        else:
            data = dssst1.dumps(build(self.scope.expand(raw["frame"]), self.vars))
        if self.s.cfg.transport == "grpc":
            call.frames = [data]
        else:
            call.raw_body = data

    def _body(self, call: Call, method: MethodInfo | None, spec: Mapping[str, Any]) -> None:
        assert method is not None
        body = self.scope.expand(spec.get("body")) if "body" in spec else None
        grpc = self.s.cfg.transport == "grpc"
        framed = method.body is BodyKind.DSSST1 or (grpc and method.grpc_shape is GrpcShape.FRAMES)
        if not framed:
            if body is not None:
                call.json_body, call.has_json = build(body, self.vars), True
            return
        if isinstance(body, Mapping) and set(body) == {"frame_bytes"}:
            frame = bytes(body["frame_bytes"])
        elif isinstance(body, Mapping) and set(body) == {"frame"}:
            frame = build_frame(body["frame"])
        else:
            value = build(body, self.vars) if body is not None else {}
            if grpc and isinstance(value, dict):  # path parameters are body fields (§4.2)
                value = {**{k: v for k, v in call.params.items() if k != "job_id"}, **value}
            frame = dssst1.dumps(value)
            call.summary = summarize(value, 300)
        chunks = self.scope.expand(spec.get("chunks") or {})
        plan = ChunkPlan(
            count=chunks.get("count"),
            order=chunks.get("order"),
            corrupt=frozenset(chunks.get("corrupt") or ()),
            group=str(chunks.get("group") or self.scope.lookup("uuid")),
            operation=chunks.get("operation", method.name),
            overrides=chunks.get("overrides") or {},
            crc=bool(chunks.get("crc")),
            bad_crc=frozenset(chunks.get("bad_crc") or ()),
        )
        call.frames = chunk_frames(frame, plan)

    def execute(self, call: Call, spec: Mapping[str, Any]) -> Reply:
        replies = self.s.send(call)
        reply = normalize(replies[-1])
        method = call.method
        if method is M.CREATE_JOB and isinstance(reply.body, Mapping) and not reply.is_error:
            self.s.created.append(str(reply.body.get("job_id", "")))  # cancelled at the end
        if method is M.DOWNLOAD_CHECKPOINT_FILE and not reply.is_error:
            reply.body = file_bytes(reply.body)
        data_plane = method is not None and method.grpc_shape is not GrpcShape.UNARY
        wait = spec.get("wait", data_plane and method is not M.GET_REQUEST)
        if data_plane and wait and not reply.is_error and call.job_id:
            reply = self.s.wait_terminal(call.job_id, reply, call.headers, accept=call.accept)
        if data_plane and spec.get("drain", wait) and not reply.is_error and call.job_id:
            reply = self.drain(call, reply)
        if isinstance(reply.body, Mapping) and not reply.decode_error:
            reply.received = summarize(reply.body)  # results decoded, events drained
        reply.request_status = (
            data_plane
            and isinstance(reply.body, Mapping)
            and ("status" in reply.body and "request_id" in reply.body)
        )
        return reply

    def drain(self, call: Call, reply: Reply) -> Reply:
        """Page through result_chunk events with the cursor; put the result in place."""
        body = reply.body
        if not isinstance(body, dict) or (not body.get("next_cursor") and not body.get("events")):
            return reply
        events = list(body.get("events") or [])
        cursor = body.get("next_cursor")
        rid = str(body.get("request_id", ""))
        seen: set[str] = set()
        while cursor:
            if cursor in seen:
                reply.decode_error = f"next_cursor {cursor!r} came back twice: the events loop"
                return reply
            seen.add(str(cursor))
            page = self.s.poll(
                call.job_id or "", rid, call.headers, {"cursor": cursor}, accept=call.accept
            )
            if page.is_error or not isinstance(page.body, Mapping):
                return page
            events += list(page.body.get("events") or [])
            cursor = page.body.get("next_cursor")
        chunks = [e for e in events if isinstance(e, Mapping) and e.get("type") == "result_chunk"]
        if chunks and body.get("result") is None:
            try:
                body["result"] = dssst1.loads(dssst1.assemble_result_events(chunks))
            except (dssst1.DSSError, ValueError) as exc:
                reply.decode_error = f"the result_chunk events do not assemble: {exc}"
        body["events"] = events
        return reply

    # ------------------------------------------------------------------ checks

    def check(self, expect: Mapping[str, Any], reply: Reply) -> str | None:
        return check_reply(expect, reply, self.scope, self.vars)


def file_bytes(value: Any) -> Any:
    """A downloaded file: raw bytes (HTTP), or `{"data", "offset"}` values (gRPC frames)."""
    parts = value if isinstance(value, list) else [value]
    if not all(isinstance(p, Mapping) and "data" in p for p in parts):
        return value
    ordered = sorted(parts, key=lambda p: int(p.get("offset") or 0))
    return b"".join(
        bytes(memoryview(p["data"]).cast("B")) if not isinstance(p["data"], bytes) else p["data"]
        for p in ordered
    )


__all__ = ["REFUSED_NOTE", "CaseFailed", "CaseResult", "CaseRun"]

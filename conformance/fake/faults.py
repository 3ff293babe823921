"""Fault injection of the fake gateway: the registry, and its HTTP and gRPC enforcement.

A fault is armed for the next `count` calls of one op (`route`, a canonical op name or `*`) on
one transport. Kinds (conformance/README.md, "Fake gateway"):

- `fail`: answer `status` with `body` (default: the spec's error body of the status) at once;
  nothing executes.
- `delay`: wait `delay_s`, then handle the call normally.
- `drop_after_execute`: handle the call (it executes), then close the connection without an
  answer (HTTP) or end it with UNAVAILABLE (gRPC).
- `close_mid_body`: handle the call, send the status line, headers with the full
  Content-Length and the first half of the body, then close (HTTP); over gRPC send the first half
  of the answer frames, then UNAVAILABLE.
- `reorder`: hold the next `count` calls until all of them arrived (or `delay_s`, default 2 s,
  passed since the first), then release them in reverse arrival order, `gap_s` apart.

Every fault counts the calls it hit (`fired`), and every hit is appended to the registry's log.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from arctic_sdk.spec.tables import methods as M
from arctic_sdk.spec.tables.error_codes import ERRORS
from arctic_servers.rules.errors import ProtocolError

KINDS = ("fail", "delay", "drop_after_execute", "close_mid_body", "reorder")
TRANSPORTS = ("http", "grpc", "any")
_FIELDS = {
    "route",
    "kind",
    "count",
    "status",
    "body",
    "delay_s",
    "transport",
    "gap_s",
    "retry_after_s",
}


@dataclass
class ReorderBatch:
    """The calls a `reorder` fault is holding."""

    expected: int
    held: list[asyncio.Future[None]] = field(default_factory=list)
    releasing: bool = False


@dataclass
class Fault:
    fault_id: int
    route: str
    kind: str
    count: int
    transport: str = "any"
    status: int = 503
    body: dict[str, Any] | None = None
    delay_s: float = 0.0
    gap_s: float = 0.02
    retry_after_s: float | None = None
    fired: int = 0
    batch: ReorderBatch | None = None

    @property
    def remaining(self) -> int:
        return self.count - self.fired

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.fault_id,
            "route": self.route,
            "kind": self.kind,
            "count": self.count,
            "transport": self.transport,
            "status": self.status,
            "body": self.body,
            "delay_s": self.delay_s,
            "gap_s": self.gap_s,
            "retry_after_s": self.retry_after_s,
            "fired": self.fired,
            "remaining": self.remaining,
        }

    def error(self) -> ProtocolError:
        """The error a `fail` fault answers (its status picks the code; `body` overrides)."""
        code = next((c for c, e in ERRORS.items() if e.http_status == self.status), "internal")
        details: dict[str, Any] = {"injected": True, "fault_id": self.fault_id}
        if self.retry_after_s is not None:
            details["retry_after_s"] = self.retry_after_s
        return ProtocolError(code, f"injected fault {self.fault_id} ({self.kind})", **details)

    def error_body(self) -> dict[str, Any]:
        return self.body if self.body is not None else self.error().body()


def _bad(field_name: str, message: str) -> ProtocolError:
    return ProtocolError("invalid_argument", f"field {field_name}: {message}", field=field_name)


class FaultRegistry:
    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.log: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    def add(self, spec: dict[str, Any]) -> Fault:
        """Arm a fault from its JSON description (the admin API's POST body)."""
        unknown = sorted(set(spec) - _FIELDS)
        if unknown:
            raise _bad(unknown[0], f"unknown field(s) {unknown}; expected {sorted(_FIELDS)}")
        route = spec.get("route")
        if route != "*":
            method = M.BY_NAME.get(str(route)) or M.BY_ALIAS.get(str(route))
            if method is None:
                raise _bad("route", f"{route!r} is not an op name (or '*')")
            route = method.name
        kind = spec.get("kind")
        if kind not in KINDS:
            raise _bad("kind", f"{kind!r} is not one of {list(KINDS)}")
        transport = spec.get("transport", "any")
        if transport not in TRANSPORTS:
            raise _bad("transport", f"{transport!r} is not one of {list(TRANSPORTS)}")
        count = spec.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise _bad("count", f"{count!r} is not an integer >= 1")
        status = spec.get("status", 503)
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise _bad("status", f"{status!r} is not an HTTP error status (400-599)")
        body = spec.get("body")
        if body is not None and not isinstance(body, dict):
            raise _bad("body", "must be a JSON object")
        nums = {}
        for name, default in (
            ("delay_s", 2.0 if kind == "reorder" else 0.0),
            ("gap_s", 0.02),
            ("retry_after_s", None),
        ):
            v = spec.get(name, default)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v < 0):
                raise _bad(name, f"{v!r} is not a number >= 0")
            nums[name] = v
        fault = Fault(
            next(self._ids),
            str(route),
            kind,
            count,
            transport,
            status,
            body,
            float(nums["delay_s"] or 0.0),
            float(nums["gap_s"] or 0.0),
            nums["retry_after_s"],
        )
        self.faults.append(fault)
        return fault

    def take(self, op: str, transport: str) -> Fault | None:
        """The first armed fault for this call, which is counted as fired."""
        for f in self.faults:
            if f.remaining > 0 and f.route in (op, "*") and f.transport in (transport, "any"):
                f.fired += 1
                self.log.append(
                    {
                        "fault_id": f.fault_id,
                        "kind": f.kind,
                        "route": op,
                        "transport": transport,
                        "at": time.time(),
                    }
                )
                return f
        return None

    def clear(self) -> None:
        for f in self.faults:
            if f.batch is not None:
                for fut in f.batch.held:
                    if not fut.done():
                        fut.set_result(None)
        self.faults.clear()
        self.log.clear()

    def remove(self, fault_id: int) -> bool:
        for f in self.faults:
            if f.fault_id == fault_id:
                self.faults.remove(f)
                return True
        return False

    def to_json(self) -> dict[str, Any]:
        fired: dict[str, int] = dict.fromkeys(KINDS, 0)
        for entry in self.log:
            fired[entry["kind"]] += 1
        return {"faults": [f.to_json() for f in self.faults], "fired": fired, "log": self.log}

    async def hold(self, fault: Fault) -> None:
        """`reorder`: wait in the fault's batch; the batch is released newest first."""
        if fault.batch is None or fault.batch.releasing:
            fault.batch = ReorderBatch(expected=fault.count)
        batch = fault.batch
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        batch.held.append(fut)
        if len(batch.held) >= batch.expected:
            asyncio.get_running_loop().create_task(self._release(fault, batch))
        elif len(batch.held) == 1:
            asyncio.get_running_loop().create_task(self._release_later(fault, batch))
        await fut

    async def _release_later(self, fault: Fault, batch: ReorderBatch) -> None:
        await asyncio.sleep(fault.delay_s)
        await self._release(fault, batch)

    async def _release(self, fault: Fault, batch: ReorderBatch) -> None:
        if batch.releasing:
            return
        batch.releasing = True
        for fut in reversed(batch.held):
            if not fut.done():
                fut.set_result(None)
            await asyncio.sleep(fault.gap_s)

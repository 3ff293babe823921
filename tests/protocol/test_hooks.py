"""The protocol core's declared hooks (`faultpoints.CoreHooks`): none by default, and each
installed one is called at its point of the request path (the fake's behaviour faults use them;
`tests/conformance/test_proven.py` proves every fault through them end to end)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from arctic_sdk.spec.tables import methods as M
from arctic_servers._generated.servicer import ServicerBase
from arctic_servers.protocol.calls import IncomingCall
from arctic_servers.protocol.config import ProtocolConfig
from arctic_servers.protocol.context import CallContext
from arctic_servers.protocol.core import ProtocolCore
from arctic_servers.protocol.faultpoints import CoreHooks
from arctic_servers.rules.errors import ProtocolError


class _Jobs(ServicerBase):
    async def get_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return {"job": {"job_id": body["job_id"], "state": "running", "token": ctx.token}}


def _get_job(body: dict[str, Any] | None = None, **headers: str) -> IncomingCall:
    return IncomingCall(
        M.GET_JOB,
        headers=headers,
        path_params={"job_id": "j1"},
        body=json.dumps(body or {}).encode(),
    )


def test_no_hooks_by_default() -> None:
    core = ProtocolCore(_Jobs())
    assert all(getattr(core.hooks, f.name) is None for f in dataclasses.fields(CoreHooks))


async def test_auth_refused_hook_decides() -> None:
    seen: list[str] = []

    def let_in(call: IncomingCall, exc: ProtocolError) -> str | None:
        seen.append(exc.code)
        return "alice"

    core = ProtocolCore(_Jobs(), ProtocolConfig(tokens=frozenset({"alice"})))
    with pytest.raises(ProtocolError, match="missing Authorization"):
        await core.handle(_get_job())
    core.hooks = CoreHooks(auth_refused=let_in)
    out = await core.handle(_get_job())
    assert out.value["job"]["token"] == "alice"
    assert seen == ["unauthenticated"]


async def test_body_refused_hook_decides() -> None:
    refused: list[Any] = []

    def accept(method: Any, body: Any, exc: ProtocolError) -> None:
        refused.append((method.name, exc.code, sorted(exc.details.get("unknown_fields") or [])))

    core = ProtocolCore(_Jobs(), hooks=CoreHooks(body_refused=accept))
    out = await core.handle(_get_job({"bogus": 1}))
    assert out.value["job"]["job_id"] == "j1"
    assert refused and refused[0][0] == "get-job" and refused[0][2] == ["bogus"]

    def refuse(method: Any, body: Any, exc: ProtocolError) -> None:
        raise exc

    core.hooks = CoreHooks(body_refused=refuse)
    with pytest.raises(ProtocolError) as info:
        await core.handle(_get_job({"bogus": 1}))
    assert "bogus" in str(info.value)

"""The `openai/*` cases proven from outside: the mutating proxy of `test_proxy_faults.py` in front
of the fake gateway (which serves the OpenAI routes over its jobs) makes a server that ignores a
field, or refuses it without naming it, and the cases about that field must fail; without the
fault the same cases pass (the fake honours the tool and session fields and refuses the six
`fields/*` by name).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from conformance.runner import Case

from .mutating_proxy import Fault, Proxy, Request, Response, fails_its_cases
from .test_proxy_faults import _drop_header

CHAT = "/v1/chat/completions"
# tool_choice dropped is "auto": the fake's auto also calls the tool (the hermes structural tag
# lets its draws write a call), so the streamed and parallel cases can pass without it
TOOLS = (
    "openai/tools/choice-required",
    "openai/tools/choice-named",
    "openai/tools/named-unknown-function",
)
FIELDS = (
    "openai/fields/logit-bias",
    "openai/fields/allowed-token-ids",
    "openai/fields/response-format-json",
    "openai/fields/structured-outputs-choice",
    "openai/fields/prompt-logprobs",
    "openai/fields/top-logprobs",
)


def _edit_chat(fn: Callable[[dict[str, object]], None]) -> Callable[[Request], None]:
    """Change the JSON body of every chat completion on its way to the server."""

    def edit(req: Request) -> None:
        if req["path"] == CHAT and req["method"] == "POST":
            body = json.loads(bytes(req["body"]))  # type: ignore[arg-type]
            fn(body)
            req["body"] = json.dumps(body).encode()

    return edit


def _drop(*names: str) -> Callable[[dict[str, object]], None]:
    def fn(body: dict[str, object]) -> None:
        for name in names:
            body.pop(name, None)

    return fn


def _no_tool_messages(body: dict[str, object]) -> None:
    messages = body.get("messages")
    if isinstance(messages, list):
        body["messages"] = [m for m in messages if m.get("role") != "tool"]


def _both(*fns: Callable[[Request], None]) -> Callable[[Request], None]:
    def fn(req: Request) -> None:
        for f in fns:
            f(req)

    return fn


def _anonymous_refusals(req: Request, resp: Response) -> None:
    """A server whose OpenAI refusals do not say which field: `param` null, a bare message."""
    status = resp["status"]
    if str(req["path"]).startswith("/v1/") and isinstance(status, int) and 400 <= status < 500:
        error = {"message": "invalid request", "type": "invalid_request_error", "param": None}
        resp["body"] = json.dumps({"error": {**error, "code": None}}).encode()


FAULTS = {
    "ignores_tool_choice": Fault(
        ("openai/tools/*",), TOOLS, on_request=_edit_chat(_drop("tool_choice"))
    ),
    "ignores_parallel_tool_calls": Fault(
        ("openai/tools/parallel-calls-false",),
        ("openai/tools/parallel-calls-false",),
        on_request=_edit_chat(_drop("parallel_tool_calls")),
    ),
    "drops_tool_messages": Fault(
        ("openai/tools/tool-message-rendered",),
        ("openai/tools/tool-message-rendered",),
        on_request=_edit_chat(_no_tool_messages),
    ),
    "ignores_sessions": Fault(
        ("openai/sessions/*",),
        (
            "openai/sessions/token-exact-turns",
            "openai/sessions/header",
            "openai/sessions/other-token-not-found",
            "openai/sessions/id-too-long",
            "openai/sessions/id-bad-characters",
        ),
        on_request=_both(_edit_chat(_drop("session_id")), _drop_header("x-session-id")),
    ),
    "ignores_max_tokens": Fault(
        ("openai/max-tokens/*",),
        (
            "openai/max-tokens/zero-refused",
            "openai/max-tokens/honoured",
            "openai/max-tokens/past-the-context",
        ),
        on_request=_edit_chat(_drop("max_tokens", "max_completion_tokens")),
    ),
    "anonymous_refusals": Fault(
        ("openai/*",),
        (
            *FIELDS,
            "openai/tools/named-unknown-function",
            "openai/sessions/id-too-long",
            "openai/sessions/id-bad-characters",
            "openai/max-tokens/zero-refused",
            "openai/max-tokens/past-the-context",
        ),
        on_response=_anonymous_refusals,
    ),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_openai_cases_fail_each_fault(
    proxy: tuple[Proxy, str], cases: list[Case], name: str
) -> None:
    fails_its_cases(proxy, cases, name, FAULTS[name])

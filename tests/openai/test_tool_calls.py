"""Tool calls and sessions on `/v1/chat/completions`, over the fake numerics, with the real
`openai` client and LiteLLM: forced calls valid under the tool's schema, streamed deltas that
join to JSON, a follow-up with the tool's answer, and the second turn's prompt holding the first
turn's sampled ids verbatim (and, without a session, not: the re-rendered tool call drifts)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from arctic_sdk.rollouts import flatten_turns, session_rows, turn_from_response
from arctic_servers.engines.fake import tokenizer

from .conftest import API_KEY, OpenAIServer

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("vllm")  # vLLM's tool parsers

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "Add a and b.", "parameters": SCHEMA},
    },
    {
        "type": "function",
        "function": {
            "name": "echo",
            "parameters": {"type": "object", "properties": {"s": {"type": "string"}}},
        },
    },
]
MESSAGES = [{"role": "user", "content": "What is 21 + 21? Use the tool."}]
NAMED = {"type": "function", "function": {"name": "add"}}


def _client(srv: OpenAIServer) -> Any:
    return openai.OpenAI(base_url=srv.v1, api_key=API_KEY, max_retries=0)


def _valid_call(call: Any, name: str | None = None) -> dict[str, Any]:
    assert call.id and call.type == "function"
    if name:
        assert call.function.name == name
    args = json.loads(call.function.arguments)
    schema = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    jsonschema.validate(args, schema["function"]["parameters"])
    return dict(args)


@pytest.mark.parametrize(("choice", "reason"), [("required", "tool_calls"), (NAMED, "stop")])
def test_forced_call_is_schema_valid(openai_server: OpenAIServer, choice: Any, reason: str) -> None:
    """`required` and a named function: a call valid under the tool's parameters, its arguments
    a JSON string, a call id; finish_reason "tool_calls" for required, "stop" for a named
    function (vLLM's and OpenAI's rule)."""
    for seed in range(6):
        chat = _client(openai_server).chat.completions.create(
            model="fake-tiny",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=120,
            seed=seed,
        )
        ch = chat.choices[0]
        assert ch.finish_reason == reason, ch
        assert len(ch.message.tool_calls) == 1
        _valid_call(ch.message.tool_calls[0], "add" if choice is NAMED else None)
    sent = openai_server.chat.requests[-1]["params"]["structured_outputs"]
    tag = json.loads(sent["structural_tag"])  # vLLM's hermes tag, the tool's schema inside
    assert "<tool_call>" in json.dumps(tag) and '"maximum": 99' in json.dumps(tag)


def test_streamed_tool_call_deltas_join_to_valid_json(openai_server: OpenAIServer) -> None:
    stream = _client(openai_server).chat.completions.create(
        model="fake-tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        seed=4,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish, pieces = None, 0
    for chunk in stream:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            pieces += 1
            c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            c["id"] = d.id or c["id"]
            c["name"] += d.function.name or "" if d.function else ""
            c["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0] and pieces >= 2
    assert calls[0]["id"] and calls[0]["name"] in ("add", "echo")
    jsonschema.validate(json.loads(calls[0]["arguments"]), TOOLS[0]["function"]["parameters"])
    whole = _client(openai_server).chat.completions.create(
        model="fake-tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        seed=4,
    )  # the same sample, whole: the same call
    assert json.loads(whole.choices[0].message.tool_calls[0].function.arguments) == json.loads(
        calls[0]["arguments"]
    )


def _two_turns(client: Any, session: str | None) -> tuple[Any, Any]:
    extra = {"session_id": session} if session else {}
    first = client.chat.completions.create(
        model="fake-tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=NAMED,
        max_tokens=120,
        seed=11,
        logprobs=True,
        extra_body=extra,
    )
    call = first.choices[0].message.tool_calls[0]
    args = json.loads(call.function.arguments)
    msgs = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])},
    ]
    second = client.chat.completions.create(
        model="fake-tiny",
        messages=msgs,
        tools=TOOLS,
        tool_choice="none",  # the answer, as text
        max_tokens=12,
        seed=3,
        logprobs=True,
        extra_body=extra,
    )
    return first, second


def _contains(prompt: list[int], head: list[int]) -> bool:
    return prompt[: len(head)] == head


def test_follow_up_in_a_session_holds_the_sampled_ids_verbatim(
    openai_server: OpenAIServer,
) -> None:
    client = _client(openai_server)
    first, second = _two_turns(client, "sess-verbatim")
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    t1, t2 = turn_from_response(first), turn_from_response(second)
    assert _contains(t2.prompt_token_ids, t1.prompt_token_ids + t1.completion_token_ids)
    assert tokenizer.EOS_ID in t1.completion_token_ids  # the sampled end of turn, kept
    flat = flatten_turns([t1, t2])
    assert not flat.fell_back and sum(flat.loss_mask) == len(t1.completion_token_ids) + len(
        t2.completion_token_ids
    )
    assert flat.weight_versions == (0, 0)
    # the server's own record gives the same row
    rec = _get(openai_server, "/sessions/sess-verbatim").json()
    (row,) = session_rows(rec)
    assert row.input_ids == flat.input_ids and row.loss_mask == flat.loss_mask
    assert row.logprobs == flat.logprobs and row.weight_versions == (0, 0)


def test_without_a_session_the_rerendered_call_drifts(openai_server: OpenAIServer) -> None:
    """The same two turns without a session: the prompt of turn 2 is the template's rendering of
    the parsed call, not the ids sampled (the sample chose `<tool_call>{...}`, the template
    writes `<tool_call>\\n{...}\\n`), so a row of the turns falls back."""
    first, second = _two_turns(_client(openai_server), None)
    t1, t2 = turn_from_response(first), turn_from_response(second)
    assert tokenizer.decode(t1.completion_token_ids).startswith("<tool_call>{")
    assert not _contains(t2.prompt_token_ids, t1.prompt_token_ids + t1.completion_token_ids)
    with pytest.warns(UserWarning, match="do not concatenate"):
        assert flatten_turns([t1, t2]).fell_back


def _get(srv: OpenAIServer, path: str, token: str = API_KEY) -> Any:
    import requests

    return requests.get(srv.v1 + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_tool_choice_validation_is_vllms(openai_server: OpenAIServer) -> None:
    client = _client(openai_server)
    for kwargs, param in (
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": []}, "tools"),
    ):
        body = {"tools": TOOLS, **kwargs}
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="fake-tiny", messages=MESSAGES, max_tokens=4, **body
            )
        assert err.value.param == param, err.value
    with pytest.raises(openai.BadRequestError, match="function_call"):
        client.chat.completions.create(
            model="fake-tiny", messages=MESSAGES, max_tokens=4, extra_body={"function_call": "x"}
        )


# LiteLLM's own imports warn (pydantic ReadOnly TypedDicts, deprecations): not ours to fix
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_litellm_tool_calls_and_session(openai_server: OpenAIServer) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    litellm = pytest.importorskip("litellm")
    common = {
        "model": "hosted_vllm/fake-tiny",
        "api_base": openai_server.v1,
        "api_key": API_KEY,
        "tools": TOOLS,
        "logprobs": True,
        "extra_body": {"return_token_ids": True, "session_id": "litellm-1"},
    }
    first = litellm.completion(
        messages=MESSAGES, tool_choice="required", parallel_tool_calls=False, max_tokens=120,
        seed=5, **common,
    )  # fmt: skip
    ch = first.choices[0]
    assert ch.finish_reason == "tool_calls"
    call = ch.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA if call.function.name == "add"
                        else TOOLS[1]["function"]["parameters"])  # fmt: skip
    ids1 = ch.provider_specific_fields["token_ids"]
    msgs = [
        *MESSAGES,
        ch.message.model_dump(),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = litellm.completion(messages=msgs, tool_choice="none", max_tokens=8, seed=5, **common)
    assert second.choices[0].message.content
    head = first.prompt_token_ids + ids1
    assert second.prompt_token_ids[: len(head)] == head
    pieces = [
        c
        for c in litellm.completion(
            messages=MESSAGES,
            tool_choice=NAMED,
            max_tokens=120,
            seed=5,
            stream=True,
            **{**common, "extra_body": {}},
        )
        if c.choices
    ]
    args = "".join(
        tc.function.arguments or ""
        for c in pieces
        for tc in (c.choices[0].delta.tool_calls or [])
        if tc.function
    )
    jsonschema.validate(json.loads(args), SCHEMA)

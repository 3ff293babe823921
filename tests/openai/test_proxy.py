"""`arctic_sdk.proxy`: an agent's turns through the local proxy (the unmodified `openai`
client and LiteLLM, whole and streamed), recorded and read back as a token-exact training row
equal to the server's own record of the session."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
from typing import Any

import pytest
from aiohttp import web

from arctic_sdk.proxy import BackgroundProxy
from arctic_sdk.rollouts import forward_backward_frame

from .conftest import API_KEY, OpenAIServer
from .test_tool_calls import MESSAGES, NAMED, TOOLS

openai = pytest.importorskip("openai")
pytest.importorskip("vllm")


def _agent(base_url: str, stream: bool) -> None:
    """A two-turn tool-using agent that knows nothing of sessions or token ids."""
    client = openai.OpenAI(base_url=base_url, api_key="anything", max_retries=0)
    if stream:
        calls: dict[str, str] = {"id": "", "name": "", "arguments": ""}
        for chunk in client.chat.completions.create(
            model="fake-tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
            max_tokens=120, seed=2, stream=True,
        ):  # fmt: skip
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                calls["id"] = d.id or calls["id"]
                calls["name"] += (d.function.name or "") if d.function else ""
                calls["arguments"] += (d.function.arguments or "") if d.function else ""
        msg = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": calls["id"], "type": "function",
                 "function": {"name": calls["name"], "arguments": calls["arguments"]}}
            ],
        }  # fmt: skip
        call_id, args = calls["id"], json.loads(calls["arguments"])
    else:
        first = client.chat.completions.create(
            model="fake-tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
            max_tokens=120, seed=2,
        )  # fmt: skip
        msg = first.choices[0].message.model_dump(exclude_none=True)
        call_id = first.choices[0].message.tool_calls[0].id
        args = json.loads(first.choices[0].message.tool_calls[0].function.arguments)
    msgs = [*MESSAGES, msg, {"role": "tool", "tool_call_id": call_id, "content": str(args["a"])}]
    out = client.chat.completions.create(
        model="fake-tiny", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=6, seed=2
    )
    assert out.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_proxy_records_a_token_exact_row(openai_server: OpenAIServer, stream: bool) -> None:
    with BackgroundProxy(openai_server.base_url, API_KEY) as proxy:
        traj = f"rollout-{int(stream)}"
        _agent(proxy.url_for(traj), stream)
        turns = proxy.recorded(traj)
        assert len(turns) == 2 and turns[0].reply["tool_calls"]
        row = proxy.row(traj)
        assert not row.fell_back and row.num_turns == 2 and row.weight_versions == (0, 0)
        t1, t2 = turns[0].turn, turns[1].turn
        assert sum(row.loss_mask) == len(t1.completion_token_ids) + len(t2.completion_token_ids)
        assert row.logprobs is not None and all(
            lp < 0 for lp, m in zip(row.logprobs, row.loss_mask, strict=True) if m
        )
        (server_row,) = proxy.session_rows(traj)  # the server's record: the same row
        assert server_row.input_ids == row.input_ids and server_row.loss_mask == row.loss_mask
        assert server_row.logprobs == row.logprobs
        frame = forward_backward_frame([row], [1.0], loss_fn="grpo")
        assert frame["context"]["loss_mask"].sum() == sum(row.loss_mask)
        # a finished trajectory: forgotten here, its session deleted on the server
        assert len(proxy.finish(traj)) == 2 and not proxy.recorded(traj)
        with pytest.raises(Exception, match="404"):
            proxy.session_rows(traj)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_litellm_through_the_proxy(openai_server: OpenAIServer) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    with BackgroundProxy(openai_server.base_url, API_KEY) as proxy:
        common: dict[str, Any] = {
            "model": "hosted_vllm/fake-tiny", "api_base": proxy.v1, "api_key": "x",
            "tools": TOOLS, "extra_body": {"session_id": "harbor-like-1"},
        }  # fmt: skip
        first = litellm.completion(messages=MESSAGES, tool_choice=NAMED, max_tokens=120, **common)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].provider_specific_fields["token_ids"]
        msgs = [*MESSAGES, first.choices[0].message.model_dump(),
                {"role": "tool", "tool_call_id": call.id, "content": "1"}]  # fmt: skip
        litellm.completion(messages=msgs, tool_choice="none", max_tokens=5, **common)
        row = proxy.row("harbor-like-1")
        assert not row.fell_back and row.num_turns == 2


def test_a_streamed_turn_is_recorded_before_the_agent_reads_done(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that starts its next turn, or hangs up, the moment it reads `data: [DONE]`
    finds the turn already recorded (the record was once made after the stream's end was
    written, and lost when the agent had closed the connection by then). Ending a response
    is made slow here, so a record made after it is seen missing every time."""
    end = web.StreamResponse.write_eof

    async def slow_end(self: web.StreamResponse, data: bytes = b"") -> None:
        await asyncio.sleep(0.5)
        await end(self, data)

    monkeypatch.setattr(web.StreamResponse, "write_eof", slow_end)
    with BackgroundProxy(openai_server.base_url, API_KEY) as proxy:
        body = {
            "model": "fake-tiny", "messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED,
            "max_tokens": 120, "seed": 3, "stream": True,
        }  # fmt: skip
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=30)
        conn.request(
            "POST", "/t/hangs-up/v1/chat/completions", json.dumps(body),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200
        while b"[DONE]" not in (line := resp.readline()):
            assert line, "the stream ended without data: [DONE]"
        turns = proxy.recorded("hangs-up")  # at once: before the agent could do anything more
        conn.close()
        assert len(turns) == 1 and turns[0].reply["tool_calls"]
        (call,) = turns[0].reply["tool_calls"]  # whole: its arguments parse
        assert call["function"]["name"] == NAMED["function"]["name"]
        assert json.loads(call["function"]["arguments"]) and turns[0].finish_reason

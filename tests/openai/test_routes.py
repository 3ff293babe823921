"""The routes over raw HTTP: shapes, vLLM extensions, parameters, errors, streaming timing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from arctic_servers.engines.fake import tokenizer

from .conftest import API_KEY, OpenAIServer

H = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
RENDERED = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
RENDERED += "<|im_start|>assistant\n"


def post(srv: OpenAIServer, path: str, body: dict[str, Any], **kw: Any) -> requests.Response:
    return requests.post(srv.v1 + path, json=body, headers=kw.pop("headers", H), timeout=30, **kw)


def test_models_and_auth(openai_server: OpenAIServer) -> None:
    r = requests.get(openai_server.v1 + "/models", headers=H, timeout=10)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["fake-tiny", "fake-base"]
    assert r.json()["object"] == "list" and r.json()["data"][0]["object"] == "model"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        bad = requests.get(openai_server.v1 + "/models", headers=headers, timeout=10)
        assert bad.status_code == 401
        assert bad.json()["error"]["code"] == "invalid_api_key"


def test_chat_completion_carries_token_ids(openai_server: OpenAIServer) -> None:
    body = {
        "model": "fake-tiny",
        "messages": CHAT,
        "max_tokens": 8,
        "seed": 3,
        "logprobs": True,
        "return_token_ids": True,
        "some_future_field": {"x": 1},
    }
    r = post(openai_server, "/chat/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == "fake-tiny"
    assert out["prompt_token_ids"] == tokenizer.encode(RENDERED)
    (choice,) = out["choices"]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["token_ids"]) == 8 and choice["finish_reason"] == "length"
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"])
    lps = [c["logprob"] for c in choice["logprobs"]["content"]]
    assert len(lps) == 8 and all(v < 0 for v in lps)
    assert out["usage"] == {
        "prompt_tokens": len(out["prompt_token_ids"]),
        "completion_tokens": 8,
        "total_tokens": len(out["prompt_token_ids"]) + 8,
    }
    # the same seed samples the same tokens; max_completion_tokens wins over max_tokens
    again = post(
        openai_server, "/chat/completions", {**body, "max_tokens": 99, "max_completion_tokens": 8}
    ).json()
    assert again["choices"][0]["token_ids"] == choice["token_ids"]


def test_chat_n_stop_penalties(openai_server: OpenAIServer) -> None:
    body = {
        "model": "fake-tiny",
        "messages": CHAT,
        "n": 3,
        "max_tokens": 40,
        "seed": 11,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.2,
        "temperature": 0.9,
        "top_p": 0.95,
    }
    out = post(openai_server, "/chat/completions", body).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert len({tuple(c["token_ids"]) for c in out["choices"]}) == 3
    text = out["choices"][0]["message"]["content"]
    stop = text[5:7]
    cut = post(openai_server, "/chat/completions", {**body, "n": 1, "stop": stop}).json()
    c0 = cut["choices"][0]
    assert c0["finish_reason"] == "stop" and c0["stop_reason"] == stop
    assert c0["message"]["content"] == text[: text.find(stop)]
    sent = openai_server.chat.requests[-1]["params"]
    assert sent["presence_penalty"] == 0.5 and sent["stop"] == [stop]


def test_completions_prompt_forms(openai_server: OpenAIServer) -> None:
    base = {"model": "fake-base", "max_tokens": 5, "seed": 1}
    one = post(openai_server, "/completions", {**base, "prompt": "Hello"}).json()
    assert one["object"] == "text_completion"
    assert one["prompt_token_ids"] == tokenizer.encode("Hello")
    ids = tokenizer.encode("Hello")
    by_ids = post(openai_server, "/completions", {**base, "prompt": ids}).json()
    assert by_ids["choices"][0]["token_ids"] == one["choices"][0]["token_ids"]
    batched = post(
        openai_server,
        "/completions",
        {**base, "prompt": [[5, 6, 7], [8, 9]], "n": 2, "logprobs": 0},
    ).json()
    assert len(batched["choices"]) == 4
    assert [c["prompt_token_ids"] for c in batched["choices"]] == [[5, 6, 7]] * 2 + [[8, 9]] * 2
    lp = batched["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 5 and len(lp["tokens"]) == 5
    texts = post(openai_server, "/completions", {**base, "prompt": ["a", "b"]}).json()
    assert len(texts["choices"]) == 2
    echo = post(openai_server, "/completions", {**base, "prompt": "Hey", "echo": True}).json()
    assert echo["choices"][0]["text"].startswith("Hey")


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/chat/completions", {"model": "fake-base", "messages": CHAT}, 400, "no chat template"),
        ("/chat/completions", {"model": "nope", "messages": CHAT}, 404, "does not exist"),
        ("/chat/completions", {"model": "fake-tiny", "messages": []}, 400, "messages"),
        ("/chat/completions", {"model": "fake-tiny", "messages": CHAT, "n": 0}, 400, "n: 0"),
        (
            "/chat/completions",
            {"model": "fake-tiny", "messages": CHAT, "logprobs": True, "top_logprobs": 5},
            400,
            "top_logprobs",
        ),
        ("/completions", {"model": "fake-base", "prompt": []}, 400, "prompt"),
        (
            "/completions",
            {"model": "fake-base", "prompt": "x", "temperature": -1},
            400,
            "temperature",
        ),
    ],
)
def test_errors(
    openai_server: OpenAIServer, path: str, body: dict[str, Any], status: int, needle: str
) -> None:
    r = post(openai_server, path, body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def sse(resp: requests.Response) -> list[tuple[float, Any]]:
    """(client receive time, parsed event) of every SSE event, as they arrive."""
    out = []
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            data = line[6:].decode()
            out.append((time.time(), data if data == "[DONE]" else json.loads(data)))
    return out


def test_chat_stream_is_incremental(openai_server: OpenAIServer) -> None:
    n_tokens = 64
    body = {
        "model": "fake-tiny",
        "messages": CHAT,
        "max_tokens": n_tokens,
        "seed": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "arctic_timing": True,
    }
    with post(openai_server, "/chat/completions", body, stream=True) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1][1] == "[DONE]"
    chunks = [e for _, e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["prompt_token_ids"] == tokenizer.encode(RENDERED)
    content = [(t, c) for t, c in events[1:-1] if c["choices"]]
    assert len(content) >= n_tokens / 4
    token_ids = [t for _, c in content for t in c["choices"][0]["token_ids"]]
    assert len(token_ids) == n_tokens
    assert content[-1][1]["choices"][0]["finish_reason"] == "length"
    # streamed = unstreamed, token for token and character for character
    full = post(openai_server, "/chat/completions", {**body, "stream": False}).json()
    assert token_ids == full["choices"][0]["token_ids"]
    # every token chunk names the weights that produced its tokens, as the whole reply does
    assert {c["weight_version"] for _, c in content} == {full["weight_version"]}
    text = "".join(c["choices"][0]["delta"]["content"] for _, c in content)
    assert text == full["choices"][0]["message"]["content"]
    # the first token chunk reached the client before the server produced the last token
    first_received = content[0][0]
    last_generated = content[-1][1]["arctic_generated_at"]
    assert first_received < last_generated
    assert chunks[-1]["usage"]["completion_tokens"] == n_tokens


def test_completion_stream_n2_with_stop(openai_server: OpenAIServer) -> None:
    ref = post(
        openai_server,
        "/completions",
        {"model": "fake-tiny", "prompt": "abc", "max_tokens": 30, "seed": 9, "n": 2},
    ).json()
    stop = ref["choices"][1]["text"][10:12]
    body = {
        "model": "fake-tiny",
        "prompt": "abc",
        "max_tokens": 30,
        "seed": 9,
        "n": 2,
        "stop": [stop],
        "stream": True,
    }
    with post(openai_server, "/completions", body, stream=True) as r:
        events = [e for _, e in sse(r)][:-1]
    texts = {0: "", 1: ""}
    finish = {}
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            if c.get("finish_reason"):
                finish[c["index"]] = c["finish_reason"]
    plain = post(openai_server, "/completions", {**body, "stream": False}).json()
    assert texts == {c["index"]: c["text"] for c in plain["choices"]}
    assert finish[1] == "stop" and stop not in texts[1]


def test_min_p_and_include_stop_str_streamed_and_not(openai_server: OpenAIServer) -> None:
    """vLLM's extra sampling params on the OpenAI routes: the streamed and the plain answer
    agree, the stop string kept at the end, and min_p 1 answers the same tokens for any seed."""
    ref = post(
        openai_server,
        "/completions",
        {"model": "fake-tiny", "prompt": "abc", "max_tokens": 30, "seed": 9},
    ).json()
    stop = ref["choices"][0]["text"][10:12]
    body = {
        "model": "fake-tiny",
        "prompt": "abc",
        "max_tokens": 30,
        "seed": 9,
        "stop": [stop],
        "include_stop_str_in_output": True,
        "stream": True,
    }
    with post(openai_server, "/completions", body, stream=True) as r:
        streamed = "".join(c["text"] for _, e in sse(r) if e != "[DONE]" for c in e["choices"])
    plain = post(openai_server, "/completions", {**body, "stream": False}).json()["choices"][0]
    assert streamed == plain["text"] and plain["text"].endswith(stop)
    assert plain["finish_reason"] == "stop"
    greedy = [
        post(
            openai_server,
            "/completions",
            {"model": "fake-tiny", "prompt": "abc", "max_tokens": 8, "seed": s, "min_p": 1.0},
        ).json()["choices"][0]["text"]
        for s in (1, 2)
    ]
    assert greedy[0] == greedy[1]
    bad = post(openai_server, "/completions", {"model": "fake-tiny", "prompt": "a", "min_p": 2})
    assert bad.status_code == 400 and "min_p" in bad.text


def _chunk_tokens(events: list[tuple[float, Any]], choice: int = 0) -> list[list[int]]:
    """The token ids of each chunk of one choice, in arrival order."""
    return [
        c["choices"][0]["token_ids"]
        for _, c in events
        if c != "[DONE]" and c["choices"] and c["choices"][0]["index"] == choice
        and c["choices"][0].get("token_ids")
    ]  # fmt: skip


def _flat(chunks: list[list[int]]) -> list[int]:
    return [t for c in chunks for t in c]


def test_stream_interval_sends_a_chunk_per_k_tokens(openai_server: OpenAIServer) -> None:
    """vLLM's `stream_interval`: the first token at once, then a chunk per k tokens, the rest
    with the finish; the same tokens, text and log-probs as without it."""
    body = {
        "model": "fake-tiny",
        "messages": CHAT,
        "max_tokens": 40,
        "seed": 5,
        "stream": True,
        "logprobs": True,
    }
    with post(openai_server, "/chat/completions", {**body, "stream_interval": 8}, stream=True) as r:
        events = sse(r)
    sizes = [len(ids) for ids in _chunk_tokens(events)]
    assert sizes == [1, 8, 8, 8, 8, 7]
    with post(openai_server, "/chat/completions", body, stream=True) as r:
        plain = sse(r)
    assert [len(ids) for ids in _chunk_tokens(plain)] == [1] * 40
    content = [c for _, c in events if c != "[DONE]" and c["choices"]]
    assert _flat(_chunk_tokens(events)) == _flat(_chunk_tokens(plain))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in content)
    full = post(openai_server, "/chat/completions", {**body, "stream": False}).json()
    assert text == full["choices"][0]["message"]["content"]
    lps = [x for c in content[1:] for x in c["choices"][0]["logprobs"]["content"]]
    assert len(lps) == 40
    assert content[-1]["choices"][0]["finish_reason"] == "length"


def test_stream_interval_per_choice_with_a_stop(openai_server: OpenAIServer) -> None:
    body = {"model": "fake-tiny", "prompt": "abc", "max_tokens": 30, "seed": 9, "n": 2}
    ref = post(openai_server, "/completions", body).json()
    stop = ref["choices"][1]["text"][10:12]
    body.update(stop=[stop], stream=True, stream_interval=5)
    with post(openai_server, "/completions", body, stream=True) as r:
        events = sse(r)
    whole = post(openai_server, "/completions", {**body, "stream": False}).json()
    for k in (0, 1):
        chunks = _chunk_tokens(events, k)
        assert len(chunks[0]) == 1 and all(len(c) == 5 for c in chunks[1:-1])
        assert 1 <= len(chunks[-1]) <= 5
        assert _flat(chunks) == whole["choices"][k]["token_ids"]
        text = "".join(
            c["choices"][0]["text"]
            for _, c in events
            if c != "[DONE]" and c["choices"] and c["choices"][0]["index"] == k
        )
        assert text == whole["choices"][k]["text"]


def test_stream_interval_sends_held_tokens_of_a_stream_that_ends_unfinished(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampler stream that stops without a finished event (not one the shipped samplers
    produce): the tokens held for `stream_interval` still go out, none is lost."""
    from arctic_servers.openai.sampler import StreamEvent

    async def cut_short(prompt: Any, params: Any, index: int = 0) -> Any:
        for j in range(6):
            yield StreamEvent([100 + j], None, "x" * (j + 1), time.time())

    async def open_cut_short(prompt: Any, params: Any, index: int = 0) -> Any:
        return cut_short(prompt, params, index)  # the route opens each stream first

    monkeypatch.setattr(openai_server.base, "open_stream", open_cut_short)
    body = {"model": "fake-base", "prompt": "abc", "max_tokens": 9, "stream": True}
    with post(openai_server, "/completions", {**body, "stream_interval": 4}, stream=True) as r:
        events = sse(r)
    assert _chunk_tokens(events) == [[100], [101, 102, 103, 104], [105]]  # the last: flushed
    text = "".join(c["choices"][0]["text"] for _, c in events[1:] if c != "[DONE]")
    assert text == "xxxxxx" and events[-1][1] == "[DONE]"


@pytest.mark.parametrize("bad", [0, -3, 1.5, "8", True])
def test_stream_interval_refuses_bad_values(openai_server: OpenAIServer, bad: Any) -> None:
    body = {"model": "fake-tiny", "prompt": "abc", "max_tokens": 4, "stream": True}
    r = post(openai_server, "/completions", {**body, "stream_interval": bad})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_interval"


def test_tokenize_and_detokenize(openai_server: OpenAIServer) -> None:
    r = requests.post(
        openai_server.base_url + "/tokenize",
        headers=H,
        timeout=10,
        json={"model": "fake-tiny", "prompt": "abc"},
    )
    assert r.json()["tokens"] == tokenizer.encode("abc") and r.json()["count"] == 3
    chat = requests.post(
        openai_server.base_url + "/tokenize",
        headers=H,
        timeout=10,
        json={"model": "fake-tiny", "messages": CHAT},
    ).json()
    assert chat["tokens"] == tokenizer.encode(RENDERED)
    back = requests.post(
        openai_server.base_url + "/detokenize",
        headers=H,
        timeout=10,
        json={"model": "fake-tiny", "tokens": chat["tokens"]},
    ).json()
    assert back["prompt"] == RENDERED


async def test_sha256_tokens_as_the_gateway_keeps_them() -> None:
    import hashlib

    import aiohttp

    from arctic_servers.openai.fake import FakeResolver
    from arctic_servers.openai.routes import start_openai_server

    digest = hashlib.sha256(b"gw-secret").hexdigest()
    runner, url = await start_openai_server(FakeResolver(), token_sha256=[digest])
    try:
        async with aiohttp.ClientSession() as s:
            ok = await s.get(url + "/v1/models", headers={"Authorization": "Bearer gw-secret"})
            bad = await s.get(url + "/v1/models", headers={"Authorization": "Bearer " + digest})
            assert (ok.status, bad.status) == (200, 401)
    finally:
        await runner.cleanup()


def test_routes_take_one_source_of_callers() -> None:
    """`authenticate` (a core's rule) and `tokens` together would leave one of them unused:
    refused at mount, naming both."""
    from aiohttp import web

    from arctic_servers.openai import add_openai_routes

    app = web.Application()
    with pytest.raises(ValueError, match=r"authenticate .* tokens"):
        add_openai_routes(app, None, authenticate=lambda a: None, tokens={"t"})  # type: ignore[arg-type]

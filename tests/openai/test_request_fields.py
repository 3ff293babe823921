"""Every OpenAI request field is used, refused by name, or named as ignored (request_fields.py).

Against the installed vLLM's own request models (the field list and vLLM's defaults), over the
routes (raw HTTP and the unmodified `openai` client), and with hostile field names.
"""

from __future__ import annotations

import logging
from typing import Any

import openai
import pytest
import requests

from arctic_servers.openai import request_fields as F
from arctic_servers.openai.requests import chat_request, completion_request
from arctic_servers.openai.sampler import OpenAIError
from arctic_servers.openai.tokenized import TokenizedSampler

from .conftest import API_KEY, OpenAIServer

H = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": "fake-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMP = {"model": "fake-tiny", "prompt": "hi", "max_tokens": 3}


def _post(srv: OpenAIServer, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(srv.v1 + path, json=body, headers=H, timeout=30)


def _not_default(defaults: tuple[Any, ...]) -> Any:
    """A value of the field that is none of its defaults."""
    d = defaults[0] if defaults else None
    if isinstance(d, bool):
        return not d
    if isinstance(d, int | float):
        return d + 2
    if isinstance(d, dict):
        return {"type": "json_object"} if "type" in d else {"x": 1}
    if isinstance(d, list):
        return ["audio"] if d == ["text"] else [7]
    if isinstance(d, str):
        return "required-x"
    return {"type": "json_object"}


REFUSED_BOTH = sorted(F.REFUSED)


# ---------------------------------------------------------------------------- against vLLM


def _vllm_models() -> tuple[Any, Any]:
    comp = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
    chat = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    return comp.CompletionRequest, chat.ChatCompletionRequest


def _vllm_default(field: Any) -> Any:
    return field.default_factory() if field.default_factory is not None else field.default


def test_every_field_of_vllms_request_models_is_classified() -> None:
    """A vLLM upgrade that adds a request field fails here until the field is used, refused or
    declared to have no effect."""
    comp, chat = _vllm_models()
    known = set(F.REFUSED) | F.NO_EFFECT
    missing_comp = set(comp.model_fields) - known - F.USED_COMPLETIONS
    missing_chat = set(chat.model_fields) - known - F.USED_CHAT - {"echo"}
    assert not missing_comp, f"vLLM completions fields not classified: {sorted(missing_comp)}"
    assert not missing_chat, f"vLLM chat fields not classified: {sorted(missing_chat)}"


def test_vllms_default_values_are_accepted() -> None:
    """A client that sends every field at vLLM's default (some serialise whole request models)
    is not refused: each refused field's vLLM default is one of its accepted values."""
    comp, chat = _vllm_models()
    for model, is_chat in ((comp, False), (chat, True)):
        for name, field in model.model_fields.items():
            if name in F.REFUSED or (is_chat and name == "echo"):
                value = _vllm_default(field)
                F.check({name: value}, chat=is_chat)  # raises if refused


# ---------------------------------------------------------------------------- over the routes


@pytest.mark.parametrize("name", REFUSED_BOTH)
def test_a_refused_field_is_a_400_naming_it(openai_server: OpenAIServer, name: str) -> None:
    defaults = F.REFUSED[name][0]
    value = _not_default(defaults)
    for path, body in (("/chat/completions", CHAT), ("/completions", COMP)):
        r = _post(openai_server, path, {**body, name: value})
        assert r.status_code == 400, (name, path, r.text)
        err = r.json()["error"]
        assert err["param"] == name and err["code"] == "unsupported_value", err
        assert name in err["message"] and "not supported" in err["message"]
        if defaults:  # the field at its default is accepted
            ok = _post(openai_server, path, {**body, name: defaults[0]})
            assert ok.status_code == 200, (name, path, ok.text)


def test_chat_only_refusals(openai_server: OpenAIServer) -> None:
    for extra, param in (
        ({"echo": True}, "echo"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"stream_options": {"continuous_usage_stats": True}, "stream": True}, None),
    ):
        r = _post(openai_server, "/chat/completions", {**CHAT, **extra})
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["param"] == (param or "stream_options.continuous_usage_stats"), err
    for extra in ({"tool_choice": "auto"}, {"tool_choice": "none"}, {"echo": False}):
        assert _post(openai_server, "/chat/completions", {**CHAT, **extra}).status_code == 200
    # completions' own echo is used: the prompt comes back in front of the text
    r = _post(openai_server, "/completions", {**COMP, "echo": True})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("hi")


def test_the_openai_client_gets_the_refusal_by_name(openai_server: OpenAIServer) -> None:
    client = openai.OpenAI(base_url=openai_server.v1, api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="fake-tiny",
            messages=CHAT["messages"],
            max_tokens=3,
            logit_bias={"5": 100},
        )
    assert exc.value.param == "logit_bias" and exc.value.code == "unsupported_value"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="fake-tiny",
            messages=CHAT["messages"],
            max_tokens=3,
            response_format={"type": "json_object"},
        )
    assert exc.value.param == "response_format"


def test_unknown_fields_are_named_in_a_header_and_logged(
    openai_server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = openai.OpenAI(base_url=openai_server.v1, api_key=API_KEY, max_retries=0)
    with caplog.at_level(logging.WARNING, logger="arctic_servers.openai"):
        raw = client.completions.with_raw_response.create(
            model="fake-tiny",
            prompt="hi",
            max_tokens=3,
            user="u-1",  # no effect by nature: not named
            extra_body={"zeta_knob": 1, "alpha_knob": True, "cache_salt": "s"},
        )
    assert raw.headers[F.IGNORED_HEADER] == "alpha_knob, zeta_knob"
    assert any("alpha_knob, zeta_knob" in r.getMessage() for r in caplog.records)
    assert raw.parse().choices[0].text is not None
    # streamed: the header comes with the event stream
    r = requests.post(
        openai_server.v1 + "/chat/completions",
        json={**CHAT, "stream": True, "mystery": 1},
        headers=H,
        stream=True,
        timeout=30,
    )
    assert r.status_code == 200 and r.headers[F.IGNORED_HEADER] == "mystery"
    assert b"[DONE]" in r.content
    # only known fields: no header
    plain = _post(openai_server, "/completions", {**COMP, "user": "u", "metadata": {"a": "b"}})
    assert plain.status_code == 200 and F.IGNORED_HEADER not in plain.headers


def test_a_huge_refused_value_is_cut_in_the_message(openai_server: OpenAIServer) -> None:
    bias = {str(i): 1.0 for i in range(20000)}
    r = _post(openai_server, "/chat/completions", {**CHAT, "logit_bias": bias})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and len(err["message"]) < 250, err


def test_hostile_field_names_do_not_reach_the_header(openai_server: OpenAIServer) -> None:
    body: dict[str, Any] = {**COMP, "a\r\nX-Injected: 1": 1, "ümlaut": 2, "x" * 500: 3}
    body.update({f"k{i:05d}": i for i in range(5000)})
    r = _post(openai_server, "/completions", body)
    assert r.status_code == 200, r.text
    named = r.headers[F.IGNORED_HEADER]
    assert "X-Injected" not in r.headers and "\n" not in named
    shown = named.split(", ")
    assert shown[: F.MAX_NAMED] == [f"k{i:05d}" for i in range(F.MAX_NAMED)]
    assert shown[-1] == f"({5003 - F.MAX_NAMED} more)"


# ---------------------------------------------------------------------------- add_special_tokens


class _BosTokenizer:
    """A tokenizer with a BOS token (id 1), as Llama's: `add_special_tokens` prepends it."""

    chat_template = "x"

    def __len__(self) -> int:
        return 300

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) % 250 + 3 for c in text]

    def apply_chat_template(self, messages: Any, **_: Any) -> str:
        return "<s>" + "".join(str(m["content"]) for m in messages)


def test_add_special_tokens_follows_vllms_defaults() -> None:
    s = TokenizedSampler("m", _BosTokenizer(), 100)
    comp = completion_request({"model": "m", "prompt": "ab"}, s)
    assert comp.prompts == [[1, 100, 101]]  # completions: with BOS, as vLLM
    off = completion_request({"model": "m", "prompt": "ab", "add_special_tokens": False}, s)
    assert off.prompts == [[100, 101]]
    ids = completion_request({"model": "m", "prompt": [5, 6]}, s)
    assert ids.prompts == [[5, 6]]  # token ids are taken as they are
    chat = chat_request({"model": "m", "messages": [{"role": "user", "content": "ab"}]}, s)
    assert chat.prompts[0][0] != 1  # chat: the template writes the special tokens
    on = chat_request(
        {"model": "m", "messages": [{"role": "user", "content": "a"}], "add_special_tokens": True},
        s,
    )
    assert on.prompts[0][0] == 1
    with pytest.raises(OpenAIError) as exc:
        completion_request({"model": "m", "prompt": "ab", "add_special_tokens": "yes"}, s)
    assert exc.value.param == "add_special_tokens"


def test_tokenize_route_takes_add_special_tokens() -> None:
    """vLLM's `/tokenize` of a prompt adds special tokens unless told not to; and a completion
    of a text prompt reaches the sampler with its BOS."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from arctic_servers.openai.fake import FakeResolver, FakeSampler
    from arctic_servers.openai.routes import add_openai_routes

    sampler = FakeSampler("bos-model")
    sampler.tok = _BosTokenizer()

    async def run() -> None:
        app = web.Application()
        add_openai_routes(app, FakeResolver(sampler))
        async with TestClient(TestServer(app)) as client:
            r = await client.post("/tokenize", json={"model": "bos-model", "prompt": "ab"})
            assert (await r.json())["tokens"] == [1, 100, 101]
            body = {"model": "bos-model", "prompt": "ab", "add_special_tokens": False}
            r = await client.post("/tokenize", json=body)
            assert (await r.json())["tokens"] == [100, 101]
            body = {"model": "bos-model", "prompt": "ab", "max_tokens": 2}
            r = await client.post("/v1/completions", json=body)
            assert r.status == 200, await r.text()
            assert (await r.json())["prompt_token_ids"] == [1, 100, 101]

    asyncio.run(run())


def test_skyrls_remote_vllm_payload_is_taken_whole(openai_server: OpenAIServer) -> None:
    """SkyRL's `RemoteInferenceEngine` (vLLM backend) posts its vLLM sampling params, as
    `get_vllm_sampling_params` builds them, with `model` and a batch of token-id prompts to
    `/v1/completions`: every field is one this server uses (nothing refused or ignored)."""
    payload = {
        "min_tokens": 1,
        "skip_special_tokens": True,
        "include_stop_str_in_output": True,
        "max_tokens": 5,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "logprobs": None,
        "stop": None,
        "model": "fake-tiny",
        "prompt": [[5, 6, 7], [8, 9]],
    }
    r = _post(openai_server, "/completions", payload)
    assert r.status_code == 200, r.text
    assert F.IGNORED_HEADER not in r.headers
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(1 <= len(c["token_ids"]) <= 5 for c in choices)


def test_tokenize_fields(openai_server: OpenAIServer) -> None:
    """vLLM's `/tokenize`: `return_token_strs` (token strings) is refused by name, an unknown
    field is named; the messages form goes through the chat rules."""

    def tok(body: dict[str, Any]) -> requests.Response:
        return requests.post(openai_server.base_url + "/tokenize", json=body, headers=H, timeout=30)

    base = {"model": "fake-tiny", "prompt": "hi"}
    r = tok({**base, "return_token_strs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_strs", r.text
    r = tok({**base, "return_token_strs": False, "odd": 1})
    assert r.status_code == 200 and r.headers[F.IGNORED_HEADER] == "odd", r.text
    chat = {"model": "fake-tiny", "messages": [{"role": "user", "content": "hi"}]}
    r = tok({**chat, "chat_template": "{{ x }}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template", r.text
    r = tok(chat)
    assert r.status_code == 200 and F.IGNORED_HEADER not in r.headers

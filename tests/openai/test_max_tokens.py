"""`max_tokens` against the model's context on the OpenAI routes, with the real `openai` client
(issue 37): past the room a 400 naming the field, the prompt's length, max_model_len and the
room (never a silent clamp); absent, chat gets the room (vLLM's chat default) and completions 16."""

from __future__ import annotations

import pytest

from .conftest import API_KEY, OpenAIServer

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "Say something."}]


def _client(server: OpenAIServer) -> object:
    return openai.OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0)


def test_completions_past_the_room_is_a_400_naming_it(openai_server: OpenAIServer) -> None:
    client = _client(openai_server)
    limit = openai_server.chat.max_model_len
    prompt = [65] * 40
    room = limit - len(prompt)
    edge = client.completions.create(model="fake-tiny", prompt=prompt, max_tokens=room, seed=1)
    assert edge.usage.completion_tokens == room and edge.choices[0].finish_reason == "length"
    for asked in (room + 1, 10**9):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="fake-tiny", prompt=prompt, max_tokens=asked)
        err = info.value
        assert err.status_code == 400 and err.param == "max_tokens"
        for part in (str(asked), str(limit), "40", str(room)):
            assert part in err.message
    with pytest.raises(openai.BadRequestError) as info:  # streamed: refused before any chunk
        client.completions.create(
            model="fake-tiny", prompt=prompt, max_tokens=room + 1, stream=True
        )
    assert info.value.param == "max_tokens"
    for bad in (0, -5):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="fake-tiny", prompt=prompt, max_tokens=bad)
        assert info.value.param == "max_tokens"
    # absent: vLLM's completions default, 16
    dflt = client.completions.create(model="fake-tiny", prompt=prompt, seed=1)
    assert dflt.usage.completion_tokens == 16


def test_chat_defaults_to_the_room_and_names_max_completion_tokens(
    openai_server: OpenAIServer,
) -> None:
    client = _client(openai_server)
    limit = openai_server.chat.max_model_len
    chat = client.chat.completions.create(model="fake-tiny", messages=MESSAGES, seed=3)
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == limit
    assert chat.choices[0].finish_reason == "length"
    room = limit - chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="fake-tiny", messages=MESSAGES, max_completion_tokens=room + 1
        )
    assert info.value.param == "max_completion_tokens" and str(room) in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake-tiny", messages=MESSAGES, max_tokens=room + 1)
    assert info.value.param == "max_tokens"
    ok = client.chat.completions.create(
        model="fake-tiny", messages=MESSAGES, max_tokens=room, seed=3
    )
    assert ok.usage.completion_tokens == room


def test_tokenize_is_not_checked_against_the_context(openai_server: OpenAIServer) -> None:
    """vLLM's /tokenize counts a conversation whatever its length (a client asks it to learn
    whether a prompt fits): no room check there."""
    import requests

    limit = openai_server.chat.max_model_len
    long = [{"role": "user", "content": "x" * (limit + 10)}]
    r = requests.post(
        openai_server.base_url + "/tokenize",
        json={"model": "fake-tiny", "messages": long},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["count"] > limit and r.json()["max_model_len"] == limit

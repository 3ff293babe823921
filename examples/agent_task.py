"""The two-turn tool task of `agent_rl.py` and its demonstrations.

    user     "Find the code of box 7."                       (tools: lookup(key), answer(value))
    turn 1   tool_choice lookup   -> lookup({"key": k})
    tool     "The code of box k is c(k)."                      (c(k) = (3 k + 7) mod 10)
    turn 2   tool_choice answer   -> answer({"value": v})
    reward   0.5 [k is the box asked for] + 0.5 [v is the code the tool answered]
    success  k is the box asked for and v = c(k)

A demonstration is a correct episode laid out exactly as a session lays out a sampled one: the
prompts rendered by the server's chat template (vLLM's `/tokenize` with the same tools), each call
spelled as the server's forced decoding spells it (`FORCED_CALL`: vLLM's structural tag for a
named function with the hermes parser, checked against a call the server sampled), then the stop
token the sampler ended that call with, the template's end of turn and the next message. So the
SFT rows and the RL rows differ only in the digits and the JSON whitespace the sampler chose; a
model trained on the template's own spelling of a call (`<tool_call>` and a newline) would put
low probability on the forced spelling, and every RL step would push on those forced tokens.
"""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp

from arctic_sdk.rollouts import FlatRollout, Turn, flatten_turns

DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "The code of a box.",
            "parameters": {"type": "object", "properties": {"key": DIGIT}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "description": "Give the final answer.",
            "parameters": {
                "type": "object",
                "properties": {"value": DIGIT},
                "required": ["value"],
            },
        },
    },
]
TRAIN = ("Find the code of box {k}.", "Box {k}: what is its code?", "Look up box {k}.")
HELD_OUT = (
    "Which code does box {k} hold?",
    "Tell me the code of box number {k}.",
    "I need the code for box {k}.",
    "What code is in box {k}?",
)
CALL_END = "</tool_call>"  # where the template's rendering of a call ends (hermes-style)
FORCED_CALL = '<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def code_of(key: int) -> int:
    return (3 * key + 7) % 10


def forced(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def tool_answer(key: int) -> str:
    return f"The code of box {key} is {code_of(key)}."


def call_message(name: str, args: dict[str, int], call_id: str) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(args)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def call_argument(resp: Any, name: str) -> int | None:
    """The integer argument `name` of the reply's first tool call (None when absent)."""
    calls = resp.choices[0].message.tool_calls or []
    try:
        value = json.loads(calls[0].function.arguments)[name]
    except (IndexError, ValueError, KeyError, TypeError):
        return None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


class Renderer:
    """The server's chat template through vLLM's `/tokenize` (`{model, messages, tools}`)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str, model: str) -> None:
        self.http, self.url, self.model = http, url.rstrip("/"), model
        self.headers = {"Authorization": f"Bearer {token}"}

    async def ids(self, body: dict[str, Any]) -> list[int]:
        body = {"model": self.model, **body}
        async with self.http.post(f"{self.url}/tokenize", json=body, headers=self.headers) as r:
            if r.status != 200:
                raise RuntimeError(f"/tokenize: HTTP {r.status}: {await r.text()}")
            return [int(t) for t in (await r.json())["tokens"]]

    async def text(self, ids: list[int]) -> str:
        body = {"model": self.model, "tokens": ids}
        async with self.http.post(f"{self.url}/detokenize", json=body, headers=self.headers) as r:
            if r.status != 200:
                raise RuntimeError(f"/detokenize: HTTP {r.status}: {await r.text()}")
            return str((await r.json())["prompt"])

    async def call(self, name: str, args: dict[str, int]) -> list[int]:
        """The call as forced decoding spells it."""
        text = FORCED_CALL.format(name=name, arguments=json.dumps(args))
        return await self.ids({"prompt": text, "add_special_tokens": False})

    async def chat(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        return await self.ids(
            {"messages": messages, "tools": TOOLS, "add_generation_prompt": generation_prompt}
        )


def _after_call(rendered: list[int], start: int, call_end: list[int], stop_id: int) -> list[int]:
    """What the template renders after the last call (from `start`): its end of turn and the next
    message, without the stop token when the end of turn is that token (a session holds it once,
    as the sampled call's last token)."""
    for i in range(len(rendered) - len(call_end), start - 1, -1):
        if rendered[i : i + len(call_end)] == call_end:
            end = i + len(call_end)
            return rendered[end + 1 :] if rendered[end : end + 1] == [stop_id] else rendered[end:]
    raise RuntimeError(f"the chat template's rendering of a call holds no {CALL_END!r}")


async def demonstration(r: Renderer, prompt: str, key: int, stop_id: int) -> FlatRollout:
    """One correct episode as a training row (`loss_mask` 1 on both calls and their stops)."""
    call_end = await r.ids({"prompt": CALL_END, "add_special_tokens": False})
    user = {"role": "user", "content": prompt}
    one = call_message("lookup", {"key": key}, "call_0")
    tool = {"role": "tool", "tool_call_id": "call_0", "content": tool_answer(key)}
    two = call_message("answer", {"value": code_of(key)}, "call_1")
    p1 = await r.chat([user], True)
    f1 = await r.chat([user, one], False)
    p2 = await r.chat([user, one, tool], True)
    f2 = await r.chat([user, one, tool, two], False)
    if f1[: len(p1)] != p1 or p2[: len(f1)] != f1 or f2[: len(p2)] != p2:
        raise RuntimeError("the chat template does not render the conversation as a prefix chain")
    c1 = [*await r.call("lookup", {"key": key}), stop_id]
    c2 = [*await r.call("answer", {"value": code_of(key)}), stop_id]
    after1 = _after_call(f1, len(p1), call_end, stop_id)
    # a session continues after the sampled stop with the template's end of turn and what follows
    turn2_prompt = [*p1, *c1, *after1, *p2[len(f1) :]]
    return flatten_turns([Turn(p1, c1), Turn(turn2_prompt, c2)])


async def demonstrations(
    url: str, token: str, model: str, stop_id: int, sampled_call: list[int]
) -> list[FlatRollout]:
    """Every training phrasing for every box (30 rows). `sampled_call`: a `lookup` call the server
    sampled under `tool_choice` lookup (without its stop token), to check `FORCED_CALL`."""
    async with aiohttp.ClientSession() as http:
        r = Renderer(http, url, token, model)
        seen = await r.text(sampled_call)
        shape = re.escape(FORCED_CALL.format(name="lookup", arguments="@")).replace("@", r"\{.*\}")
        if not re.fullmatch(shape, seen, re.DOTALL):
            raise RuntimeError(
                f"the server spells a forced call as {seen!r}, not as agent_task.FORCED_CALL "
                f"{FORCED_CALL!r} (vLLM's structural tag for the hermes tool parser)"
            )
        return [await demonstration(r, t.format(k=k), k, stop_id) for t in TRAIN for k in range(10)]

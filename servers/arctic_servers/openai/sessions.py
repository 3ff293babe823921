"""Token-exact multi-turn chat: sessions keyed by `session_id` (body) or `X-Session-ID` (header).

Without a session, each turn's prompt is the chat template's rendering of the whole
conversation, re-tokenized: the ids the model sampled in an earlier turn come back as whatever
the tokenizer makes of their text (a non-canonical split merged, a byte sequence that is not
UTF-8 turned into U+FFFD, a tool call re-serialised), so the ids an RL update trains on are not
the ids that were sampled. In a session the server keeps the token history: when the
conversation continues the one the session holds (the messages before, then the assistant reply
it returned, as the client sends it back), the new prompt is the history's ids verbatim — the
previous prompt and the *sampled* ids — then the template's rendering of only what was added
(the end of the assistant turn, tool results, the next user message, the generation prompt).

A conversation that does not continue the session's (an edited history, a reply the client
changed) starts a new *segment*: that prompt is rendered and tokenized whole, as without a
session. `GET /v1/sessions/{id}` returns every segment's ids and every turn's place in them,
its sampled ids, log-probs and `weight_version` (the SDK's `arctic_sdk.rollouts.session_rows`
makes training rows of it); `DELETE` forgets it.

Session ids are untrusted input: at most `MAX_ID_LEN` characters of `[A-Za-z0-9._:@+=/-]`;
a session belongs to the token that made it (another token's id is a different session, and
its `GET` answers 404); each token holds at most `max_per_owner` live sessions (a new one past
that is 429) and the server `max_total`; a session idle for `ttl_s` is forgotten; a session
holds at most `max_turns` turns. One session's turns run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .sampler import OpenAIError

__all__ = ["MAX_ID_LEN", "Session", "SessionStore", "session_id"]

MAX_ID_LEN = 128
HEADER = "X-Session-ID"
_ID = re.compile(r"[A-Za-z0-9._:@+=/-]{1,128}")  # MAX_ID_LEN


def session_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The request's session id (body `session_id` or header `X-Session-ID`; both must agree)."""
    from_body, from_header = body.get("session_id"), headers.get(HEADER)
    if from_body is not None and not isinstance(from_body, str):
        raise OpenAIError(400, "session_id: expected a string", param="session_id")
    sid = from_body or from_header or None
    if from_body and from_header and from_body != from_header:
        raise OpenAIError(
            400,
            f"session_id: the body's and the {HEADER} header's session ids differ",
            param="session_id",
            code="invalid_value",
        )
    if sid is not None and not _ID.fullmatch(sid):
        raise OpenAIError(
            400,
            f"session_id: expected 1 to {MAX_ID_LEN} characters of [A-Za-z0-9._:@+=/-] "
            f"(got {len(sid)} characters)",
            param="session_id",
            code="invalid_value",
        )
    return sid


def message_key(m: Mapping[str, Any]) -> str:
    """A message as the session compares it: role, text, tool calls (name, parsed arguments),
    tool_call_id; ids of tool calls and vendor fields are not compared."""
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or {} if isinstance(c, Mapping) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        calls.append([fn.get("name"), args])
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    key = [m.get("role"), content or "", calls, m.get("tool_call_id") or ""]
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Turn:
    segment: int
    start: int  # where its sampled ids begin in the segment's ids (= its prompt's length)
    completion_token_ids: list[int]
    logprobs: list[float] | None
    weight_version: int
    finish_reason: str


@dataclass
class Session:
    id: str
    owner: str
    model: str
    created: float
    touched: float
    segments: list[list[int]] = field(default_factory=list)  # each segment's token history
    turns: list[Turn] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the conversation the history holds
    prompt_text: str = ""  # the last turn's rendered prompt (text)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def record(self) -> dict[str, Any]:
        """What `GET /v1/sessions/{id}` answers."""
        return {
            "id": self.id,
            "object": "session",
            "model": self.model,
            "created": int(self.created),
            "segments": [{"input_ids": list(ids)} for ids in self.segments],
            "turns": [
                {
                    "segment": t.segment,
                    "start": t.start,
                    "completion_token_ids": t.completion_token_ids,
                    "logprobs": t.logprobs,
                    "weight_version": t.weight_version,
                    "finish_reason": t.finish_reason,
                }
                for t in self.turns
            ],
        }


@dataclass
class Continuation:
    """How a turn's prompt was made: the ids, and whether it extends the session's history."""

    prompt: list[int]
    extends: bool  # False: a new segment (rendered whole)


class SessionStore:
    """The server's sessions, by (token, id)."""

    def __init__(
        self,
        *,
        ttl_s: float = 3600.0,
        max_per_owner: int = 1024,
        max_total: int = 4096,
        max_turns: int = 1024,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_per_owner = max_per_owner
        self.max_total = max_total
        self.max_turns = max_turns
        self.sessions: dict[tuple[str, str], Session] = {}

    def _expire(self, now: float) -> None:
        for key, s in list(self.sessions.items()):
            if now - s.touched > self.ttl_s and not s.lock.locked():
                del self.sessions[key]

    def find(self, owner: str, sid: str) -> Session | None:
        self._expire(time.time())
        return self.sessions.get((owner, sid))

    def get(self, owner: str, sid: str) -> Session:
        s = self.find(owner, sid)
        if s is None:
            raise OpenAIError(
                404,
                f"session {sid!r} does not exist (never used by this token, or expired after "
                f"{self.ttl_s:g} s idle)",
                param="session_id",
                code="session_not_found",
            )
        return s

    def delete(self, owner: str, sid: str) -> None:
        self.get(owner, sid)
        del self.sessions[(owner, sid)]

    def open(self, owner: str, sid: str, model: str) -> Session:
        """The session (made on first use), for a turn on `model`."""
        now = time.time()
        s = self.find(owner, sid)
        if s is None:
            mine = sum(1 for o, _ in self.sessions if o == owner)
            if mine >= self.max_per_owner or len(self.sessions) >= self.max_total:
                raise OpenAIError(
                    429,
                    f"session_id: too many live sessions ({mine} of this token's "
                    f"{self.max_per_owner}, {len(self.sessions)} of {self.max_total} in all); "
                    f"DELETE /v1/sessions/{{id}} finished ones or wait {self.ttl_s:g} s for idle "
                    "ones to expire",
                    param="session_id",
                    code="too_many_sessions",
                )
            s = self.sessions[(owner, sid)] = Session(sid, owner, model, now, now)
        if s.model != model:
            raise OpenAIError(
                400,
                f"session_id: session {sid!r} samples model {s.model!r}, not {model!r}",
                param="session_id",
                code="invalid_value",
            )
        if len(s.turns) >= self.max_turns:
            raise OpenAIError(
                400,
                f"session_id: session {sid!r} holds {self.max_turns} turns, the most one may",
                param="session_id",
                code="invalid_value",
            )
        s.touched = now
        return s


def continue_prompt(
    s: Session,
    messages: Sequence[Mapping[str, Any]],
    full: str,
    render: Any,
    encode: Any,
    decode_special: Any,
    eos_text: str,
) -> Continuation:
    """The turn's prompt ids: the history verbatim plus the rendering of what was added, when
    `messages` continue the session's conversation (its messages, then its last reply); else
    the whole rendering (a new segment). `full` is the turn's prompt text; `render(msgs)` the
    template's text of a conversation that ends with an assistant reply."""
    keys = [message_key(m) for m in messages]
    n = len(s.keys)
    if not s.segments or n == 0 or keys[:n] != s.keys or len(keys) == n:
        return Continuation(encode(full), False)
    history = render(messages[:n])  # ... up to the end of the last reply's turn
    if not (full.startswith(history) and history.startswith(s.prompt_text)):
        return Continuation(encode(full), False)  # the template is not prefix-stable here
    reply = history[len(s.prompt_text) :]  # the template's rendering of the last reply
    last = s.turns[-1]
    sampled = decode_special(last.completion_token_ids)
    if reply.startswith(sampled):
        bridge = reply[len(sampled) :]
    elif eos_text and eos_text in reply:  # the reply re-renders otherwise (a tool call's JSON)
        at = reply.rindex(eos_text) + len(eos_text)
        bridge = reply[at:] if sampled.endswith(eos_text) else eos_text + reply[at:]
    else:
        return Continuation(encode(full), False)
    added = bridge + full[len(history) :]
    return Continuation(list(s.segments[-1]) + encode(added), True)


def record_turn(
    s: Session,
    messages: Sequence[Mapping[str, Any]],
    cont: Continuation,
    prompt_text: str,
    reply: Mapping[str, Any],
    ids: Sequence[int],
    logprobs: Sequence[float] | None,
    weight_version: int,
    finish_reason: str,
) -> None:
    """The session after a turn: its history ends with this prompt and the sampled ids."""
    if not cont.extends:
        s.segments.append([])
    s.turns.append(
        Turn(
            len(s.segments) - 1,
            len(cont.prompt),
            [int(t) for t in ids],
            None if logprobs is None else [float(x) for x in logprobs],
            int(weight_version),
            finish_reason,
        )
    )
    s.segments[-1] = [*cont.prompt, *ids]
    s.keys = [message_key(m) for m in messages] + [message_key(reply)]
    s.prompt_text = prompt_text
    s.touched = time.time()

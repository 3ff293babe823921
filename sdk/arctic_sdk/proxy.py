"""A local OpenAI-compatible proxy for agent frameworks: it records every turn for training.

An agent (the `openai` client, LiteLLM's `hosted_vllm/<model>`, Harbor's agents, OpenHands)
points its base URL at the proxy; the proxy forwards every `/v1/...` call to the job's endpoint
(the on-prem server's or the gateway's OpenAI routes, with the driver's token) and records each
`/v1/chat/completions` turn: the prompt and sampled token ids, the sampler's log-probs, the
`weight_version`, the messages and the reply. The driver then reads finished trajectories as
training rows (`rows`, `frame`).

A trajectory is a server-side session (`session_id`, body or `X-Session-ID`): the proxy puts
every turn of one trajectory in one session, so each turn's prompt holds the earlier turns'
sampled ids verbatim and the row is token-exact. Give each rollout its own base URL,
`{proxy}/t/{trajectory_id}/v1` (the agent then needs no session support), or let the agent send
its own `session_id` (Harbor does); turns with neither go to the trajectory "default". The proxy
asks for `logprobs` and token ids on every turn (a reply then carries them even when the agent
did not ask).

    python -m arctic_sdk.proxy --target http://127.0.0.1:8080 --token "$PAT" --port 8765 \\
        [--out turns.jsonl]

    with BackgroundProxy("http://127.0.0.1:8080", token) as proxy:
        run_agent(base_url=proxy.url_for("rollout-1"))          # .../t/rollout-1/v1
        row = proxy.row("rollout-1")                              # a rollouts.FlatRollout
        frame = rollouts.forward_backward_frame([row], [adv], loss_fn="grpo")
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from .rollouts import FlatRollout, Turn, flatten_turns, session_rows, turn_from_response

__all__ = ["BackgroundProxy", "ChatCompletionsProxy", "RecordedTurn", "main"]

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization"}


@dataclass
class RecordedTurn:
    """One chat turn through the proxy."""

    trajectory: str
    turn: Turn
    messages: list[Any]
    reply: dict[str, Any]  # the choice's message (content, tool_calls)
    finish_reason: str | None


@dataclass
class _Stream:
    """A streamed reply, reassembled from its chunks."""

    body: dict[str, Any] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    content: str = ""
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish: str | None = None

    def add(self, chunk: Mapping[str, Any]) -> None:
        for key in ("prompt_token_ids", "weight_version", "model", "id"):
            if chunk.get(key) is not None:
                self.body[key] = chunk[key]
        for ch in chunk.get("choices") or []:
            if ch.get("index", 0) != 0:
                continue
            self.ids += ch.get("token_ids") or []
            for c in (ch.get("logprobs") or {}).get("content") or []:
                self.logprobs.append(float(c["logprob"]))
            delta = ch.get("delta") or {}
            self.content += delta.get("content") or ""
            for d in delta.get("tool_calls") or []:
                call = self.calls.setdefault(
                    int(d.get("index", 0)),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = d.get("id") or call["id"]
                fn = d.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            self.finish = ch.get("finish_reason") or self.finish

    def response(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        message["tool_calls"] = [self.calls[k] for k in sorted(self.calls)]
        lp = {"content": [{"logprob": x} for x in self.logprobs]} if self.logprobs else None
        choice = {"message": message, "token_ids": self.ids, "logprobs": lp}
        return {**self.body, "choices": [{**choice, "finish_reason": self.finish}]}


class ChatCompletionsProxy:
    """The proxy's routes (aiohttp) and its record of turns, by trajectory."""

    def __init__(self, target: str, token: str = "", *, out: str | Path | None = None) -> None:
        self.target = target.rstrip("/")
        if self.target.endswith("/v1"):
            self.target = self.target[:-3]
        self.token = token
        self.turns: dict[str, list[RecordedTurn]] = {}
        self.out = Path(out) if out else None
        self._http: ClientSession | None = None
        self._lock = threading.Lock()

    # -- reading the record -----------------------------------------------------------------

    def trajectories(self) -> list[str]:
        with self._lock:
            return list(self.turns)

    def recorded(self, trajectory: str) -> list[RecordedTurn]:
        with self._lock:
            return list(self.turns.get(trajectory, []))

    def row(self, trajectory: str) -> FlatRollout:
        """The trajectory as one training row (`rollouts.flatten_turns` over its turns: token-
        exact when every turn continued the session)."""
        turns = [t.turn for t in self.recorded(trajectory)]
        if not turns:
            raise KeyError(f"no turns recorded for trajectory {trajectory!r}")
        return flatten_turns(turns)

    def pop(self, trajectory: str) -> list[RecordedTurn]:
        """Forget a trajectory's record here (its server-side session stays: `finish`)."""
        with self._lock:
            return self.turns.pop(trajectory, [])

    async def finish(self, trajectory: str) -> list[RecordedTurn]:
        """A finished trajectory: its record, forgotten here and its session deleted on the
        server (`DELETE /v1/sessions/{id}`; a token holds a bounded number of live sessions)."""
        turns = self.pop(trajectory)
        async with self._client().delete(
            f"{self.target}/v1/sessions/{trajectory}", headers=self._auth()
        ) as r:
            if r.status not in (200, 404):
                r.raise_for_status()
        return turns

    async def session_rows(self, trajectory: str) -> list[FlatRollout]:
        """The server's own record of the trajectory's session (`GET /v1/sessions/{id}`)."""
        async with self._client().get(
            f"{self.target}/v1/sessions/{trajectory}", headers=self._auth()
        ) as r:
            r.raise_for_status()
            return session_rows(await r.json())

    # -- serving ----------------------------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _client(self) -> ClientSession:
        if self._http is None or self._http.closed:
            self._http = ClientSession(timeout=ClientTimeout(total=None, sock_read=3600))
        return self._http

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/t/{trajectory}/v1/{tail:.*}", self.handle)
        app.router.add_route("*", "/v1/{tail:.*}", self.handle)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._http is not None:
            await self._http.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers.update(self._auth())
        raw = await request.read()
        url = f"{self.target}/v1/{tail}"
        chat = request.method == "POST" and tail.rstrip("/") == "chat/completions"
        trajectory = ""
        body: dict[str, Any] = {}
        if chat:
            body = json.loads(raw or b"{}")
            trajectory = (
                request.match_info.get("trajectory")
                or body.get("session_id")
                or request.headers.get("X-Session-ID")
                or "default"
            )
            body["session_id"] = trajectory  # one server-side session per trajectory
            headers.pop("X-Session-ID", None)
            headers.pop("x-session-id", None)
            body["logprobs"] = True
            body.setdefault("return_token_ids", True)
            raw = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        async with self._client().request(
            request.method, url, data=raw, headers=headers, params=request.query
        ) as up:
            keep = {
                k: v
                for k, v in up.headers.items()
                if k.lower() not in HOP_HEADERS | {"content-encoding"}
            }
            if chat and up.status == 200 and body.get("stream"):
                return await self._relay_stream(request, up, keep, trajectory, body)
            data = await up.read()
            if chat and up.status == 200:
                self._record(trajectory, body, json.loads(data))
            return web.Response(body=data, status=up.status, headers=keep)

    async def _relay_stream(
        self,
        request: web.Request,
        up: Any,
        headers: Mapping[str, str],
        trajectory: str,
        body: Mapping[str, Any],
    ) -> web.StreamResponse:
        """Relay the SSE stream as it comes and record the turn once it is whole.

        The turn is recorded before the piece that ends the stream reaches the agent, so an
        agent that starts its next turn (or hangs up) the moment it reads `[DONE]` never finds
        its last turn missing; an agent that hangs up earlier saw no whole turn: nothing is
        recorded and the upstream request is dropped (the server aborts it)."""
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)
        acc, buf, recorded = _Stream(), b"", False
        try:
            async for piece in up.content.iter_any():
                buf += piece
                ended = False
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    line = event.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        ended = True
                    elif data:
                        obj = json.loads(data)
                        if isinstance(obj, dict) and "error" not in obj:
                            acc.add(obj)
                if ended and not recorded:
                    recorded = self._record_stream(trajectory, body, acc)
                await resp.write(piece)
            if not recorded:
                self._record_stream(trajectory, body, acc)
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the agent hung up; what it saw whole is recorded above
        return resp

    def _record_stream(self, trajectory: str, body: Mapping[str, Any], acc: _Stream) -> bool:
        if not acc.ids or acc.finish is None:
            return False  # no token ids, or the turn never finished: nothing to train on
        self._record(trajectory, body, acc.response())
        return True

    def _record(self, trajectory: str, body: Mapping[str, Any], reply: Mapping[str, Any]) -> None:
        try:
            turn = turn_from_response(reply)
        except ValueError:
            return  # the endpoint returned no token ids: nothing to train on
        ch = (reply.get("choices") or [{}])[0]
        rec = RecordedTurn(
            trajectory,
            turn,
            list(body.get("messages") or []),
            dict(ch.get("message") or {}),
            ch.get("finish_reason"),
        )
        with self._lock:
            self.turns.setdefault(trajectory, []).append(rec)
        if self.out is not None:
            line = {
                "trajectory": trajectory,
                "prompt_token_ids": turn.prompt_token_ids,
                "completion_token_ids": turn.completion_token_ids,
                "logprobs": turn.logprobs,
                "weight_version": turn.weight_version,
                "messages": rec.messages,
                "reply": rec.reply,
                "finish_reason": rec.finish_reason,
            }
            with self.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")


class BackgroundProxy:
    """The proxy on a free local port, in its own thread (for synchronous drivers)."""

    def __init__(
        self,
        target: str,
        token: str = "",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        out: str | Path | None = None,
    ) -> None:
        self.proxy = ChatCompletionsProxy(target, token, out=out)
        self.host, self.port = host, port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def __enter__(self) -> BackgroundProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.proxy.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]
        self.base_url = f"http://{self.host}:{self.port}"

    def url_for(self, trajectory: str) -> str:
        """The OpenAI base URL an agent of this trajectory uses (`.../t/{id}/v1`)."""
        return f"{self.base_url}/t/{trajectory}/v1"

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def row(self, trajectory: str) -> FlatRollout:
        return self.proxy.row(trajectory)

    def recorded(self, trajectory: str) -> list[RecordedTurn]:
        return self.proxy.recorded(trajectory)

    def session_rows(self, trajectory: str) -> list[FlatRollout]:
        fut = asyncio.run_coroutine_threadsafe(self.proxy.session_rows(trajectory), self.loop)
        return fut.result(60)

    def finish(self, trajectory: str) -> list[RecordedTurn]:
        """`ChatCompletionsProxy.finish`: the record, and the server's session deleted."""
        fut = asyncio.run_coroutine_threadsafe(self.proxy.finish(trajectory), self.loop)
        return fut.result(60)

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m arctic_sdk.proxy",
        description="A local OpenAI-compatible proxy that records every chat turn for training.",
    )
    ap.add_argument("--target", required=True, help="the endpoint's base URL (http://HOST:PORT)")
    ap.add_argument("--token", default="", help="the endpoint's Bearer token")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--out", default="", help="append every recorded turn here (JSON lines)")
    args = ap.parse_args(argv)
    proxy = ChatCompletionsProxy(args.target, args.token, out=args.out or None)
    print(f"proxy: http://{args.host}:{args.port}/v1 -> {proxy.target}", file=sys.stderr)
    web.run_app(proxy.app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

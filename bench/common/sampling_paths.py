"""The concurrency benchmark's calls: one single-prompt call per path, and the batched reference.

`Paths` holds one server's clients (`bench/concurrency.py` builds it): the protocol `AsyncClient`
(HTTP, gRPC, in-process), the `openai` client and a bare aiohttp session for the OpenAI routes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

TOKEN = "bench-concurrency"
BARE = ["bare-completions", "bare-stream"]  # the same routes read by bare aiohttp, no `openai`


def greedy(max_tokens: int) -> dict[str, Any]:
    return {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}


async def timed(calls: list[Callable[[], Awaitable[int]]]) -> tuple[float, list[float], int]:
    """Run the calls at once: (wall s, per-call latencies, tokens produced)."""
    lat: list[float] = []

    async def one(call: Callable[[], Awaitable[int]]) -> int:
        t = time.perf_counter()
        n = await call()
        lat.append(time.perf_counter() - t)
        return n

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(c) for c in calls)))
    return time.perf_counter() - t0, lat, tokens


class Paths:
    """One server's clients: a batched generate, and one single-prompt call per path."""

    def __init__(self, client: Any, others: dict[str, Any], oai: Any, job: str, tokens: int):
        self.client, self.others, self.oai, self.job, self.tokens = client, others, oai, job, tokens
        self.bare: Any = None  # an aiohttp session for the bare-* paths
        self.extra: dict[str, Any] = {}  # more request fields on the OpenAI routes

    async def _bare(self, prompt: list[int] | list[list[int]], stream: bool) -> int:
        """`/v1/completions` read by aiohttp: the JSON, or each SSE event's `json.loads` (what
        any client must do at least), so the row shows the server without the `openai` client's
        own per-event cost."""
        body = {"model": self.job, "prompt": prompt, "max_tokens": self.tokens, **self.extra}
        body.update(temperature=0.0, ignore_eos=True, stream=stream)
        async with self.bare.post("/v1/completions", json=body) as r:
            r.raise_for_status()
            if not stream:
                return sum(len(c["token_ids"]) for c in (await r.json())["choices"])
            n = 0
            async for line in r.content:
                if line.startswith(b"data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        n += len(c.get("token_ids") or [])
            return n

    async def batched(self, prompts: list[list[int]]) -> int:
        """One call of all the prompts: a protocol generate, or (no protocol client: vLLM's own
        server) one `/v1/completions` of the token-id prompts."""
        if self.client is None:
            body = {"model": self.job, "prompt": prompts, "max_tokens": self.tokens, **self.extra}
            body.update(temperature=0.0, ignore_eos=True)
            async with self.bare.post("/v1/completions", json=body) as r:
                r.raise_for_status()
                return sum(len(c["token_ids"]) for c in (await r.json())["choices"])
        res = await self.client.generate(prompts=prompts, sampling_params=greedy(self.tokens))
        return sum(len(r["samples"][0]["token_ids"]) for r in res["results"])

    def path_batched(
        self, path: str, prompts: list[list[int]]
    ) -> Callable[[], Awaitable[int]] | None:
        """One call of all the prompts on `path` itself (None where the path takes one prompt a
        call: chat): the reference that pays the path's own costs — the client's per-request and
        per-event work, the route — once for N prompts, where `batched` is a protocol generate."""
        kw = {"model": self.job, "max_tokens": self.tokens, "temperature": 0.0}
        kw["extra_body"] = {"ignore_eos": True, **self.extra}

        async def completion() -> int:
            res = await self.oai.completions.create(prompt=prompts, **kw)
            return sum(len(c.model_extra["token_ids"]) for c in res.choices)

        async def stream() -> int:
            n = 0
            async for c in await self.oai.completions.create(prompt=prompts, stream=True, **kw):
                n += sum(len(ch.model_extra.get("token_ids") or []) for ch in c.choices)
            return n

        async def bare() -> int:
            return await self._bare(prompts, path == "bare-stream")

        async def protocol() -> int:
            c = self.client if path == "protocol-http" else self.others[path]
            res = await c.generate(prompts=prompts, sampling_params=greedy(self.tokens))
            return sum(len(r["samples"][0]["token_ids"]) for r in res["results"])

        if path == "openai-chat":
            return None
        table = {"openai-completions": completion, "openai-stream": stream}
        return table.get(path, bare if path in BARE else protocol)

    def single(self, path: str, prompt: list[int], text: str) -> Callable[[], Awaitable[int]]:
        sp, extra = greedy(self.tokens), {"ignore_eos": True, **self.extra}
        kw = {"model": self.job, "max_tokens": self.tokens, "temperature": 0.0, "extra_body": extra}

        async def protocol() -> int:
            c = self.client if path == "protocol-http" else self.others[path]
            res = await c.generate(prompts=[prompt], sampling_params=sp)
            return len(res["results"][0]["samples"][0]["token_ids"])

        async def completion() -> int:
            res = await self.oai.completions.create(prompt=prompt, **kw)
            return len(res.choices[0].model_extra["token_ids"])

        async def chat() -> int:
            res = await self.oai.chat.completions.create(
                messages=[{"role": "user", "content": text}], **kw
            )
            return len(res.choices[0].model_extra["token_ids"])

        async def stream() -> int:
            n = 0
            async for c in await self.oai.completions.create(prompt=prompt, stream=True, **kw):
                if c.choices:
                    n += len(c.choices[0].model_extra.get("token_ids") or [])
            return n

        async def bare() -> int:
            return await self._bare(prompt, path == "bare-stream")

        table = {"openai-completions": completion, "openai-chat": chat, "openai-stream": stream}
        return table.get(path, bare if path in BARE else protocol)


async def chat_ids(base_url: str, job: str, texts: list[str]) -> list[list[int]]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
        for t in texts:
            body = {"model": job, "messages": [{"role": "user", "content": t}]}
            async with s.post(base_url + "/tokenize", json=body) as r:
                out.append(list((await r.json())["tokens"]))
    return out

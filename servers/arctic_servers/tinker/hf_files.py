"""`/hf/...`: the tokenizer files of the server's models in the Hugging Face hub's layout, so a
Tinker client loads a model's tokenizer by the server's own model name.

The `tinker` SDK's `get_tokenizer()` (training and sampling clients) and the cookbook's
`tokenizer_utils.get_tokenizer(model_name)` call `AutoTokenizer.from_pretrained(name)`, which
asks the hub at `HF_ENDPOINT`. With `HF_ENDPOINT=http://SERVER:PORT/hf` (and, on a server with
tokens, `HF_TOKEN` = the Tinker API key) `from_pretrained("tiny-qwen2")` gets the server's
tokenizer — no hub, no model directory on the client (servers/TINKER.md).

Served: `HEAD|GET /hf/{model}/resolve/{revision}/{file}` for the tokenizer and config files
of a model the catalog has a directory for (`TOKENIZER_FILES`, never the weights), and
`GET /hf/api/models/{model}[/revision/{revision}]` (its file list); anything else 404 with
the hub's `X-Error-Code`, which `huggingface_hub` reads as "no such file". Free of `tinker`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from .catalog import Catalog

__all__ = ["HF_PREFIX", "TOKENIZER_FILES", "add_hf_routes"]

HF_PREFIX = "/hf"
TOKENIZER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
REVISION = "0" * 40  # the one revision a server's model has


def _not_found(what: str, code: str = "EntryNotFound") -> web.Response:
    return web.json_response({"error": what}, status=404, headers={"X-Error-Code": code})


def add_hf_routes(
    app: web.Application, catalog: Catalog, authorised: Callable[[web.Request], bool]
) -> None:
    """Serve `/hf/...` for `catalog`'s models on `app`; `authorised(request)` says whether the
    caller's token is one of the server's (`Authorization: Bearer` or `X-API-Key`)."""

    async def model_dir(request: web.Request, model: str) -> Path | web.Response:
        if not authorised(request):
            return web.json_response(
                {"error": "missing or invalid token: set HF_TOKEN to your Tinker API key"},
                status=401,
            )
        info = await asyncio.to_thread(catalog.info, model)
        if info is None or info.tokenizer_dir is None:
            return _not_found(f"model {model!r} has no tokenizer on this server", "RepoNotFound")
        return info.tokenizer_dir

    async def resolve(request: web.Request) -> web.StreamResponse:
        model, name = request.match_info["model"], request.match_info["file"]
        d = await model_dir(request, model)
        if isinstance(d, web.Response):
            return d
        f = d / name
        if name not in TOKENIZER_FILES or not f.is_file():
            return _not_found(f"{model}/{name} is not a tokenizer file of this server")
        data = await asyncio.to_thread(f.read_bytes)
        headers = {
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "X-Repo-Commit": REVISION,
            "Content-Length": str(len(data)),
        }
        if request.method == "HEAD":
            return web.Response(headers=headers)
        return web.Response(body=data, headers=headers)

    async def model_info(request: web.Request) -> web.Response:
        model = request.match_info["model"]
        d = await model_dir(request, model)
        if isinstance(d, web.Response):
            return d
        files = [n for n in TOKENIZER_FILES if (d / n).is_file()]
        return web.json_response(
            {"id": model, "sha": REVISION, "siblings": [{"rfilename": n} for n in files]}
        )

    async def other(request: web.Request) -> web.Response:
        return _not_found("not served by this server's /hf/ (tokenizer files only)")

    model = "{model:[^/]+(?:/[^/]+)?}"  # a name, or an org/name
    path = f"{HF_PREFIX}/{model}/resolve/{{revision}}/{{file}}"
    app.router.add_route("HEAD", path, resolve)
    app.router.add_get(path, resolve, allow_head=False)
    app.router.add_get(f"{HF_PREFIX}/api/models/{model}", model_info, allow_head=False)
    app.router.add_get(
        f"{HF_PREFIX}/api/models/{model}/revision/{{revision}}", model_info, allow_head=False
    )
    app.router.add_route("*", HF_PREFIX + "/{tail:.*}", other)

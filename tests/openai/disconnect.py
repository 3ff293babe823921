"""The disconnect proof both servers' tests run: a client that leaves a stream early has its
request aborted in the vLLM engine, long before max_tokens were produced."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests

MAX_TOKENS = 1000
MARK = "aborted after"


def leave_stream_and_wait_abort(
    v1: str, model: str, token: str, logs: Callable[[], list[str]], *, chunks: int = 5
) -> tuple[int, str]:
    """Read `chunks` token chunks of a long completion stream, close the connection, and wait
    (30 s at most) for the worker's abort line; (chunks read, that line). Asserts the abort came
    well before max_tokens and left no stream running."""
    before = sum(MARK in ln for ln in logs())
    body = {"model": model, "prompt": "Once", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    url = v1 + "/completions"
    with requests.post(url, json=body, headers=headers, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        got = 0
        for line in r.iter_lines():
            if line.startswith(b"data: {") and b'"token_ids": [' in line:
                got += 1
                if got >= chunks:
                    break
    deadline = time.time() + 30
    aborted: list[str] = []
    while not aborted:
        assert time.time() < deadline, "the worker did not abort the stream"
        time.sleep(0.2)
        aborted = [ln for ln in logs() if MARK in ln][before:]
    line = aborted[0]
    produced = int(line.split(MARK + " ")[1].split(" of ")[0])
    assert produced < MAX_TOKENS // 2, line
    assert "0 streams running" in line, line
    return got, line

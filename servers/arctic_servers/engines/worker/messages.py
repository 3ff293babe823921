"""The worker pipe's message shapes that engines, the worker loop and both servers' clients share:
the command names with a protocol of their own (a stream, an abort) and the batch of one engine
step (`worker.py`'s docstring has the whole protocol). Imports nothing of the engines."""

from __future__ import annotations

from typing import Any

STREAM_CMD = "generate_stream"  # a command answered by partial messages, then its reply
ABORT_CMD = "abort_stream"  # ends a batched command early (a stream's final: finish "abort")
IMMEDIATE_CMDS = frozenset({ABORT_CMD, "stream_stats"})  # never deferred

# Worker commands of a pool's engines (not ops): a job joins, leaves; the pool's counters.
ATTACH_CMD = "attach"
DETACH_CMD = "detach"
POOL_STATS_CMD = "pool_stats"
TENANT_ARG = "tenant"  # the command argument naming the tenant (tenant_queue.py)

BATCH_KIND = "batch"  # {"kind": "batch", "msgs": [...]}: the messages of one engine step


def send_step(pump: Any, send: Any) -> None:
    """One engine step; its messages (a partial per stream, finished replies) in one pipe
    message, so N streams cost the engine's thread one send a step, not N."""
    out: list[dict[str, Any]] = []
    pump(out.append)
    if len(out) == 1:
        send(out[0])
    elif out:
        send({"kind": BATCH_KIND, "msgs": out})


def unbatch(msg: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a pipe message carries (`send_step`)."""
    return list(msg["msgs"]) if msg.get("kind") == BATCH_KIND else [msg]


def merge_stream(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive messages of one stream (partials; the final result may be last) as one: all
    their tokens, log-probs and text, the last one's other fields. A consumer that fell behind
    the engine (a busy server, a slow client) sends one chunk for what piled up, not one each."""
    if len(items) == 1:
        return items[0]
    out = dict(items[-1])
    out["token_ids"] = [t for it in items for t in it.get("token_ids") or []]
    out["text"] = "".join(str(it.get("text") or "") for it in items)
    lps = [it.get("logprobs") for it in items]
    out["logprobs"] = None if any(lp is None for lp in lps) else [x for lp in lps for x in lp or []]
    return out

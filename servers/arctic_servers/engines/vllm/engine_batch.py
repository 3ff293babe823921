"""The vLLM engine's continuous batch, fed by every sampling command of a worker.

Every command that runs on a sampler's engine — `generate` (prompts × n whole samples),
`generate_stream` (one sample, its new tokens after every step) and the scorers `log_probs` /
`forward` (prompt log-probs) — is added to vLLM's `LLMEngine` as requests the moment the worker
reads it (`EngineBatch.add`: one submission path for all of them), and the worker's serve loop
calls `pump` between reads of its pipe. Each `pump` is one `LLMEngine.step()` over every request
in the engine, whichever command sent it, so concurrent calls share the continuous batch exactly
as the prompts of one batched call do. After the step, `pump` sends:

- per stream that got tokens, `{"id", "partial": {token_ids, logprobs, text, at,
  weight_version}}` with the new tokens only (`RequestOutputKind.DELTA`), and when it ends its
  final `{"id", "ok": True, "result": {..., "finished": True, finish_reason, stop_reason}}`;
- per other command whose requests have all finished (`RequestOutputKind.FINAL_ONLY`),
  `{"id", "ok": True, "result": finish(outputs)}` (its outputs in input order).

`abort` removes a command's requests from the engine (`LLMEngine.abort_request`), so a client
that went away stops costing engine steps. A command records the engine's `weight_version`
(and its LoRA adapter version) when it is added; full weights change only while the batch is
empty (the serve loop defers weight loads until then), and a LoRA pool's new adapter version is
a new adapter, the old one registered while a request uses it (`loras_in_use`), so every request
of a command ran on the weights of that version.

When the batch empties, one line says what the busy period served (calls, requests, engine steps,
the most requests in the engine at once): the operator's view of batching, read by the tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import WorkerError, error_body

Send = Callable[[dict[str, Any]], None]
Finish = Callable[[list[Any]], dict[str, Any]]
IDLE_MARK = "engine batch:"  # the busy-period line


@dataclass
class _Call:
    """One command's requests in the engine."""

    msg_id: int
    what: str  # the command, for messages
    ids: list[str]  # engine request ids, in input order
    finish: Finish | None  # None: a stream (its tokens are sent step by step)
    version: int
    outs: dict[str, Any] = field(default_factory=dict)  # engine id -> final RequestOutput
    max_tokens: int = 0  # streams: what it may produce, what it produced
    produced: int = 0
    logprobs: bool = False
    lora_id: int = 0  # the LoRA adapter version its requests run with (0: none)


@dataclass
class _Period:
    """What the engine served since it last was idle."""

    calls: int = 0
    requests: int = 0
    steps: int = 0
    peak: int = 0
    peak_adapters: int = 0  # the most LoRA adapters the engine's requests used at once
    t0: float = 0.0


class EngineBatch:
    def __init__(self, engine: Any) -> None:
        self.engine = engine  # vllm.v1.engine.llm_engine.LLMEngine
        self.calls: dict[int, _Call] = {}  # message id -> its command's requests
        self.owner: dict[str, _Call] = {}  # engine request id -> its command
        self.stream_counts = {"started": 0, "finished": 0, "aborted": 0}
        self.steps = 0
        self.peak_adapters = 0  # the most adapters in one engine step, ever (stats)
        self.period = _Period()

    def busy(self) -> bool:
        """Whether requests are in the engine (the serve loop then pumps it)."""
        return bool(self.calls)

    def loras_in_use(self) -> set[int]:
        """The LoRA adapter versions (`lora_int_id`) the requests in the engine run with."""
        return {c.lora_id for c in self.calls.values() if c.lora_id}

    def streams(self) -> int:
        return sum(1 for c in self.calls.values() if c.finish is None)

    # ------------------------------------------------------------------ submission

    def add(
        self,
        msg_id: int,
        what: str,
        inputs: Sequence[Any],
        params: Sequence[Any],
        finish: Finish | None,
        *,
        version: int,
        lora: Any = None,
    ) -> None:
        """Add a command's requests (`inputs[i]` with `params[i]`); `finish=None`: a stream of
        one request whose tokens `pump` sends as they come; `lora`: the LoRARequest they run
        with (a LoRA job's adapter version), None for the base weights."""
        from vllm.sampling_params import RequestOutputKind

        if msg_id in self.calls:
            raise WorkerError("invalid_argument", f"message id {msg_id} is already running")
        kind = RequestOutputKind.DELTA if finish is None else RequestOutputKind.FINAL_ONLY
        ids: list[str] = []
        try:
            for i, (inp, p) in enumerate(zip(inputs, params, strict=True)):
                p.output_kind = kind
                rid = f"arctic-stream-{msg_id}" if finish is None else f"arctic-{msg_id}-{i}"
                self.engine.add_request(rid, inp, p, lora_request=lora)
                ids.append(rid)
        except ValueError as exc:
            if ids:
                self.engine.abort_request(ids)
            if any(getattr(p, "structured_outputs", None) is not None for p in params):
                path = "sampling_params.structured_outputs"  # vLLM refused the constraint
                raise WorkerError("invalid_argument", f"field {path}: {exc}", field=path) from None
            raise WorkerError("invalid_argument", f"{what}: {exc}") from None
        call = _Call(
            msg_id, what, ids, finish, version, lora_id=int(getattr(lora, "lora_int_id", 0))
        )
        if finish is None:
            call.max_tokens = int(params[0].max_tokens or 0)
            call.logprobs = params[0].logprobs is not None
            self.stream_counts["started"] += 1
        if not self.calls:
            self.period = _Period(t0=time.perf_counter())
        self.calls[msg_id] = call
        for rid in ids:
            self.owner[rid] = call
        self.period.calls += 1
        self.period.requests += len(ids)

    # ------------------------------------------------------------------ abort

    def abort(self, msg_id: int) -> list[dict[str, Any]]:
        """Remove command `msg_id`'s requests from the engine: the messages that end it (none
        when it had finished already)."""
        call = self.calls.get(int(msg_id))
        if call is None:
            return []
        self._drop(call)
        self.engine.abort_request(list(call.ids))
        if call.finish is not None:
            print(
                f"{call.what} {call.msg_id}: aborted ({len(call.ids)} requests); "
                f"{self.engine.get_num_unfinished_requests()} requests in the engine",
                flush=True,
            )
            self._maybe_idle()
            err = {"code": "request_cancelled", "message": f"{call.what} was aborted",
                   "details": {}}  # fmt: skip
            return [{"id": call.msg_id, "ok": False, "error": err}]
        self.stream_counts["aborted"] += 1
        print(
            f"generate_stream {call.ids[0]}: aborted after {call.produced} of {call.max_tokens} "
            f"tokens; {self.streams()} streams running, "
            f"{self.engine.get_num_unfinished_requests()} requests in the engine",
            flush=True,
        )
        self._maybe_idle()
        result: dict[str, Any] = {
            "token_ids": [],
            "logprobs": [] if call.logprobs else None,
            "text": "",
            "at": time.time(),
            "finished": True,
            "finish_reason": "abort",
            "stop_reason": None,
            "weight_version": call.version,
        }
        return [{"id": call.msg_id, "ok": True, "result": result}]

    def abort_all(self) -> None:
        for msg_id in list(self.calls):
            self.abort(msg_id)

    def _drop(self, call: _Call) -> None:
        self.calls.pop(call.msg_id, None)
        for rid in call.ids:
            self.owner.pop(rid, None)

    # ------------------------------------------------------------------ stepping

    def pump(self, send: Send) -> None:
        """One engine step over every request in it; the messages of what it produced."""
        p = self.period
        p.peak = max(p.peak, int(self.engine.get_num_unfinished_requests()))
        p.peak_adapters = max(p.peak_adapters, len(self.loras_in_use()))
        self.peak_adapters = max(self.peak_adapters, p.peak_adapters)
        try:
            outs = self.engine.step()
        except Exception as exc:
            err = {"code": "internal", "message": f"engine step failed: {exc}", "details": {}}
            for call in list(self.calls.values()):
                send({"id": call.msg_id, "ok": False, "error": err})
                self._drop(call)
                self.engine.abort_request(list(call.ids))
            self._maybe_idle()
            return
        self.steps += 1
        p.steps += 1
        now = time.time()
        for ro in outs:
            owner = self.owner.get(str(ro.request_id))
            if owner is None or not isinstance(ro.outputs, list):
                continue
            if owner.finish is None:
                self._stream_output(owner, ro, now, send)
            elif ro.finished:
                self._finished(owner, ro, send)
        self._maybe_idle()

    def _finished(self, call: _Call, ro: Any, send: Send) -> None:
        rid = str(ro.request_id)
        call.outs[rid] = ro
        self.owner.pop(rid, None)
        if len(call.outs) < len(call.ids):
            return
        self.calls.pop(call.msg_id, None)
        assert call.finish is not None
        try:
            result = call.finish([call.outs[i] for i in call.ids])
        except Exception as exc:
            send({"id": call.msg_id, "ok": False, "error": error_body(exc, call.what)})
            return
        send({"id": call.msg_id, "ok": True, "result": result})

    def _stream_output(self, call: _Call, ro: Any, now: float, send: Send) -> None:
        if not ro.outputs:
            return
        co = ro.outputs[0]
        toks = [int(t) for t in co.token_ids]
        call.produced += len(toks)
        part: dict[str, Any] = {"token_ids": toks, "text": co.text, "at": now}
        lps: Any = co.logprobs
        part["logprobs"] = (
            [float(lps[j][t].logprob) for j, t in enumerate(toks)]
            if call.logprobs and lps is not None
            else None
        )
        part["weight_version"] = call.version
        if not ro.finished:
            if toks:
                send({"id": call.msg_id, "partial": part})
            return
        self._drop(call)
        self.stream_counts["finished"] += 1
        part.update(
            finished=True,
            finish_reason=co.finish_reason or "length",
            stop_reason=co.stop_reason if isinstance(co.stop_reason, str | int) else None,
        )
        send({"id": call.msg_id, "ok": True, "result": part})

    def _maybe_idle(self) -> None:
        if self.calls or not self.period.calls:
            return
        p = self.period
        print(
            f"{IDLE_MARK} {p.calls} calls ({p.requests} requests) in {p.steps} engine steps, "
            f"{time.perf_counter() - p.t0:.3f} s; at most {p.peak} requests in the engine at once"
            + (f", of {p.peak_adapters} LoRA adapters" if p.peak_adapters else ""),
            flush=True,
        )
        self.period = _Period()

    def stats(self) -> dict[str, Any]:
        """Streams running / started / finished / aborted, commands running, engine steps."""
        return {
            "running": self.streams(),
            **self.stream_counts,
            "calls": len(self.calls),
            "steps": self.steps,
            "engine_unfinished": int(self.engine.get_num_unfinished_requests()),
            "peak_adapters": self.peak_adapters,
        }

"""The server-side protocol layer over live HTTP and gRPC, with a toy servicer."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest

import dssst1
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2, jobs_pb2
from arctic_servers._generated.servicer import ServicerBase
from arctic_servers.protocol.config import ProtocolConfig, ProtocolLimits
from arctic_servers.protocol.context import CallContext
from arctic_servers.protocol.sqlite_store import SqliteChunkStore, SqliteRequestStore
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving.serve import RunningServer, start_server

PREFIX = "/api/v2/databases/db/schemas/sc/cortex-training"
OCTET = {"Content-Type": "application/octet-stream"}


class Toy(ServicerBase):
    """Counts executions; fwd-bwd echoes shapes; step can be slowed down."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.step_delay = 0.0
        self.big_result = 0

    async def step(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.step_delay)
        self.log.append(("step", ctx.seq))
        return {"metrics": {"loss": 0.0, "num_tokens": 0, "global_step": len(self.log)}}

    async def forward_backward(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        ids = body["kwargs"]["input_ids"]
        self.log.append(("forward-backward", ctx.seq))
        out: dict[str, Any] = {
            "loss": 1.5,
            "metrics": {"loss": 1.5, "num_tokens": int(ids.size)},
            "outputs": {"logprobs_shifted": -np.ones(ids.shape, np.float32)},
        }
        if self.big_result:
            out["outputs"]["entropy"] = np.arange(self.big_result, dtype=np.float32)
        return out

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("disk on fire")

    async def get_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return {"job": {"job_id": body["job_id"], "state": "running"}}


async def _start(toy: Toy, **cfg: Any) -> RunningServer:
    return await start_server(toy, ProtocolConfig(**cfg))


@pytest.fixture
async def env() -> AsyncIterator[tuple[Toy, RunningServer, aiohttp.ClientSession, str]]:
    toy = Toy()
    srv = await _start(toy)
    async with aiohttp.ClientSession() as session:
        yield toy, srv, session, srv.base_url + PREFIX
    await srv.close()


def _batch(rows: int = 3, cols: int = 400) -> dict[str, Any]:
    return {"args": [], "kwargs": {"input_ids": np.arange(rows * cols).reshape(rows, cols)}}


def _chunks(body: Any, group: str, max_bytes: int = 3000) -> list[bytes]:
    frame = dssst1.dumps(body)
    return dssst1.encode_chunks(
        frame, kind="request", max_bytes=max_bytes, operation="forward-backward",
        chunk_group_id=group,
    )  # fmt: skip


async def _post(s: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with s.post(url, **kw) as r:
        return r.status, await r.json()


async def test_capabilities_and_unimplemented(env: Any) -> None:
    _toy, srv, s, base = env
    async with s.get(base + "/capabilities") as r:
        caps = await r.json()
    assert {"forward-backward", "step", "get-request"} <= set(caps["routes"])
    assert "generate" not in caps["routes"]
    assert caps["features"]["grpc_port"] == srv.grpc_port
    status, body = await _post(s, base + "/7/generate", data=b"x", headers=OCTET)
    assert (status, body["error"]["code"]) == (501, "unimplemented")


async def test_keyed_step_executes_once_and_conflicts(env: Any) -> None:
    toy, _, s, base = env
    key = {"Idempotency-Key": "k-1"}
    first = await _post(s, base + "/7/step", json={}, headers=key)
    again = await _post(s, base + "/7/step", json={}, headers=key)
    assert first[0] == again[0] == 200
    assert first[1]["request_id"] == again[1]["request_id"]
    assert [op for op, _ in toy.log] == ["step"]
    status, body = await _post(s, base + "/7/step", json={"learning_rate": 0.1}, headers=key)
    assert (status, body["error"]["code"]) == (409, "idempotency_key_conflict")


async def test_unknown_fields_are_all_named(env: Any) -> None:
    _, _, s, base = env
    status, body = await _post(s, base + "/7/step", json={"lr": 1, "foo": 2})
    assert status == 400
    assert body["error"]["details"]["unknown_fields"] == ["lr", "foo"]


async def test_chunk_group_out_of_order_replay_restart_conflict(env: Any) -> None:
    toy, _, s, base = env
    chunks = _chunks(_batch(), "g-1")
    assert len(chunks) > 2
    order = list(range(len(chunks)))
    order = [0, *random.Random(1).sample(order[1:], len(order) - 1)]
    answers = [await _post(s, base + "/7/forward-backward", data=chunks[i], headers=OCTET)
               for i in order]  # fmt: skip
    assert all(a[1].get("chunk_cached") for a in answers[:-1])
    status, done = answers[-1]
    assert status == 200 and done["status"] == "completed"
    result = dssst1.loads(dssst1.decode_inline_envelope(done["result"]))
    assert result["outputs"]["logprobs_shifted"].shape == (3, 400)
    replay = await _post(s, base + "/7/forward-backward", data=chunks[1], headers=OCTET)
    assert replay[1]["request_id"] == done["request_id"]
    assert len(toy.log) == 1  # at-most-once
    status, body = await _post(s, base + "/7/forward-backward",
                               data=_chunks(_batch(), "g-2")[1], headers=OCTET)  # fmt: skip
    assert (status, body["error"]["code"]) == (409, "chunk_group_restart_required")
    other = _chunks(_batch(cols=401), "g-1")
    status, body = await _post(s, base + "/7/forward-backward", data=other[0], headers=OCTET)
    assert (status, body["error"]["code"]) == (409, "chunk_group_conflict")


async def test_out_of_range_chunk_idx_is_invalid_not_restart(env: Any) -> None:
    """An index outside [0, total_chunks) is a bad descriptor whatever group it names: 400, never
    the 409 that would send a client into a replay (DSSST1.md §8 check order)."""
    from dssst1._chunks import _chunk_frame
    from dssst1._format import DEFAULT_LIMITS

    toy, _, s, base = env
    desc = {"chunk_idx": 5, "total_chunks": 2, "frame_sha256": "0" * 64, "frame_size_bytes": 4,
            "chunk_group_id": "g-range", "operation": "forward-backward"}  # fmt: skip
    frame = _chunk_frame(desc, "request", memoryview(b"ab"), DEFAULT_LIMITS).tobytes()
    status, body = await _post(s, base + "/7/forward-backward", data=frame, headers=OCTET)
    assert (status, body["error"]["code"]) == (400, "chunk_descriptor_invalid")
    assert body["error"]["details"]["field"] == "op.request_chunk.chunk_idx"
    assert toy.log == []


async def test_plain_frame_runs_and_empty_body_is_missing(env: Any) -> None:
    """A DSSST1 body without a chunk descriptor is the whole value (no replay identity); an
    empty body is `missing_field` (PROTOCOL.md §3.5)."""
    toy, _, s, base = env
    status, done = await _post(s, base + "/7/forward-backward", data=dssst1.dumps(_batch()),
                               headers=OCTET)  # fmt: skip
    assert status == 200 and done["status"] == "completed"
    assert [op for op, _ in toy.log] == ["forward-backward"]
    status, body = await _post(s, base + "/7/forward-backward", data=b"", headers=OCTET)
    assert (status, body["error"]["code"]) == (400, "missing_field")


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"kwargs": {"input_ids": np.zeros((2, 3), np.float32)}}, "dtype_mismatch",
         "kwargs.input_ids"),
        ({"kwargs": {"input_ids": np.zeros((2, 3), np.int64)},
          "context": {"advantages": np.zeros((2, 4), np.float32)}}, "shape_mismatch",
         "context.advantages"),
        ({"args": []}, "missing_field", "kwargs"),
        ({"kwargs": {"input_ids": np.zeros(3, np.int64)}}, "shape_mismatch", "kwargs.input_ids"),
    ],
)  # fmt: skip
async def test_body_validation(env: Any, body: Any, code: str, field: str) -> None:
    _, _, s, base = env
    status, err = await _post(s, base + "/7/forward-backward", data=dssst1.dumps(body),
                              headers=OCTET)  # fmt: skip
    assert (status, err["error"]["code"], err["error"]["details"]["field"]) == (400, code, field)


async def test_codec_errors_are_400_not_500(env: Any) -> None:
    _, _, s, base = env
    frame = bytearray(dssst1.dumps(_batch(1, 4)))
    frame[12] ^= 0xFF
    status, err = await _post(s, base + "/7/forward-backward", data=bytes(frame), headers=OCTET)
    assert 400 <= status < 500, err


async def test_sequence_numbers_order_execution() -> None:
    toy = Toy()
    srv = await _start(toy, answer_mode="async")
    base = srv.base_url + PREFIX
    async with aiohttp.ClientSession() as s:
        posts = [
            _post(s, base + "/7/step", json={}, headers={"X-Arctic-Seq": str(n)}) for n in (3, 2, 1)
        ]
        answers = await asyncio.gather(*posts)
        for _, a in answers:
            while True:
                async with s.get(f"{base}/7/requests/{a['request_id']}") as r:
                    if (await r.json())["status"] == "completed":
                        break
                await asyncio.sleep(0.01)
    await srv.close()
    assert [seq for _, seq in toy.log] == [1, 2, 3]


async def test_sequence_gap_times_out() -> None:
    toy = Toy()
    srv = await _start(toy, answer_mode="inline",
                       limits=ProtocolLimits(sequence_gap_timeout_seconds=0.2))  # fmt: skip
    async with aiohttp.ClientSession() as s:
        status, body = await _post(s, srv.base_url + PREFIX + "/7/step", json={},
                                   headers={"X-Arctic-Seq": "5"})  # fmt: skip
    await srv.close()
    assert status == 200 and body["status"] == "failed"
    assert body["error"]["code"] == "sequence_gap_timeout"


async def test_polling_cursor_draining_and_octet_results() -> None:
    toy = Toy()
    toy.big_result = 200_000
    limits = ProtocolLimits(max_inline_result_bytes=100_000, result_chunk_bytes=64_000)
    srv = await _start(toy, answer_mode="async", limits=limits)
    base = srv.base_url + PREFIX
    async with aiohttp.ClientSession() as s:
        for c in _chunks(_batch(), "g-p"):
            status, sub = await _post(s, base + "/7/forward-backward", data=c, headers=OCTET)
        assert status == 202
        url = f"{base}/7/requests/{sub['request_id']}"
        events: list[dict[str, Any]] = []
        cursor = ""
        while True:
            async with s.get(url, params={"cursor": cursor, "max_events": "2"}) as r:
                poll = await r.json()
            events += poll["events"]
            if poll["status"] == "completed" and not poll["next_cursor"]:
                break
            cursor = poll["next_cursor"] or cursor
            await asyncio.sleep(0.01 if not poll["next_cursor"] else 0)
        frames = [dssst1.decode_result_chunk_event(e) for e in events]
        result = dssst1.loads(dssst1.decode_chunks(frames, kind="result"))
        assert result["outputs"]["entropy"].shape == (200_000,)
        async with s.get(url, headers={"Accept": "application/octet-stream"}) as r:
            assert r.content_type == "application/octet-stream"
            value = dssst1.loads(await r.read())
        assert value["status"] == "completed"
        assert value["result"]["outputs"]["entropy"][-1] == 199_999
    await srv.close()


async def test_cancel_pending_request() -> None:
    toy = Toy()
    srv = await _start(toy, answer_mode="async")
    base = srv.base_url + PREFIX
    async with aiohttp.ClientSession() as s:
        _, sub = await _post(s, base + "/7/step", json={}, headers={"X-Arctic-Seq": "2"})
        status, body = await _post(s, f"{base}/7/requests/{sub['request_id']}:cancel")
        assert status == 200 and body["cancelled"] is True
        async with s.get(f"{base}/7/requests/{sub['request_id']}") as r:
            poll = await r.json()
        assert poll["status"] == "cancelled"
        assert poll["error"]["code"] == "request_cancelled"
    await srv.close()
    assert toy.log == []


async def test_servicer_crash_is_a_failed_request(env: Any) -> None:
    _, _, s, base = env
    status, body = await _post(s, base + "/7/save", json={})
    assert status == 200 and body["status"] == "failed"
    assert body["error"]["code"] == "internal"
    assert "disk on fire" in body["error"]["message"]


async def test_auth() -> None:
    srv = await _start(Toy(), tokens=frozenset({"sekrit"}))
    base = srv.base_url + PREFIX
    async with aiohttp.ClientSession() as s:
        assert (await _post(s, base + "/7/step", json={}))[0] == 401
        bad = {"Authorization": "Bearer nope"}
        assert (await _post(s, base + "/7/step", json={}, headers=bad))[0] == 401
        good = {"Authorization": "Bearer sekrit"}
        assert (await _post(s, base + "/7/step", json={}, headers=good))[0] == 200
        async with s.get(base + "/capabilities") as r:
            assert r.status == 200
    await srv.close()


async def test_body_too_large() -> None:
    srv = await _start(Toy(), limits=ProtocolLimits(max_body_bytes=1000))
    async with aiohttp.ClientSession() as s:
        status, body = await _post(s, srv.base_url + PREFIX + "/7/forward-backward",
                                   data=b"\0" * 5000, headers=OCTET)  # fmt: skip
    await srv.close()
    assert (status, body["error"]["code"]) == (413, "body_too_large")


async def test_grpc_frames_errors_and_unary(env: Any) -> None:
    _, srv, _, _ = env
    async with grpc.aio.insecure_channel(srv.grpc_target) as ch:
        fb = ch.stream_stream(
            "/arctic.v1.TrainingService/ForwardBackward",
            request_serializer=dssst1_pb2.Frame.SerializeToString,
            response_deserializer=dssst1_pb2.Frame.FromString,
        )
        chunks = _chunks(_batch(), "g-grpc")

        async def frames() -> AsyncIterator[dssst1_pb2.Frame]:
            for c in chunks:
                yield dssst1_pb2.Frame(dssst1=c)

        md = (("x-arctic-job-id", "7"),)
        out = [m.dssst1 async for m in fb(frames(), metadata=md)]
        value = dssst1.loads(dssst1.decode_chunks(out, kind="result"))
        assert value["status"] == "completed"
        assert value["result"]["outputs"]["logprobs_shifted"].dtype == np.float32

        async def bad() -> AsyncIterator[dssst1_pb2.Frame]:
            yield dssst1_pb2.Frame(dssst1=_chunks(_batch(), "g-x")[1])

        with pytest.raises(grpc.aio.AioRpcError) as info:
            [m async for m in fb(bad(), metadata=md)]
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        trailer = dict(info.value.trailing_metadata() or ())["x-arctic-error-bin"]
        assert b"chunk_group_restart_required" in trailer

        get_job = ch.unary_unary(
            "/arctic.v1.JobService/GetJob",
            request_serializer=jobs_pb2.GetJobRequest.SerializeToString,
            response_deserializer=jobs_pb2.GetJobResponse.FromString,
        )
        reply = await get_job(jobs_pb2.GetJobRequest(job_id="9"))
        assert reply.job.state == jobs_pb2.JOB_STATE_RUNNING


async def test_sqlite_store_keeps_results_across_restart(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    toy = Toy()
    key = {"Idempotency-Key": "durable"}
    for round_ in range(2):
        srv = await start_server(
            toy, ProtocolConfig(), request_store=SqliteRequestStore(db),
            chunk_store=SqliteChunkStore(db),
        )  # fmt: skip
        async with aiohttp.ClientSession() as s:
            status, body = await _post(s, srv.base_url + PREFIX + "/7/step", json={},
                                       headers=key)  # fmt: skip
        await srv.close()
        assert status == 200 and body["status"] == "completed", round_
    assert len(toy.log) == 1


def test_protocol_error_refuses_unknown_codes() -> None:
    with pytest.raises(ValueError):
        ProtocolError("no_such_code", "x")


async def test_refused_sequenced_call_does_not_stall_the_next() -> None:
    toy = Toy()
    srv = await _start(toy, answer_mode="inline",
                       limits=ProtocolLimits(sequence_gap_timeout_seconds=5))  # fmt: skip
    base = srv.base_url + PREFIX
    async with aiohttp.ClientSession() as s:
        status, _ = await _post(
            s, base + "/7/step", json={"bogus": 1}, headers={"X-Arctic-Seq": "1"}
        )
        assert status == 400
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        status, body = await _post(s, base + "/7/step", json={}, headers={"X-Arctic-Seq": "2"})
        assert status == 200 and body["status"] == "completed"
        assert loop.time() - t0 < 4  # did not wait out the gap timeout
    await srv.close()


@pytest.mark.parametrize(
    ("value", "ok"),
    [(None, True), (0.0, True), (0, True), (3e-4, True), (-1e-9, False), (float("nan"), False),
     (float("inf"), False), ("fast", False), (True, False)],
)  # fmt: skip
def test_learning_rate_is_a_finite_number_at_least_zero(value: Any, ok: bool) -> None:
    """One rule for every server (training.proto StepRequest.learning_rate): the protocol
    layer's body check (type, finiteness, the spec's `ge: 0` bound), then the shared reader."""
    from arctic_sdk.spec.pb.arctic.v1 import training_pb2
    from arctic_servers.rules.errors import ProtocolError
    from arctic_servers.rules.fields import learning_rate
    from arctic_servers.rules.validate import validate_body

    body = {} if value is None else {"learning_rate": value}
    desc = training_pb2.StepRequest.DESCRIPTOR
    if ok:
        validate_body(desc, body)
        assert learning_rate(body) == (None if value is None else float(value))
    else:
        with pytest.raises(ProtocolError) as exc:
            validate_body(desc, body)
        assert exc.value.code == "invalid_argument"
        assert exc.value.details["field"] == "learning_rate"


def test_the_servers_default_path_is_the_sdks_default_prefix() -> None:
    """The prefix the on-prem server and the gateway print is where an SDK with only a base URL
    calls (PROTOCOL.md §3.1)."""
    from arctic_sdk.config import CortexConfig
    from arctic_servers.serving.http_app import DEFAULT_PATH

    assert CortexConfig(base_url="http://h:1").prefix_url() == "http://h:1" + DEFAULT_PATH

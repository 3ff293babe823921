#!/usr/bin/env python3
"""SDK transport benchmark: the SDK against bare aiohttp / grpc calls of the same bytes.

    python bench/transport.py            # the full run recorded in bench/README.md
    python bench/transport.py --smoke    # small sizes, a few seconds (CI; no thresholds)

A local arctic.v1 server whose servicer does no work runs in a subprocess (its own GIL), serving
HTTP and gRPC through the real protocol core. Against it, in one run:

1. a forward-backward of one large frame (256 MiB of int64 `input_ids`), through
   `AsyncClient` over HTTP and over gRPC, against a bare aiohttp POST / bare grpc.aio stream of
   the same chunk-frame bytes to the same route, with the same client-side hashing (the frame's
   sha256, and the per-chunk CRC-32 the server advertises); the server does identical work in
   both;
2. 1,000 small `step` calls, SDK against a bare POST / unary-stream call of the same body and
   headers (token, idempotency key, sequence number) to the same route;
3. a training loop of forward-backward + step per iteration, pipelined (both submitted, then
   awaited) against the same loop awaiting each call, with `--work-ms` of server work per call.

Targets (reported, not asserted): 1. <= 1.10x the bare call of the same transport; 2. <= 1.3x;
3. the pipelined loop costs about one round trip per step plus the server work.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for sub in ("sdk", "servers"):
    sys.path.insert(0, str(ROOT / sub))

import dssst1  # noqa: E402
from arctic_sdk import AsyncClient  # noqa: E402
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2  # noqa: E402
from arctic_sdk.spec.tables.methods import FORWARD_BACKWARD, STEP  # noqa: E402

MiB = 1 << 20
TOKEN = "bench-token"
PREFIX = "/api/v2/databases/bench/schemas/bench/cortex-training"
# The SDK clients number their calls (X-Arctic-Seq), as the owner of a job does.
HTTP: dict[str, Any] = {
    "token": TOKEN,
    "database": "bench",
    "schema": "bench",
    "progress": False,
    "sequencing": True,
}


def GRPC(srv: Server) -> dict[str, Any]:
    return {
        "transport": "grpc",
        "grpc_target": srv.grpc_target,
        "token": TOKEN,
        "progress": False,
        "sequencing": True,
    }


# ----------------------------------------------------------------------------- server


def serve(work_ms: float, rtt_ms: float) -> None:
    """The server process: prints its ports, serves until stdin closes. `rtt_ms` delays every
    HTTP request before it is handled (a network round trip), `work_ms` is each op's work."""
    from aiohttp import web

    from arctic_servers._generated.servicer import ServicerBase
    from arctic_servers.protocol.config import ProtocolConfig
    from arctic_servers.serving.serve import start_server

    work, rtt = work_ms / 1000.0, rtt_ms / 1000.0

    @web.middleware
    async def latency(request: web.Request, handler: Any) -> web.StreamResponse:
        await asyncio.sleep(rtt)
        return await handler(request)  # type: ignore[no-any-return]

    def configure(app: web.Application, core: Any) -> None:
        if rtt:
            app.middlewares.insert(0, latency)

    class NoWork(ServicerBase):
        steps = 0

        async def create_job(self, ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
            return {"job_id": "bench"}

        async def get_job(self, ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
            return {"job": {"job_id": "bench", "state": "running"}}

        async def forward_backward(self, ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
            if work:
                await asyncio.sleep(work)
            return {"loss": 0.0, "metrics": {"loss": 0.0, "num_tokens": 0}}

        async def step(self, ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
            if work:
                await asyncio.sleep(work)
            NoWork.steps += 1
            return {"metrics": {"global_step": NoWork.steps}}

    async def main() -> None:
        cfg = ProtocolConfig(server="bench", tokens=frozenset({TOKEN}), answer_mode="inline")
        server = await start_server(NoWork(), cfg, configure_app=configure)
        print(json.dumps({"http": server.http_port, "grpc": server.grpc_port}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.close()

    asyncio.run(main())


class Server:
    def __init__(self, work_ms: float = 0.0, rtt_ms: float = 0.0) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                "--work-ms",
                str(work_ms),
                "--rtt-ms",
                str(rtt_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ports = json.loads(self.proc.stdout.readline())
        self.base_url = f"http://127.0.0.1:{ports['http']}"
        self.grpc_target = f"127.0.0.1:{ports['grpc']}"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ----------------------------------------------------------------------------- timing


async def paired(fns: dict[str, Callable[[], Awaitable[Any]]], rounds: int) -> dict[str, float]:
    """The best time of each function over `rounds` rounds; each round runs every function once,
    in alternating order, so load that comes and goes on a shared machine hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            await fns[name]()
            times[name].append(time.perf_counter() - t)
    return {name: min(ts) for name, ts in times.items()}


def row(name: str, seconds: float, base: float | None, extra: str = "") -> str:
    ratio = f"{seconds / base:6.3f}x" if base else "   base"
    return f"  {name:<44} {seconds * 1000:10.2f} ms  {ratio}  {extra}"


# ----------------------------------------------------------------------------- the cases


def big_body(mib: int) -> dict[str, Any]:
    cols = mib * MiB // 8
    ids = np.arange(cols, dtype=np.int64).reshape(1, cols) % 1000
    return {"kwargs": {"input_ids": ids}}


def chunk_frames(frame: bytes, max_bytes: int, checksum: bool) -> list[bytes]:
    """The chunk frames of a new chunk group (the codec computes the sha256 and CRC-32s)."""
    return dssst1.encode_chunks(
        frame,
        kind="request",
        max_bytes=max_bytes,
        operation=FORWARD_BACKWARD.name,
        checksum=checksum,
    )


def headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {TOKEN}",
        "X-Snowflake-Authorization-Token-Type": "PROGRAMMATIC_ACCESS_TOKEN",
        **(extra or {}),
    }


async def bare_http_upload(
    session: Any, url: str, frame: bytes, max_bytes: int, checksum: bool
) -> None:
    """A hand-written chunked upload of an encoded frame: chunk it (a new group: the frame's
    sha256, each chunk's CRC-32), POST each chunk frame."""
    import aiohttp.payload

    chunks = chunk_frames(frame, max_bytes, checksum)
    for c in chunks:
        body = aiohttp.payload.BytesIOPayload(io.BytesIO(c)) if len(c) > MiB else c
        h = headers({"Content-Type": "application/octet-stream"})
        async with session.post(url, data=body, headers=h) as r:
            await r.read()
            assert r.status == 200, await r.text()


async def bare_grpc_upload(stub: Any, frame: bytes, max_bytes: int, checksum: bool) -> None:
    chunks = chunk_frames(frame, max_bytes, checksum)
    md = (("authorization", f"Bearer {TOKEN}"), ("x-arctic-job-id", "bare-big"))
    call = stub(iter([dssst1_pb2.Frame(dssst1=c) for c in chunks]), metadata=md)
    async for _ in call:
        pass


async def case_big(srv: Server, mib: int, rounds: int) -> list[str]:
    import aiohttp
    import grpc.aio

    from arctic_sdk._generated.grpc_stubs import make_stubs

    body = big_body(mib)
    out = [f"1. forward-backward of one {mib} MiB frame (best of {rounds}, interleaved)"]
    opts = [("grpc.max_send_message_length", 8 * MiB), ("grpc.max_receive_message_length", 8 * MiB)]
    async with (
        AsyncClient(srv.base_url, job_id="big-http", **HTTP) as http_c,
        AsyncClient(job_id="big-grpc", **GRPC(srv)) as grpc_c,
        aiohttp.ClientSession() as session,
        grpc.aio.insecure_channel(srv.grpc_target, options=opts) as ch,
    ):
        caps = await http_c.get_capabilities()
        checksum = bool(caps["features"]["chunk_checksum"])
        lim = caps["limits"]
        frame = dssst1.dumps(body)
        http_max = min(lim["max_chunk_bytes"], lim["max_body_bytes"])
        grpc_max = lim["max_grpc_message_bytes"] - 1024
        n_http = len(chunk_frames(frame, http_max, checksum))
        n_grpc = len(chunk_frames(frame, grpc_max, checksum))
        url = srv.base_url + PREFIX + "/bare-big/forward-backward"
        stub = make_stubs(ch)[FORWARD_BACKWARD.grpc_path]
        t = await paired(
            {
                "bare-http": lambda: bare_http_upload(session, url, frame, http_max, checksum),
                "sdk-http": lambda: http_c.forward_backward(body),
                "bare-grpc": lambda: bare_grpc_upload(stub, frame, grpc_max, checksum),
                "sdk-grpc": lambda: grpc_c.forward_backward(body),
            },
            rounds,
        )
    for kind, n in (("http", n_http), ("grpc", n_grpc)):
        bare, sdk = t[f"bare-{kind}"], t[f"sdk-{kind}"]
        label = "aiohttp POST" if kind == "http" else "grpc.aio stream"
        out.append(row(f"bare {label} x{n} ({kind})", bare, None))
        verdict = "ok" if sdk / bare <= 1.10 else "MISSED"
        out.append(
            row(
                f"SDK AsyncClient.forward_backward ({kind})",
                sdk,
                bare,
                f"target <= 1.10x {verdict}",
            )
        )
    return out


async def case_small(srv: Server, calls: int, rounds: int) -> list[str]:
    import aiohttp
    import grpc.aio

    from arctic_sdk._generated.grpc_stubs import make_stubs

    per = max(1, calls // rounds)
    out = [
        f"2. {calls} small step calls, one at a time ({rounds} interleaved rounds of {per}; "
        "time per call x 1000 from the best round)"
    ]
    url = srv.base_url + PREFIX + "/bare-small-http/step"
    seq = {"http": 0, "grpc": 0}

    def bare_headers(kind: str) -> dict[str, str]:
        seq[kind] += 1
        return {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Idempotency-Key": uuid.uuid4().hex,
            "X-Arctic-Seq": str(seq[kind]),
        }

    async def bare_http(session: Any) -> None:
        for _ in range(per):
            async with session.post(url, data=b"{}", headers=headers(bare_headers("http"))) as r:
                json.loads(await r.read())

    async def bare_grpc(stub: Any) -> None:
        for _ in range(per):
            h = bare_headers("grpc")
            md = (
                ("authorization", f"Bearer {TOKEN}"),
                ("x-arctic-job-id", "bare-small-grpc"),
                ("idempotency-key", h["Idempotency-Key"]),
                ("x-arctic-seq", h["X-Arctic-Seq"]),
            )
            chunks = dssst1.encode_chunks(
                dssst1.dumps({}), kind="request", max_bytes=4 * MiB, operation=STEP.name
            )
            frames = [dssst1_pb2.Frame(dssst1=c) for c in chunks]
            answer = [m.dssst1 async for m in stub(iter(frames), metadata=md)]
            dssst1.loads(dssst1.ChunkAssembler("result").feed(answer[-1]) or b"")

    async def sdk(client: Any) -> None:
        for _ in range(per):
            await client.step()

    async with (
        AsyncClient(srv.base_url, job_id="small-http", **HTTP) as c,
        AsyncClient(job_id="small-grpc", **GRPC(srv)) as g,
        aiohttp.ClientSession() as session,
        grpc.aio.insecure_channel(srv.grpc_target) as ch,
    ):
        stub = make_stubs(ch)[STEP.grpc_path]
        fns = {
            "bare-http": lambda: bare_http(session),
            "sdk-http": lambda: sdk(c),
            "bare-grpc": lambda: bare_grpc(stub),
            "sdk-grpc": lambda: sdk(g),
        }
        for fn in fns.values():  # warm-up
            await fn()
        t = await paired(fns, rounds)
    for kind in ("http", "grpc"):
        bare, sdk_t = t[f"bare-{kind}"] / per * calls, t[f"sdk-{kind}"] / per * calls
        label = "aiohttp POST" if kind == "http" else "grpc.aio stream"
        out.append(row(f"bare {label} ({kind})", bare, None, f"{bare / calls * 1e6:7.0f} us/call"))
        verdict = "ok" if sdk_t / bare <= 1.3 else "MISSED"
        out.append(
            row(
                f"SDK AsyncClient.step ({kind})",
                sdk_t,
                bare,
                f"{sdk_t / calls * 1e6:7.0f} us/call  target <= 1.3x {verdict}",
            )
        )
    return out


async def case_pipeline(srv: Server, steps: int, work_ms: float, rtt_ms: float) -> list[str]:
    body = {"kwargs": {"input_ids": np.ones((4, 64), np.int64)}}
    out = [
        f"3. training loop, {steps} x (forward-backward + step), {work_ms:g} ms server work "
        f"per call, {rtt_ms:g} ms simulated round trip (HTTP)"
    ]
    async with AsyncClient(srv.base_url, job_id="loop", **HTTP) as c:
        await c.step()
        t = time.perf_counter()
        for _ in range(20):
            await c.get_job()
        rtt = (time.perf_counter() - t) / 20

        async def sequential() -> None:
            for _ in range(steps):
                await c.forward_backward(body)
                await c.step()

        async def pipelined() -> None:
            for _ in range(steps):
                fb = c.submit_forward_backward(body)
                st = c.submit_step()
                await fb
                await st

        t = await paired({"sequential": sequential, "pipelined": pipelined}, 2)
        seq_t, pipe_t = t["sequential"] / steps, t["pipelined"] / steps
    work = 2 * work_ms / 1000
    out.append(
        row(
            "awaiting each call (per step)",
            seq_t,
            None,
            f"~ 2 round trips + work = {(2 * rtt + work) * 1000:.2f} ms",
        )
    )
    out.append(
        row(
            "pipelined: both submitted (per step)",
            pipe_t,
            seq_t,
            f"~ 1 round trip + work = {(rtt + work) * 1000:.2f} ms "
            f"(round trip {rtt * 1000:.2f} ms)",
        )
    )
    return out


async def run(args: argparse.Namespace) -> None:
    srv = Server()
    try:
        mib = 8 if args.smoke else 256
        for line in await case_big(srv, mib, 2 if args.smoke else 5):
            print(line, flush=True)
        for line in await case_small(srv, 50 if args.smoke else 1000, 2 if args.smoke else 5):
            print(line, flush=True)
    finally:
        srv.close()
    srv = Server(args.work_ms, args.rtt_ms)
    try:
        steps = 10 if args.smoke else 100
        for line in await case_pipeline(srv, steps, args.work_ms, args.rtt_ms):
            print(line, flush=True)
    finally:
        srv.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="small sizes, a few seconds")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work-ms", type=float, default=5.0, help="server work per call (case 3)")
    p.add_argument("--rtt-ms", type=float, default=10.0, help="simulated round trip (case 3)")
    args = p.parse_args()
    if args.serve:
        serve(args.work_ms, args.rtt_ms)
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, pid {os.getpid()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

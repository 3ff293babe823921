#!/usr/bin/env python3
"""Concurrent sampling benchmark: N single-prompt calls at once against one call of N prompts.

    python bench/concurrency.py            # N = 1, 8, 32, 64 on every path and server
    python bench/concurrency.py --smoke    # N = 1, 4: three paths on-prem, two on vllm serve
    python bench/concurrency.py --levels 1,8,32,64 --max-tokens 32 --reps 1   # a smaller run
    python bench/concurrency.py --servers onprem --paths openai-stream,bare-stream --levels 64

In one run, on the tiny embedded model with the same token-id prompts and greedy sampling
(`ignore_eos`, `max_tokens` tokens per prompt), for each N:

- `vllm direct`: `vllm.LLM.generate` of the N prompts in a process of its own, same engine
  arguments and threads as the servers' sampling workers: the throughput reference, measured in
  `pair_reps` pairs with one batched call each (back to back, which goes first alternating; the
  median of the pairs' ratios is reported, so a slow moment of the shared machine spoils one
  pair, not one side);
- `batched`: one protocol `generate` of the N prompts through the server (HTTP, `AsyncClient`);
- each path with N single-prompt calls at once: protocol `generate` over HTTP (the job's own
  client: its calls are sequenced), gRPC and in-process (`AsyncClient`), and the OpenAI routes
  (`/v1/completions`, `/v1/chat/completions`, streamed `/v1/completions`; the `openai` client),
  and the same completions routes read by bare aiohttp (`bare-completions`, `bare-stream`: the
  JSON, or one `json.loads` per SSE event), which shows the server apart from the `openai`
  client's own per-event CPU on the same cores. Chat prompts are the chat template's rendering
  of short messages; their batched reference is one generate of exactly those token ids
  (`/tokenize`).

Servers: the on-prem server, an in-process on-prem servicer (`transport="inproc"`), the
gateway with on-prem workers (`--answer-mode inline`: the deployed polled mode adds the SDK's
first poll wait, 0.5 s, to every call's latency, which would measure polling, not batching), and
vLLM's own OpenAI server (`vllm-serve`, `common/vllm_serve.py`: the reference for the OpenAI
paths, the same clients against vLLM's server on the same cores; batched there = one
`/v1/completions` of the N prompts). Each sampling sub-job is one vLLM worker with `--threads`
threads.

Reported: wall time of the N calls (median of `reps`); `ratio`: to the batched protocol generate
of the same prompts; `p ratio`: to one call of the same prompts on the path itself (`path b s`:
one `/v1/completions` of the N prompts, streamed or not, by the same client; one generate of N
prompts over gRPC; none for chat, which takes one conversation a call), the reference that pays
the path's own per-request and per-event costs once for N prompts, so the ratio is what
concurrency costs over batching on that path; tokens/s, p50 / p99 per-call latency; `peak` and
`steps`: the most requests that were in the sampler's engine at once while the N calls ran and
the engine steps they took (the
worker's busy-period lines, read with tail-logs: N and about `max_tokens` when the calls share
the batch, 1 and N x `max_tokens` when they run one after another; the largest over the reps);
batched tokens/s through the server over vLLM direct; `client cpu s`: the CPU time of this
process while the N calls ran (the SDK / `openai` clients; for `inproc` the server too), which
shares the machine's cores with the engine; `server cpu s` / `engine cpu s`: the same for the
server's own process and for its workers and engine processes (`common/proc_cpu.py`; `-` for
`inproc`), so a row shows which side a miss comes from. Targets (printed, not asserted): `p ratio`
(`ratio` for chat) <= 1.5 at N = 8 and 32, <= 2 at N = 64; batched throughput >= 0.95x direct.
`uptime` is recorded beside the numbers: the machine is shared. A run stops with an error if the
N calls or a batched call produce other than N x `max_tokens` tokens (a short reference would
flatter the ratio). Measured runs: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.bench_servers import busy_periods, engine_log, start, stop, uptime
from common.proc_cpu import ServerCpu, new_mark
from common.sampling_paths import BARE, TOKEN, Paths, chat_ids, timed
from common.vllm_direct import Direct, prompts_of
from common.vllm_serve import VllmServe

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "servers"), str(ROOT / "sdk"), str(ROOT)]

FULL: dict[str, Any] = {"levels": [1, 8, 32, 64], "max_tokens": 64, "prompt_len": 16, "reps": 3}
FULL.update(servers=["onprem", "inproc", "gateway", "vllm-serve"], pair_reps=7)
SMOKE = {"levels": [1, 4], "max_tokens": 8, "prompt_len": 8, "reps": 1, "pair_reps": 1}
SMOKE["servers"] = ["onprem", "vllm-serve"]  # the reference server's path runs in CI too
PROTOCOL = ["protocol-http", "protocol-grpc"]
OPENAI = ["openai-completions", "openai-chat", "openai-stream"]
SERVER_PATHS = [*PROTOCOL, *OPENAI, *BARE]
PATHS = {"onprem": SERVER_PATHS, "inproc": ["protocol-inproc"], "gateway": SERVER_PATHS}
PATHS["vllm-serve"] = ["openai-completions", "openai-stream", *BARE]  # vLLM's own server
SMOKE_PATHS = ["protocol-http", "openai-completions", "openai-stream"]
TARGETS = {8: 1.5, 32: 1.5, 64: 2.0}


async def throughput(
    p: Paths, vllm: Direct, prompts: list[list[int]], pairs: int
) -> dict[str, Any]:
    """Batched through the server against vLLM direct: `pairs` pairs run back to back (which of
    the two goes first alternates), on the same N prompts; the pair's ratio is direct seconds
    over batched seconds (batched tokens/s over direct tokens/s), the median of the ratios what
    is reported, so a slow moment of the shared machine lands in one pair, not in one side."""
    n, tokens = len(prompts), p.tokens  # vLLM direct generates the same N prompts
    walls: list[tuple[float, float]] = []
    for i in range(pairs):
        if i % 2:
            b0 = time.perf_counter()
            await p.batched(prompts)
            b = time.perf_counter() - b0
            d = await asyncio.to_thread(vllm.run, n)
        else:
            d = await asyncio.to_thread(vllm.run, n)
            b0 = time.perf_counter()
            await p.batched(prompts)
            b = time.perf_counter() - b0
        walls.append((d, b))
    return {
        "direct_tokens_per_s": n * tokens / statistics.median(d for d, _ in walls),
        "pair_batched_tokens_per_s": n * tokens / statistics.median(b for _, b in walls),
        "throughput_ratio": statistics.median(d / b for d, b in walls),
        "pairs": pairs,
    }


async def measure_levels(
    server: str,
    p: Paths,
    paths: list[str],
    sizes: dict[str, Any],
    vllm: Direct,
    texts: list[str],
    chat: list[list[int]],
    log_client: Any,
    cpu: ServerCpu | None,
) -> list[dict[str, Any]]:
    """Every path's row at every N (and the throughput pairs at each N); `log_client`: the
    protocol client that reads the sampling worker's busy-period lines (None: not ours);
    `cpu`: the server's processes (None: the server runs in this process)."""
    tokens, rows = sizes["max_tokens"], []
    cursor = (await engine_log(log_client, 0))[1] if log_client is not None else 0
    for n in sizes["levels"]:
        prompts = prompts_of(n, sizes["prompt_len"])
        pair = await throughput(p, vllm, prompts, sizes["pair_reps"])
        for path in paths:
            ref = chat[:n] if path == "openai-chat" else prompts
            walls, bwalls, lats, toks, peak, steps = [], [], [], 0, 0, 0
            pwalls: list[float] = []  # the same path's batched call (none for chat)
            cpus: list[float] = []
            server_cpus: list[tuple[float, float]] = []
            if cpu is not None:
                cpu.refresh()
            for _ in range(sizes["reps"]):
                b0 = time.perf_counter()
                await p.batched(ref)
                bwalls.append(time.perf_counter() - b0)
                if log_client is not None:
                    _, cursor = await engine_log(log_client, cursor)
                calls = [p.single(path, prompts[i], texts[i]) for i in range(n)]
                s0 = cpu.sample() if cpu is not None else None
                c0 = time.process_time()  # this process: the clients (and inproc's server)
                wall, lat, toks = await timed(calls)
                cpus.append(time.process_time() - c0)
                if toks != n * tokens:
                    raise RuntimeError(f"{server} {path}: {n} calls gave {toks} tokens, not "
                                       f"{n * tokens}")  # fmt: skip
                s1 = cpu.sample() if cpu is not None else None
                if s0 is not None and s1 is not None:
                    server_cpus.append((s1[0] - s0[0], s1[1] - s0[1]))
                walls.append(wall)
                lats += lat
                if log_client is not None:
                    await asyncio.sleep(0.2)  # the worker logs the busy period once idle
                    lines, cursor = await engine_log(log_client, cursor)
                    periods = busy_periods(lines)
                    peak = max([peak, *(q for _, _, q in periods)])
                    steps = max(steps, sum(st for _, st, _ in periods))
                one_call = p.path_batched(path, ref)  # (its busy period: skipped above)
                if one_call is not None:
                    pwall, _, got = await timed([one_call])
                    if got != n * tokens:  # a shorter reference would flatter the ratio
                        raise RuntimeError(f"{server} {path}: one call of {n} prompts gave {got} "
                                           f"tokens, not {n * tokens}")  # fmt: skip
                    pwalls.append(pwall)
            lats.sort()
            w, bw = statistics.median(walls), statistics.median(bwalls)
            p50, p99 = lats[len(lats) // 2], lats[min(len(lats) - 1, int(0.99 * len(lats)))]
            row = dict(server=server, path=path, n=n, wall_s=w, batched_s=bw, ratio=w / bw)
            pw = statistics.median(pwalls) if pwalls else None
            row.update(path_batched_s=pw, path_ratio=w / pw if pw else None)
            row.update(tokens=toks, tokens_per_s=toks / w, p50_s=p50, p99_s=p99)
            row.update(batched_tokens_per_s=n * tokens / bw, direct_tokens_per_s=None)
            if path == paths[0]:
                row.update(pair)
            row.update(engine_peak=peak if log_client else None, engine_steps=steps or None)
            row.update(client_cpu_s=statistics.median(cpus), server_cpu_s=None, engine_cpu_s=None)
            if server_cpus:
                row["server_cpu_s"] = statistics.median(c for c, _ in server_cpus)
                row["engine_cpu_s"] = statistics.median(c for _, c in server_cpus)
            rows.append({**row, "uptime": uptime()})
            print(_row(rows[-1]), flush=True)
    return rows


async def measure_vllm_serve(
    serve: VllmServe, sizes: dict[str, Any], vllm: Direct, paths: list[str]
) -> Any:
    """The OpenAI paths against vLLM's own server (`return_token_ids`: its chunks then carry
    the token ids, as ours always do); batched = one `/v1/completions` of the N prompts."""
    import aiohttp
    import openai

    await asyncio.to_thread(serve.wait_ready)
    await asyncio.to_thread(vllm.wait_ready)
    base = serve.base_url
    oai = openai.AsyncOpenAI(base_url=base + "/v1", api_key=TOKEN, max_retries=0, timeout=900)
    p = Paths(None, {}, oai, serve.model, sizes["max_tokens"])
    p.extra = {"return_token_ids": True}
    p.bare = aiohttp.ClientSession(base)
    texts = [f"Tell me about item {i}." for i in range(max(sizes["levels"]))]
    try:
        await p.batched(prompts_of(2, 4))  # warm
        for path in paths:
            await p.single(path, [1, 2, 3], "hi")()
        cpu = ServerCpu(serve.mark, serve.proc.pid)
        return await measure_levels("vllm-serve", p, paths, sizes, vllm, texts, [], None, cpu)
    finally:
        await oai.close()
        await p.bare.close()


async def measure(
    server: str,
    info: dict[str, Any],
    sizes: dict[str, Any],
    paths: list[str],
    threads: int,
    vllm: Direct,
    cpu: ServerCpu | None,
) -> list[dict[str, Any]]:
    """The server's rows (its job started here, cancelled at the end)."""
    import openai

    from arctic_sdk import AsyncClient

    tokens = sizes["max_tokens"]
    kw: dict[str, Any] = {"token": TOKEN, "timeout": 900}
    if server == "inproc":
        from arctic_servers.onprem.servicer import OnpremServicer
        from arctic_servers.onprem.settings import ServerSettings, ThreadPlan

        settings = ServerSettings(threads=ThreadPlan.parse(str(threads)), prewarm=())
        client = AsyncClient(transport="inproc", servicer=OnpremServicer(settings), **kw)
    else:
        client = AsyncClient(info["base_url"], **kw)
    async with client:
        t0 = time.perf_counter()
        await client.create_job(sub_job_configs=[{"job_type": "sampling", "dtype": "float32"}])
        await asyncio.to_thread(vllm.wait_ready)
        await client.wait_until_running(timeout=900)
        print(f"# {server}: sampling job running in {time.perf_counter() - t0:.1f} s", flush=True)
        job = str(client.job_id)
        others: dict[str, Any] = {}
        if "protocol-grpc" in paths:
            others["protocol-grpc"] = AsyncClient(
                info["base_url"],
                transport="grpc",
                job_id=job,
                grpc_target=info["grpc_target"],
                **kw,
            )
        others["protocol-inproc"] = client
        base = info.get("base_url", "")
        oai = openai.AsyncOpenAI(base_url=base + "/v1", api_key=TOKEN, max_retries=0, timeout=900)
        p = Paths(client, others, oai, job, tokens)
        if any(path in BARE for path in paths):
            import aiohttp

            auth = {"Authorization": f"Bearer {TOKEN}"}
            p.bare = aiohttp.ClientSession(base, headers=auth)
        texts = [f"Tell me about item {i}." for i in range(max(sizes["levels"]))]
        chat = await chat_ids(base, job, texts) if "openai-chat" in paths else []
        await p.batched(prompts_of(2, 4))  # warm: engine, chat template, tokenizer
        for path in paths:
            await p.single(path, [1, 2, 3], "hi")()
        print(f"# {server}: warm in {time.perf_counter() - t0:.1f} s", flush=True)
        rows = await measure_levels(server, p, paths, sizes, vllm, texts, chat, client, cpu)
        await oai.close()
        if p.bare is not None:
            await p.bare.close()
        if "protocol-grpc" in others:
            await others["protocol-grpc"].close()
        await client.cancel_job()
    return rows


HEAD = f"{'server':10s} {'path':19s} {'N':>3s} {'N calls s':>9s} {'batched s':>9s} {'ratio':>6s} "
HEAD += f"{'path b s':>8s} {'p ratio':>7s} {'target':>6s} {'tok/s':>8s} {'p50 s':>7s} {'p99 s':>7s}"
HEAD += f" {'peak':>4s} {'steps':>5s}"
HEAD += f" {'client cpu s':>12s} {'server cpu s':>12s} {'engine cpu s':>12s}"
HEAD += "  load avg"


def _cpu(v: float | None) -> str:
    return f"{v:12.2f}" if v is not None else f"{'-':>12s}"


def _row(r: dict[str, Any]) -> str:
    t = TARGETS.get(r["n"])
    ratio = r["path_ratio"] if r["path_ratio"] is not None else r["ratio"]
    mark = "" if t is None else ("ok" if ratio <= t else "MISS")
    pb, pr = r["path_batched_s"], r["path_ratio"]
    path_cols = (
        f"{pb:8.3f} {pr:7.2f}" if pb is not None and pr is not None else f"{'-':>8s} {'-':>7s}"
    )
    peak, steps = (str(r[k]) if r[k] is not None else "-" for k in ("engine_peak", "engine_steps"))
    return (
        f"{r['server']:10s} {r['path']:19s} {r['n']:3d} {r['wall_s']:9.3f} "
        f"{r['batched_s']:9.3f} {r['ratio']:6.2f} {path_cols} {mark:>6s} {r['tokens_per_s']:8.0f} "
        f"{r['p50_s']:7.3f} {r['p99_s']:7.3f} {peak:>4s} {steps:>5s} "
        f"{r['client_cpu_s']:12.3f} {_cpu(r['server_cpu_s'])} {_cpu(r['engine_cpu_s'])}"
        f"  {r['uptime']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--smoke", action="store_true", help="N = 1, 4; on-prem (three paths), vllm serve (two)"
    )
    ap.add_argument("--threads", type=int, default=1, help="threads of each vLLM engine")
    ap.add_argument("--servers", default="", help="comma-separated subset of onprem,inproc,gateway")
    ap.add_argument(
        "--gateway-db-dir", type=Path, help="the gateway's SQLite directory (default: a temp dir)"
    )
    ap.add_argument("--levels", help="comma-separated N to run (default: the run's own)")
    ap.add_argument("--paths", default="", help="comma-separated subset of the paths to run")
    ap.add_argument("--max-tokens", type=int, help="tokens per prompt (default: the run's own)")
    ap.add_argument("--reps", type=int, help="repetitions per row (default: the run's own)")
    ap.add_argument(
        "--pair-reps", type=int, help="batched / vLLM direct pairs per N (default: the run's own)"
    )
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    from arctic_servers.engines.tiny_model import build_tiny_model
    from arctic_servers.onprem.settings import default_cache_dir

    sizes = dict(SMOKE if args.smoke else FULL)
    if args.levels:
        sizes["levels"] = [int(n) for n in args.levels.split(",")]
    if args.max_tokens:
        sizes["max_tokens"] = args.max_tokens
    if args.reps:
        sizes["reps"] = args.reps
    if args.pair_reps:
        sizes["pair_reps"] = args.pair_reps
    servers = [s for s in args.servers.split(",") if s] or list(sizes["servers"])
    wanted = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(wanted) - set(SERVER_PATHS) - {"protocol-inproc"})
    if unknown:
        ap.error(f"--paths: unknown {', '.join(unknown)} (known: {', '.join(SERVER_PATHS)})")

    def chosen(paths: list[str]) -> list[str]:
        keep = wanted or (SMOKE_PATHS if args.smoke else paths)
        return [p for p in paths if p in keep]

    model_dir = str(build_tiny_model(default_cache_dir() / "tiny-qwen2-seed0"))
    t0 = time.perf_counter()
    print(
        f"# concurrency benchmark ({'smoke' if args.smoke else 'full'}): "
        f"{sizes['max_tokens']} tokens per prompt, {args.threads} thread(s) per engine; "
        f"load average at start {uptime()}"
    )
    spec = {**sizes, "model_dir": model_dir, "threads": args.threads}
    spec.pop("servers")
    vllm = Direct(spec)
    if not args.smoke:
        vllm.wait_ready()  # started alone on the machine (the smoke overlaps it with a job's)
    rows: list[dict[str, Any]] = []
    print(HEAD, flush=True)
    with tempfile.TemporaryDirectory(prefix="arctic-bench-conc-") as tmp:
        for server in servers:
            if server == "vllm-serve":
                serve = VllmServe(model_dir, args.threads, Path(tmp) / "vllm-serve.log")
                try:
                    paths = chosen(PATHS[server])
                    rows += asyncio.run(measure_vllm_serve(serve, sizes, vllm, paths))
                finally:
                    serve.close()
                continue
            paths = chosen(PATHS[server])
            mark = new_mark()
            proc, info = (
                start(server, Path(tmp), args.threads, args.gateway_db_dir, mark)
                if server != "inproc"
                else (None, {})
            )
            cpu = ServerCpu(mark, proc.pid) if proc is not None else None
            try:
                rows += asyncio.run(measure(server, info, sizes, paths, args.threads, vllm, cpu))
            finally:
                t1 = time.perf_counter()
                if proc is not None:
                    stop(proc)
                print(f"# {server}: stopped in {time.perf_counter() - t1:.1f} s", flush=True)
    vllm.close()
    print(
        f"\n{'server':10s} {'N':>3s} {'batched tok/s':>13s} {'direct tok/s':>12s} "
        f"{'ratio':>6s} (median of {sizes['pair_reps']} pairs)"
    )
    for r in rows:
        d = r["direct_tokens_per_s"]
        if d is None:
            continue
        ratio = r["throughput_ratio"]
        mark = "" if args.smoke else ("ok" if ratio >= 0.95 else "MISS")
        print(
            f"{r['server']:10s} {r['n']:3d} {r['pair_batched_tokens_per_s']:13.0f} {d:12.0f} "
            f"{ratio:6.3f} {mark}"
        )
    print(
        f"targets: N calls within 1.5x (N=8, 32) / 2x (N=64) of one batched call on the same "
        f"path (chat: of the batched generate); batched "
        f">= 0.95x vLLM direct (reported, not asserted); load average at end {uptime()}; "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""On-prem server benchmark: engines through the server against the same engines called directly.

    python bench/server.py              # the full run (sizes where each engine call takes >= 1 s)
    python bench/server.py --smoke      # tiny sizes, one repetition (CI; no thresholds)

Two measurements, each on the same inputs both ways, with the same threads per engine:

- generate: `AsyncClient.generate` through the server (HTTP, DSSST1, the server's pipe to its
  vLLM worker) against `vllm.LLM.generate` called in a process of its own, same engine arguments,
  same token-id prompts, same sampling params and seed;
- train: `forward_backward` + `step` through the server (cross-entropy on a fixed batch) against
  a DeepSpeed engine in a process of its own, same DeepSpeed config, `engine(...)`,
  `engine.backward`, `engine.step` on the same batch.

Ratio = direct time / server time (1.0 = no overhead; the target is >= 0.9). Each time is the
median of several repetitions after a warm-up. The direct engines run in subprocesses, never next
to the server's busy workers: one engine works at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common.vllm_direct import direct_llm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "servers"))

from arctic_sdk.spec.tables import methods as M  # noqa: E402

GENERATE = M.GENERATE.name  # the measure of the generate op (the other: "train")

FULL = {
    GENERATE: {"prompts": 16, "prompt_len": 32, "n": 4, "max_tokens": 256},
    "train": {"batch": 32, "seq": 512},
    "reps": 5,
}
SMOKE = {
    GENERATE: {"prompts": 2, "prompt_len": 8, "n": 2, "max_tokens": 8},
    "train": {"batch": 2, "seq": 16},
    "reps": 1,
}


def prompts_of(size: dict[str, int]) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 500, size["prompt_len"]).tolist() for _ in range(size["prompts"])]


def batch_of(size: dict[str, int]) -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.integers(0, 500, (size["batch"], size["seq"])).astype(np.int64)


def sampling_params(size: dict[str, int]) -> dict[str, Any]:
    return {
        "n": size["n"],
        "max_tokens": size["max_tokens"],
        "ignore_eos": True,
        "seed": 7,
        "temperature": 1.0,
    }


TRAINING_CONFIG = {
    "zero_stage": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"name": "adamw", "lr": 1e-5, "weight_decay": 0.0},
}


# --------------------------------------------------------------------------- direct (subprocesses)


def direct_generate(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = direct_llm(spec["model_dir"], spec["threads"])
    sp = spec["params"]
    params = SamplingParams(
        n=sp["n"], max_tokens=sp["max_tokens"], ignore_eos=True, seed=sp["seed"], temperature=1.0
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
    times, tokens = [], 0
    for _ in range(spec["reps"]):
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - t)
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"times": times, "tokens": tokens}


def direct_train(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    from arctic_servers.engines.deepspeed.training import ds_config, load_hf_model, set_ds_env

    set_ds_env()
    import deepspeed

    model = load_hf_model(spec["model_dir"], "float32", "eager")
    model.train()
    cfg = ds_config(TRAINING_CONFIG, "float32", cuda=False)
    cfg["managed_gradient_accumulation"] = True  # plain DeepSpeed usage: GAS 1, step every batch
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg
    )
    ids = torch.as_tensor(np.asarray(spec["batch"], np.int64))
    mask = torch.ones_like(ids)

    def one() -> float:
        out = engine(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
        engine.backward(out.loss)
        engine.step()
        return float(out.loss)

    one()  # warm-up
    times = []
    for _ in range(spec["reps"]):
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    return {"times": times}


def run_direct(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = dict(os.environ)
    n = str(spec["threads"])
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "servers"), env.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.run(
        [sys.executable, __file__, "--direct", kind, "--spec", f.name],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    os.unlink(f.name)
    for line in proc.stdout.splitlines():
        if line.startswith("DIRECT_RESULT "):
            return dict(json.loads(line.removeprefix("DIRECT_RESULT ")))
    raise RuntimeError(
        f"direct {kind} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )


# --------------------------------------------------------------------------- through the server


def start_server(tmp: Path, threads: int) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    ready = tmp / "ready.json"
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed by the caller's exit
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "arctic_servers.onprem",
            "serve",
            "--port",
            "0",
            "--no-grpc",
            "--threads",
            str(threads),
            "--data-dir",
            str(tmp / "data"),
            "--ready-file",
            str(ready),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT / "servers"), os.environ.get("PYTHONPATH", "")) if p
            ),
        },
    )
    log.close()
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / "server.log").read_text()[-3000:])
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


async def through_server(
    base_url: str, sizes: dict[str, Any], prompts: list[list[int]], batch: np.ndarray
) -> dict[str, Any]:
    from arctic_sdk import AsyncClient

    out: dict[str, Any] = {}
    async with AsyncClient(base_url) as client:
        await client.create_job(
            sub_job_configs=[
                {"job_type": "training", "training_config": TRAINING_CONFIG},
                {"job_type": "sampling"},
            ]
        )
        t = time.perf_counter()
        await client.wait_until_running(timeout=900)
        out["job_start_s"] = time.perf_counter() - t
        params = sampling_params(sizes[GENERATE])
        await client.generate(prompts=prompts[:1], sampling_params=params)  # warm-up
        times, tokens = [], 0
        for _ in range(sizes["reps"]):
            await client.reset_prefix_cache()
            t = time.perf_counter()
            gen = await client.generate(prompts=prompts, sampling_params=params)
            times.append(time.perf_counter() - t)
            tokens = sum(len(s["token_ids"]) for r in gen["results"] for s in r["samples"])
        out[GENERATE] = {"times": times, "tokens": tokens}
        body = {
            "kwargs": {"input_ids": batch, "attention_mask": np.ones_like(batch)},
            "processing": {"loss_fn": "cross_entropy"},
        }
        await client.forward_backward(body)
        await client.step()  # warm-up
        times = []
        for _ in range(sizes["reps"]):
            t = time.perf_counter()
            await client.forward_backward(body)
            await client.step()
            times.append(time.perf_counter() - t)
        out["train"] = {"times": times}
        await client.cancel_job()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (CI)")
    ap.add_argument(
        "--threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="threads per engine, both ways",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--direct", choices=(GENERATE, "train"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.direct:
        spec = json.loads(Path(args.spec).read_text())
        res = direct_generate(spec) if args.direct == GENERATE else direct_train(spec)
        print("DIRECT_RESULT " + json.dumps(res), flush=True)
        return 0

    from arctic_servers.engines.tiny_model import build_tiny_model
    from arctic_servers.onprem.settings import default_cache_dir

    sizes = SMOKE if args.smoke else FULL
    model_dir = str(build_tiny_model(default_cache_dir() / "tiny-qwen2-seed0"))
    prompts = prompts_of(sizes[GENERATE])
    batch = batch_of(sizes["train"])
    common = {"model_dir": model_dir, "threads": args.threads, "reps": sizes["reps"]}
    t0 = time.perf_counter()
    direct_gen = run_direct(
        GENERATE, {**common, "prompts": prompts, "params": sampling_params(sizes[GENERATE])}
    )
    direct_tr = run_direct("train", {**common, "batch": batch.tolist()})
    with tempfile.TemporaryDirectory(prefix="arctic-bench-") as tmp:
        proc, info = start_server(Path(tmp), args.threads)
        try:
            served = asyncio.run(through_server(info["base_url"], sizes, prompts, batch))
        finally:
            proc.terminate()
            proc.wait(60)
    med = statistics.median
    rows = {
        GENERATE: (
            med(direct_gen["times"]),
            med(served[GENERATE]["times"]),
            direct_gen["tokens"],
            served[GENERATE]["tokens"],
        ),
        "train (forward-backward + step)": (
            med(direct_tr["times"]),
            med(served["train"]["times"]),
            None,
            None,
        ),
    }
    print(
        f"on-prem server vs direct engines ({'smoke' if args.smoke else 'full'}; "
        f"{args.threads} thread(s) per engine; sizes "
        f"{json.dumps({k: sizes[k] for k in (GENERATE, 'train')})})"
    )
    print(f"{'measure':34s} {'direct s':>9s} {'server s':>9s} {'ratio':>7s}")
    results: dict[str, Any] = {
        "sizes": sizes,
        "threads": args.threads,
        "job_start_s": served["job_start_s"],
    }
    for name, (d, s, dt, st) in rows.items():
        ratio = d / s if s > 0 else float("nan")
        extra = f"  ({dt} tokens direct, {st} via server)" if dt is not None else ""
        print(f"{name:34s} {d:9.3f} {s:9.3f} {ratio:7.3f}{extra}")
        results[name] = {
            "direct_s": d,
            "server_s": s,
            "ratio": ratio,
            "direct_times": direct_gen["times"] if dt else direct_tr["times"],
            "server_times": served[GENERATE if dt else "train"]["times"],
        }
    if not args.smoke:
        slow = [n for n, (d, _s, _a, _b) in rows.items() if d < 1.0]
        if slow:
            print(
                f"note: the direct engine took < 1 s per call for {slow}; "
                "raise the sizes for a fair ratio"
            )
    print(f"target: ratio >= 0.9 (reported, not asserted); total {time.perf_counter() - t0:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

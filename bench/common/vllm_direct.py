"""vLLM alone, as the concurrency benchmark's throughput reference (`bench/concurrency.py`).

`Direct` starts this file as a process of its own (one `vllm.LLM`, the servers' sampling-worker
engine arguments and threads); each line N it reads -> the seconds of one `generate` of N prompts,
so its runs interleave with the servers' batched calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any


def prompts_of(n: int, length: int) -> list[list[int]]:
    """N token-id prompts of `length` tokens, the same in every run and process."""
    return [[(17 * i + 31 * j) % 400 + 10 for j in range(length)] for i in range(n)]


def direct_llm(model_dir: str, threads: int) -> Any:
    """`vllm.LLM` with the servers' sampling-worker engine arguments, on `threads` threads (the
    benchmarks' vLLM-alone reference: `bench/concurrency.py`, `bench/server.py`)."""
    import torch

    torch.set_num_threads(threads)
    from arctic_servers.engines.vllm.sampling import EXT_CLS, set_vllm_env

    set_vllm_env(cuda=False)
    from vllm import LLM

    return LLM(
        model=model_dir,
        tokenizer=model_dir,
        dtype="float32",
        seed=0,
        worker_extension_cls=EXT_CLS,
        enable_prefix_caching=True,
        max_num_seqs=64,
        enforce_eager=True,
    )


def direct(spec: dict[str, Any]) -> None:
    """The `--direct` process: one `vllm.LLM`; each line N on stdin -> the seconds of one
    `generate` of the N prompts (so its runs interleave with the servers' batched calls)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = direct_llm(spec["model_dir"], spec["threads"])
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, temperature=0.0)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], params, use_tqdm=False)  # warm-up
    print("READY", flush=True)
    for line in sys.stdin:
        n = int(line)
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts_of(n, spec["prompt_len"])]
        llm.reset_prefix_cache()
        t = time.perf_counter()
        llm.generate(inputs, params, use_tqdm=False)
        print(f"DIRECT {time.perf_counter() - t}", flush=True)


class Direct:
    """The `--direct` process, from this side: `run(n)` -> seconds."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path[:3])}
        n = str(spec["threads"])
        env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, TOKENIZERS_PARALLELISM="false")
        argv = [sys.executable, __file__, json.dumps(spec)]
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.ready = False

    def _line(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise RuntimeError(f"vLLM direct ended ({self.proc.wait()})")

    def wait_ready(self) -> None:
        if not self.ready:
            self._line("READY")
            self.ready = True

    def run(self, n: int) -> float:
        self.wait_ready()
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return float(self._line("DIRECT "))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


if __name__ == "__main__":
    direct(json.loads(sys.argv[1]))

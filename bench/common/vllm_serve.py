"""vLLM's own OpenAI server (`vllm serve`), as the concurrency benchmark's reference server.

`bench/concurrency.py` runs the same `openai` client and bare-aiohttp calls against it as against
the on-prem server and the gateway, so a row that misses its target can be read against what
vLLM's own server does with the same client on the same cores. It is started as a user would
start it — `python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs), its API
server and its engine core in processes of their own — with the engine arguments and threads of
the servers' sampling workers (`vllm_direct.direct_llm`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServe:
    """One `vllm serve` process; `base_url` once `wait_ready` returns; `close` stops it."""

    def __init__(self, model_dir: str, threads: int, log: Path) -> None:
        from arctic_servers.engines.vllm.sampling import set_vllm_env

        port = _free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.model = model_dir  # the model id vLLM serves under
        from .proc_cpu import MARK_VAR, new_mark

        self.mark = new_mark()  # its engine core inherits it (the benchmark reads their CPU)
        env = {**os.environ, MARK_VAR: self.mark}
        set_vllm_env(False, env)  # the CPU settings the workers get (KV cache, no thread binding)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: the engine core apart
        n = str(threads)
        env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
        argv += ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "64", "--seed", "0"]
        argv += ["--enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port)]
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vllm serve did not start:\n{tail}")
            try:
                with urllib.request.urlopen(self.base_url + "/v1/models", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, 9)  # its engine core, in the same session

"""The sampling engine (vLLM) of a worker process: generate, score, reload weights, sleep/wake.

One `vllm.LLM` per sub-job. On CPU it runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`:
3 s to start instead of 15 s, and killing the worker kills the engine with it), `enforce_eager`,
the KV cache sized by `VLLM_CPU_KVCACHE_SPACE`. Weight pushes go through the worker extension
(`reload_weights`, ENGINE_NOTES §3b), and every push is followed by `reset_prefix_cache()` so
no KV computed with the old weights is reused (ENGINE_NOTES pitfall 7).

Every sampling command (`generate`, `generate_stream`, and `log_probs` / `forward` scoring)
goes to the engine as requests the moment the worker reads it: `submit` prepares its vLLM inputs
and params (the code below) and hands them to the one submission path, `engine_batch.py`; the
worker's serve loop pumps the engine (`pump`: one `LLMEngine.step()`), so concurrent calls share
the continuous batch. Other commands (weight loads, cache resets, sleep / wake) wait until the
batch is empty (the serve loop defers them), and every result carries the `weight_version` of
the weights that produced it (set by `load_weights`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .engine_batch import EngineBatch, Finish
from .worker import WorkerError

EXT_CLS = "arctic_servers.onprem.vllm_ext.OnpremWorkerExtension"
MAX_LOGPROBS = 20
BATCHED = "_batch_"  # `_batch_<cmd>`: a command that runs in the engine's continuous batch


def set_vllm_env(cuda: bool) -> None:
    """Set before `import vllm` (setdefault: an operator's explicit value wins)."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not cuda:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class SamplingEngine:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.cuda = _cuda()
        set_vllm_env(self.cuda)
        from vllm import LLM

        conf: dict[str, Any] = dict(spec.get("config") or {})
        max_len = conf.get("max_seq_len")
        kwargs: dict[str, Any] = {
            "model": spec["model_dir"],
            "tokenizer": spec["model_dir"],
            "dtype": spec.get("dtype") or "float32",
            "seed": int(spec.get("seed") or 0),
            "worker_extension_cls": EXT_CLS,
            "enable_prefix_caching": True,
            "max_num_seqs": 64,
        }
        if max_len:
            kwargs["max_model_len"] = int(max_len)
        if self.cuda:
            kwargs["enable_sleep_mode"] = True
        else:
            kwargs["enforce_eager"] = True
        kwargs.update(dict(conf.get("vllm_config") or {}))
        t = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.startup_s = time.perf_counter() - t
        self.tokenizer = self.llm.get_tokenizer()
        mc = self.llm.llm_engine.model_config
        self.max_model_len = int(mc.max_model_len)
        self.vocab_size = int(mc.get_vocab_size())
        self.sleeping = False
        self.weight_version = 0  # of the weights loaded (`load_weights`); results report it
        self._warm_up()
        self.batch = EngineBatch(self.llm.llm_engine)

    def _warm_up(self) -> None:
        """One tiny generate at start-up: the first call pays seconds of one-time set-up."""
        from vllm import SamplingParams

        t = time.perf_counter()
        self.llm.generate(
            ["warm up"], SamplingParams(max_tokens=4, logprobs=0, seed=0), use_tqdm=False
        )
        self.llm.reset_prefix_cache()
        self.warmup_s = time.perf_counter() - t

    def info(self) -> dict[str, Any]:
        return {
            "engine": "vllm",
            "vocab_size": self.vocab_size,
            "max_model_len": self.max_model_len,
            "engine_startup_s": round(self.startup_s, 3),
            "warmup_s": round(self.warmup_s, 3),
            "cuda": self.cuda,
        }

    def close(self) -> None:
        self.batch.abort_all()

    # -- the continuous batch (the worker's serve loop) ----------------------------------------

    def submits(self, cmd: str) -> bool:
        """Whether `cmd` runs in the engine's batch (`_batch_<cmd>`: its requests) rather than
        as `op_<cmd>`: generate, generate_stream, log_probs and forward."""
        return callable(getattr(self, BATCHED + cmd, None))

    def submit(self, msg_id: int, cmd: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """Add command `msg_id` to the engine (None: `pump` sends its messages), or its result
        when it needs no engine step. Raises WorkerError for input the engine cannot take."""
        if self.sleeping:
            raise WorkerError(
                "unavailable", "the sampler is asleep (sleep-inference); wake it first"
            )
        if not self.submits(cmd):
            raise WorkerError("unimplemented", f"{cmd!r} does not run in the engine's batch")
        requests: Callable[..., tuple[list[Any], list[Any], Finish | None]]
        requests = getattr(self, BATCHED + cmd)
        inputs, params, finish = requests(**args)
        if not inputs and finish is not None:  # nothing to score: answered at once
            return finish([])
        self.batch.add(msg_id, cmd, inputs, params, finish, version=self.weight_version)
        return None

    def busy(self) -> bool:
        return self.batch.busy()

    def pump(self, send: Callable[[dict[str, Any]], None]) -> None:
        self.batch.pump(send)

    def abort(self, msg_id: int) -> list[dict[str, Any]]:
        return self.batch.abort(msg_id)

    def op_stream_stats(self) -> dict[str, Any]:
        return self.batch.stats()

    # -- generate ----------------------------------------------------------------------------

    def _sampling_params(self, sp: Mapping[str, Any], strict: bool) -> Any:
        from vllm import SamplingParams

        kw: dict[str, Any] = {
            "n": int(sp.get("n") or 1),
            "max_tokens": int(sp.get("max_tokens") or 16),
        }
        for name in ("temperature", "top_p"):
            if sp.get(name) is not None:
                kw[name] = float(sp[name])
        if sp.get("top_k") is not None and int(sp["top_k"]) > 0:
            kw["top_k"] = int(sp["top_k"])
        for name in ("presence_penalty", "frequency_penalty"):
            if sp.get(name):
                kw[name] = float(sp[name])
        if sp.get("repetition_penalty"):
            kw["repetition_penalty"] = float(sp["repetition_penalty"])
        if sp.get("stop"):
            kw["stop"] = [str(s) for s in sp["stop"]]
        if sp.get("stop_token_ids"):
            kw["stop_token_ids"] = [int(t) for t in sp["stop_token_ids"]]
        if sp.get("seed") is not None:
            kw["seed"] = int(sp["seed"])
        if sp.get("logprobs") is not None:
            kw["logprobs"] = int(sp["logprobs"])
        if sp.get("min_tokens"):
            kw["min_tokens"] = int(sp["min_tokens"])
        if sp.get("ignore_eos"):
            kw["ignore_eos"] = True
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as exc:
            raise WorkerError(
                "invalid_argument", f"field sampling_params: {exc}", field="sampling_params"
            ) from None

    def _prompts(self, prompts: Sequence[Any]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        out: list[Any] = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                ids = self.tokenizer.encode(p, add_special_tokens=False)
            else:
                ids = [int(t) for t in p]
            if not ids:
                raise WorkerError(
                    "invalid_argument",
                    f"field prompts[{i}]: the prompt has no tokens",
                    field=f"prompts[{i}]",
                )
            if len(ids) >= self.max_model_len:
                raise WorkerError(
                    "invalid_argument",
                    f"field prompts[{i}]: {len(ids)} tokens leave no room under max_model_len "
                    f"{self.max_model_len}",
                    field=f"prompts[{i}]",
                    expected=f"< {self.max_model_len} tokens",
                )
            out.append(TokensPrompt(prompt_token_ids=ids))
        return out

    def _batch_generate(
        self, prompts: Sequence[Any], sampling_params: Mapping[str, Any], strict: bool = False
    ) -> tuple[list[Any], list[Any], Finish]:
        params = self._sampling_params(sampling_params or {}, strict)
        inputs = self._prompts(prompts)
        # clamp max_tokens per prompt so a long prompt is not an engine error
        per_prompt = []
        for inp in inputs:
            room = self.max_model_len - len(inp["prompt_token_ids"])
            if params.max_tokens is not None and params.max_tokens > room:
                p2 = params.clone()
                p2.max_tokens = room
                per_prompt.append(p2)
            else:
                per_prompt.append(params)
        want_lp, version = params.logprobs is not None, self.weight_version

        def finish(outs: list[Any]) -> dict[str, Any]:
            return {**self._generate_result(outs, want_lp), "weight_version": version}

        return inputs, per_prompt, finish

    def _generate_result(self, outs: Sequence[Any], want_lp: bool) -> dict[str, Any]:
        results = []
        for ro in outs:
            samples = []
            for co in sorted(ro.outputs, key=lambda c: c.index):
                toks = [int(t) for t in co.token_ids]
                s: dict[str, Any] = {
                    "token_ids": toks,
                    "text": co.text,
                    "finish_reason": co.finish_reason or "length",
                }
                if want_lp and co.logprobs is not None:
                    s["logprobs"] = [float(co.logprobs[j][t].logprob) for j, t in enumerate(toks)]
                if isinstance(co.stop_reason, str):
                    s["stop_reason"] = co.stop_reason
                samples.append(s)
            results.append(
                {"prompt_token_ids": [int(t) for t in ro.prompt_token_ids], "samples": samples}
            )
        return {"results": results}

    # -- streaming ---------------------------------------------------------------------------

    def _batch_generate_stream(
        self, prompt: Sequence[Any], sampling_params: Mapping[str, Any]
    ) -> tuple[list[Any], list[Any], None]:
        """One streamed sample of `prompt` (no `finish`: `pump` sends its tokens step by step)."""
        sp = dict(sampling_params or {})
        if int(sp.get("n") or 1) != 1:
            raise WorkerError(
                "invalid_argument",
                f"field sampling_params.n: {sp.get('n')!r}; a stream is one sample",
                field="sampling_params.n",
                expected=1,
            )
        params = self._sampling_params(sp, False)
        (inp,) = self._prompts([prompt])
        room = self.max_model_len - len(inp["prompt_token_ids"])
        if params.max_tokens is None or params.max_tokens > room:
            params.max_tokens = room
        return [inp], [params], None

    # -- scoring (forward / log-probs targeted at a vLLM sub-job) -----------------------------

    def _score_requests(
        self, ids: np.ndarray, mask: np.ndarray
    ) -> tuple[list[Any], list[Any], Callable[[Sequence[Any]], np.ndarray]]:
        """Prompt log-prob requests for the rows of `ids` (the columns `mask` keeps), and what
        makes the shifted log-probs array of their outputs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        b, s = ids.shape
        rows, where = [], []
        for r in range(b):
            cols = np.nonzero(mask[r])[0]
            if len(cols) < 2:
                continue
            rows.append(TokensPrompt(prompt_token_ids=[int(t) for t in ids[r, cols]]))
            where.append((r, cols))

        def fill(outs: Sequence[Any]) -> np.ndarray:
            out = np.zeros((b, s), np.float32)
            for ro, (r, cols) in zip(outs, where, strict=True):
                plp = ro.prompt_logprobs
                toks = ro.prompt_token_ids
                for j in range(1, len(cols)):
                    if cols[j] != cols[j - 1] + 1:
                        continue  # a hole in the mask: not a prediction of adjacent columns
                    out[r, cols[j - 1]] = plp[j][toks[j]].logprob
            return out

        params = [SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0) for _ in rows]
        return rows, params, fill

    def _scores(self, kw: Mapping[str, Any]) -> tuple[list[Any], list[Any], Finish]:
        """The scoring requests of a body's `input_ids` / `attention_mask`, and its result."""
        ids = np.asarray(kw["input_ids"]).astype(np.int64)
        mask = kw.get("attention_mask")
        m = (
            np.ones(ids.shape, np.int64)
            if mask is None
            else (np.asarray(mask) != 0).astype(np.int64)
        )
        rows, params, fill = self._score_requests(ids, m)
        n, rows_in = int(((m[:, :-1] != 0) & (m[:, 1:] != 0)).sum()), len(m)

        def finish(outs: list[Any]) -> dict[str, Any]:
            return {
                "loss": 0.0,
                "metrics": {"loss": 0.0, "num_tokens": n, "num_sequences": rows_in},
                "outputs": {"logprobs_shifted": fill(outs)},
            }

        return rows, params, finish

    def _batch_forward(self, body: Mapping[str, Any]) -> tuple[list[Any], list[Any], Finish]:
        proc = body.get("processing") or {}
        if proc.get("loss_fn") or "compute_entropy" in (proc.get("post") or []):
            raise WorkerError(
                "unsupported_option",
                "a vLLM sub-job scores log-probs only: no loss_fn, no compute_entropy",
                options=["processing.loss_fn", "processing.post=compute_entropy"],
            )
        return self._scores(body["kwargs"])

    def _batch_log_probs(self, body: Mapping[str, Any]) -> tuple[list[Any], list[Any], Finish]:
        if body.get("entropy"):
            raise WorkerError(
                "unsupported_option", "a vLLM sub-job does not compute entropy", options=["entropy"]
            )
        return self._scores(body)

    # -- weights, cache, lifecycle -------------------------------------------------------------

    def op_load_weights(
        self,
        path: str | None = None,
        blob: bytes | None = None,
        method: str = "shm",
        handles: Any = None,
        nccl_port: int = 0,
        weight_version: int | None = None,
    ) -> dict[str, Any]:
        """Swap the weights (the serve loop runs this only while no request is in the engine);
        `weight_version`: what results report from now on."""
        t = time.perf_counter()
        if method == "nccl" and nccl_port:  # pragma: no cover - GPU only
            self.llm.collective_rpc("arctic_nccl_init", args=("127.0.0.1", nccl_port, 2, 1))
        if method in ("cuda_ipc", "nccl"):
            from .weight_sync import sampler_import_gpu

            res = sampler_import_gpu(self, method, handles)
        elif path:
            res = self.llm.collective_rpc("arctic_reload_weights_from_file", args=(path,))[0]
        else:
            res = self.llm.collective_rpc("arctic_reload_weights_from_bytes", args=(blob,))[0]
        reset = bool(self.llm.reset_prefix_cache())
        if weight_version is not None:
            self.weight_version = int(weight_version)
        return {
            "num_tensors": int(res.get("n", 0)),
            "seconds": time.perf_counter() - t,
            "reset": reset,
        }

    def op_reset_prefix_cache(self) -> dict[str, Any]:
        return {"reset": bool(self.llm.reset_prefix_cache())}

    def op_sleep(self, level: int = 1) -> dict[str, Any]:
        if not self.cuda:
            return {
                "applied": False,
                "reason": "CPU sampler: vLLM sleep mode needs a GPU; nothing to offload",
            }
        self.llm.sleep(level=int(level or 1))
        self.sleeping = True
        return {"applied": True, "reason": f"vLLM sleep level {int(level or 1)}"}

    def op_wake(self, tags: Sequence[str] | None = None) -> dict[str, Any]:
        if not self.cuda:
            return {
                "applied": False,
                "reason": "CPU sampler: vLLM sleep mode needs a GPU; nothing to offload",
            }
        self.llm.wake_up(tags=list(tags) if tags else None)
        if not tags or "weights" in tags:
            self.sleeping = False
        return {
            "applied": True,
            "reason": f"vLLM woke {list(tags) if tags else ['weights', 'kv_cache']}",
        }

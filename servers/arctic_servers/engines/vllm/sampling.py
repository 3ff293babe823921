"""The sampling engine (vLLM) of a worker process: generate, score, reload weights, sleep/wake.

One `vllm.LLM` per sub-job. On CPU it runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`:
3 s to start instead of 15 s, and killing the worker kills the engine with it), `enforce_eager`,
the KV cache sized by `VLLM_CPU_KVCACHE_SPACE`. Weight pushes go through the worker extension
(`reload_weights`, ENGINE_NOTES §3b), and every push is followed by `reset_prefix_cache()` so
no KV computed with the old weights is reused (ENGINE_NOTES pitfall 7).

Every sampling command (`generate`, `generate_stream`, and `log_probs` / `forward` scoring)
goes to the engine as requests the moment the worker reads it: `submit` prepares its vLLM inputs
and params (the code below; the scorers' in `vllm_scoring.py`) and hands them to the one
submission path, `engine_batch.py`; the worker's serve loop pumps the engine (`pump`: one
`LLMEngine.step()`), so concurrent calls share the continuous batch. Other commands (weight
loads, cache resets, sleep / wake) wait until the batch is empty (the serve loop defers them),
and every result carries the `weight_version` of the weights that produced it (set by
`load_weights`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ...rules import token_budget
from ...rules.weight_sync import START_TIMEOUT_S
from .. import structured
from ..errors import WorkerError
from ..worker.commands import Command
from ..worker.engine_base import EngineBase
from ..worker.messages import STREAM_CMD
from . import lora_sampler
from .engine_batch import EngineBatch, Finish
from .vllm_scoring import VllmScoring

EXT_CLS = "arctic_servers.engines.vllm.vllm_ext.OnpremWorkerExtension"
COLLECTIVE_BACKEND = "arctic"  # collective.BACKEND (imported with vLLM, after set_vllm_env)
MAX_LOGPROBS = 20
# a command of the engine's continuous batch: its arguments -> (prompts, params, finish)
BatchedCommand = Callable[..., tuple[list[Any], list[Any], Finish | None]]


def set_vllm_env(cuda: bool, env: MutableMapping[str, str] | None = None) -> None:
    """Set before `import vllm` (setdefault: an operator's explicit value wins); `env`: the
    environment to fill (default this process's)."""
    e = os.environ if env is None else env
    e.setdefault("VLLM_NO_USAGE_STATS", "1")
    e.setdefault("DO_NOT_TRACK", "1")
    e.setdefault("HF_HUB_OFFLINE", "1")
    e.setdefault("TRANSFORMERS_OFFLINE", "1")
    e.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not cuda:
        e.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        e.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        e.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def top_of(position: Mapping[int, Any], k: int) -> dict[str, list[Any]]:
    """`TopLogprobs` of one position of vLLM's logprobs ({token id: Logprob}): the k tokens of
    rank 1..k (vLLM adds the sampled token when it ranks lower), most likely first."""
    ranked = sorted(position.items(), key=lambda kv: (kv[1].rank or 1 << 30, -kv[1].logprob))
    top = [(int(t), float(lp.logprob)) for t, lp in ranked if (lp.rank or 1 << 30) <= k][:k]
    if len(top) < k:  # no ranks: the k largest log-probs
        by_lp = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:k]
        top = [(int(t), float(lp.logprob)) for t, lp in by_lp]
    return {"token_ids": [t for t, _ in top], "logprobs": [lp for _, lp in top]}


def prompt_logprobs_of(prompt: Sequence[int], plp: Any, k: int) -> dict[str, Any]:
    """`Completion.prompt_logprobs` (0 first: nothing predicts the first token) and, for k > 0,
    `prompt_top_logprobs` (empty first) from vLLM's `prompt_logprobs`."""
    lps = [0.0] + [float(plp[i][t].logprob) for i, t in enumerate(prompt) if i > 0]
    out: dict[str, Any] = {"prompt_logprobs": lps}
    if k > 0:
        empty: dict[str, list[Any]] = {"token_ids": [], "logprobs": []}
        out["prompt_top_logprobs"] = [empty] + [top_of(plp[i], k) for i in range(1, len(prompt))]
    return out


class SamplingEngine(VllmScoring, EngineBase):
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
            # the collective weight sync: vLLM's weight-transfer hooks with our backend
            "weight_transfer_config": {"backend": COLLECTIVE_BACKEND},
        }
        if max_len:
            kwargs["max_model_len"] = int(max_len)
        if self.cuda:
            kwargs["enable_sleep_mode"] = True
        else:
            kwargs["enforce_eager"] = True
        kwargs.update(self._lora_engine_args(spec))  # a LoRA job's sampler: adapter versions
        kwargs.update(dict(conf.get("vllm_config") or {}))
        from .collective import register

        register()  # in this process too (CPU: vLLM's worker runs in it)
        t = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.adapters = lora_sampler.adapters_of(self.llm, spec)
        self.startup_s = time.perf_counter() - t
        self.tokenizer = self.llm.get_tokenizer()
        mc = self.llm.llm_engine.model_config
        self.max_model_len = int(mc.max_model_len)
        self.vocab_size = int(mc.get_vocab_size())
        self.sleeping = False
        self.weight_version = 0  # of the weights loaded (`load_weights`); results report it
        self.torn = ""  # why the weights are part old, part new (a sync failed part way)
        pc = self.llm.llm_engine.vllm_config.parallel_config
        self.weight_ranks = int(pc.world_size)  # processes it joins a weight group with
        self._warm_up()
        self.batch = EngineBatch(self.llm.llm_engine)
        self._batched = self.batched_commands()

    def _lora_engine_args(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """`vllm.LLM`'s LoRA arguments (a LoRA pool's sampler has its own)."""
        return lora_sampler.engine_args(spec)

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
            "weight_ranks": self.weight_ranks,
        }

    def close(self) -> None:
        self.batch.abort_all()
        lora_sampler.close(self.adapters)

    def lora_request(self, adapter: str = "") -> Any:  # "": the current version; "base": none
        return None if self.adapters is None else self.adapters.request(adapter)

    # -- the continuous batch (the worker's serve loop) ----------------------------------------

    def batched_commands(self) -> dict[str, BatchedCommand]:
        """The commands that run in the engine's continuous batch, each as the method that turns
        its arguments into engine requests (the rest run at once from `commands()`)."""
        return {
            M.GENERATE.python_name: self._batch_generate,
            STREAM_CMD: self._batch_generate_stream,
            M.LOG_PROBS.python_name: self._batch_log_probs,
            M.FORWARD.python_name: self._batch_forward,
        }

    def submits(self, cmd: str) -> bool:
        """Whether `cmd` runs in the engine's batch (`batched_commands`) rather than at once."""
        return cmd in self._batched

    def submit(self, msg_id: int, cmd: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """Add command `msg_id` to the engine (None: `pump` sends its messages), or its result
        when it needs no engine step. Raises WorkerError for input the engine cannot take."""
        if self.sleeping:
            raise WorkerError(
                "unavailable", "the sampler is asleep (sleep-inference); wake it first"
            )
        if self.torn:
            raise WorkerError(
                "unavailable",
                f"the sampler's last weight sync failed part way ({self.torn}); its weights are "
                "part old, part new until a sync succeeds",
            )
        if not self.submits(cmd):
            raise WorkerError("unimplemented", f"{cmd!r} does not run in the engine's batch")
        inputs, params, finish = self._batched[cmd](**args)
        if not inputs and finish is not None:  # nothing to score: answered at once
            return finish([])
        # a LoRA job's requests run with its current adapter, or none (generate `adapter: "base"`)
        adapter = str(args.get("adapter") or "")
        version = 0 if adapter else self.weight_version
        lora = self.lora_request(adapter)
        self.batch.add(msg_id, cmd, inputs, params, finish, version=version, lora=lora)
        return None

    def busy(self) -> bool:
        return self.batch.busy()

    def pump(self, send: Callable[[dict[str, Any]], None]) -> None:
        self.batch.pump(send)

    def abort(self, msg_id: int) -> list[dict[str, Any]]:
        return self.batch.abort(msg_id)

    def commands(self) -> dict[str, Command]:
        """The worker commands this engine runs (`engines/worker/commands.py`)."""
        return {
            "stream_stats": self.op_stream_stats,
            "load_weights": self.op_load_weights,
            "weight_group_join": self.op_weight_group_join,
            "weight_group_close": self.op_weight_group_close,
            M.RESET_PREFIX_CACHE.python_name: self.op_reset_prefix_cache,
            "sleep": self.op_sleep,
            "wake": self.op_wake,
        }

    def op_stream_stats(self) -> dict[str, Any]:
        return self.batch.stats()

    # -- generate ----------------------------------------------------------------------------

    def _sampling_params(self, sp: Mapping[str, Any], strict: bool) -> Any:
        from vllm import SamplingParams

        # max_tokens: each prompt's, against its room (`_budgets`), set after; None here, not
        # vLLM's default 16, which its own checks (min_tokens <= max_tokens) would read
        kw: dict[str, Any] = {"n": int(sp.get("n") or 1), "max_tokens": None}
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
        if sp.get("prompt_logprobs") is not None:
            kw["prompt_logprobs"] = int(sp["prompt_logprobs"])
        if sp.get("min_tokens"):
            kw["min_tokens"] = int(sp["min_tokens"])
        if sp.get("ignore_eos"):
            kw["ignore_eos"] = True
        if sp.get("min_p"):
            kw["min_p"] = float(sp["min_p"])
        if sp.get("include_stop_str_in_output"):
            kw["include_stop_str_in_output"] = True
        constraint = structured.parse(sp)
        if constraint is not None:  # xgrammar decodes it (vLLM's structured outputs)
            from vllm.sampling_params import StructuredOutputsParams

            if constraint.kind == "json":
                so = StructuredOutputsParams(json=constraint.text)
            else:  # structured.KINDS: "structural_tag"
                so = StructuredOutputsParams(structural_tag=constraint.text)
            kw["structured_outputs"] = so
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
                raise token_budget.no_room(len(ids), self.max_model_len, f"prompts[{i}]")
            out.append(TokensPrompt(prompt_token_ids=ids))
        return out

    def _budgets(
        self, inputs: Sequence[Any], sp: Mapping[str, Any], clamp: bool
    ) -> list[token_budget.Budget]:
        """Each prompt's `max_tokens` against the room it leaves under `max_model_len`: refused
        past it unless `clamp` (rules/token_budget.py)."""
        asked = token_budget.requested(sp.get("max_tokens"))
        return [
            token_budget.budget(
                asked,
                len(inp["prompt_token_ids"]),
                self.max_model_len,
                clamp=clamp,
                prompt_field=f"prompts[{i}]",
            )
            for i, inp in enumerate(inputs)
        ]

    def _batch_generate(
        self,
        prompts: Sequence[Any],
        sampling_params: Mapping[str, Any],
        strict: bool = False,
        adapter: str = "",
        clamp_max_tokens: bool = False,
    ) -> tuple[list[Any], list[Any], Finish]:
        params = self._sampling_params(sampling_params or {}, strict)
        inputs = self._prompts(prompts)
        budgets = self._budgets(inputs, sampling_params or {}, clamp_max_tokens)
        per_prompt = []
        for b in budgets:
            p2 = params.clone()
            p2.max_tokens = b.max_tokens
            per_prompt.append(p2)
        version = 0 if adapter else self.weight_version  # "base": the base model, version 0

        def finish(outs: list[Any]) -> dict[str, Any]:
            res = self._generate_result(outs, params)
            for c, b in zip(res["results"], budgets, strict=True):
                if b.clamped:
                    c["clamped_max_tokens"] = b.max_tokens
            return {**res, "weight_version": version}

        return inputs, per_prompt, finish

    def _generate_result(self, outs: Sequence[Any], params: Any) -> dict[str, Any]:
        want_lp, top_k = params.logprobs is not None, int(params.logprobs or 0)
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
                    if top_k > 0:
                        s["top_logprobs"] = [
                            top_of(co.logprobs[j], top_k) for j in range(len(toks))
                        ]
                if isinstance(co.stop_reason, str):
                    s["stop_reason"] = co.stop_reason
                samples.append(s)
            prompt = [int(t) for t in ro.prompt_token_ids]
            c: dict[str, Any] = {"prompt_token_ids": prompt, "samples": samples}
            if params.prompt_logprobs is not None:
                c.update(prompt_logprobs_of(prompt, ro.prompt_logprobs, params.prompt_logprobs))
            results.append(c)
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
        (b,) = self._budgets([inp], sp, False)
        params.max_tokens = b.max_tokens
        return [inp], [params], None

    # -- weights, cache, lifecycle -------------------------------------------------------------

    def op_load_weights(
        self,
        path: str | None = None,
        blob: bytes | None = None,
        method: str = "shm",
        handles: Any = None,
        weight_version: int | None = None,
        adapter_config: Mapping[str, Any] | None = None,
        group_id: str = "",
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Swap the weights (the serve loop runs this only while no request is in the engine);
        `weight_version`: what results report from now on. A LoRA job's sync loads a new adapter
        version instead (lora_sampler.py). `collective`: receive them from the job's weight
        group (collective.py)."""
        t = time.perf_counter()
        if method == "collective":
            res = self._receive(group_id, int(weight_version or 0), start_timeout_s)
        elif adapter_config is not None or self.adapters is not None:
            res = lora_sampler.load(self.llm, self.adapters, adapter_config, path, blob)
        else:
            if method == "cuda_ipc":
                from .weight_sync import sampler_import_gpu

                out = sampler_import_gpu(self, handles)
            elif path:
                out = self.llm.collective_rpc("arctic_reload_weights_from_file", args=(path,))[0]
            else:
                out = self.llm.collective_rpc("arctic_reload_weights_from_bytes", args=(blob,))[0]
            res = {
                "num_tensors": int(out.get("n", 0)),
                "reset": bool(self.llm.reset_prefix_cache()),
            }
        self.torn = ""
        if weight_version is not None:
            self.weight_version = int(weight_version)
        return {**res, "seconds": time.perf_counter() - t}

    # -- the collective weight sync (collective.py: vLLM's weight-transfer hooks) ---------------

    def op_weight_group_join(
        self,
        group_id: str,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float = 120.0,
    ) -> dict[str, Any]:
        info = {
            "group_id": group_id, "host": host, "port": int(port), "rank_offset": int(rank),
            "world_size": int(world_size), "backend": backend, "timeout_s": float(timeout_s),
            "mode": "adapter" if self.adapters is not None else "full",
        }  # fmt: skip
        try:
            self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})
        except Exception as exc:
            raise WorkerError("unavailable", f"joining weight group {group_id}: {exc}") from None
        return dict(self.llm.collective_rpc("arctic_weight_transfer_last")[0].get("joined") or {})

    def op_weight_group_close(self, group_id: str = "") -> dict[str, Any]:
        with contextlib.suppress(Exception):
            self.llm.collective_rpc("shutdown_weight_transfer_engine")
        return {"closed": True}

    def _buckets_loaded(self) -> int:
        with contextlib.suppress(Exception):
            last = self.llm.collective_rpc("arctic_weight_transfer_last")[0]
            return int(last.get("buckets_loaded", 0))
        return 1  # unknown: assume the worst

    def _receive(self, group_id: str, version: int, start_timeout_s: float) -> dict[str, Any]:
        """One collective sync: vLLM's start / update / finish weight update, or for a LoRA
        sampler the adapter into a file, registered as its next version."""
        rpc = self.llm.collective_rpc
        update: dict[str, Any] = {
            "version": version,
            "group_id": group_id,
            "start_timeout_s": float(start_timeout_s),
        }
        adapter_file = ""
        if self.adapters is not None:
            adapter_file = str(self.adapters.root / f"incoming-{version}.safetensors")
            update["adapter_path"] = adapter_file
        try:
            if self.adapters is not None:
                last = dict(rpc("arctic_receive_adapter", args=(update,))[0])
            else:
                rpc("start_weight_update")
                rpc("update_weights", kwargs={"update_info": update})
                rpc("finish_weight_update")
                last = dict(rpc("arctic_weight_transfer_last")[0])
        except Exception as exc:
            if self.adapters is None and self._buckets_loaded():
                # the layers it got have the new weights, the others the old (collective.py)
                self.torn = f"weight version {version}: {exc}"
            raise WorkerError("unavailable", f"receiving weight version {version}: {exc}") from None
        if self.adapters is not None:
            t0 = time.perf_counter()
            try:
                res = lora_sampler.load(
                    self.llm, self.adapters, last.pop("adapter_config", {}), adapter_file, None
                )
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(adapter_file)
            # registering the adapter's new version is its load into the engine
            last["load_seconds"] = last.get("load_seconds", 0.0) + time.perf_counter() - t0
        else:
            res = {"num_tensors": last.get("num_tensors", 0),
                   "reset": bool(self.llm.reset_prefix_cache())}  # fmt: skip
        return {**last, **res}

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

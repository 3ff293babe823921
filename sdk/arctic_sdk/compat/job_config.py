"""The CreateJob body of a legacy config: every legacy field honoured, refused or warned by name.

`plan_job(config, keys)` maps the deployed clients' DeepSpeed-shaped fields (`ds_config`,
`ds_worker_config`, `training_config`, `log_prob_ds_config`, `vllm_config`,
`arctic_inference_config`, `checkpoint_path`, `full_determinism`, `colocate`, ...) onto the
sub-job configs of `jobs.proto`. `keys` are the config keys the server advertises
(capabilities `config_keys`; the standard ones when it advertises none): a field whose key the
server does not offer is warned about by name and not sent; a field no server could honour is
refused, all of them in one `UnsupportedConfigError`, before anything is sent. The mapping, field
by field, is the table in docs/FRAMEWORKS.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedOptionError
from ..spec.model import STANDARD_CONFIG_KEYS
from .lora import LORA_TRAINING_KEYS, lora_fields

if TYPE_CHECKING:
    from .config import ArcticRLClientConfig

__all__ = ["JobPlan", "UnsupportedConfigError", "plan_job"]

#: DeepSpeed batch-split keys: the protocol accumulates gradients across calls until `step`
#: (PROTOCOL.md §9), so they decide nothing; `train_micro_batch_size_per_gpu` is the rows of one
#: pass (`micro_batch_size`).
BATCH_KEYS = ("train_batch_size", "gradient_accumulation_steps")
#: ds_worker_config knobs of the deployed model patches (ZoRRO's prompt dedup, unpadding, the
#: chunked logits): memory and speed only; the row balancer follows each call's meta.
ZORRO_WORKER_KEYS = (
    "zorro_train_enable",
    "response_len",
    "max_token_len",
    "rollout_n",
    "temperature",
    "use_unpad",
    "logits_optimization",
    "logits_optimization_peak_mem_size_in_gib",
    "logits_compute_from_fp32_inputs",
    "logits_compute_in_fp32",
)
WORKER_KEYS = frozenset(
    {"use_liger", "enable_gradient_checkpointing", "attn_implementation", *ZORRO_WORKER_KEYS}
)
OPTIMIZER_KEYS = frozenset(
    {"lr", "betas", "eps", "weight_decay", "beta1", "beta2", "gradient_clipping", "max_grad_norm"}
)
SCHEDULE_KEYS = frozenset({"type", "warmup_ratio", "warmup_steps", "min_lr_ratio"})
TRAINING_CONFIG_KEYS = frozenset(
    {
        "training_horizon",
        "optimizer",
        "lr_scheduler",
        "max_length",
        "model_config",
        "attn_implementation",
        "gradient_clipping",
        "gradient_checkpointing",
        "dtype",
        "gradient_accumulation_steps",
        *LORA_TRAINING_KEYS,  # verl's / SkyRL's LoRA fields (compat/lora.py)
    }
)
FLASH = ("flash_attention_2", "flash_attention_3")
#: vLLM arguments of Arctic Inference (not in vLLM): the sampler runs without them
ARCTIC_VLLM_KEYS = ("forest_cascade_attn_configs",)


class UnsupportedConfigError(UnsupportedOptionError):
    """Legacy config fields no server can honour; `options` names every one."""

    def __init__(self, problems: list[str]) -> None:
        self.options = [p.split(" ", 1)[0] for p in problems]
        super().__init__(
            f"{len(problems)} config field(s) cannot be honoured, nothing was created: "
            + "; ".join(problems),
            code="unsupported_option",
            details={"options": self.options, "problems": problems},
        )


@dataclass
class JobPlan:
    """A CreateJob body, the warnings (each naming its fields) and the refusals."""

    body: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class _Planner:
    def __init__(self, cfg: ArcticRLClientConfig, keys: Mapping[str, frozenset[str]]) -> None:
        self.cfg = cfg
        self.keys = keys
        self.plan = JobPlan()
        self.no_effect: list[str] = []

    def warn(self, msg: str) -> None:
        self.plan.warnings.append(msg)

    def refuse(self, msg: str) -> None:
        self.plan.problems.append(msg)

    def offer(self, role: str, key: str, conf: dict[str, Any], value: Any, what: str) -> None:
        """`conf[key] = value` when the server accepts `key` for `role`; else a warning."""
        if key in self.keys[role]:
            conf[key] = value
        else:
            self.warn(
                f"{what} is not used: the server does not offer {role} config key {key!r} "
                f"(it offers {sorted(self.keys[role])})"
            )

    # -------------------------------------------------------------------- sub-jobs

    def run(self) -> JobPlan:
        cfg = self.cfg
        tc = dict(cfg.training_config or {})
        for k in sorted(set(tc) - TRAINING_CONFIG_KEYS):
            self.refuse(f"training_config.{k} (unknown; known: {sorted(TRAINING_CONFIG_KEYS)})")
        if tc.get("model_config") is not None:
            self.refuse("training_config.model_config (a model config override; pass model_name)")
        dtype = self._dtype(tc)
        base: dict[str, Any] = {"model_name": cfg.model_name, "seed": cfg.seed}
        if dtype:
            base["dtype"] = dtype
        max_len = (
            cfg.max_seq_len or tc.get("max_length") or (cfg.vllm_config or {}).get("max_model_len")
        )
        subs: list[dict[str, Any]] = []
        if cfg.training_gpus > 0:
            training = self._training(tc)
            if max_len:
                training["max_seq_len"] = int(max_len)
            subs.append({"job_type": "training", **base, "training_config": training})
        if cfg.sampling_gpus > 0:
            subs.append(
                {"job_type": "sampling", **base, "inference_config": self._sampling(max_len)}
            )
        if cfg.log_prob_gpus > 0:
            lp = self._log_prob(tc, max_len)
            subs.append({"job_type": "log_prob", **base, "inference_config": lp})
        if not subs:
            self.refuse("training_gpus (training_gpus, sampling_gpus and log_prob_gpus are all 0)")
        self._global()
        if self.no_effect:
            self.warn(
                "accepted without effect (the protocol accumulates gradients until step and the "
                "server places the sub-jobs; these only tuned the deployed server): "
                + ", ".join(self.no_effect)
            )
        body: dict[str, Any] = {"sub_job_configs": subs}
        if cfg.experiment_name:
            body["experiment_name"] = cfg.experiment_name
        if cfg.lease_seconds:
            body["lease_seconds"] = cfg.lease_seconds
        self.plan.body = body
        return self.plan

    def _dtype(self, tc: Mapping[str, Any]) -> str | None:
        if self.cfg.dtype:
            return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(
                self.cfg.dtype, self.cfg.dtype
            )
        ds = self.cfg.ds_config
        on = [n for n in ("bf16", "fp16") if (ds.get(n) or {}).get("enabled")]
        if len(on) > 1:
            self.refuse("ds_config.bf16 (and ds_config.fp16 are both enabled)")
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(on[0]) if on else None
        if tc.get("dtype") is not None:
            want = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(
                str(tc["dtype"]), str(tc["dtype"])
            )
            if dtype is not None and want != dtype:
                self.refuse(f"training_config.dtype={tc['dtype']!r} (ds_config says {dtype})")
            dtype = want
        return dtype

    def _training(self, tc: Mapping[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        ds = dict(cfg.ds_config)
        out: dict[str, Any] = {"n_gpus": cfg.training_gpus}
        self._optimizer(tc, ds, out)
        zero = ds.pop("zero_optimization", None)
        if isinstance(zero, dict) and zero.get("stage") is not None:
            out["zero_stage"] = int(zero["stage"])
            rest = {k: v for k, v in zero.items() if k != "stage"}
            if rest:
                ds["zero_optimization"] = rest
        micro = ds.pop("train_micro_batch_size_per_gpu", None)
        if micro:
            out["micro_batch_size"] = int(micro)
        for k in BATCH_KEYS:
            if ds.pop(k, None) is not None:
                self.no_effect.append(f"ds_config.{k}")
        if tc.get("gradient_accumulation_steps") is not None:
            self.no_effect.append("training_config.gradient_accumulation_steps")
        sp = ds.pop("sequence_parallel_size", 1)
        if int(sp or 1) != 1:
            self.refuse(f"ds_config.sequence_parallel_size={sp} (Ulysses sequence parallelism)")
        for n in ("bf16", "fp16"):  # the sub-job's dtype (every sub-job runs it)
            ds.pop(n, None)
        if ds:
            out["deepspeed"] = ds
        self._schedule(tc, out)
        self._lora(tc, out)
        self._worker(tc, out, "training")
        if cfg.full_determinism:
            self.offer("training", "full_determinism", out, True, "full_determinism")
        if cfg.checkpoint_path:
            self.offer("training", "checkpoint_path", out, cfg.checkpoint_path, "checkpoint_path")
        return out

    def _lora(self, tc: Mapping[str, Any], out: dict[str, Any]) -> None:
        """verl's / SkyRL's LoRA fields -> `lora` (refused when the server offers no LoRA: the
        job would otherwise train every weight)."""
        found = lora_fields(tc)
        for p in found.problems:
            self.refuse(p)
        self.no_effect += found.no_effect
        if found.lora is None:
            return
        if "lora" not in self.keys["training"]:
            self.refuse("training_config.lora (the server offers no LoRA training)")
            return
        out["lora"] = found.lora

    def _optimizer(self, tc: Mapping[str, Any], ds: dict[str, Any], out: dict[str, Any]) -> None:
        opt = dict(tc.get("optimizer") or {})
        for k in sorted(set(opt) - OPTIMIZER_KEYS - {"lr_scheduler_type", "warmup_ratio"}):
            self.refuse(f"training_config.optimizer.{k} (known: {sorted(OPTIMIZER_KEYS)})")
        ds_opt = dict(ds.pop("optimizer", None) or {})
        params = dict(ds_opt.get("params") or {})
        for k in sorted(set(params) - {"lr", "betas", "eps", "weight_decay"}):
            self.refuse(f"ds_config.optimizer.params.{k} (known: lr, betas, eps, weight_decay)")
        merged = {**params, **{k: v for k, v in opt.items() if k in ("lr", "eps", "weight_decay")}}
        if opt.get("betas") is not None:
            merged["betas"] = opt["betas"]
        elif opt.get("beta1") is not None or opt.get("beta2") is not None:
            merged["betas"] = [opt.get("beta1", 0.9), opt.get("beta2", 0.999)]
        if merged or ds_opt:
            o: dict[str, Any] = {"name": str(ds_opt.get("type") or "adamw").lower()}
            for k in ("lr", "betas", "eps", "weight_decay"):
                if merged.get(k) is not None:
                    o[k] = [float(b) for b in merged[k]] if k == "betas" else float(merged[k])
            out["optimizer"] = o
        clip = next(
            (
                v
                for v in (
                    opt.get("gradient_clipping"),
                    opt.get("max_grad_norm"),
                    tc.get("gradient_clipping"),
                    ds.pop("gradient_clipping", None),
                )
                if v is not None
            ),
            None,
        )
        if clip is not None:
            out["gradient_clipping"] = float(clip)

    def _schedule(self, tc: Mapping[str, Any], out: dict[str, Any]) -> None:
        """`training_config.lr_scheduler` (+ `training_horizon`), as the deployed server read it:
        warm-up `round(warmup_ratio * horizon)` steps, then constant or cosine over the horizon."""
        sched = dict(tc.get("lr_scheduler") or {})
        opt = dict(tc.get("optimizer") or {})
        if opt.get("lr_scheduler_type") is not None:
            sched.setdefault("type", opt["lr_scheduler_type"])
        if opt.get("warmup_ratio") is not None:
            sched.setdefault("warmup_ratio", opt["warmup_ratio"])
        for k in sorted(set(sched) - SCHEDULE_KEYS):
            self.refuse(f"training_config.lr_scheduler.{k} (known: {sorted(SCHEDULE_KEYS)})")
        horizon = int(tc.get("training_horizon") or 0)
        if not sched:
            if horizon:
                self.no_effect.append("training_config.training_horizon (no lr_scheduler)")
            return
        kind = str(sched.get("type") or "constant")
        if kind not in ("constant", "cosine", "linear"):
            self.refuse(
                f"training_config.lr_scheduler.type={kind!r} (known: constant, cosine, linear)"
            )
            return
        if "warmup_steps" in sched:
            warmup = round(float(sched["warmup_steps"]))
        else:
            warmup = round(float(sched.get("warmup_ratio") or 0.0) * horizon)
        low = float(sched.get("min_lr_ratio") or 0.0)
        if kind == "constant" and warmup == 0:  # the optimizer's lr, nothing to schedule
            if horizon:
                self.no_effect.append("training_config.training_horizon (a constant rate)")
            return
        if kind != "constant" and horizon <= 0:
            self.refuse(f"training_config.training_horizon (a {kind} decay needs it > 0)")
            return
        if horizon <= 0 and warmup > 0 and "warmup_steps" not in sched:
            self.refuse("training_config.training_horizon (warmup_ratio needs it > 0)")
            return
        value: dict[str, Any] = {"type": kind, "warmup_steps": warmup, "min_lr_ratio": low}
        if horizon > 0:
            value["total_steps"] = horizon
        what = "training_config.lr_scheduler (with training_horizon)"
        self.offer("training", "lr_scheduler", out, value, what)

    def _worker(self, tc: Mapping[str, Any], out: dict[str, Any], role: str) -> None:
        """`ds_worker_config` (and `training_config.attn_implementation`)."""
        w = dict(self.cfg.ds_worker_config or {})
        if role == "training":
            for k in sorted(set(w) - WORKER_KEYS):
                self.refuse(f"ds_worker_config.{k} (known: {sorted(WORKER_KEYS)})")
            if w.get("use_liger"):
                self.warn(
                    "ds_worker_config.use_liger=True is not used: the trainer runs the Hugging "
                    "Face modules (Liger's fused kernels compute the same values, faster on GPU)"
                )
            gc = w.get("enable_gradient_checkpointing", tc.get("gradient_checkpointing"))
            if gc:
                what = "ds_worker_config.enable_gradient_checkpointing"
                self.offer(role, "activation_checkpointing", out, True, what)
            zorro = [f"ds_worker_config.{k}" for k in ZORRO_WORKER_KEYS if k in w]
            if zorro:
                self.warn(
                    "ZoRRO's model patches are not used (prompt deduplication, unpadding and "
                    "chunked logits change memory and speed, not the values): "
                    + ", ".join(zorro)
                    + "; rows are balanced across ranks per call (meta.zorro_train_enable / "
                    "load_balancer -> processing.balance_rows)"
                )
        attn = w.get("attn_implementation", tc.get("attn_implementation"))
        if attn:
            if attn in FLASH and role == "training":
                self.warn(
                    f"attn_implementation={attn!r} is sent as is; a server without flash-attn "
                    "kernels (every CPU host) runs sdpa instead, the same attention"
                )
            self.offer(role, "attn_implementation", out, str(attn), "attn_implementation")

    def _sampling(self, max_len: Any) -> dict[str, Any]:
        inf: dict[str, Any] = {"n_gpus": self.cfg.sampling_gpus}
        vc = self._vllm()
        if vc:
            inf["vllm_config"] = vc
        if max_len:
            inf["max_seq_len"] = int(max_len)
        return inf

    def _vllm(self) -> dict[str, Any]:
        vc = dict(self.cfg.vllm_config or {})
        dropped = [f"vllm_config.{k}" for k in ARCTIC_VLLM_KEYS if vc.pop(k, None) is not None]
        if dropped:
            self.warn(
                f"{', '.join(dropped)} not used: Arctic Inference's forest cascade attention is "
                "not installed; vLLM samples the same distribution without it"
            )
        spec = vc.get("speculative_config")
        if isinstance(spec, Mapping) and spec.get("method") == "arctic":
            self.refuse("vllm_config.speculative_config (Arctic speculative decoding)")
        return vc

    def _log_prob(self, tc: Mapping[str, Any], max_len: Any) -> dict[str, Any]:
        cfg = self.cfg
        lp: dict[str, Any] = {"n_gpus": cfg.log_prob_gpus}
        if max_len:
            lp["max_seq_len"] = int(max_len)
        engine = cfg.log_prob_engine
        if engine == "deepspeed" and "engine" in self.keys["log_prob"]:
            lp["engine"] = "deepspeed"
            ds = self._log_prob_ds()
            if ds:
                self.offer("log_prob", "deepspeed", lp, ds, "log_prob_ds_config")
        elif engine in ("vllm", "hf") and "engine" in self.keys["log_prob"]:
            lp["engine"] = engine
            if engine == "vllm":
                vc = self._vllm()
                if vc:
                    lp["vllm_config"] = vc
        else:
            if "log_prob_engine" in cfg.model_fields_set:  # set, not the default
                self.warn(f"log_prob_engine={engine!r} is not used: the server picks its engine")
            if cfg.log_prob_ds_config:
                self.warn("log_prob_ds_config is not used: the server picks its log-prob engine")
        if engine != "deepspeed" and cfg.log_prob_ds_config:
            self.warn(f"log_prob_ds_config is not used by log_prob_engine={engine!r}")
        if engine != "vllm":
            self._worker(tc, lp, "log_prob")
            if cfg.full_determinism:
                self.offer("log_prob", "full_determinism", lp, True, "full_determinism")
        return lp

    def _log_prob_ds(self) -> dict[str, Any]:
        src = dict(self.cfg.log_prob_ds_config or {})
        out: dict[str, Any] = {}
        unused = []
        for k in ("optimizer", "scheduler", "gradient_clipping", *BATCH_KEYS):
            if src.pop(k, None) is not None:
                unused.append(f"log_prob_ds_config.{k}")
        zero = dict(src.pop("zero_optimization", None) or {})
        if zero.pop("offload_optimizer", None) is not None:
            unused.append("log_prob_ds_config.zero_optimization.offload_optimizer")
        if zero:
            out["zero_optimization"] = zero
        sp = src.pop("sequence_parallel_size", 1)
        if int(sp or 1) != 1:
            self.refuse(f"log_prob_ds_config.sequence_parallel_size={sp} (Ulysses)")
        micro = src.pop("train_micro_batch_size_per_gpu", None)
        if micro:
            out["train_micro_batch_size_per_gpu"] = int(micro)
        for n in ("bf16", "fp16"):
            src.pop(n, None)  # the sub-job's dtype
        out.update(src)
        if unused:
            self.warn(
                "not used by the forward-only log-prob engine (it has no optimizer): "
                + ", ".join(unused)
            )
        return out

    def _global(self) -> None:
        cfg = self.cfg
        if cfg.colocate:
            self.warn(
                "colocate=True is not used for placement: the server places each sub-job "
                "(sleep/wake calls are sent and answer applied:false where nothing shares a GPU)"
            )
        aic = cfg.arctic_inference_config
        if aic and _enabled(aic):
            self.refuse(
                "arctic_inference_config (Arctic Inference FCA / speculative decoding is not "
                f"available; got {dict(aic)})"
            )


def _enabled(block: Any) -> bool:
    """Whether an `arctic_inference_config` asks for anything: a truthy leaf (`enable: true`, a
    draft model's name); the all-disabled block verl sends is off, as the deployed server had it."""
    if isinstance(block, Mapping):
        return any(_enabled(v) for v in block.values())
    return bool(block)


def plan_job(
    cfg: ArcticRLClientConfig, keys: Mapping[str, frozenset[str]] | None = None
) -> JobPlan:
    """The CreateJob body of `cfg` for a server that accepts `keys` (module doc)."""
    return _Planner(cfg, keys or STANDARD_CONFIG_KEYS).run()

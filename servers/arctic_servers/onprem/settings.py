"""Server settings, the default model, sub-job configs and the thread plan (no torch here).

Everything the server decides before a worker process starts lives here, so the server process
itself stays free of torch, DeepSpeed and vLLM: it only spawns workers with the right argv and
environment.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import jobs as pj
from ..protocol.errors import ProtocolError
from ..protocol.jobs import role_of

ROLES = ("training", "sampling", "log_prob")
DTYPES = ("float32", "bfloat16", "float16")
# Names that mean "the embedded default model" (an empty model_name means it too).
DEFAULT_MODEL_NAMES = frozenset({"", "tiny", "arctic-tiny", "tiny-qwen2", "default"})
# the standard config keys, with the on-prem extensions
TRAINING_KEYS = pj.TRAINING_KEYS | {"attn_implementation", "num_threads"}
# the log-prob engine ("hf" = a torch forward, "vllm"), threads
INFERENCE_KEYS = pj.INFERENCE_KEYS | {"engine", "num_threads"}
OPTIMIZER_KEYS = frozenset({"name", "type", "lr", "betas", "eps", "weight_decay", "momentum"})
OPTIMIZERS = ("adamw", "adam", "sgd")


def default_cache_dir() -> Path:
    env = os.environ.get("ARCTIC_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "arctic"


def servers_dir() -> Path:
    """The directory holding the `arctic_servers` package (put on a worker's PYTHONPATH)."""
    return Path(__file__).resolve().parents[2]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per worker process, so the client, server and engines do not oversubscribe.

    `per_role` overrides the default for a role; a sub-job's `num_threads` overrides both.
    `pin` binds each worker to `cores` round-robin (off by default: on a small machine the
    trainer and the sampler mostly take turns, and pinning would halve what each one gets).
    """

    default: int = 0  # 0 = max(1, cores // 2)
    per_role: Mapping[str, int] = field(default_factory=dict)
    pin: bool = False

    def threads(self, role: str, override: int | None = None) -> int:
        if override:
            return max(1, int(override))
        n = self.per_role.get(role) or self.default
        return max(1, n or cpu_count() // 2)

    @staticmethod
    def parse(spec: str | None) -> ThreadPlan:
        """`"2"` (every worker) or `"training=1,sampling=1,log_prob=1"`, optionally `",pin"`."""
        if not spec:
            return ThreadPlan()
        default, per, pin = 0, {}, False
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            if part == "pin":
                pin = True
            elif "=" in part:
                role, _, n = part.partition("=")
                if role not in ROLES:
                    raise ValueError(f"--threads: unknown role {role!r} (one of {ROLES})")
                per[role] = int(n)
            else:
                default = int(part)
        return ThreadPlan(default, per, pin)


def thread_env(n: int) -> dict[str, str]:
    """Environment every worker gets: one thread count for every threading library."""
    s = str(n)
    return {
        "OMP_NUM_THREADS": s,
        "MKL_NUM_THREADS": s,
        "OPENBLAS_NUM_THREADS": s,
        "NUMEXPR_NUM_THREADS": s,
        "ARCTIC_NUM_THREADS": s,
        "TOKENIZERS_PARALLELISM": "false",
    }


@dataclass(frozen=True)
class ServerSettings:
    """What the on-prem server needs beyond the protocol layer's `ProtocolConfig`."""

    data_dir: Path = field(default_factory=lambda: default_cache_dir() / "onprem")
    model: str = ""  # default model directory ("" = the embedded tiny model)
    worker_python: str = field(default_factory=lambda: sys.executable)
    threads: ThreadPlan = field(default_factory=ThreadPlan)
    max_slots: int = 16  # sub-jobs running at once (n_gpus each, 1 by default)
    worker_start_timeout_s: float = 600.0
    lease_default_seconds: int = 0
    lease_max_seconds: int = 7 * 24 * 3600
    verbose_workers: bool = False  # echo worker output to the server's stderr
    tiny_model_seed: int = 0
    # engines with one idle, pre-imported worker kept ready, so a job starts in seconds
    prewarm: tuple[str, ...] = ("deepspeed", "vllm")


def _bad(path: str, message: str, code: str = "invalid_argument", **details: Any) -> ProtocolError:
    return ProtocolError(code, f"field {path}: {message}", field=path, **details)


def _int(conf: Mapping[str, Any], key: str, path: str, *, lo: int = 1) -> int | None:
    v = conf.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # Struct numbers arrive as floats over gRPC
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise _bad(f"{path}.{key}", f"{v!r} is not an integer >= {lo}", expected=f">= {lo}")
    return v


def _num(conf: Mapping[str, Any], key: str, path: str, *, lo: float = 0.0) -> float | None:
    v = conf.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not float(v) >= lo:
        raise _bad(f"{path}.{key}", f"{v!r} is not a number >= {lo}", expected=f">= {lo}")
    return float(v)


@dataclass
class SubJobSpec:
    """A checked sub-job config."""

    role: str
    model_name: str
    dtype: str
    seed: int
    config: dict[str, Any]
    n_gpus: int = 1


def check_optimizer(opt: Any, path: str) -> None:
    if not isinstance(opt, Mapping):
        raise _bad(path, "must be an object", expected='{"name": "adamw", "lr": ...}')
    unknown = sorted(str(k) for k in opt if k not in OPTIMIZER_KEYS)
    if unknown:
        opts = [f"{path}.{k}" for k in unknown]
        raise ProtocolError(
            "unsupported_option",
            f"unknown optimizer key(s): {', '.join(opts)}; known: {sorted(OPTIMIZER_KEYS)}",
            options=opts,
            field=opts[0],
        )
    name = str(opt.get("name") or opt.get("type") or "adamw").lower()
    if name not in OPTIMIZERS:
        raise _bad(
            f"{path}.name", f"{name!r} is not one of {list(OPTIMIZERS)}", expected=OPTIMIZERS
        )
    _num(opt, "lr", path)
    _num(opt, "eps", path)
    _num(opt, "weight_decay", path)
    _num(opt, "momentum", path)
    betas = opt.get("betas")
    if betas is not None and (
        not isinstance(betas, list | tuple)
        or len(betas) != 2
        or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)
    ):
        raise _bad(f"{path}.betas", f"{betas!r} is not two numbers in [0, 1)", expected="[b1, b2]")


def sub_job_specs(body: Mapping[str, Any], *, cuda: bool) -> list[SubJobSpec]:
    """Check `sub_job_configs` of a CreateJob body; every unknown key is listed in one error."""
    configs = body.get("sub_job_configs") or []
    if not configs:
        raise _bad("sub_job_configs", "at least one sub-job config is required", "missing_field")
    out: list[SubJobSpec] = []
    unsupported: list[str] = []
    for i, cfg in enumerate(configs):
        path = f"sub_job_configs[{i}]"
        role = role_of(cfg.get("job_type"))
        if role is None:
            raise _bad(
                f"{path}.job_type", "is required: training, sampling or log_prob", "missing_field"
            )
        dtype = cfg.get("dtype") or "float32"
        if dtype not in DTYPES:
            raise _bad(f"{path}.dtype", f"{dtype!r} is not one of {list(DTYPES)}", expected=DTYPES)
        own, other = ("training_config", "inference_config")
        if role != "training":
            own, other = other, own
        if cfg.get(other):
            raise _bad(f"{path}.{other}", f"is not used by a {role} sub-job; use {own}")
        conf: dict[str, Any] = dict(cfg.get(own) or {})
        known = TRAINING_KEYS if role == "training" else INFERENCE_KEYS
        unsupported += [f"{path}.{own}.{k}" for k in conf if k not in known]
        cpath = f"{path}.{own}"
        # capacity slots; a training sub-job also runs n_gpus ranks (processes, dp_training.py)
        n_gpus = _int(conf, "n_gpus", cpath) or 1
        _int(conf, "max_seq_len", cpath)
        _int(conf, "num_threads", cpath)
        if role == "training":
            stage = _int(conf, "zero_stage", cpath, lo=0)
            if stage is not None and stage > 3:
                raise _bad(
                    f"{cpath}.zero_stage", f"{stage} is not 0, 1, 2 or 3", expected=[0, 1, 2, 3]
                )
            _int(conf, "micro_batch_size", cpath)
            _int(conf, "train_batch_size", cpath)
            _num(conf, "gradient_clipping", cpath)
            if conf.get("optimizer") is not None:
                check_optimizer(conf["optimizer"], f"{cpath}.optimizer")
            ds = conf.get("deepspeed")
            if ds is not None and not isinstance(ds, Mapping):
                raise _bad(f"{cpath}.deepspeed", "must be an object (DeepSpeed config keys)")
            attn = conf.get("attn_implementation")
            if attn is not None and attn not in ("eager", "sdpa"):
                raise _bad(f"{cpath}.attn_implementation", f"{attn!r}", expected=["eager", "sdpa"])
        else:
            vc = conf.get("vllm_config")
            if vc is not None and not isinstance(vc, Mapping):
                raise _bad(f"{cpath}.vllm_config", "must be an object (vLLM engine arguments)")
            engine = conf.get("engine")
            allowed = ("vllm", "hf") if role == "log_prob" else ("vllm",)
            if engine is not None and engine not in allowed:
                raise _bad(
                    f"{cpath}.engine", f"{engine!r} is not one of {list(allowed)}", expected=allowed
                )
        seed = cfg.get("seed") or 0
        out.append(
            SubJobSpec(role, str(cfg.get("model_name") or ""), dtype, int(seed), conf, n_gpus)
        )
    if unsupported:
        raise ProtocolError(
            "unsupported_option",
            f"config key(s) this server cannot honour: {', '.join(unsupported)}",
            options=unsupported,
            field=unsupported[0].split("=")[0].split(" ")[0],
        )
    return out


def embedded_model_names() -> list[str]:
    """The model names served without a directory: the default's aliases and tiny_model.CONFIGS."""
    from ..engines.tiny_model import CONFIGS

    return sorted({n for n in DEFAULT_MODEL_NAMES if n} | set(CONFIGS))


def resolve_model(name: str, settings: ServerSettings) -> Path:
    """A sub-job's model directory: an embedded tiny model (built once, cached) or a local dir."""
    from ..engines.tiny_model import CONFIGS, build_tiny_model, cache_dir_name

    name = name.strip()
    seed = settings.tiny_model_seed
    if name in DEFAULT_MODEL_NAMES:
        if settings.model:
            return Path(settings.model).expanduser().resolve()
        return build_tiny_model(default_cache_dir() / cache_dir_name(seed=seed), seed=seed)
    if name in CONFIGS:  # another embedded configuration (tiny_model.CONFIGS), e.g. "tiny-4l"
        out = default_cache_dir() / cache_dir_name(name, seed)
        return build_tiny_model(out, seed=seed, config=name)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ProtocolError(
            "invalid_argument",
            f"model_name {name!r} is neither a model this server knows "
            f"({embedded_model_names()}) nor a local Hugging Face directory with a config.json",
            field="model_name",
            expected="a local HF model directory, or empty for the embedded tiny model",
        )
    return path.resolve()


def model_vocab_size(model_dir: Path) -> int:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
        return int(cfg.get("vocab_size") or 0)
    except (OSError, ValueError):
        return 0

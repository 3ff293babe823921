"""The engines' sub-job configs, config keys, models and worker environment (no torch here).

Everything a server decides before an engine's worker process starts, shared by the on-prem
server and the gateway: it stays free of torch, DeepSpeed and vLLM, so a server process only
spawns workers with the right argv and environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..rules import jobs as pj
from ..rules import lora_config
from ..rules.errors import ProtocolError
from ..rules.sub_job_config import int_at, walk_sub_job_configs
from .deepspeed import train_options as opts

ROLES = ("training", "sampling", "log_prob")
DTYPES = ("float32", "bfloat16", "float16")
# Names that mean "the embedded default model" (an empty model_name means it too).
DEFAULT_MODEL_NAMES = frozenset({"", "tiny", "arctic-tiny", "tiny-qwen2", "default"})
# LoRA jobs need peft in the workers' environment (the `onprem` extra); without it the
# capabilities say so and `lora` is refused by name instead of failing the job at start
LORA = (
    lora_config.SUPPORT
    if importlib.util.find_spec("peft") is not None
    else lora_config.LoraSupport(training=False, sampling=False, why="peft is not installed")
)
# the standard config keys, with the on-prem extensions (train_options.py)
TRAINING_KEYS = pj.TRAINING_KEYS | {
    "attn_implementation",
    "num_threads",
    "lr_scheduler",
    "activation_checkpointing",
    "full_determinism",
    "checkpoint_path",
    "lora",  # PROTOCOL.md §3.6 (rules/lora_config.py)
}
# threads; a log-prob sub-job also: its engine ("hf" = a torch forward, "deepspeed" = a
# forward-only DeepSpeed engine configured by `deepspeed`, "vllm"), attention, determinism
INFERENCE_KEYS = pj.INFERENCE_KEYS | {"num_threads"}
LOG_PROB_KEYS = INFERENCE_KEYS | {"engine", "deepspeed", "attn_implementation", "full_determinism"}
LOG_PROB_ENGINES = ("hf", "deepspeed", "vllm")


def default_cache_dir() -> Path:
    env = os.environ.get("ARCTIC_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "arctic"


def servers_dir() -> Path:
    """The directory holding the `arctic_servers` package (put on a worker's PYTHONPATH)."""
    return Path(__file__).resolve().parents[2]


def worker_env(threads: int = 0, extra_paths: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a worker process, on-prem or gateway: this interpreter's with the
    servers package (and `extra_paths`) on PYTHONPATH, one thread count for every threading
    library when `threads` is set, the model hub offline, and nothing of the test runner's
    warning filters or of the server's crash points (`ARCTIC_CRASH_AT`)."""
    env = dict(os.environ)
    if threads:
        env.update(thread_env(threads))
    paths = [str(servers_dir()), *extra_paths]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.pop("PYTHONWARNINGS", None)
    env.pop("ARCTIC_CRASH_AT", None)
    if env.get("ARCTIC_TRACING"):  # the server traces (--tracing): so do its workers
        env["OTEL_SERVICE_NAME"] = env.get("OTEL_SERVICE_NAME", "arctic") + "-worker"
    return env


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


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


class ModelSettings(Protocol):
    """What `resolve_model` needs: the default model directory, the tiny model's seed."""

    @property
    def model(self) -> str: ...

    @property
    def tiny_model_seed(self) -> int: ...


@dataclass(frozen=True)
class ModelChoice:
    """A worker's `ModelSettings`, from its engine spec (the server resolved them already)."""

    model: str = ""
    tiny_model_seed: int = 0


def _bad(path: str, message: str, code: str = "invalid_argument", **details: Any) -> ProtocolError:
    return ProtocolError(code, f"field {path}: {message}", field=path, **details)


@dataclass
class SubJobSpec:
    """A checked sub-job config."""

    role: str
    model_name: str
    dtype: str
    seed: int
    config: dict[str, Any]
    n_gpus: int = 1


def sub_job_specs(body: Mapping[str, Any], *, cuda: bool) -> list[SubJobSpec]:
    """Check `sub_job_configs` of a CreateJob body: the rules every engine shares
    (`walk_sub_job_configs`: every unknown key listed in one error), then these engines' own."""
    out: list[SubJobSpec] = []
    keys = config_keys()
    for c in walk_sub_job_configs(
        body, known_keys=keys, dtypes=DTYPES, default_dtype="float32", lora=LORA
    ):
        role, conf, cpath = c.role, c.config, c.config_path
        # capacity slots; a training sub-job also runs n_gpus ranks (processes, dp_training.py)
        int_at(conf, "num_threads", cpath)
        if role == "training":
            _check_training(conf, cpath)
        else:
            _check_inference(role, conf, cpath)
        if conf.get("attn_implementation") is not None:
            opts.check_attn(conf["attn_implementation"], f"{cpath}.attn_implementation")
        opts.check_bool(conf, "full_determinism", cpath)
        seed = c.source.get("seed") or 0
        model = str(c.source.get("model_name") or "")
        out.append(SubJobSpec(role, model, c.dtype, int(seed), conf, c.n_gpus))
    return out


def _check_training(conf: dict[str, Any], cpath: str) -> None:
    ds = conf.get("deepspeed")
    if conf.get("lr_scheduler") is not None:
        if isinstance(ds, Mapping) and ds.get("scheduler") is not None:
            raise _bad(
                f"{cpath}.lr_scheduler",
                "and deepspeed.scheduler both set a learning-rate schedule",
                expected="one of them",
            )
        conf["lr_scheduler"] = opts.check_scheduler(conf["lr_scheduler"], f"{cpath}.lr_scheduler")
    opts.check_bool(conf, "activation_checkpointing", cpath)
    if conf.get("checkpoint_path") is not None:
        cp = opts.check_checkpoint_path(conf["checkpoint_path"], f"{cpath}.checkpoint_path")
        if Path(cp).exists() and not Path(cp).is_dir():
            raise _bad(f"{cpath}.checkpoint_path", f"{cp!r} is not a directory")


def _check_inference(role: str, conf: dict[str, Any], cpath: str) -> None:
    engine = conf.get("engine")
    allowed = LOG_PROB_ENGINES if role == "log_prob" else ("vllm",)
    if engine is not None and engine not in allowed:
        raise _bad(f"{cpath}.engine", f"{engine!r} is not one of {list(allowed)}", expected=allowed)
    ds = conf.get("deepspeed")
    if ds is not None and (engine != "deepspeed" or not isinstance(ds, Mapping)):
        raise _bad(
            f"{cpath}.deepspeed",
            "configures the forward-only DeepSpeed log-prob engine: an object, with "
            'engine "deepspeed"',
            expected='{"zero_optimization": {...}} with engine "deepspeed"',
        )
    if ds is not None:
        opts.check_forward_only_deepspeed(ds, f"{cpath}.deepspeed")


def engine_kind(role: str, config: dict[str, Any]) -> str:
    """The engine a sub-job runs: DeepSpeed (training), vLLM (sampling; log_prob on request),
    or a plain Hugging Face forward (log_prob by default)."""
    if role == "training":
        return "deepspeed"
    if role == "sampling":
        return "vllm"
    return str(config.get("engine") or "hf")


def canonical_model_name(name: str) -> str:
    """A CreateJob `model_name` with one name for the embedded default model's aliases ("")."""
    name = name.strip()
    return "" if name in DEFAULT_MODEL_NAMES else name


def embedded_model_names() -> list[str]:
    """The model names served without a directory: the default's aliases and tiny_model.CONFIGS."""
    from .tiny_model import CONFIGS

    return sorted({n for n in DEFAULT_MODEL_NAMES if n} | set(CONFIGS))


def config_keys() -> dict[str, frozenset[str]]:
    """The sub-job config keys this server accepts, per role (advertised in the capabilities)."""
    return {"training": TRAINING_KEYS, "sampling": INFERENCE_KEYS, "log_prob": LOG_PROB_KEYS}


def resolve_model(name: str, settings: ModelSettings) -> Path:
    """A sub-job's model directory: an embedded tiny model (built once, cached) or a local dir."""
    from .tiny_model import CONFIGS, build_tiny_model, cache_dir_name

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

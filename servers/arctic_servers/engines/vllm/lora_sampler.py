"""LoRA adapters on the vLLM sampler (PROTOCOL.md §3.6): each weight sync of a LoRA job is a new
adapter version; the base weights are never copied.

The engine is started with `enable_lora` (`engine_args`: `max_lora_rank` the smallest value vLLM
takes that holds the job's rank). `load` writes the synced tensors and their
`adapter_config.json` as a PEFT directory (under /dev/shm when it exists) and registers it with
`LLMEngine.add_lora` under a NEW `lora_int_id` — vLLM caches adapters by id, and a reused id
without `load_inplace` silently keeps the old weights (ENGINE_NOTES.md, LoRA) — then removes the
previous version and its directory. Registering first also validates the adapter: a bad one
raises here, while the engine keeps serving; named directly in a generate it would fail inside
the engine step and leave the engine hung.

`request(adapter)` is the `LoRARequest` a generate, a stream or a scoring pass uses: the current
version, or None for the base model (`adapter: "base"`, or before the first sync — the adapter
is B = 0 then, so the base model is what the trainer holds too).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...rules.lora_config import BASE_ADAPTER, vllm_max_rank
from ..errors import WorkerError


def engine_args(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`vllm.LLM` arguments of a LoRA job's sampler (none for another sampler)."""
    lora = spec.get("lora")
    if not lora:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": vllm_max_rank(int(lora["rank"])),
        "max_loras": 1,  # adapters in one batch: the job's current version
        "max_cpu_loras": 2,  # the current version and the one being replaced
    }


def adapters_of(llm: Any, spec: Mapping[str, Any]) -> LoraAdapters | None:
    """The adapter versions of a LoRA job's sampler (None for another sampler)."""
    lora = spec.get("lora")
    return LoraAdapters(llm, lora, str(spec.get("sub_job_id") or "")) if lora else None


def close(adapters: LoraAdapters | None) -> None:
    if adapters is not None:
        adapters.close()


def load(
    llm: Any,
    adapters: LoraAdapters | None,
    adapter_config: Mapping[str, Any] | None,
    path: str | None,
    blob: bytes | None,
) -> dict[str, Any]:
    """`load_weights` of a LoRA job's sync: a new adapter version, then a prefix-cache reset."""
    t = time.perf_counter()
    if adapter_config is None or adapters is None:
        raise WorkerError(
            "invalid_argument",
            "a LoRA job's adapter loads into its own samplers only, and they take nothing else "
            "(PROTOCOL.md §3.6)",
        )
    res = adapters.load(adapter_config, path, blob)
    return {
        "num_tensors": res["n"],
        "seconds": time.perf_counter() - t,
        "reset": bool(llm.reset_prefix_cache()),
        "adapter_version": res["adapter_version"],
    }


EMBEDDING_ENV = "ARCTIC_VLLM_LORA_EMBEDDINGS"  # set: vLLM's engine process declares them too


def serve_embedding_adapters() -> None:
    """Declare `embed_tokens` / `lm_head` as LoRA embedding modules of the vLLM model classes
    that lack them (Qwen2 in vLLM 0.32; Llama and Qwen3 declare them themselves). Called in the
    process that builds the model: the sampler's (in-process engine), and vLLM's engine process
    through the worker extension when `EMBEDDING_ENV` is set."""
    from vllm.model_executor.models import qwen2

    for cls in (qwen2.Qwen2ForCausalLM,):
        mods = dict(getattr(cls, "embedding_modules", None) or {})
        if "lm_head" not in mods:
            cls.embedding_modules = {
                "embed_tokens": "input_embeddings",
                "lm_head": "output_embeddings",
                **mods,
            }


PREFIX = "arctic-lora-"  # one directory of adapter versions per sampler
OWNER = ".owner"  # in it: a file the sampler holds an exclusive flock on while it lives


def sweep_stale(root: Path) -> list[Path]:
    """Remove the adapter directories under `root` whose sampler is gone: a sampler killed with
    SIGKILL never runs `close`, and under /dev/shm what it left holds RAM. A directory is stale
    when its owner file's flock can be taken (the kernel drops a dead process's locks, whatever
    its PID namespace); one without an owner file, or locked, stays. The removed paths."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for d in root.glob(f"{PREFIX}*"):
            try:
                fd = os.open(d / OWNER, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its sampler holds it
            finally:
                os.close(fd)
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def own(root: Path) -> int:
    """Mark `root` as this process's: the open, flocked owner file (kept for its lifetime)."""
    fd = os.open(root / OWNER, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


class LoraAdapters:
    """The adapter versions of one sampler (or of one tenant of a LoRA pool's sampler:
    `next_id` then hands out `lora_int_id`s unique in the pool, and `keep_old` keeps a replaced
    version registered until `retire` finds none of its requests left in the engine)."""

    def __init__(
        self,
        llm: Any,
        lora: Mapping[str, Any],
        sub_job_id: str = "",
        *,
        next_id: Callable[[], int] | None = None,
        keep_old: bool = False,
    ) -> None:
        self.llm = llm
        self.lora = dict(lora)
        self.name = f"arctic-{sub_job_id or 'sampler'}".replace(":", "-")
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        sweep_stale(shm or Path(tempfile.gettempdir()))  # what killed samplers left
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=shm))
        self._owner = own(self.root)
        self.version = 0  # adapter versions loaded (0: none, the base model)
        self.current: Any = None  # the LoRARequest of the current version
        self.dir: Path | None = None
        self.next_id = next_id
        self.keep_old = keep_old
        self.retired: list[tuple[Any, Path]] = []  # replaced versions still registered

    def request(self, adapter: str = "") -> Any:
        return None if adapter == BASE_ADAPTER else self.current

    def load(
        self, adapter_config: Mapping[str, Any], path: str | None, blob: bytes | None
    ) -> dict[str, Any]:
        from vllm.lora.request import LoRARequest

        t = time.perf_counter()
        version = self.version + 1
        d = self.root / f"v{version}"
        d.mkdir(parents=True, exist_ok=True)
        target = d / "adapter_model.safetensors"
        if path:
            shutil.copyfile(path, target)
        elif blob is not None:
            target.write_bytes(bytes(blob))
        else:
            raise WorkerError("invalid_argument", "load_weights: a LoRA sync needs path or blob")
        (d / "adapter_config.json").write_text(json.dumps(dict(adapter_config)))
        lora_id = self.next_id() if self.next_id is not None else version
        req = LoRARequest(f"{self.name}-v{version}", lora_id, str(d))
        engine = self.llm.llm_engine
        try:
            ok = engine.add_lora(req)
        except Exception as exc:  # vLLM's message names the module / the rank
            shutil.rmtree(d, ignore_errors=True)
            raise WorkerError(
                "invalid_argument", f"the sampler refused adapter version {version}: {exc}"
            ) from None
        if not ok:
            shutil.rmtree(d, ignore_errors=True)
            raise WorkerError("internal", f"vLLM did not register adapter version {version}")
        old, old_dir = self.current, self.dir
        self.current, self.dir, self.version = req, d, version
        if old is not None and old_dir is not None and self.keep_old:
            self.retired.append((old, old_dir))  # its requests may still run: `retire`
        else:
            if old is not None:
                with contextlib.suppress(Exception):
                    engine.remove_lora(old.lora_int_id)
            if old_dir is not None:
                shutil.rmtree(old_dir, ignore_errors=True)
        return {
            "n": len(_safetensors_names(target)),
            "adapter_version": version,
            "num_bytes": target.stat().st_size,
            "seconds": time.perf_counter() - t,
            "loras": sorted(int(i) for i in engine.list_loras()),
        }

    def retire(self, in_use: set[int]) -> int:
        """Unregister the replaced versions no request in the engine uses; how many."""
        gone = [(r, d) for r, d in self.retired if int(r.lora_int_id) not in in_use]
        for r, d in gone:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.remove_lora(r.lora_int_id)
            shutil.rmtree(d, ignore_errors=True)
        self.retired = [x for x in self.retired if x not in gone]
        return len(gone)

    def close(self) -> None:
        """Unregister every version and remove its files."""
        for r in [*(x for x, _ in self.retired), self.current]:
            if r is not None:
                with contextlib.suppress(Exception):
                    self.llm.llm_engine.remove_lora(r.lora_int_id)
        self.retired = []
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._owner)


def _safetensors_names(path: Path) -> list[str]:
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return [k for k in header if k != "__metadata__"]

"""vLLM worker extension for in-place weight updates on CPU (and any other device).

Pass ``worker_extension_cls="arctic_servers.engines.vllm_worker_ext.ArcticWorkerExtension"`` to
``vllm.LLM(...)`` (or ``--worker-extension-cls`` to ``vllm serve``); vLLM mixes this class into its
worker (``vllm.v1.worker.cpu_worker.CPUWorker`` on CPU) in the worker process, so the module must be
importable there (``servers/`` on ``PYTHONPATH`` or the package installed). Call the methods with
``llm.collective_rpc("arctic_...", args=(...))``; the call runs on every worker and returns a
list of per-worker results.

Why not ``self.model_runner.model.load_weights(...)`` alone: on CPU, vLLM's
``UnquantizedLinearMethod.process_weights_after_loading`` hands every linear layer's weight to a
oneDNN (or sgl/zentorch) kernel that keeps its own packed copy and *replaces* ``layer.weight`` with
an empty tensor (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``). A second
``load_weights`` then either fails on the empty parameter or writes into tensors the kernels no
longer read. vLLM's in-place reload (``model_runner.reload_weights`` →
``model_executor.model_loader.reload.inplace.reload_weights``) wraps ``load_weights`` in
``initialize_layerwise_reload`` / ``finalize_layerwise_reload``, which restores the
checkpoint-format parameters and re-runs ``process_weights_after_loading`` per layer; that is what
these methods use. Send *all* tensors of the model on every sync (HF names, checkpoint format, fp32
or the engine's dtype).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class ArcticWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (has ``model_runner``, ``device``)."""

    # -- weight loading --------------------------------------------------------------------------

    def arctic_reload_weights_from_file(self, path: str) -> dict[str, Any]:
        """Reload every weight from one safetensors file (e.g. under /dev/shm); HF tensor names.
        The tensors are read as the reload takes them (never the whole file in memory)."""
        from arctic_servers.engines.safetensors_stream import read_torch

        t0 = time.perf_counter()
        n = [0]

        def counted() -> Any:
            for item in read_torch(path):
                n[0] += 1
                yield item

        self._arctic_reload(counted())
        return {"n": n[0], "load_s": time.perf_counter() - t0}

    def arctic_reload_weights_from_bytes(self, blob: bytes) -> dict[str, Any]:
        """Reload weights sent inline through ``collective_rpc`` as one safetensors blob.

        (``collective_rpc`` args travel as msgpack without type hints: a ``torch.Tensor`` inside a
        list arrives as a plain ``[dtype, shape, data]`` list, not a tensor. ``bytes`` arrive
        intact, so the sender packs the tensors with ``safetensors.torch.save``.)
        """
        from safetensors.torch import load

        t0 = time.perf_counter()
        tensors = load(bytes(blob))
        t1 = time.perf_counter()
        self._arctic_reload(list(tensors.items()))
        return {
            "n": len(tensors),
            "bytes": len(blob),
            "decode_s": t1 - t0,
            "load_s": time.perf_counter() - t1,
        }

    def arctic_load_weights_raw(self, path: str) -> dict[str, Any]:
        """Plain ``model.load_weights`` (no reload bracket): only to demonstrate the CPU pitfall."""
        from safetensors.torch import load_file

        tensors = load_file(path, device="cpu")
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=list(tensors.items()))
        return {"n": len(tensors), "loaded": len(loaded or ())}

    def _arctic_reload(self, weights: Iterable[tuple[str, Any]]) -> None:
        runner = self.model_runner  # type: ignore[attr-defined]
        if hasattr(runner, "reload_weights"):
            # Worker.reload_weights sets the current vllm config; go through the worker when it can.
            worker_reload = getattr(self, "reload_weights", None)
            if callable(worker_reload):
                worker_reload(weights_iterator=weights, is_checkpoint_format=True)
            else:
                runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            return
        # Older vLLM without reload_weights: best effort (correct where no kernel repacks weights).
        runner.model.load_weights(weights=weights)

    # -- introspection ---------------------------------------------------------------------------

    def arctic_param_shapes(self) -> list[tuple[str, list[int], str]]:
        """(name, shape, dtype) of the engine-side parameters (vLLM names, e.g. ``qkv_proj``)."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        return [(n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()]

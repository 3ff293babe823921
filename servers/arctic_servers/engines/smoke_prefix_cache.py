"""Smoke test: with prefix caching on, a weight sync must be followed by ``reset_prefix_cache()``.

Run in the on-prem venv from the repository root::

    PYTHONPATH=servers python -m arctic_servers.engines.smoke_prefix_cache

vLLM's prefix cache is keyed by token ids only. After weights are reloaded in place, a repeated
prompt reuses KV blocks computed with the *old* weights, so the sampler's log-probs no longer match
the trainer's. The script shows the mismatch without a reset and the agreement after
``llm.reset_prefix_cache()``. (CPU KV blocks are 128 tokens here: prompts shorter than one block
never hit the cache, which hides the problem in small tests.)
"""

from __future__ import annotations

import json
import sys
from typing import Any

from arctic_servers.engines import smoke_vllm as svl


def main() -> int:
    svl.set_cpu_env()
    from arctic_servers.engines.tiny_model import build_tiny_model

    model_dir = build_tiny_model(svl.DEFAULT_MODEL_DIR)
    import torch
    from safetensors.torch import load_file, save
    from transformers import AutoModelForCausalLM  # type: ignore[import-not-found, unused-ignore]
    from vllm import LLM, SamplingParams  # type: ignore[import-not-found, unused-ignore]
    from vllm.inputs import TokensPrompt  # type: ignore[import-not-found, unused-ignore]

    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        worker_extension_cls=svl.EXT_CLS,
        enable_prefix_caching=True,
    )
    prompt = TokensPrompt(prompt_token_ids=[100 + (i * 7) % 400 for i in range(400)])
    sp = SamplingParams(n=1, max_tokens=8, seed=3, logprobs=0, temperature=1.0)
    llm.generate([prompt], sp, use_tqdm=False)
    res: dict[str, Any] = {
        "cached_tokens_on_repeat": llm.generate([prompt], sp, use_tqdm=False)[0].num_cached_tokens
    }

    sd = load_file(str(model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    sd1 = {
        k: v + 0.05 * v.std() * torch.randn(v.shape, generator=g) if v.numel() > 1 else v
        for k, v in sd.items()
    }
    llm.collective_rpc("arctic_reload_weights_from_bytes", args=(save(sd1),))
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    hf.load_state_dict(sd1)
    for label in ("without_reset", "after_reset_prefix_cache"):
        if label == "after_reset_prefix_cache":
            res["reset_prefix_cache_returned"] = llm.reset_prefix_cache()
        out = llm.generate([prompt], sp, use_tqdm=False)
        seqs, vlp = svl.vllm_sampled(out)
        res[label] = {
            "num_cached_tokens": out[0].num_cached_tokens,
            "logprob_max_abs_diff_vs_trainer": svl.max_abs_diff(
                svl.hf_token_logprobs(hf, seqs), vlp
            ),
        }
    ok = res["after_reset_prefix_cache"]["logprob_max_abs_diff_vs_trainer"] <= 1e-3
    res["stale_kv_reproduced"] = res["without_reset"]["logprob_max_abs_diff_vs_trainer"] > 1e-3
    res["ok"] = ok
    print("SMOKE_RESULT " + json.dumps(res, indent=1, default=str), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

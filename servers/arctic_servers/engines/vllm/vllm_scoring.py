"""Scoring on a vLLM sub-job: `forward` and `log-probs` targeted at a sampler (PROTOCOL.md §3.4).

The prompt log-probs come from vLLM (`prompt_logprobs=0`, one request of one token per row),
added to the engine's continuous batch like every other sampling command (`engine_batch.py`:
each batched command, listed in `SamplingEngine.batched_commands`, returns the requests and the
`finish` that turns their outputs into the result); a forward's loss is then computed from them
by the trainer's own loss code (`engines/losses/`), so a vLLM sub-job answers the same loss and
metrics as a trainer would for the same log-probs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import WorkerError
from .engine_batch import Finish


def _mask_of(kw: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(kw["input_ids"]).astype(np.int64)
    mask = kw.get("attention_mask")
    m = np.ones(ids.shape, np.int64) if mask is None else (np.asarray(mask) != 0).astype(np.int64)
    return ids, m


class VllmScoring:
    """The scoring half of `SamplingEngine`: the requests of `forward` / `log_probs`."""

    def _score_requests(
        self, ids: np.ndarray, mask: np.ndarray
    ) -> tuple[list[Any], list[Any], Callable[[Sequence[Any]], np.ndarray]]:
        """Prompt log-prob requests for the rows of `ids` (the columns `mask` keeps), and what
        makes the shifted log-probs array of their outputs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        b, s = ids.shape
        rows, where = [], []
        for r in range(b):
            cols = np.nonzero(mask[r])[0]
            if len(cols) < 2:
                continue
            rows.append(TokensPrompt(prompt_token_ids=[int(t) for t in ids[r, cols]]))
            where.append((r, cols))

        def fill(outs: Sequence[Any]) -> np.ndarray:
            out = np.zeros((b, s), np.float32)
            for ro, (r, cols) in zip(outs, where, strict=True):
                plp = ro.prompt_logprobs
                toks = ro.prompt_token_ids
                for j in range(1, len(cols)):
                    if cols[j] != cols[j - 1] + 1:
                        continue  # a hole in the mask: not a prediction of adjacent columns
                    out[r, cols[j - 1]] = plp[j][toks[j]].logprob
            return out

        params = [SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0) for _ in rows]
        return rows, params, fill

    def _batch_forward(self, body: Mapping[str, Any]) -> tuple[list[Any], list[Any], Finish]:
        """Forward on a vLLM sub-job: its prompt log-probs, and the loss of `processing` (default
        cross_entropy) computed from them by the trainer's loss code. What vLLM's scoring
        cannot honour (entropy, a temperature, labels or position ids) is refused."""
        from ...rules.errors import ProtocolError
        from ..checks import vllm_forward

        try:
            vllm_forward(body)  # the server refused these before sending; a direct caller too
        except ProtocolError as exc:
            raise WorkerError(exc.code, exc.message, **exc.details) from None
        proc = {k: v for k, v in (body.get("processing") or {}).items() if k != "post"}
        ids, m = _mask_of(body["kwargs"])
        context = dict(body.get("context") or {})
        rows, params, fill = self._score_requests(ids, m)

        def finish(outs: list[Any]) -> dict[str, Any]:
            import torch

            from ..losses import torch_losses as losses

            lp = fill(outs)
            ctx = {k: torch.as_tensor(np.asarray(v)) for k, v in context.items() if v is not None}
            res = losses.compute_loss(
                torch.from_numpy(lp),
                input_ids=torch.as_tensor(ids),
                attention_mask=torch.from_numpy(m),
                context=ctx,
                processing=proc,
            )
            return {
                "loss": float(res.metrics["loss"]),
                "metrics": dict(res.metrics),
                "outputs": {"logprobs_shifted": lp},
            }

        return rows, params, finish

    def _batch_log_probs(self, body: Mapping[str, Any]) -> tuple[list[Any], list[Any], Finish]:
        if body.get("entropy"):
            raise WorkerError(
                "unsupported_option", "a vLLM sub-job does not compute entropy", options=["entropy"]
            )
        ids, m = _mask_of(body)
        rows, params, fill = self._score_requests(ids, m)
        n, rows_in = int(((m[:, :-1] != 0) & (m[:, 1:] != 0)).sum()), int(m.shape[0])

        def finish(outs: list[Any]) -> dict[str, Any]:
            return {
                "loss": 0.0,
                "metrics": {"loss": 0.0, "num_tokens": n, "num_sequences": rows_in},
                "outputs": {"logprobs_shifted": fill(outs)},
            }

        return rows, params, finish

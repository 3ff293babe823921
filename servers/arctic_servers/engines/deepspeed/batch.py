"""A forward / forward-backward / log-probs request body as tensors (`Batch`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import WorkerError


class Batch:
    """A forward / forward-backward / log-probs body as tensors (training.proto alignment)."""

    def __init__(self, body: Mapping[str, Any], dev: torch.device) -> None:
        kw: Mapping[str, Any] = body.get("kwargs") or body  # LogProbsRequest is flat
        ids = np.asarray(kw["input_ids"])
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise WorkerError(
                "shape_mismatch",
                f"field input_ids: shape {list(ids.shape)} is not [B >= 1, S >= 1]",
                field="input_ids",
            )
        self.shape = ids.shape
        self.ids = torch.as_tensor(ids.astype(np.int64), device=dev)
        mask = kw.get("attention_mask")
        self.mask_np = (
            np.ones(ids.shape, np.int64)
            if mask is None
            else (np.asarray(mask) != 0).astype(np.int64)
        )
        self.mask = torch.as_tensor(self.mask_np, device=dev)
        pos = kw.get("position_ids")
        if pos is None:
            pos_np = np.clip(np.cumsum(self.mask_np, axis=1) - 1, 0, None)
        else:
            pos_np = np.asarray(pos).astype(np.int64)
        self.pos = torch.as_tensor(pos_np, device=dev)
        labels = kw.get("labels")
        self.labels = (
            None
            if labels is None
            else torch.as_tensor(np.asarray(labels).astype(np.int64), device=dev)
        )
        self.context: dict[str, torch.Tensor | None] = {}
        for k, v in (body.get("context") or {}).items():
            if v is None:
                continue
            arr = np.asarray(v)
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float64 if arr.dtype == np.float64 else np.float32)
            elif arr.dtype.kind in "biu":
                arr = arr.astype(np.int64 if k == "input_ids" else np.float32)
            self.context[k] = torch.as_tensor(arr, device=dev)
        self.processing: dict[str, Any] = dict(body.get("processing") or {})
        self.post = frozenset(str(p) for p in self.processing.get("post") or [])
        # prediction i is valid when columns i and i + 1 are real
        pair = np.zeros(ids.shape, bool)
        pair[:, :-1] = (self.mask_np[:, :-1] != 0) & (self.mask_np[:, 1:] != 0)
        self.pair = pair

    def rows(self, sl: slice) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[sl],
            "attention_mask": self.mask[sl],
            "position_ids": self.pos[sl],
        }

    def out(self, t: torch.Tensor) -> np.ndarray:
        """A shifted [B, S] result as F32, 0 outside real prediction positions."""
        a = t.detach().float().cpu().numpy().astype(np.float32)
        a[~self.pair] = 0.0
        return a

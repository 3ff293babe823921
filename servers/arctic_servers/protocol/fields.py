"""Readers of body fields whose meaning the servers share beyond their proto type.

Their bounds are the spec's (`(arctic.v1.field)` `ge`/`le`, checked on arrival by the protocol
layer from `arctic_sdk.spec.tables.request_rules`), so these only read a checked body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def learning_rate(body: Mapping[str, Any]) -> float | None:
    """`StepRequest.learning_rate`: None when absent (the schedule's), else the number (>= 0;
    0 steps without changing the weights: an lr = 0 control run)."""
    v = body.get("learning_rate")
    return None if v is None else float(v)


def min_p(sampling_params: Mapping[str, Any]) -> float | None:
    """`SamplingParams.min_p`: None when absent, else the number (in [0, 1]; 0 = off)."""
    v = sampling_params.get("min_p")
    return None if v is None else float(v)

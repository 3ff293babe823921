"""Checks of body fields whose meaning the servers share beyond their proto type."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from .sub_jobs import field_error


def learning_rate(body: Mapping[str, Any]) -> float | None:
    """`StepRequest.learning_rate`: absent (the schedule's), or a finite number >= 0; 0 steps
    without changing the weights (an lr = 0 control run)."""
    v = body.get("learning_rate")
    if v is None:
        return None
    x = float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else math.nan
    if not math.isfinite(x) or x < 0:
        raise field_error(
            "learning_rate", f"{v!r} is not a finite number >= 0", expected="a finite number >= 0"
        )
    return x


def min_p(sampling_params: Mapping[str, Any]) -> float | None:
    """`SamplingParams.min_p`: absent, or a finite number in [0, 1] (0 = off)."""
    v = sampling_params.get("min_p")
    if v is None:
        return None
    x = float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else math.nan
    if not (math.isfinite(x) and 0.0 <= x <= 1.0):
        raise field_error(
            "sampling_params.min_p", f"{v!r} is not a number in [0, 1]", expected="[0, 1]"
        )
    return x

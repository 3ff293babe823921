"""Typed bodies and results of every op: one `TypedDict` per message of the spec, public.

    from arctic_sdk.types import ForwardBackwardRequest, LossFn, SamplingParams

    params: SamplingParams = {"max_tokens": 64, "temperature": 0.7, "logprobs": 0}
    loss: LossFn = "grpo"

Keys are the proto field names; the client's op methods take the same fields as keyword
arguments (`client.generate(prompts=[...], sampling_params=params)`). `LossFn`, `LossAggMode` and
`KlType` are `Literal`s of the values the spec allows. Generated from `proto/arctic/v1`
(`arctic_sdk._generated.types`); this module only makes them public.
"""

from ._generated.types import *  # noqa: F403
from ._generated.types import __all__ as __all__

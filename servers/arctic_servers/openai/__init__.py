"""The OpenAI-compatible surface of a sampler: `/v1/models`, `/v1/chat/completions`,
`/v1/completions`, with vLLM's RL extensions (token ids, log-probs) and streaming.

    from arctic_servers.openai import add_openai_routes
    add_openai_routes(app, resolver, tokens={"my-pat"})

A server supplies a `Resolver` (which models a token may use, and their `Sampler`s):
`arctic_servers.openai.onprem.OnpremResolver` over the on-prem server's sampling sub-jobs,
`arctic_servers.openai.gateway.GatewayResolver` over the Cortex gateway's (Bearer auth
mandatory), `arctic_servers.openai.fake.FakeResolver` over the fake gateway's numerics (tests).
"""

from .routes import OpenAIRoutes, add_openai_routes, start_openai_server
from .sampler import (
    ModelCard,
    NoChatTemplateError,
    OpenAIError,
    Resolver,
    Sample,
    Sampler,
    StreamEvent,
)

__all__ = [
    "ModelCard",
    "NoChatTemplateError",
    "OpenAIError",
    "OpenAIRoutes",
    "Resolver",
    "Sample",
    "Sampler",
    "StreamEvent",
    "add_openai_routes",
    "start_openai_server",
]

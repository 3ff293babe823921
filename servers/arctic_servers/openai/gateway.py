"""The Cortex gateway's sampling sub-jobs behind the OpenAI-compatible routes.

Mounted by the gateway (`gateway/server.py`) on its HTTP listener, beside the protocol's routes:
`http://HOST:PORT/v1/models`, `/v1/chat/completions`, `/v1/completions` (and vLLM's `/tokenize`,
`/detokenize`). Bearer auth is mandatory: the token must be one of the gateway's (kept as sha256
digests); a gateway started without tokens answers 401 on these routes.

Model ids (`job_models.py`): a running job with a sampling sub-job is served as the model
`{job_id}`; its sub-job id and its `model_name` (the caller's newest running job of that name)
resolve to it too. A job is visible only to the token that created it (another token's job answers
404 `model_not_found`, as if it did not exist). Generation is an arctic.v1 `generate` call of the
gateway's protocol core in this process (`protocol/inproc.py`) as that token: the core's auth, field
rules and limits, the same job visibility and running-state checks, the profile's semantic checks
(`check_request`), the request record, the weight-sync gate and `weight_version`, and the same keyed
call on the sampling sub-job's worker (fake or vLLM).

Tokenizer: the model directory's (`transformers.AutoTokenizer`; the on-prem engines report it as
`model_dir`), or for fake workers the fake engine's byte-level tokenizer with the tiny model's
Qwen-style template (their samples' text is that tokenizer's decoding).

Streaming (admitted by the core first, `CoreCalls.checked`: the same checks, no request
record): on a vLLM sampler, token by token through the servicer's `generate_stream` (the worker
host's `stream` op: the new tokens of every engine step; a client that disconnects has its
request aborted in the engine). Fake workers do not stream: there each step of a stream asks
for up to `chunk_tokens` more tokens (`tokenized.continuation_stream`), each a generate of its
own, so a weight sync between two of them moves the rest of the sample to the new weights; every
chunk's `weight_version` says which weights produced its tokens (a vLLM sampler's stream is one
engine request: one version from its first token to its last).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..protocol.config import token_digest
from ..protocol.core import ProtocolCore
from ..protocol.inproc import CoreCalls
from .job_models import JobResolver
from .sampler import OpenAIError
from .tokenized import FakeTokenizer, ServicerSampler, load_tokenizer

__all__ = ["GatewayResolver", "GatewaySampler", "install"]

NO_TOKENS = (
    "the OpenAI routes of the gateway need Bearer auth, and this gateway accepts no tokens "
    "(start it with --tokens-file)"
)


class GatewaySampler(ServicerSampler):
    def __init__(
        self,
        calls: CoreCalls,
        job_id: str,
        sub: Any,
        token: str,
        tokenizer: Any,
        *,
        max_model_len: int = 0,
        chunk_tokens: int = 4,
    ) -> None:
        super().__init__(
            calls, job_id, sub, token, tokenizer, max_model_len, sub_job_id=sub.sub_job_id
        )
        self.chunk_tokens = chunk_tokens

    @property
    def token_streaming(self) -> bool:
        """The vLLM sampler streams token by token; fake workers answer whole replies."""
        return _info(self.sub).get("engine") == "vllm"


def _info(sub: Any) -> dict[str, Any]:
    return dict((sub.worker or {}).get("info") or {})


class GatewayResolver(JobResolver):
    """Models = the caller's running jobs with a sampling sub-job whose worker is up
    (`job_models.py`); Bearer auth mandatory."""

    def __init__(self, calls: CoreCalls, *, chunk_tokens: int = 4) -> None:
        super().__init__(calls)
        self.chunk_tokens = chunk_tokens

    def _owner(self, token: str | None) -> str:
        if not token or not self.servicer.auth:
            raise OpenAIError(401, NO_TOKENS, type="authentication_error", code="invalid_api_key")
        return token_digest(token)

    def _serves(self, sub: Any) -> bool:
        return bool(_info(sub))

    def _max_len(self, sub: Any) -> int:
        return int(_info(sub).get("max_model_len") or sub.max_seq_len or 0)

    async def sampler(self, model: str, token: str | None) -> GatewaySampler:
        job, sub = self._match(model, token)
        info = _info(sub)
        if info.get("model_dir"):
            tok = await asyncio.to_thread(load_tokenizer, Path(str(info["model_dir"])))
        elif info.get("engine") == "fake":
            tok = FakeTokenizer()
        else:
            raise OpenAIError(
                503,
                f"the sampling sub-job {sub.sub_job_id} of job {job.job_id} reports no model "
                f"directory (engine {info.get('engine')!r}), so its tokenizer is unknown",
                type="server_error",
                code="no_tokenizer",
            )
        return GatewaySampler(
            self.calls,
            job.job_id,
            sub,
            str(token),
            tok,
            max_model_len=self._max_len(sub),
            chunk_tokens=self.chunk_tokens,
        )


def install(app: Any, core: ProtocolCore, tools: Any = None) -> None:
    """Mount the OpenAI-compatible routes of the gateway's sampling sub-jobs on `app`, served
    by its protocol core in this process (`tools`: the server's `tool_calls.ToolSettings`)."""
    from .routes import add_openai_routes

    calls = CoreCalls(core)
    add_openai_routes(app, GatewayResolver(calls), authenticate=calls.authenticate, tools=tools)

"""Tool calling on `/v1/chat/completions`, with vLLM's own parsers and request machinery.

The server options are vLLM's (`ToolSettings`: `--enable-auto-tool-choice`,
`--tool-call-parser NAME`, `--tool-strict-level`). Per request, `ToolCalls.for_request` builds
vLLM's `ChatCompletionRequest` of the tool fields (so `tools`, `tool_choice` and
`parallel_tool_calls` are validated by vLLM's own validators, with its messages), composes
vLLM's `Parser` (`ParserManager.get_parser`) and lets it adjust the request as vLLM's server does:
`tool_choice` "required" or a named function becomes vLLM's structured-output constraint (for
parsers with a structural-tag model, `hermes` among them, the tag of the tool-call format with
each tool's parameter schema), which the sampler decodes (`SamplingParams.structured_outputs`:
xgrammar on vLLM, the fake engine's writer on the fake). The reply is parsed with the same
`Parser` (`parse`, or `parse_delta` per streamed chunk) into `tool_calls` with ids and JSON
arguments; `finish_reason` is vLLM's: "tool_calls" when "auto" or "required" called a tool,
"stop" for a named function (OpenAI's rule); `parallel_tool_calls: false` keeps one call.

Two departures from vLLM's defaults, both so that a weak model (the embedded one, a random one)
returns a schema-valid call in a few dozen tokens: the default strict level is `parameter`
(vLLM's `auto` leaves a tool's arguments free unless the tool says `strict: true`), and JSON
whitespace inside tool-call grammars is bounded to one character a run (xgrammar's
`max_whitespace_cnt`; unbounded, a random model spends its tokens on whitespace).

Without vLLM importable (the base install's fake gateway), `tool_choice` "none" still renders
the tools into the prompt; any other value is refused naming `tool_choice`.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .sampler import OpenAIError

__all__ = ["STRICT_LEVELS", "ToolCalls", "ToolSettings", "ToolTurn", "add_tool_args", "raw_text"]

STRICT_LEVELS = ("auto", "function", "parameter")
MAX_WHITESPACE = 1  # xgrammar's max_whitespace_cnt in tool-call JSON
_PARSERS: dict[tuple[str, bool, str], Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ToolSettings:
    """vLLM's serving options for tool calls (a server's; `from_args` reads its flags)."""

    enable_auto_tool_choice: bool = True
    tool_call_parser: str = "hermes"  # "" = none: "auto" refused, as vLLM without the flags
    tool_strict_level: str = "parameter"

    def __post_init__(self) -> None:
        if self.tool_strict_level not in STRICT_LEVELS:
            raise ValueError(
                f"tool_strict_level {self.tool_strict_level!r} is not one of {STRICT_LEVELS}"
            )
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")

    @classmethod
    def from_args(cls, args: Any) -> ToolSettings:
        parser = str(getattr(args, "tool_call_parser", "hermes") or "")
        return cls(
            enable_auto_tool_choice=bool(getattr(args, "enable_auto_tool_choice", True))
            and parser not in ("", "none"),
            tool_call_parser="" if parser == "none" else parser,
            tool_strict_level=str(getattr(args, "tool_strict_level", "parameter")),
        )


def add_tool_args(ap: Any) -> None:
    """The flags of `ToolSettings` on a server's argument parser (vLLM's names)."""
    import argparse

    ap.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="parse tool calls from replies with tool_choice 'auto' (vLLM's flag; on by default "
        "here, off with --no-enable-auto-tool-choice)",
    )
    ap.add_argument(
        "--tool-call-parser",
        default="hermes",
        help="vLLM's tool parser for /v1/chat/completions (default hermes, the embedded model's "
        "format; 'none' = no parsing)",
    )
    ap.add_argument(
        "--tool-strict-level",
        choices=STRICT_LEVELS,
        default="parameter",
        help="vLLM's floor for tool-call grammars (default parameter: forced calls follow each "
        "tool's parameter schema; vLLM's own default is auto)",
    )


_LOADED: list[bool] = []


def load_vllm() -> bool:
    """Import vLLM's parser and request modules once (seconds: call it off the event loop,
    `asyncio.to_thread`); their import-time deprecation warnings are vLLM's and torch's, not the
    caller's. False when vLLM is not installed."""
    with _LOCK:
        if not _LOADED:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    import vllm.entrypoints.openai.chat_completion.protocol
                    import vllm.parser
                    import vllm.renderers.chat_utils  # noqa: F401

                    _LOADED.append(True)
                except ImportError:
                    _LOADED.append(False)
        return _LOADED[0]


def _bad(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param, code=code)


def _vllm_error(exc: Exception) -> OpenAIError:
    """A vLLM / pydantic validation error of the tool fields as a 400 naming the field."""
    param = str(getattr(exc, "parameter", "") or "")
    errors = getattr(exc, "errors", None)
    if not param and callable(errors):
        locs = [".".join(str(x) for x in e.get("loc", ())) for e in errors()]
        param = locs[0] if locs else ""
        msg = "; ".join(f"{loc}: {e.get('msg')}" for loc, e in zip(locs, errors(), strict=False))
    else:
        msg = str(exc)
    param = param or "tools"
    return OpenAIError(400, f"{param}: {msg}", param=param.split(".")[0], code="invalid_value")


def _bound_whitespace(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and not node.get("max_whitespace_cnt"):
            node["max_whitespace_cnt"] = MAX_WHITESPACE
        for v in node.values():
            _bound_whitespace(v)
    elif isinstance(node, list):
        for v in node:
            _bound_whitespace(v)


def _constraint(so: Any) -> dict[str, str] | None:
    """vLLM's StructuredOutputsParams as the protocol's `structured_outputs` (a structural tag,
    whitespace bounded; a JSON schema becomes a one-region tag so its whitespace is bounded too)."""
    if so is None:
        return None
    if so.structural_tag:
        tag = json.loads(so.structural_tag)
    elif so.json is not None:
        schema = json.loads(so.json) if isinstance(so.json, str) else so.json
        tag = {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": schema}}
    else:
        raise OpenAIError(500, f"unexpected tool-call constraint {so!r}", type="server_error")
    _bound_whitespace(tag)
    return {"structural_tag": json.dumps(tag, ensure_ascii=False)}


@dataclass
class ToolTurn:
    """One chat request's tool handling: vLLM's request and parser, and what it asked for."""

    request: Any  # vLLM's ChatCompletionRequest of the tool fields
    parser_cls: Any  # vLLM's composed Parser class, or None (no parser configured)
    tokenizer: Any
    auto: bool
    constraint: dict[str, str] | None  # the protocol's structured_outputs, forced choices
    parsers: dict[int, Any] = field(default_factory=dict)  # streaming: one per choice

    @property
    def choice(self) -> Any:
        return self.request.tool_choice

    @property
    def named(self) -> bool:
        return not isinstance(self.choice, str | type(None))

    @property
    def parses(self) -> bool:
        """Whether replies are parsed (a tool choice other than "none" with a parser or forced)."""
        return self.choice != "none" and (self.parser_cls is not None)

    def _parser(self) -> Any:
        return self.parser_cls(self.tokenizer, self.request.tools)

    def message(self, text: str, ids: Sequence[int], finish: str) -> tuple[dict[str, Any], str]:
        """The reply message of one sample and its finish reason, as vLLM's server builds them."""
        from vllm.renderers.chat_utils import make_tool_call_id

        if not self.parses:
            return {"role": "assistant", "content": text, "tool_calls": []}, finish
        _, content, calls = self._parser().parse(
            text, self.request, enable_auto_tools=self.auto, model_output_token_ids=list(ids)
        )
        tool_calls = [
            {
                "id": tc.id or make_tool_call_id(),
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments},
            }
            for tc in calls or []
        ]
        if self.request.parallel_tool_calls is False:
            tool_calls = tool_calls[:1]
        if self.named or self.choice == "required":
            content = content or ""
        auto_called = bool(tool_calls) and self.choice == "auto"
        required = self.choice == "required" and finish == "stop"
        reason = "tool_calls" if auto_called or required else finish
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, reason

    def delta(
        self, choice: int, text: str, ids: Sequence[int], prompt: Sequence[int], finished: bool
    ) -> dict[str, Any] | None:
        """One streamed chunk's `delta` (vLLM's `parse_delta`: content, `tool_calls` deltas with
        index, id, name and argument fragments); None when the parser holds the text back."""
        if not self.parses:
            return {"content": text}
        parser = self.parsers.get(choice)
        if parser is None:
            parser = self.parsers[choice] = self._parser()
        msg = parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(ids),
            request=self.request,
            prompt_token_ids=list(prompt),
            finished=finished,
        )
        if msg is None:
            return None
        out: dict[str, Any] = msg.model_dump(exclude_none=True)
        out.pop("role", None)
        calls = [c for c in out.get("tool_calls") or [] if c]
        if self.request.parallel_tool_calls is False:
            calls = [c for c in calls if c.get("index") == 0]
        if calls:
            out["tool_calls"] = calls
        else:
            out.pop("tool_calls", None)
        return out

    def stream_finish(self, streamed_calls: bool, finish: str) -> str:
        """vLLM's streamed finish reason: "tool_calls" once calls streamed, unless named."""
        return "tool_calls" if streamed_calls and not self.named and finish == "stop" else finish


class ToolCalls:
    """The tool handling of a server's chat route (`ToolSettings`)."""

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    def _parser_cls(self) -> Any:
        s = self.settings
        if not s.tool_call_parser:
            return None
        key = (s.tool_call_parser, s.enable_auto_tool_choice, s.tool_strict_level)
        with _LOCK:
            if key not in _PARSERS:
                from vllm.parser import ParserManager

                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        _PARSERS[key] = ParserManager.get_parser(
                            tool_parser_name=s.tool_call_parser,
                            enable_auto_tools=True,
                            tool_strict_level=s.tool_strict_level,
                        )
                except TypeError as exc:
                    raise OpenAIError(
                        500, f"--tool-call-parser: {exc}", type="server_error"
                    ) from None
            return _PARSERS[key]

    def for_request(self, body: Mapping[str, Any], tokenizer: Any) -> ToolTurn | None:
        """The request's tool handling (None without `tools` / `tool_choice`); 400 naming the
        field for what vLLM refuses or this server cannot do."""
        tools, choice = body.get("tools"), body.get("tool_choice")
        if tools is None and choice in (None, "none", "auto"):  # "auto" of no tools: no call
            return None
        if choice == "none" and tools is not None:
            _vllm_request(body)  # the tools are still vLLM-valid: they are rendered
            return None
        if not load_vllm():
            raise _bad(
                "tool_choice",
                f"{json.dumps(choice or 'auto')}: tool calls need vLLM's tool parsers, which "
                "this server does not have (install the on-prem extra); send tool_choice 'none'",
                code="unsupported_value",
            )
        req = _vllm_request(body)
        s = self.settings
        parser_cls = self._parser_cls()
        if req.tool_choice == "auto" and not (s.enable_auto_tool_choice and parser_cls):
            raise _bad(
                "tool_choice",
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set (this server has no tool parser); send tool_choice 'none'",
                code="unsupported_value",
            )
        if parser_cls is None:
            raise _bad(
                "tool_choice",
                f"{json.dumps(body.get('tool_choice'))} requires --tool-call-parser to be set",
                code="unsupported_value",
            )
        parser = parser_cls(tokenizer, req.tools)
        try:
            req = parser.adjust_request(req)
        except Exception as exc:  # vLLM refused the tools for its grammar
            raise _vllm_error(exc) from None
        forced = req.tool_choice == "required" or not isinstance(req.tool_choice, str)
        constraint = _constraint(req.structured_outputs) if forced else None
        if forced and constraint is None:
            raise _bad(
                "tool_choice",
                f"the tool parser {s.tool_call_parser!r} gives no grammar for a forced call",
                code="unsupported_value",
            )
        if constraint is None and req.tool_choice == "auto" and req.structured_outputs:
            constraint = _constraint(req.structured_outputs)  # strict tools in "auto"
        return ToolTurn(req, parser_cls, tokenizer, s.enable_auto_tool_choice, constraint)


def raw_text(
    sampler: Any, ids: Sequence[int], finish: str | None, stop_reason: Any, text: str
) -> str:
    """A sample's text as a tool parser reads it (vLLM: `skip_special_tokens` false, so tool-call
    markers that are special tokens survive): its ids decoded with special tokens, less the stop
    token that ended it (vLLM drops its text); a sample cut at a stop string keeps its text."""
    if isinstance(stop_reason, str):
        return text
    if finish == "stop" and ids:
        ids = ids[:-1]
    return str(sampler.decode_special(ids))


def _vllm_request(body: Mapping[str, Any]) -> Any:
    """vLLM's ChatCompletionRequest of the tool fields (its validators, its messages)."""
    if not load_vllm():
        return None
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    except ImportError:
        return None
    fields = {k: body[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if k in body}
    try:
        return ChatCompletionRequest(
            model=str(body.get("model") or ""),
            messages=[{"role": "user", "content": ""}],
            **fields,
        )
    except Exception as exc:
        raise _vllm_error(exc) from None

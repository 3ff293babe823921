"""The tiny model's chat template (jinja, `tiny_tokenizer.CHAT_TEMPLATE`) and its Python twin
(`openai.fake.render_qwen_chat`, the fake engine's) render every message kind alike: plain
turns as before, tools, assistant tool calls (arguments as OpenAI's JSON strings), tool
results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from arctic_servers.engines import tiny_tokenizer
from arctic_servers.openai.fake import render_qwen_chat
from arctic_servers.openai.sampler import OpenAIError
from arctic_servers.openai.tokenized import template_messages

transformers = pytest.importorskip("transformers")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers (é)",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
CASES: list[tuple[list[dict[str, Any]], Any]] = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], TOOLS),
    (
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
            {"role": "tool", "tool_call_id": "c2", "content": "4"},
            {"role": "assistant", "content": "It is 3."},
            {"role": "user", "content": [{"type": "text", "text": "ok"}]},
        ],
        TOOLS,
    ),
    (
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "let me", "tool_calls": [CALL, CALL]},
            {"role": "tool", "content": "3"},
        ],
        TOOLS,
    ),
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d: Path = tmp_path_factory.mktemp("tok")
    for name, data in tiny_tokenizer.tokenizer_files(1024).items():
        (d / name).write_bytes(data)
    return transformers.AutoTokenizer.from_pretrained(str(d))


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("gen", [True, False])
def test_jinja_template_and_python_twin_agree(tok: Any, case: int, gen: bool) -> None:
    messages, tools = CASES[case]
    msgs = template_messages(messages)
    want = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)
    assert render_qwen_chat(msgs, add_generation_prompt=gen, tools=tools) == want


def test_plain_turns_render_as_before(tok: Any) -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


def test_tool_call_renders_as_hermes_and_bad_arguments_are_refused(tok: Any) -> None:
    msgs = template_messages(CASES[3][0])
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n' in text
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n4" in text
    bad = {**CALL, "function": {"name": "add", "arguments": "{not json"}}
    with pytest.raises(OpenAIError, match=r"messages\[0\].tool_calls\[0\].function.arguments"):
        template_messages([{"role": "assistant", "content": "", "tool_calls": [bad]}])

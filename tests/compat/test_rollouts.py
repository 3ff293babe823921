"""`arctic_sdk.rollouts`: agent transcripts to (input_ids, loss_mask), pure."""

from __future__ import annotations

import numpy as np
import pytest

from arctic_sdk.rollouts import (
    FlatRollout,
    Turn,
    TurnsDoNotConcatenateWarning,
    flatten_turns,
    forward_backward_frame,
    pad_rollouts,
    turn_from_response,
)

SYS = [1, 2, 3]  # system + user prompt
TOOL = [40, 41]  # tool output and the template glue before the next assistant turn


def test_single_turn() -> None:
    r = flatten_turns([SYS], [[7, 8, 9]], [[-0.5, -0.25, -1.0]])
    assert r.input_ids == [1, 2, 3, 7, 8, 9]
    assert r.loss_mask == [0, 0, 0, 1, 1, 1]
    assert r.logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, -1.0]
    assert (r.num_turns, r.trained_turns, r.fell_back, r.reason) == (1, 1, False, "")


def test_three_turns_mask_every_model_token() -> None:
    p0 = SYS
    c0 = [7, 8]
    p1 = p0 + c0 + TOOL
    c1 = [9]
    p2 = p1 + c1 + [42]
    c2 = [10, 11, 12]
    r = flatten_turns([p0, p1, p2], [c0, c1, c2], [[-1.0, -2.0], [-3.0], [-4.0, -5.0, -6.0]])
    assert r.input_ids == [1, 2, 3, 7, 8, 40, 41, 9, 42, 10, 11, 12]
    assert r.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert r.logprobs == [0, 0, 0, -1.0, -2.0, 0, 0, -3.0, 0, -4.0, -5.0, -6.0]
    assert (r.num_turns, r.trained_turns, r.fell_back) == (3, 3, False)
    # the mask marks exactly the completions, in order
    picked = [t for t, m in zip(r.input_ids, r.loss_mask, strict=True) if m]
    assert picked == c0 + c1 + c2


def test_turns_from_turn_objects_and_no_logprobs() -> None:
    turns = [Turn([1], [2]), Turn([1, 2, 5], [6], logprobs=[-1.0])]
    r = flatten_turns(turns)
    assert r.input_ids == [1, 2, 5, 6] and r.loss_mask == [0, 1, 0, 1]
    assert r.logprobs is None  # one turn came without log-probs


def test_broken_invariant_falls_back_to_last_turn_with_warning() -> None:
    # turn 1's prompt re-renders turn 0's completion differently (template dropped token 8)
    p0, c0 = SYS, [7, 8]
    p1, c1 = [*SYS, 7, 40, 41], [9, 10]
    with pytest.warns(TurnsDoNotConcatenateWarning, match=r"turn 1 differs .* position 4"):
        r = flatten_turns([p0, p1], [c0, c1])
    assert r.fell_back and r.trained_turns == 1 and r.num_turns == 2
    assert r.input_ids == p1 + c1
    assert r.loss_mask == [0] * len(p1) + [1, 1]
    assert "inside turn 0's completion" in r.reason


def test_shorter_next_prompt_and_silent_fallback() -> None:
    r = flatten_turns([[1, 2, 3], [1, 2]], [[4], [5]], warn=False)
    assert r.fell_back and "fewer than" in r.reason
    assert r.input_ids == [1, 2, 5] and r.loss_mask == [0, 0, 1]


@pytest.mark.parametrize(
    ("args", "err"),
    [
        (([[1]], [[2], [3]]), "1 prompts but 2 completions"),
        (([], []), "at least one turn"),
        (([[1]], [[2, 3]], [[-1.0]]), "1 log-probs for 2"),
        (([[1.5]], [[2]]), "expected an int token id"),
    ],
)
def test_bad_transcripts(args: tuple, err: str) -> None:  # type: ignore[type-arg]
    with pytest.raises((ValueError, TypeError), match=err):
        flatten_turns(*args)


def chat_response(prompt: list[int], ids: list[int], lps: list[float] | None) -> dict:  # type: ignore[type-arg]
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": "x"}, "token_ids": ids}  # type: ignore[type-arg]
    if lps is not None:
        choice["logprobs"] = {"content": [{"token": "x", "logprob": v} for v in lps]}
    return {"object": "chat.completion", "choices": [choice], "prompt_token_ids": prompt}


def test_turn_from_chat_and_completion_responses() -> None:
    t = turn_from_response(chat_response([1, 2], [3, 4], [-0.5, -0.75]))
    assert t == Turn([1, 2], [3, 4], [-0.5, -0.75])
    comp = {
        "choices": [
            {
                "text": "ab",
                "token_ids": [5],
                "prompt_token_ids": [9, 9],
                "logprobs": {"token_logprobs": [-2.0]},
            }
        ]
    }
    assert turn_from_response(comp) == Turn([9, 9], [5], [-2.0])
    with pytest.raises(ValueError, match="return_token_ids"):
        turn_from_response({"choices": [{"text": "x"}]})
    with pytest.raises(ValueError, match="1 choices; choice 3"):
        turn_from_response(chat_response([1], [2], None), choice=3)


def test_turn_from_openai_objects() -> None:
    openai = pytest.importorskip("openai")
    del openai
    from openai.types.chat import ChatCompletion

    obj = ChatCompletion.model_validate(
        chat_response([1, 2], [3], [-1.0])
        | {"id": "c", "created": 0, "model": "m"}
        | {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "token_ids": [3],
                    "message": {"role": "assistant", "content": "x"},
                    "logprobs": {
                        "content": [
                            {"token": "x", "logprob": -1.0, "bytes": None, "top_logprobs": []}
                        ]
                    },
                }
            ]
        }
    )
    assert turn_from_response(obj) == Turn([1, 2], [3], [-1.0])


def test_pad_and_frame() -> None:
    a = flatten_turns([[1, 2]], [[3, 4]], [[-1.0, -2.0]])
    b = flatten_turns([[5]], [[6]], [[-3.0]])
    padded = pad_rollouts([a, b], pad_token_id=0)
    assert padded.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert padded.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert padded.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert padded.logprobs_shifted is not None
    assert padded.logprobs_shifted.tolist() == [[0, -1, -2, 0], [-3, 0, 0, 0]]
    frame = forward_backward_frame([a, b], [0.5, -1.0], config={"eps_clip": 0.2})
    ctx = frame["context"]
    assert ctx["advantages"].tolist() == [[0, 0, 0.5, 0.5], [0, -1.0, 0, 0]]
    assert ctx["old_log_probs_shifted"].dtype == np.float32
    assert frame["processing"] == {
        "post": ["compute_logprobs"],
        "loss_fn": "importance_sampling",
        "config": {"eps_clip": 0.2},
    }
    with pytest.raises(ValueError, match="3 advantages for 2"):
        forward_backward_frame(padded, [1, 2, 3])
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_rollouts([a], width=2)


def test_flat_rollout_is_frozen() -> None:
    r = flatten_turns([[1]], [[2]])
    assert isinstance(r, FlatRollout)
    with pytest.raises(AttributeError):
        r.fell_back = True  # type: ignore[misc]


def test_docstring_example_runs() -> None:
    import doctest

    import arctic_sdk.rollouts as mod

    result = doctest.testmod(mod)
    assert result.failed == 0 and result.attempted > 0

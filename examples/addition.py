"""The main job's task: integer addition with an exact-match checker and a held-out split.

A problem is two D-digit operands, zero-padded, and its answer is their sum zero-padded to D + 1
digits::

    prompt  "07+58="        answer  "065"

Fixed widths keep every prompt the same length (no padding in a batch) and put each digit at a
fixed position. The embedded tokenizer (and Qwen2's) splits numbers into single digits, so every
digit, `+` and `=` is one token. Two splits are drawn once from a seeded generator, each closed
under swapping the operands (`b+a` goes with `a+b`), so a trained model cannot answer one of their
problems by having seen its mirror image: the held-out split (the reported accuracy, never used
for a decision) and a disjoint validation split (what a stopping rule reads). Training problems
are drawn by rejection from everything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class Problem:
    a: int
    b: int
    digits: int

    @property
    def prompt(self) -> str:
        d = self.digits
        return f"{self.a:0{d}d}+{self.b:0{d}d}="

    @property
    def answer(self) -> str:
        return f"{self.a + self.b:0{self.digits + 1}d}"


def is_correct(problem: Problem, completion: str) -> bool:
    """Exact match: the completion (stop token excluded, surrounding spaces ignored) is the sum."""
    return completion.strip() == problem.answer


def accuracy(problems: Sequence[Problem], completions: Sequence[str]) -> float:
    if len(problems) != len(completions):
        raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    return sum(map(is_correct, problems, completions)) / max(1, len(problems))


class AdditionTask:
    """D-digit addition: fixed held-out and validation splits and a seeded stream of training
    problems (drawn from neither split)."""

    def __init__(
        self, digits: int = 2, held_out: int = 200, seed: int = 0, validation: int = 0
    ) -> None:
        if digits < 1:
            raise ValueError(f"digits must be >= 1, not {digits}")
        space = 10 ** (2 * digits)
        if not 0 < held_out <= space // 4:
            raise ValueError(f"held_out must be in [1, {space // 4}] for {digits} digits")
        if not 0 <= validation <= space // 4:
            raise ValueError(f"validation must be in [0, {space // 4}] for {digits} digits")
        self.digits = digits
        self.n = 10**digits
        rng = np.random.Generator(np.random.PCG64([seed, 17]))
        held = self._draw(rng, held_out, set())
        # drawn after the held-out split from the same stream: the held-out split does not
        # depend on whether there is a validation split
        val = self._draw(rng, validation, held)
        self._held, self._val = held, val
        self.held_out = sorted(Problem(a, b, digits) for a, b in held)
        self.validation = sorted(Problem(a, b, digits) for a, b in val)
        self._rng = np.random.Generator(np.random.PCG64([seed, 18]))

    def _draw(
        self, rng: np.random.Generator, size: int, taken: set[tuple[int, int]]
    ) -> set[tuple[int, int]]:
        """`size` pairs closed under swap, none in `taken`."""
        out: set[tuple[int, int]] = set()
        while len(out) < size:
            a, b = (int(x) for x in rng.integers(0, self.n, size=2))
            if (a, b) in out or (a, b) in taken:
                continue
            if len(out) + (1 if a == b else 2) <= size:
                out.update({(a, b), (b, a)})
        return out

    def is_held_out(self, p: Problem) -> bool:
        """In the held-out or the validation split: never a training problem."""
        return (p.a, p.b) in self._held or (p.a, p.b) in self._val

    def train_batch(self, size: int) -> list[Problem]:
        """`size` training problems (in neither split), the next ones of the seeded stream."""
        out: list[Problem] = []
        while len(out) < size:
            for a, b in self._rng.integers(0, self.n, size=(size, 2)).tolist():
                if not self.is_held_out(Problem(a, b, self.digits)) and len(out) < size:
                    out.append(Problem(a, b, self.digits))
        return out


def prompts(problems: Iterable[Problem]) -> list[str]:
    return [p.prompt for p in problems]

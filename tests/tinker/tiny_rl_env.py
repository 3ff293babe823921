"""A tiny local RL task for tinker-cookbook's `rl.train` (the loop `math_rl` and the other
recipes run), small enough for the embedded tiny model on CPU and learnable in a few steps:
the prompt is a few fixed tokens, the model samples `max_tokens` tokens (no stop: the
cookbook's `stop=[]`), and the reward is the fraction of sampled tokens that are in a fixed
half of the vocabulary (even ids). A random model starts near 0.5; RL moves it up."""

from __future__ import annotations

from collections.abc import Sequence

import chz
import tinker
from tinker_cookbook.rl.types import (
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    Trajectory,
)

PROMPTS = ([5, 6, 7, 8], [9, 10, 11, 12], [20, 21, 22, 23], [30, 31, 32, 33])


def reward_of(tokens: Sequence[int]) -> float:
    return sum(1 for t in tokens if t % 2 == 0) / max(len(tokens), 1)


class EvenTokensEnv(Env):
    def __init__(self, prompt: list[int]) -> None:
        self.prompt = prompt

    async def initial_observation(self) -> tuple[Observation, list[int]]:
        return tinker.ModelInput.from_ints(self.prompt), []

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        r = reward_of(list(action))
        return StepResult(
            reward=r,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[],
            metrics={"even_fraction": r},
        )


class EvenTokensGroup(EnvGroupBuilder):
    def __init__(self, prompt: list[int], size: int) -> None:
        self.prompt, self.size = prompt, size

    async def make_envs(self) -> Sequence[Env]:
        return [EvenTokensEnv(self.prompt) for _ in range(self.size)]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["even_tokens"]


class EvenTokensDataset(RLDataset):
    def __init__(self, batch_size: int, group_size: int, n_batches: int) -> None:
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [
            EvenTokensGroup(list(PROMPTS[(index + i) % len(PROMPTS)]), self.group_size)
            for i in range(self.batch_size)
        ]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class EvenTokensDatasetBuilder(RLDatasetBuilder):
    batch_size: int
    group_size: int
    n_batches: int

    async def __call__(self) -> tuple[EvenTokensDataset, None]:
        return EvenTokensDataset(self.batch_size, self.group_size, self.n_batches), None

"""tinker-cookbook 0.6.1's supervised and RL training (`supervised.train`, `rl.train`), unchanged
but for configuration: the server's model name (its tokenizer comes from the server's /hf/,
`HF_ENDPOINT`) or a local model directory, a local JSONL of conversations (SL) and a tiny local
RL task (`tiny_rl_env.py`), no hub. Run as
`python -m tests.tinker.cookbook_recipes sl|rl BASE_URL MODEL LOG_DIR [CONVS_JSONL | STEPS]`;
prints `DONE` and the recipe's own metrics file is `LOG_DIR/metrics.jsonl`."""

from __future__ import annotations

import asyncio
import sys

import chz


def sl(url: str, model: str, log: str, convs: str) -> None:
    from tinker_cookbook.supervised import train

    argv = [
        f"base_url={url}",
        f"model_name={model}",
        "recipe_name=local",
        "renderer_name=role_colon",
        f"log_path={log}",
        "learning_rate=1e-4",
        "lora_rank=8",
        "eval_every=2",
        "save_every=2",
        "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
        f"dataset_builder.file_path={convs}",
        f"dataset_builder.common_config.model_name_for_tokenizer={model}",
        "dataset_builder.common_config.renderer_name=role_colon",
        "dataset_builder.common_config.batch_size=8",
        "dataset_builder.common_config.max_length=128",
    ]
    asyncio.run(train.main(chz.entrypoint(train.Config, argv=argv)))


def rl(url: str, model: str, log: str, steps: str = "8") -> None:
    """`rl.train` (the loop math_rl and the other RL recipes run) with its default loss, on
    a tiny local task (`tiny_rl_env.py`: reward = the fraction of even token ids sampled)."""
    from tinker_cookbook.rl import train

    from tests.tinker.tiny_rl_env import EvenTokensDatasetBuilder

    cfg = train.Config(
        learning_rate=3e-3,
        model_name=model,
        recipe_name="local_rl",
        renderer_name="role_colon",
        dataset_builder=EvenTokensDatasetBuilder(batch_size=4, group_size=8, n_batches=int(steps)),
        max_tokens=8,
        log_path=log,
        eval_every=0,
        save_every=0,
        lora_rank=8,
        base_url=url,
    )
    assert cfg.loss_fn == "importance_sampling"  # rl.train's default (sync runs)
    asyncio.run(train.main(cfg))


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    {"sl": sl, "rl": rl}[kind](*args)
    print("DONE")

"""TRL's GRPO quick start, trained by rollwise: the script is a TRL script; only its import line differs.

    python recipes/trl_quickstart.py            # SmolLM2-135M-Instruct learns 2-digit addition (about 10 min on 2 cores)

The dataset is built in memory (`datasets.Dataset.from_list`, conversational prompts), the reward follows TRL's
convention (`completions`, the dataset's columns by name), and GRPOConfig's arguments keep TRL's meaning; one
rollwise cannot honour is refused when the config or trainer is built (docs/trl.md lists them all).
"""

from __future__ import annotations

import random
import re
import sys

from datasets import Dataset

from rollwise.trl import GRPOConfig, GRPOTrainer  # with TRL: from trl import GRPOConfig, GRPOTrainer

_INT = re.compile(r"-?\d[\d,]*")


def sum_correct(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last integer is the sum, else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        text = " ".join(m["content"] for m in c) if isinstance(c, list) else c
        nums = _INT.findall(text)
        out.append(1.0 if nums and int(nums[-1].replace(",", "")) == int(a) else 0.0)
    return out


def addition(pairs: list[tuple[int, int]]) -> Dataset:
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b}
                              for a, b in pairs])


def main(max_steps: int = 20, output_dir: str = "runs/trl-quickstart", eval_size: int = 100,
         batch_size: int = 64) -> GRPOTrainer:
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(0).shuffle(pairs)
    train_dataset, eval_dataset = addition(pairs[100:2100]), addition(pairs[:eval_size])  # disjoint problems

    args = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=batch_size,   # completions per step: 8 prompts x 8 generations
        num_generations=8,
        max_completion_length=32,
        learning_rate=1e-5,
        max_steps=max_steps,
        logging_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(model="smollm2-135m", reward_funcs=sum_correct, args=args, train_dataset=train_dataset,
                          eval_dataset=eval_dataset)
    trainer.train()
    trainer.save_model()
    r = trainer.result
    print(f"held-out greedy accuracy {r.accuracy_before_greedy:.3f} -> {r.accuracy_after_greedy:.3f} "
          f"(sampled {r.accuracy_before:.3f} -> {r.accuracy_after:.3f}); last log: {trainer.state.log_history[-1]}")
    return trainer


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))

"""Tasks for a tool class that owns its data: `env.name: env_owned` (TRL's GRPOTrainer without a train_dataset).

Each task is an empty user message; the class's `reset(**row)` returns the real prompt, which becomes that message
(`envs.multiturn.with_opening` with the tool class's `opening_sep=""`). `rows` tasks per split, the same ones each
step, as TRL cycles `generation_batch_size // num_generations` placeholder rows; a run's length is `train.steps`.

    env:
      name: env_owned
      kwargs: {rows: 8}
      environment: recipes/tools/increment_env.py:IncrementEnv     # reset() returns the prompt; get_reward() scores

Deliberately left out: any scoring of its own (`score` is errored: the tool class's `get_reward` or `env.reward`
scores the episodes), and a different task set for evaluation (the class samples its own tasks on each reset).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollwise.types import Score, Task


@dataclass
class EnvOwnedTasks:
    """`rows` empty-prompt tasks per split, for a tool class whose `reset` makes each episode's prompt."""

    rows: int = 8
    """Tasks per split (the TRL front end sets it to generation_batch_size // num_generations)."""
    name: str = "env_owned"

    def __post_init__(self) -> None:
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"env.kwargs.rows must be a positive integer, got {self.rows!r}")

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        count = self.rows if n is None else min(n, self.rows)
        return [Task(f"{split}/{i}", [{"role": "user", "content": ""}], None) for i in range(count)]

    def score(self, task: Task, completion: str) -> Score:
        return Score(0.0, error="env_owned has no reward of its own: the tool class's get_reward() or env.reward "
                                "scores its episodes")

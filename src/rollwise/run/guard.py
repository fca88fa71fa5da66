"""No silent run: a reward that errors on every sample stops the run with one line; a policy never can.

Whatever goes wrong inside an episode is that sample's outcome: a reward raising on some samples scores them as
`algo.errored_reward` (a wrong answer), with the reason kept on the rollout. A reward that raises on *every*
sample is another thing: the user's reward is broken (typically the same exception at the same line each time),
nothing can be learned, and a run that went on would end with "accuracy 0.000 -> 0.000" and exit 0.

NOTE on the rule (`ErroredSteps.observe`, called on each step's own rollouts before the step trains):
    stop when every scored sample (not aborted) of the step errored (`filter.all_errored`), and either it is the run's first step
    (the initial model: no policy has had a chance to learn to break the reward) or it is the
    `run.max_all_errored_steps`-th such step in a row.
A step with any sample that did not error resets the count, so no output a policy can learn to write stops the
run unless it breaks every sample of N steps running. The step that stops the run is neither trained nor stored;
what was done before it (checkpoints, stored steps, metrics lines) stays, and `run.resume` continues from it once
the reward is fixed.

Deliberately left out: carrying the count across a resume (a resumed run counts from zero), and telling errors
apart by their text (the rule looks at statuses only; the message quotes the most common reason).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollwise.filter import all_errored
from rollwise.types import Rollout


class RewardBroken(ValueError):
    """The reward errored on every sample (the first step, or N steps in a row); the message is one line naming
    the error, where the user's code raised it, and the run directory."""


@dataclass
class ErroredSteps:
    """Consecutive RL steps whose every scored sample errored (`run.max_all_errored_steps`)."""

    limit: int
    """Stop at this many all-errored steps in a row (`run.max_all_errored_steps`)."""
    run_dir: Path
    """Named in the message: what was done is kept there."""
    streak: int = 0
    """All-errored steps in a row, up to and including the last one observed."""

    def observe(self, step: int, rollouts: Sequence[Rollout]) -> None:
        """Count `step` (its own rollouts); raise RewardBroken when the rule in the module docstring says stop."""
        if not all_errored(rollouts):
            self.streak = 0
            return
        self.streak += 1
        if step != 1 and self.streak < self.limit:
            return
        scored = [r for r in rollouts if r.status == "errored"]  # all of them but the aborted ones
        reason, count = Counter(r.status_reason for r in scored).most_common(1)[0]
        when = ("step 1, the run's first" if step == 1 else f"step {step}" if self.streak == 1 else
                f"{self.streak} steps in a row ({step - self.streak + 1}-{step})")
        same = f"on {count} of {len(scored)} samples" + (f" of step {step}" if step != 1 else "")
        then = (f"fix the reward and run again (run directory {self.run_dir})" if step == 1 else
                f"fix the reward and resume: rollwise train --resume {self.run_dir} (the steps before {step} are kept)")
        raise RewardBroken(f"the reward errored on every sample of {when}: {reason} {same}; stopped before training "
                           f"on step {step}; {then}")

"""The token ledger: where one step's rollouts and tokens went, checked to add up every step.

NOTE on the token ledger (checked every step by `Accounting.check`):
    generated_tokens = rollout_tokens - shared_tokens + carried_out_tokens - carried_in_tokens
where rollout_tokens counts every policy-generated completion token of the step's rollouts (any status, aborted
included; a multi-turn episode's environment tokens, loss mask 0, are not generated), shared_tokens those a tree
rollout took from its parent (`Rollout.tree_fork`: generated once, for the parent), and carried_* count the tokens
of samples held over between steps (partial rollouts). The rollout counts add up too:
kept + filtered + errored + truncated + aborted = rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rollwise.control.tail import split_generate
from rollwise.types import ROLLOUT_STATUSES, CompletionOutput


@dataclass
class Accounting:
    """Where one step's rollouts and tokens went. Every count is per step; `check` proves they add up."""

    rollouts: dict[str, int] = field(default_factory=lambda: {s: 0 for s in ROLLOUT_STATUSES})
    """Rollouts by final status (kept / filtered / errored / truncated / aborted)."""
    groups: int = 0
    """Groups returned this step."""
    zero_variance_groups: int = 0
    """Returned groups whose valid rewards are all equal (no GRPO signal)."""
    generated_tokens: int = 0
    """Tokens the engine produced during this step (for every sample, finished, aborted or carried)."""
    rollout_tokens: int = 0
    """Completion tokens of this step's rollouts, any status."""
    aborted_tokens: int = 0
    """Completion tokens of rollouts the controller aborted (status 'aborted'): spent, never trained."""
    shared_tokens: int = 0
    """Completion tokens of tree rollouts that are their parent's (generated once, counted in rollout_tokens for
    every leaf that shares them)."""
    carried_in_tokens: int = 0
    """Tokens of samples carried into this step from earlier ones (partial rollouts)."""
    carried_out_tokens: int = 0
    """Tokens of unfinished samples carried from this step into the next one."""
    useful_tokens: int = 0
    """Tokens of trainable rollouts with a non-zero advantage (filled by `finalize`, after advantages)."""
    trained_tokens: int = 0
    """Tokens of trainable (kept / truncated) rollouts."""
    skipped_prompts: int = 0
    """Prompts the selector skipped (posterior: almost surely all-correct or all-wrong)."""
    prompts: int = 0
    """Prompts sampled this step (a prompt refilled by dynamic sampling counts again)."""
    rounds: int = 0
    """Generation rounds (dynamic sampling and adaptive refill in rounds)."""
    direct_groups: int = 0
    """adaptive: groups sampled in full at once because the prompt was believed mixed (no pilot)."""
    gen_s: float = 0.0
    """Wall time in the engine."""
    score_s: float = 0.0
    """Wall time scoring."""
    idle_s: float = 0.0
    """Engine time left idle waiting for the long tail: sum over engine steps of step time x the fraction of
    the step's batch capacity (the most samples in flight at once this step) that was empty. 0 for batch-only
    engines, where it cannot be observed."""
    tail_s: float | None = None
    """Engine time after 90% of the samples of each wave had ended (control/tail.py); None where the end of a sample
    is not observed (batch engines)."""
    staleness_mean: float = 0.0
    """Mean age, in weight versions, of the trained tokens (version trained - version that sampled them)."""
    staleness_max: int = 0
    """Largest such age."""
    spec_acceptance: float | None = None
    """Speculative rollouts (rollout.speculative; None when off): accepted / tested draft tokens this step."""
    spec_tokens_per_forward: float | None = None
    """Tokens a sample gained per engine decode step it was in (1.0 = no gain from drafts)."""
    spec_saved_s: float | None = None
    """Estimated engine seconds saved by drafts (engine.speculative.SpecStats.saved_s_est)."""

    def check(self) -> None:
        """Raise if the ledger does not balance (a bug in a policy, never a user error)."""
        if (self.generated_tokens
                != self.rollout_tokens - self.shared_tokens + self.carried_out_tokens - self.carried_in_tokens):
            raise AssertionError(
                f"token ledger does not balance: generated {self.generated_tokens} != rollouts {self.rollout_tokens}"
                f" - shared {self.shared_tokens} + carried out {self.carried_out_tokens} - carried in {self.carried_in_tokens}")

    @property
    def total_rollouts(self) -> int:
        return sum(self.rollouts.values())

    def metrics(self) -> dict[str, float]:
        """Flat `control_*` metrics for metrics.jsonl (staleness under the loop's own key names)."""
        m: dict[str, float] = {f"control_{k}": float(getattr(self, k)) for k in (
            "groups", "zero_variance_groups", "generated_tokens", "aborted_tokens", "shared_tokens", "carried_in_tokens",
            "carried_out_tokens", "useful_tokens", "skipped_prompts", "prompts", "rounds", "direct_groups", "idle_s")}
        m["control_zero_var_frac"] = self.zero_variance_groups / max(self.groups, 1)
        m["control_tokens_per_useful_group"] = self.generated_tokens / max(self.groups - self.zero_variance_groups, 1)
        m["control_gen_tokens_per_useful_token"] = self.generated_tokens / max(self.useful_tokens, 1)
        m["staleness_mean"] = self.staleness_mean
        m["staleness_max"] = float(self.staleness_max)
        for k in ("spec_acceptance", "spec_tokens_per_forward", "spec_saved_s"):
            if getattr(self, k) is not None:
                m[f"control_{k}"] = float(getattr(self, k))
        m.update(self.time_split())
        return m

    def time_split(self) -> dict[str, float]:
        """The generate phase split into useful, filtered and tail seconds, and the tail's share (control/tail.py);
        empty where the tail is not observed. Call after `finalize` has counted the useful tokens."""
        if self.tail_s is None:
            return {}
        sp = split_generate(self.gen_s, self.tail_s, self.generated_tokens, self.useful_tokens)
        return {"time_tail_s": sp.tail_s, "tail_frac": sp.tail_s / self.gen_s if self.gen_s > 0 else 0.0,
                "time_gen_useful_s": sp.useful_s, "time_gen_filtered_s": sp.filtered_s}


def own_tokens(outputs: Sequence[CompletionOutput]) -> int:
    """Tokens the engine generated for these samples: a tree sample's tokens before its fork are its parent's."""
    return sum(len(o.token_ids) - (o.tree_fork or 0) for o in outputs)

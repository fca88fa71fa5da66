"""`StepStats`: the running totals of one `Trainer.train_step`, accumulated over micro-batches and merged over ranks.

Every field says how it combines (`combine=` in its metadata): "sum" and "max" fields accumulate over a rank's
micro-batches and over the ranks alike; "rank" fields are the same on every rank by construction (the optimiser
sees the summed gradient, every rank computes the same plan) and keep this rank's value. Merging goes by field
name, so adding a total is one field here and nothing in the trainer's collective.

`metrics()` turns the merged totals into the step's metrics: the loss's own per-token metrics token-weighted,
the rest as documented on `Trainer.train_step` (the keys are the metrics.jsonl columns users chart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

Combine = Literal["sum", "max", "rank"]


def _total(combine: Combine, default: float = 0.0) -> float:
    return field(default=default, metadata={"combine": combine})


@dataclass
class StepStats:
    """Totals of one RL step on one rank (after `merge`: on all ranks)."""

    weighted: dict[str, float] = field(default_factory=dict, metadata={"combine": "sum"})
    """Per key of the loss's metrics, sum over micro-batches of value x loss tokens (the token weighting)."""
    weight: float = _total("sum")
    """Loss tokens of the micro-batches that ran."""
    loss_total: float = _total("sum")
    """Sum of the micro-batches' losses (each already normalised by its whole mini-batch's counts)."""
    ratio_max: float = _total("max")
    diff_sum: float = _total("sum")
    """Sum over loss tokens of |trainer - engine| log-prob, at the parameters before any update of the step."""
    diff_tokens: float = _total("sum")
    diff_max: float = _total("max")
    seq_gap_max: float = _total("max")
    """The largest per-sequence mean gap over tokens generated at the trainer's own weight version."""
    seq_gap_count: float = _total("sum")
    """Sequences `seq_gap_max` was taken over."""
    forward_tokens: float = _total("sum")
    micro_batches: float = _total("sum")
    # the same on every rank
    grad_norm: float = _total("rank", float("nan"))
    lr: float = _total("rank")
    skipped_steps: float = _total("rank")
    zero_adv_sequences: float = _total("rank")
    train_tokens: float = _total("rank")
    mini_batches: float = _total("rank", 1.0)

    def __iadd__(self, other: StepStats) -> StepStats:
        """Accumulate `other` (a micro-batch's totals) into these: sums add, maxima take the larger (the first of
        equals), per-rank values stay."""
        self._combine(other, ("sum", "max"))
        return self

    def _combine(self, other: StepStats, kinds: tuple[Combine, ...]) -> None:
        for f in fields(self):
            combine: Combine = f.metadata["combine"]
            if combine not in kinds:
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                for key, v in theirs.items():
                    mine[key] = mine.get(key, 0.0) + v
            elif combine == "sum":
                setattr(self, f.name, mine + theirs)
            else:
                setattr(self, f.name, max(mine, theirs))

    def add_micro(self, metrics: Mapping[str, float], tokens: float, *, forward_tokens: int) -> None:
        """One micro-batch's loss metrics over `tokens` loss tokens ('loss' and 'ratio_max' are not averages), and
        the tokens its forward ran."""
        rest = dict(metrics)
        loss, ratio_max = rest.pop("loss"), rest.pop("ratio_max", 0.0)
        self += StepStats(weighted={k: v * tokens for k, v in rest.items()}, weight=tokens, loss_total=loss,
                          ratio_max=ratio_max, forward_tokens=float(forward_tokens), micro_batches=1.0)

    def add_gap(self, gap_sum: float, tokens: float, gap_max: float) -> None:
        """The trainer-vs-engine log-prob gap of one micro-batch: its sum and max over `tokens` loss tokens."""
        self += StepStats(diff_sum=gap_sum, diff_tokens=tokens, diff_max=gap_max)

    def add_seq_gap(self, gap_max: float, sequences: float) -> None:
        """The largest per-sequence mean gap of one micro-batch's fresh sequences, and how many there were."""
        self += StepStats(seq_gap_max=gap_max, seq_gap_count=sequences)

    def merge(self, parts: Sequence[StepStats]) -> StepStats:
        """The whole step's totals from every rank's (`parts` in rank order); per-rank values are this rank's.
        Sums run from zero in rank order and maxima keep the first of equals, so one rank's merge is itself."""
        out = StepStats()
        for f in fields(self):
            combine: Combine = f.metadata["combine"]
            if combine == "rank":
                setattr(out, f.name, getattr(self, f.name))
            elif combine == "max":
                setattr(out, f.name, max(getattr(p, f.name) for p in parts))
        for p in parts:
            out._combine(p, ("sum",))
        return out

    def metrics(self, **timings: float) -> dict[str, float]:
        """The step's metrics: the loss's per-token metrics token-weighted, then the step-level ones, then
        `timings` (seconds) in the order given."""
        out: dict[str, float] = {key: v / max(self.weight, 1.0) for key, v in self.weighted.items()}
        out.update(
            loss=self.loss_total / self.mini_batches,
            ratio_max=self.ratio_max,
            grad_norm=self.grad_norm,
            lr=self.lr,
            logprob_diff_mean=self.diff_sum / max(self.diff_tokens, 1.0),
            logprob_diff_max=self.diff_max,
            logprob_diff_seq_max=self.seq_gap_max,
            logprob_diff_seqs=self.seq_gap_count,
            train_tokens=self.train_tokens,
            forward_tokens=self.forward_tokens,
            zero_adv_sequences=self.zero_adv_sequences,
            micro_batches=self.micro_batches,
            skipped_steps=self.skipped_steps,
            **timings,
        )
        return out

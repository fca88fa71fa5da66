"""Speculative rollouts: drafts from past continuations and n-grams, verified with the sampling law unchanged.

The idea. RL samples the same prompts step after step with a policy that moves a little, and the samples of one
group share much of their text. A *draft* is a deterministic guess of a sample's next tokens; the engine feeds
the sample's last token plus up to k draft tokens through one forward pass (each draft position is one more row of
the decode batch, attending to the paged KV cache up to its own position) and gets the sampling distribution at
every draft position at once.

Acceptance (exact, and pathwise equal to ordinary sampling). At output position t the sampler draws the token
`y_t = F_t^-1(u(seed, t))` by inverse CDF from the processed distribution p_t (temperature, top-k, top-p) with the
counter-based uniform of (seed, t). Verification draws `y_t` the same way at each draft row, and accepts draft
token x_t iff `y_t == x_t`; at the first mismatch `y_t` itself is emitted and the rest of the draft is dropped; if
all k are accepted, the row after the last one gives one more token. So:
- draft token x is accepted with probability p_t(x), and on rejection the emitted token is distributed as p_t with
  x removed and renormalised (P(y | y != x) = p_t(y) / (1 - p_t(x))): the speculative-sampling rule for a
  point-mass draft, which is also the largest acceptance rate any exact rule can have for it;
- every emitted token is the very token ordinary sampling draws at that position given the same prefix, because
  the prefix of row t is exactly the emitted tokens before t. With the same seed the output equals the output
  without drafts (up to float rounding differences between batch shapes); greedy (argmax) likewise;
- the recorded log-prob is the sampler's processed log p_t(y_t), as without drafts.

Drafts (`RequestDrafter`, per request; pure token bookkeeping, no torch):
- past: the caller's past continuations of the same prompt. Sample j starts on continuation j mod D; it follows
  it while its tokens match; after a divergence it re-attaches at the longest n-gram (up to `MAX_NGRAM` tokens)
  of its own suffix found in any past continuation.
- ngram: the same suffix match over the prompt and the group's other samples (grown as they decode), at least
  `MIN_NGRAM_LOCAL` tokens long; used when the past source has nothing.

Draft length (`draft_length`): a draft token j positions ahead is accepted with probability about a^j (a: the
sample's observed acceptance rate, with a Beta(1, 1) prior); one more row costs about 1 / (R0 + B) of a step
whose B sequences share a fixed cost worth R0 rows (the weights are read once per step), while an emitted token
is worth a sequence's share of a step, R0 / B + 1 rows. A row is worth adding while a^j * (R0 / B + 1) >= 1: a full
batch speculates little and the long tail (few sequences left) speculates up to k.

Left out: tree drafts (several candidates per position), drafts for the prefill's first token, and drafts in
prefill steps (a step is either prefill or decode; verify rows ride in decode steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence as Seq

from rollwise.engine.sequence import Sequence

MAX_NGRAM = 4
"""Longest suffix matched when re-attaching to a draft source."""
MIN_NGRAM_LOCAL = 2
"""Shortest suffix match accepted from the prompt / sibling n-gram source (one token is too weak a guess)."""
MIN_NGRAM_PAST = 1
"""Shortest suffix match accepted from the past continuations (same prompt: a one-token re-sync is often right)."""


@dataclass(frozen=True)
class DraftSpec:
    """What a request speculates with: past continuations of its prompt and/or the n-gram source."""

    sequences: tuple[tuple[int, ...], ...] = ()
    """Past continuations (completion token ids) of the same prompt; empty ones are ignored."""
    k: int = 8
    """Most draft tokens verified per sample per step."""
    ngram: bool = True
    """Also draft from n-grams of the prompt and the group's other samples."""
    prior: tuple[float, float] = (1.0, 1.0)
    """Beta prior (pseudo-accepted, pseudo-rejected draft tokens) of a new sample's acceptance rate. The draft
    length of a sample's first steps follows it (`draft_length`); Beta(1, 1) says 0.5, which at a full batch drafts
    nothing. A caller with history (control/drafts.py: the run's measured acceptance) passes it here, so drafts fire
    from a request's first step when they have been paying."""

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"draft length k must be an integer >= 1, got {self.k!r}")
        if len(self.prior) != 2 or not all(math.isfinite(x) and x > 0 for x in self.prior):
            raise ValueError(f"draft acceptance prior must be two positive numbers, got {self.prior!r}")

    @classmethod
    def make(cls, drafts: "DraftSpec | Seq[Seq[int]] | None", k: int = 8, ngram: bool = True) -> "DraftSpec | None":
        """A DraftSpec from a DraftSpec (kept), a list of token sequences, or None (no speculation)."""
        if drafts is None or isinstance(drafts, DraftSpec):
            return drafts
        if isinstance(drafts, (str, bytes)) or not isinstance(drafts, Seq):
            raise ValueError(f"drafts must be a list of token-id lists, got {type(drafts).__name__}")
        seqs = []
        for d in drafts:
            if isinstance(d, (str, bytes)) or not isinstance(d, Seq):
                raise ValueError(f"drafts must be a list of token-id lists, got an item of type {type(d).__name__}")
            seqs.append(tuple(int(t) for t in d))
        return cls(tuple(seqs), k, ngram)

    def check_vocab(self, vocab_size: int) -> None:
        for d in self.sequences:
            if d and (min(d) < 0 or max(d) >= vocab_size):
                bad = next(t for t in d if t < 0 or t >= vocab_size)
                raise ValueError(f"draft token id {bad} is outside the vocabulary [0, {vocab_size})")


@dataclass
class SpecState:
    """Per-sample speculation state (lives on `Sequence.spec`)."""

    drafter: "RequestDrafter"
    cursor: tuple[list[int], int] | None = None
    """(source token list, index of the next expected token) while the sample follows a source."""
    accepted: int = 0
    """Draft tokens accepted so far."""
    tested: int = 0
    """Draft tokens tested so far (accepted ones plus each first rejection)."""
    indexed: int = 0
    """How many of this sample's tokens are in its request's n-gram index."""

    @property
    def acceptance(self) -> float:
        """Estimated acceptance rate of this sample's next draft token: its own counts, plus its request's counts
        weighted as one sample's worth (the samples share the drafts), on the request's Beta prior
        (`DraftSpec.prior`)."""
        d = self.drafter
        w = 1.0 / max(len(d.members), 1)
        a0, b0 = d.spec.prior
        return (self.accepted + w * d.accepted + a0) / (self.tested + w * d.tested + a0 + b0)


def draft_length(acceptance: float, num_seqs: int, overhead_rows: float, k_max: int) -> int:
    """Draft tokens worth verifying for one sample: the largest j <= k_max with acceptance^j * (R0/B + 1) >= 1."""
    if k_max <= 0 or num_seqs <= 0:
        return 0
    gain = overhead_rows / num_seqs + 1.0
    if acceptance >= 1.0:
        return k_max
    if acceptance <= 0.0:
        return 0
    j = math.floor(math.log(gain) / -math.log(acceptance))
    return max(0, min(k_max, j))


def accepted_prefix(draft: Seq[int], sampled: Seq[int]) -> int:
    """How many tokens a verify step emits: the sampled tokens up to and including the first that differs from the
    draft (all len(draft) + 1 when every draft token matched). `sampled[j]` is the token drawn at draft row j."""
    n = 0
    for d, y in zip(draft, sampled):
        n += 1
        if d != y:
            return n
    return n + 1 if len(sampled) > len(draft) else n


class _Index:
    """n-gram -> the most recent places (source list, end index) where it ends, newest last (a few per key)."""

    KEEP = 4

    def __init__(self) -> None:
        self.map: dict[tuple[int, ...], list[tuple[list[int], int]]] = {}

    def add(self, src: list[int], end: int) -> None:
        """Index the n-grams (1..MAX_NGRAM) of `src` ending at `end` (exclusive)."""
        for g in range(1, min(MAX_NGRAM, end) + 1):
            key = tuple(src[end - g : end])
            lst = self.map.get(key)
            if lst is None:
                self.map[key] = [(src, end)]
            else:
                lst.append((src, end))
                if len(lst) > self.KEEP:
                    del lst[0]

    def lookup(self, tokens: list[int], min_g: int, newest_first: bool) -> tuple[list[int], int] | None:
        """The place after the longest suffix of `tokens` (>= min_g long) that has a non-empty continuation."""
        for g in range(min(MAX_NGRAM, len(tokens)), min_g - 1, -1):
            lst = self.map.get(tuple(tokens[len(tokens) - g :]))
            if not lst:
                continue
            for src, end in (reversed(lst) if newest_first else lst):
                if end < len(src):
                    return src, end
        return None


class RequestDrafter:
    """Draft proposals for the samples of one request (see the module docstring)."""

    def __init__(self, prompt: list[int], spec: DraftSpec) -> None:
        self.spec = spec
        self.num_prompt = len(prompt)
        # Past sources are prompt + continuation, so matches may span the prompt's end.
        self.past: list[list[int]] = [list(prompt) + list(d) for d in spec.sequences if d]
        self.past_index = _Index()
        for src in self.past:
            for end in range(len(prompt), len(src)):
                self.past_index.add(src, end)
        self.local_index: _Index | None = None
        self.members: list[Sequence] = []  # the request's sequences (siblings feed the n-gram source)
        self.accepted = 0  # draft tokens accepted / tested over all the request's samples
        self.tested = 0
        if spec.ngram:
            self.local_index = _Index()
            for end in range(1, len(prompt)):
                self.local_index.add(prompt, end)

    def attach(self, seq: Sequence, sample_index: int) -> SpecState:
        st = SpecState(self)
        if self.past and seq.num_output_tokens == 0:
            st.cursor = (self.past[sample_index % len(self.past)], self.num_prompt)
        st.indexed = self.num_prompt
        self.members.append(seq)
        return st

    def _refresh_local(self) -> None:
        idx = self.local_index
        assert idx is not None
        for s in self.members:
            st = s.spec
            toks = s.token_ids
            while st.indexed < len(toks):
                st.indexed += 1
                idx.add(toks, st.indexed)

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to k draft tokens for `seq`'s next positions (possibly none)."""
        if k <= 0:
            return []
        st: SpecState = seq.spec
        toks = seq.token_ids
        if st.cursor is not None:
            src, pos = st.cursor
            if pos < len(src):
                return src[pos : pos + k]
            st.cursor = None
        hit = self.past_index.lookup(toks, MIN_NGRAM_PAST, newest_first=False) if self.past else None
        if hit is not None:
            st.cursor = hit
            return hit[0][hit[1] : hit[1] + k]
        if self.local_index is not None:
            self._refresh_local()
            hit = self.local_index.lookup(toks, MIN_NGRAM_LOCAL, newest_first=True)
            if hit is not None:
                st.cursor = hit  # may be the sample's own earlier text: its tokens never change, only grow
                return hit[0][hit[1] : hit[1] + k]
        return []

    def observe(self, seq: Sequence, emitted: Seq[int]) -> None:
        """Advance the sample's cursor past the tokens it just emitted, or drop it where they diverge."""
        st: SpecState = seq.spec
        if st.cursor is None or not emitted:
            return
        src, pos = st.cursor
        n = len(emitted)
        if src[pos : pos + n] == list(emitted):
            st.cursor = (src, pos + n)
        else:
            st.cursor = None


@dataclass
class SpecStats:
    """Speculation books of an engine (cumulative; read deltas)."""

    verify_steps: int = 0
    """Decode steps that verified at least one draft token."""
    draft_tokens: int = 0
    """Draft tokens fed to the model."""
    tested_tokens: int = 0
    """Draft tokens whose acceptance was decided (accepted ones and each first rejection)."""
    accepted_tokens: int = 0
    """Draft tokens accepted (emitted as drafted)."""
    decode_seq_steps: int = 0
    """Sum over decode steps of the sequences in them."""
    decode_emitted: int = 0
    """Tokens emitted by decode steps."""
    saved_s_est: float = 0.0
    """Estimated seconds saved: sum over decode steps of step time x (mean tokens per sequence - 1)."""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.tested_tokens if self.tested_tokens else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.decode_emitted / self.decode_seq_steps if self.decode_seq_steps else 0.0


class StepCost:
    """Online fit of a decode step's time as c0 + c1 * rows (least squares over the last `window` decode steps), so
    the draft-length rule's R0 = c0 / c1 follows the hardware: ~16 on a small CPU, hundreds on a GPU.

    NOTE: the fit is used only once the window holds steps of clearly different sizes (max rows >= 2 x min rows)
    and gives a positive intercept and slope; otherwise `overhead_rows` returns the configured prior."""

    def __init__(self, prior: float, window: int = 256, min_steps: int = 32) -> None:
        self.prior, self.window, self.min_steps = prior, window, min_steps
        self.obs: list[tuple[int, float]] = []

    def observe(self, rows: int, dt: float) -> None:
        self.obs.append((rows, dt))
        if len(self.obs) > self.window:
            del self.obs[: len(self.obs) - self.window]

    def overhead_rows(self) -> float:
        obs = self.obs
        if len(obs) < self.min_steps:
            return self.prior
        xs = [float(r) for r, _ in obs]
        if max(xs) < 2 * min(xs):
            return self.prior
        n = len(obs)
        mx = sum(xs) / n
        my = sum(t for _, t in obs) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        sxy = sum((x - mx) * (t - my) for x, (_, t) in zip(xs, obs))
        c1 = sxy / sxx
        c0 = my - c1 * mx
        if c1 <= 0 or c0 <= 0:
            return self.prior
        return min(max(c0 / c1, 1.0), 4096.0)

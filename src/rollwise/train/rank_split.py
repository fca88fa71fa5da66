"""Which sequences of a mini-batch each data-parallel rank trains on: token-balanced, groups kept together.

A pure function of the sequences (ids and prompt lengths) and the world size, so every rank computes the same
split from the same rollouts without talking to the others, and a test can check it with hand-made lists.

Units are the groups of sequences with identical prompt ids (a GRPO group): a group stays on one rank, so the
trainer's shared-prompt forward still runs its prompt once. When there are fewer groups than ranks the units are
single sequences instead (a rank with nothing to do wastes more than a prompt run twice). Units are assigned
longest first to the least-loaded rank (LPT scheduling: the load of the heaviest rank is within 4/3 of the
optimum), where a unit's load is the tokens its forward runs: the prompt once plus every completion.

The split changes which rank computes what, never the update: the loss of every sequence is normalised by the
counts of the whole mini-batch (`losses.normalizers`, taken before the split), and the ranks' gradients are
summed, so 1 and N ranks give the same update up to float reassociation.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_for_ranks(tokens: Sequence[Sequence[int]], prompt_lens: Sequence[int], world_size: int) -> list[list[int]]:
    """Sequence indices per rank (each list ascending; together a partition of range(len(tokens)))."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n = len(tokens)
    if world_size == 1:
        return [list(range(n))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in range(n):
        groups.setdefault(tuple(tokens[i][:prompt_lens[i]]), []).append(i)
    if len(groups) >= world_size:
        units = [(p_len_cost(ids, tokens, prompt_lens), ids) for ids in groups.values()]
    else:
        units = [(len(tokens[i]), [i]) for i in range(n)]
    units.sort(key=lambda u: (-u[0], u[1][0]))  # longest first; ties in input order (deterministic)
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for cost, ids in units:
        r = min(range(world_size), key=lambda k: (load[k], k))
        load[r] += cost
        out[r].extend(ids)
    return [sorted(x) for x in out]


def p_len_cost(ids: Sequence[int], tokens: Sequence[Sequence[int]], prompt_lens: Sequence[int]) -> int:
    """Tokens a shared-prompt forward runs for one group: its prompt once, then each sample's completion."""
    return prompt_lens[ids[0]] + sum(len(tokens[i]) - prompt_lens[i] for i in ids)

"""Tree rollouts in the report: the tree maths (`group_tree`) on hand-made groups, and the page's "Tree rollouts"
section for a synthetic run with trees (and its absence for a run without)."""

from __future__ import annotations

import json
import random
import re

import pytest

from rollwise.report import write_report
from rollwise.report.data import TreeFigures, TreeSample, group_tree
from rollwise.report.svg import tree_chart, tree_rows
from rollwise.store.writer import RolloutStore
from rollwise.types import Rollout, TreeSpec


def binary_tree() -> list[TreeSample]:
    """TreeSpec(fanout=2).parents(4) == [None, 0, 0, 1]: the root (20 tokens); sample 1 forks from it at 8 and ends
    at 12; sample 2 forks from it at 16 and ends at 22; sample 3 would fork from sample 1 after 12, but sample 1
    ended there: sample 3 is a copy of it (fork == length == 12)."""
    return [TreeSample(0, 20, None, 0, 1.0), TreeSample(1, 12, 0, 8, 0.0), TreeSample(2, 22, 0, 16, 1.0),
            TreeSample(3, 12, 1, 12, 0.0)]


def test_group_tree_cuts_a_binary_tree_of_four_leaves_with_a_copy():
    t = group_tree(binary_tree())
    segs = [(s.sample, s.start, s.end, s.parent) for s in t.segments]
    # The root's own span is cut where its children fork (8 and 16); each child's first segment continues the
    # root's segment that ends at its fork.
    assert segs == [(0, 0, 8, None), (0, 8, 16, 0), (0, 16, 20, 1), (1, 8, 12, 0), (2, 16, 22, 1)]
    assert [s.tokens for s in t.segments] == [8, 8, 4, 4, 6]
    assert t.leaf == {0: 2, 1: 3, 2: 4, 3: 3}  # the copy ends where its parent does
    assert t.copies == [3] and t.leaves == 4 and t.distinct_leaves == 3
    assert t.generated == 20 + 4 + 6 + 0 == sum(s.tokens for s in t.segments)
    assert t.independent == 20 + 12 + 22 + 12
    f = TreeFigures()
    f.add(t)
    assert f.generated_per_leaf == 7.5 and f.independent_per_leaf == 16.5 and f.ratio == pytest.approx(30 / 66)
    assert TreeSpec(fanout=2).parents(4) == [s.parent for s in binary_tree()]


def test_a_child_forking_before_its_parents_own_tokens_hangs_from_the_ancestor():
    """Sample 2 is sample 1's child but forks at 2, before sample 1's own tokens (from 4): its branch point is on the
    root's span, and the root is cut there too."""
    t = group_tree([TreeSample(0, 10), TreeSample(1, 10, 0, 4), TreeSample(2, 9, 1, 2)])
    assert t.owner == {0: None, 1: 0, 2: 0}
    assert [(s.sample, s.start, s.end, s.parent) for s in t.segments] == [
        (0, 0, 2, None), (0, 2, 4, 0), (0, 4, 10, 1), (1, 4, 10, 1), (2, 2, 9, 0)]
    assert t.generated == 10 + 6 + 7 and t.copies == []


def test_a_child_forking_at_its_parents_own_start_shares_its_branch_point():
    t = group_tree([TreeSample(0, 6), TreeSample(1, 6, 0, 3), TreeSample(2, 5, 1, 3)])
    assert t.owner[2] == 1 and t.segments[t.leaf[2]].parent == t.segments[t.leaf[1]].parent == 0


@pytest.mark.parametrize("samples, message", [
    ([TreeSample(0, 5), TreeSample(1, 5, 4, 2)], "sample 1: tree_parent 4 is not a sample of the group"),
    ([TreeSample(0, 5, 1, 0), TreeSample(1, 5, 0, 2)], "its tree_parent links form a cycle"),
    ([TreeSample(0, 5), TreeSample(1, 9, 0, 7)], "sample 1: forks at token 7, after sample 0's path ends (5 tokens)"),
    ([TreeSample(0, 5), TreeSample(0, 4)], "sample 0 appears twice"),
    ([TreeSample(0, 5), TreeSample(1, 5, 0, 6)], "sample 1: tree_fork 6 is outside [0, 5]"),
    ([TreeSample(0, 5, None, 2)], "sample 0: tree_fork 2 without a tree_parent"),
])
def test_group_tree_refuses_links_that_are_not_a_tree(samples, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        group_tree(samples)


def random_tree(rng: random.Random, n: int, roots: int = 1) -> list[TreeSample]:
    """A tree as the engine grows one (TreeSpec's plan; a child forks inside its parent's own span, or copies it)."""
    plan = TreeSpec(fanout=rng.choice([2, 3]), roots=roots).parents(n)
    out: list[TreeSample] = []
    for i, p in enumerate(plan):
        if p is None:
            out.append(TreeSample(i, rng.randint(0, 30), None, 0, float(rng.random() < 0.5)))
            continue
        parent = out[p]
        fork = rng.randint(parent.fork or 0, parent.length)
        copy = fork == parent.length and rng.random() < 0.7  # the parent ended before the branch point
        length = fork if copy else fork + rng.randint(1, 25)  # a child that samples samples at least one token
        out.append(TreeSample(i, length, p, fork, None if rng.random() < 0.1 else float(rng.random() < 0.5)))
    return out


def test_random_trees_cut_every_own_token_once_and_their_drawing_never_crosses_a_line():
    rng = random.Random(3)
    for _ in range(150):
        samples = random_tree(rng, rng.randint(1, 12), roots=rng.choice([1, 1, 2]))
        t = group_tree(samples)
        assert t.generated == sum(s.tokens for s in t.segments) == sum(s.length - (s.fork or 0) for s in samples)
        for s in samples:  # each path, walked back from its leaf, is the sample's whole completion
            seg, covered = t.leaf[s.index], 0
            while seg is not None:
                covered += t.segments[seg].tokens
                seg = t.segments[seg].parent
            assert covered == s.length
        rows = tree_rows(t)
        assert sorted(rows) == [s.index for s in samples]
        y = {i: k for k, i in enumerate(rows)}
        for s in samples:
            o = t.owner[s.index]
            if o is None:
                continue
            x, lo, hi = t.fork[s.index], min(y[o], y[s.index]), max(y[o], y[s.index])
            crossed = [g for g in t.segments if lo < y[g.sample] < hi and g.start < x < g.end]
            assert not crossed, (samples, s.index, crossed)
        page = tree_chart(t)
        assert page.count('class="data leaf"') == len(samples) and page.count('class="data seg"') == len(t.segments)


# ------------------------------------------------------------------------------------------------- the page

VOCAB = 50


def _rollouts(step: int, group: int, samples: list[TreeSample], rng: random.Random) -> list[Rollout]:
    """Store rows for a planned tree: a child's tokens are its parent's up to its fork, then its own."""
    tokens: dict[int, list[int]] = {}
    out = []
    for s in samples:
        own = [rng.randrange(VOCAB) for _ in range(s.length - (s.fork or 0))]
        ids = (tokens[s.parent][: s.fork] if s.parent is not None else []) + own
        tokens[s.index] = ids
        out.append(Rollout(
            prompt_id=f"p{group}", group_id=f"s{step}-g{group}", sample_index=s.index, prompt_token_ids=[1, 2, 3],
            completion_token_ids=ids, logprobs=[-0.5] * len(ids), weight_versions=[step] * len(ids),
            loss_mask=[1] * len(ids), text="x" * len(ids), finish_reason="stop", reward=s.reward,
            reward_parts={} if s.reward is None else {"correct": s.reward}, advantage=0.0, step=step,
            tree_parent=s.parent, tree_fork=s.fork, token_advantages=[0.25] * len(ids)))
    return out


@pytest.fixture
def tree_run(tmp_path):
    """4 steps of 3 groups of 4 leaves. The first group of the last step is `binary_tree()` (3 distinct leaves);
    step 1's group 2 has 4 distinct leaves (no copy), the most of any group; every other group is random."""
    rng = random.Random(7)
    run = tmp_path / "run-tree"
    run.mkdir()
    store = RolloutStore(run)
    planned: dict[tuple[int, int], list[TreeSample]] = {}
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(4):
            rows = []
            for g in range(3):
                if (step, g) == (3, 0):
                    samples = binary_tree()
                elif (step, g) == (1, 2):
                    samples = [TreeSample(0, 20, None, 0, 1.0), TreeSample(1, 15, 0, 6, 1.0),
                               TreeSample(2, 18, 0, 14, 0.0), TreeSample(3, 19, 1, 9, 1.0)]
                else:
                    while True:  # at most 3 distinct leaves, so the two drawn groups are the planned ones
                        samples = random_tree(rng, 4)
                        if group_tree(samples).distinct_leaves <= 3:
                            break
                planned[(step, g)] = samples
                rows += _rollouts(step, g, samples, rng)
            store.write_step(step, rows)
            f.write(json.dumps({"step": step, "wall_s": step + 1.0, "reward_mean": 0.5}) + "\n")
    (run / "summary.json").write_text(json.dumps({"steps": 4}))
    return run, planned


def _section(page: str) -> str:
    m = re.search(r"<h2>Tree rollouts</h2><section id='trees'>(.*?)</section>", page, re.S)
    assert m, "no tree section"
    return m.group(1)


def test_the_report_draws_the_trees_of_a_tree_run(tree_run):
    run, planned = tree_run
    page = write_report(run).read_text()
    section = _section(page)
    figures = re.findall(r'<figure class="plot tree" id="tree-\d+" data-tree-group="([^"]+)" data-step="(\d+)" '
                         r'data-leaves="(\d+)">(.*?)</figure>', section, re.S)
    assert [(g, int(s)) for g, s, _, _ in figures] == [("s3-g0", 3), ("s1-g2", 1)]
    for gid, step, leaves, body in figures:
        samples = planned[(int(step), int(gid[-1]))]
        assert int(leaves) == len(samples) == body.count('class="data leaf"') == 4
        assert body.count('class="data seg"') == len(group_tree(samples).segments)
    last = figures[0][3]
    assert "first group of the last step" in last and "3 distinct, 1 copy)" in last and "(copy of #1)" in last
    # Segment labels: the binary tree's segments carry their token counts 8, 8, 4, 4 and 6.
    assert sorted(int(x) for x in re.findall(r'class="seglabel">(\d+)<', last)) == [4, 4, 6, 8, 8]
    # Leaf colours: rewards 1, 0, 1, 0.
    leaves = re.findall(r'class="data leaf" data-sample="(\d)" [^>]*fill="(#[0-9a-f]+)"', last)
    assert dict(leaves) == {"0": "#16a34a", "1": "#dc2626", "2": "#16a34a", "3": "#dc2626"}
    # The figures: generated tokens per leaf (sum of len - fork) against completion tokens per leaf.
    every = [s for samples in planned.values() for s in samples]
    generated = sum(s.length - (s.fork or 0) for s in every)
    completion = sum(s.length for s in every)
    copies = sum(1 for s in every if s.parent is not None and s.fork == s.length)
    overall = re.search(r"<tr><td>all steps</td>(.*?)</tr>", section).group(1)
    cells = re.findall(r"<td>([^<]*)</td>", overall)
    assert cells == ["12", "48", cells[2], str(copies), f"{generated / 48:.1f}", f"{completion / 48:.1f}",
                     f"{generated / completion:.2f}×"]
    assert re.search(r"<tr><td>step 3</td><td>3</td><td>12</td>", section)
    assert 'data-plot="tree_tokens"' in section
    # The browser says where each child branched.
    data = json.loads(re.search(r'id="rollout-data">(.*?)</script>', page, re.S).group(1))
    g = next(g for g in data["groups"] if g["group_id"] == "s3-g0")
    assert [s.get("tree") for s in g["samples"]] == [None, [0, 8], [0, 16], [1, 12]]


def test_a_run_without_trees_has_no_tree_section(run_dir):
    page = write_report(run_dir).read_text()
    assert "Tree rollouts" not in page and "id='trees'" not in page and 'class="data leaf"' not in page


def test_a_group_whose_fork_runs_past_its_parent_is_named_not_drawn(tree_run):
    """The store checks a fork against the sample's own length; one past its parent's end is caught here."""
    run, planned = tree_run
    store = RolloutStore(run)
    rows = store.read(steps=[3])
    bad = next(r for r in rows if r.group_id == "s3-g1" and r.tree_parent is not None)
    parent = next(r for r in rows if r.group_id == "s3-g1" and r.sample_index == bad.tree_parent)
    extra = len(parent.completion_token_ids) + 3 - len(bad.completion_token_ids)
    if extra > 0:
        for name in ("completion_token_ids", "logprobs", "weight_versions", "loss_mask", "token_advantages"):
            getattr(bad, name).extend(getattr(bad, name)[-1:] * extra if getattr(bad, name) else [0] * extra)
    bad.tree_fork = len(parent.completion_token_ids) + 1
    store.write_step(3, rows)
    page = write_report(run).read_text()
    assert f"step 3 group s3-g1: sample {bad.sample_index}: forks at token {bad.tree_fork}" in page
    assert re.search(r"<tr><td>step 3</td><td>2</td><td>8</td>", _section(page))


def test_a_run_stored_before_the_tree_columns_still_reports(run_dir):
    """Shards without tree_parent / tree_fork / token_advantages (an older rollwise): the page builds, no trees."""
    import pyarrow.parquet as pq

    from rollwise.store.schema import ADDED_COLUMNS

    for p in sorted((run_dir / "rollouts").glob("step-*.parquet")):
        t = pq.read_table(p)
        pq.write_table(t.drop_columns(list(ADDED_COLUMNS)).replace_schema_metadata(t.schema.metadata), p,
                       write_page_checksum=True)
    assert "tree_parent" not in pq.read_schema(run_dir / "rollouts" / "step-000019.parquet").names
    page = write_report(run_dir).read_text()
    assert "Tree rollouts" not in page and "skipped unreadable shard" not in page
    assert "embeds" in page and 'data-plot="status_by_step"' in page

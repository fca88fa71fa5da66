"""Tiny SVG charts drawn in Python: line charts, histograms, stacked bars and tree rollouts' trees, as inline markup.

Why not a plotting library: the report must open with no network and no extra install, and the charts it
needs are few and plain. Every data mark carries `class="data"` (tests and readers can tell a drawn chart
from an empty frame) and a `<title>` tooltip where it helps.

Deliberately left out: zoom, log axes, interactivity beyond tooltips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from rollwise.report.data import GroupTree

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")

W, H = 460, 250
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM = 52, 14, 30, 38


@dataclass
class Series:
    """One named line: xs and ys of equal length (non-finite points are dropped when drawn)."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.1e}"
    return f"{v:.4g}"


class _Frame:
    """Axes and the data-to-pixel mapping shared by every chart type."""

    def __init__(self, x_lo: float, x_hi: float, y_lo: float, y_hi: float, x_label: str, y_label: str) -> None:
        # x spans the data exactly (ticks inside it); y is widened to round ticks, so bars and lines sit on them.
        if x_hi <= x_lo:
            x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
        eps = (x_hi - x_lo) * 1e-9
        self.xt = [t for t in nice_ticks(x_lo, x_hi) if x_lo - eps <= t <= x_hi + eps]
        self.yt = nice_ticks(y_lo, y_hi)
        self.x0, self.x1 = x_lo, x_hi
        self.y0, self.y1 = self.yt[0], self.yt[-1]
        self.x_label, self.y_label = x_label, y_label

    def px(self, x: float) -> float:
        return M_LEFT + (x - self.x0) / ((self.x1 - self.x0) or 1.0) * (W - M_LEFT - M_RIGHT)

    def py(self, y: float) -> float:
        return H - M_BOTTOM - (y - self.y0) / ((self.y1 - self.y0) or 1.0) * (H - M_TOP - M_BOTTOM)

    def axes(self) -> list[str]:
        out = []
        for t in self.yt:
            y = self.py(t)
            out.append(f'<line x1="{M_LEFT}" x2="{W - M_RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
            out.append(f'<text x="{M_LEFT - 5}" y="{y + 3.5:.1f}" text-anchor="end" class="tick">{fmt(t)}</text>')
        for t in self.xt:
            x = self.px(t)
            out.append(f'<text x="{x:.1f}" y="{H - M_BOTTOM + 14}" text-anchor="middle" class="tick">{fmt(t)}</text>')
        out.append(
            f'<path class="axis" d="M{M_LEFT},{M_TOP} V{H - M_BOTTOM} H{W - M_RIGHT}" fill="none"/>'
            f'<text x="{(M_LEFT + W - M_RIGHT) / 2:.0f}" y="{H - 6}" text-anchor="middle" class="label">{escape(self.x_label)}</text>'
            f'<text transform="translate(12,{(M_TOP + H - M_BOTTOM) / 2:.0f}) rotate(-90)" text-anchor="middle" class="label">{escape(self.y_label)}</text>'
        )
        return out


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _legend(entries: Sequence[tuple[str, str]]) -> str:
    """(name, colour) pairs in a row above the plot area."""
    parts, x = [], M_LEFT
    for name, color in entries:
        parts.append(f'<rect x="{x}" y="8" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14}" y="17" class="legend">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return "".join(parts)


def _svg(body: Sequence[str], aria: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(aria)}">' + "".join(body) + "</svg>"
    )


def _finite_pairs(s: Series) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in zip(s.xs, s.ys) if _ok(x) and _ok(y)]


def _ok(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, y_zero: bool = False) -> str | None:
    """Lines with point markers; None when no series has a finite point (the caller skips the chart)."""
    pts = [(_color(i), s, _finite_pairs(s)) for i, s in enumerate(series)]
    pts = [(c, s, p) for c, s, p in pts if p]
    if not pts:
        return None
    xs = [x for _, _, p in pts for x, _ in p]
    ys = [y for _, _, p in pts for _, y in p]
    y_lo, y_hi = min(ys), max(ys)
    if y_zero:
        y_lo, y_hi = min(0.0, y_lo), max(0.0, y_hi)
    f = _Frame(min(xs), max(xs), y_lo, y_hi, x_label, y_label)
    body = f.axes()
    for color, s, p in pts:
        d = " ".join(f"{'M' if j == 0 else 'L'}{f.px(x):.1f},{f.py(y):.1f}" for j, (x, y) in enumerate(p))
        body.append(f'<path class="data line" d="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        if len(p) <= 80:
            for x, y in p:
                body.append(
                    f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.4" fill="{color}">'
                    f"<title>{escape(s.name)}: {fmt(y)} at {escape(x_label)} {fmt(x)}</title></circle>"
                )
    body.append(_legend([(s.name, c) for c, s, _ in pts]))
    return _svg(body, f"{y_label} against {x_label}")


def histogram(values: Sequence[float], *, x_label: str, bins: int = 24, name: str = "count") -> str | None:
    """Counts of `values` in equal-width bins; None when there are no finite values."""
    vals = [float(v) for v in values if _ok(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if hi == lo:
        hi = lo + 1
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in vals:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    f = _Frame(lo, hi, 0, max(counts), x_label, name)
    body = f.axes()
    for i, c in enumerate(counts):
        if c == 0:
            continue
        a, b = lo + i * width, lo + (i + 1) * width
        x0, x1, y = f.px(a), f.px(b), f.py(c)
        body.append(
            f'<path class="data bar" d="M{x0 + 0.5:.1f},{f.py(0):.1f} V{y:.1f} H{x1 - 0.5:.1f} V{f.py(0):.1f} Z" fill="{_color(0)}">'
            f"<title>{fmt(a)}–{fmt(b)}: {c}</title></path>"
        )
    return _svg(body, f"distribution of {x_label}")


def stacked_bars(xs: Sequence[float], stacks: Sequence[Series], *, x_label: str, y_label: str) -> str | None:
    """One bar per x, split into the stacks' values (missing or non-finite parts count as 0)."""
    present = [(_color(i), s) for i, s in enumerate(stacks) if any(_ok(y) for y in s.ys)]
    if not xs or not present:
        return None
    totals = [sum(float(s.ys[i]) for _, s in present if _ok(s.ys[i])) for i in range(len(xs))]
    half = 0.4 * (min((b - a for a, b in zip(xs, xs[1:]) if b > a), default=1.0))
    f = _Frame(min(xs) - half, max(xs) + half, 0, max(totals) or 1.0, x_label, y_label)
    body = f.axes()
    bar_w = max(1.0, f.px(xs[0] + half) - f.px(xs[0] - half))
    for i, x in enumerate(xs):
        base = 0.0
        for color, s in present:
            v = float(s.ys[i]) if _ok(s.ys[i]) else 0.0
            if v <= 0:
                continue
            top = base + v
            x0 = f.px(x) - bar_w / 2
            body.append(
                f'<path class="data bar" d="M{x0:.1f},{f.py(base):.1f} V{f.py(top):.1f} h{bar_w:.1f} V{f.py(base):.1f} Z" fill="{color}">'
                f"<title>{escape(x_label)} {fmt(x)} · {escape(s.name)}: {fmt(v)}</title></path>"
            )
            base = top
    body.append(_legend([(s.name, c) for c, s in present]))
    return _svg(body, f"{y_label} split by part against {x_label}")


# ------------------------------------------------------------------------------------------------- tree drawing
TREE_W = 640
T_LEFT, T_RIGHT, T_TOP, T_BOTTOM = 52, 150, 34, 34
RIGHT, WRONG, UNSCORED = "#16a34a", "#dc2626", "#9ca3af"


def leaf_color(reward: float | None) -> str:
    """Green for a right answer (reward > 0), red for a wrong one, grey when it has no reward."""
    if reward is None or not _ok(reward):
        return UNSCORED
    return RIGHT if reward > 0 else WRONG


def tree_rows(tree: GroupTree) -> list[int]:
    """Samples top to bottom: each sample, then the samples hanging from it, latest fork first, each followed by
    its own. NOTE: with that order no connector crosses a line: a connector falls from its fork past the rows of
    siblings that fork later (their lines start right of it) and of their subtrees (which hang at or after them)."""
    kids: dict[int | None, list[int]] = {}
    for s in tree.samples:
        kids.setdefault(tree.owner[s.index], []).append(s.index)
    out: list[int] = []
    stack = sorted(kids.get(None, []), reverse=True)
    while stack:
        i = stack.pop()
        out.append(i)
        # pushed in reverse of the order they are drawn in: latest fork (then lowest index) first
        stack.extend(sorted(kids.get(i, []), key=lambda j: (tree.fork[j], -j)))
    return out


def tree_chart(tree: GroupTree, *, caption: str = "") -> str:
    """One group's tree: x is the completion position, one row per sample. Each segment is a thick line as long as
    its tokens (labelled with their count), a child falls from its parent's line at its fork, a copy by a dashed
    line, and each sample ends on a leaf coloured by its reward. Every segment carries `class="data seg"` and every
    leaf `class="data leaf"`, so a reader (or a test) can count them."""
    rows = tree_rows(tree)
    by = {s.index: s for s in tree.samples}
    copies = set(tree.copies)
    row_h = 22 if len(rows) <= 24 else 14
    height = T_TOP + row_h * max(len(rows), 1) + T_BOTTOM
    longest = max((s.length for s in tree.samples), default=0) or 1
    plot_w = TREE_W - T_LEFT - T_RIGHT

    def px(pos: float) -> float:
        return T_LEFT + pos / longest * plot_w

    y = {i: T_TOP + row_h * (k + 0.5) for k, i in enumerate(rows)}
    body: list[str] = []
    base = T_TOP + row_h * len(rows)
    for t in nice_ticks(0, longest):
        if t > longest:
            continue
        body.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{T_TOP}" y2="{base:.1f}" class="grid"/>')
        body.append(f'<text x="{px(t):.1f}" y="{base + 14:.1f}" text-anchor="middle" class="tick">{fmt(t)}</text>')
    body.append(f'<text x="{T_LEFT + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle" class="label">completion '
                f'position (tokens)</text>')
    for i in rows:  # connectors under the lines
        o = tree.owner[i]
        if o is None:
            body.append(f'<text x="{T_LEFT - 6}" y="{y[i] + 3.5:.1f}" text-anchor="end" class="tick">prompt</text>')
            continue
        x = px(tree.fork[i])
        dash = ' stroke-dasharray="3,2"' if i in copies else ""
        body.append(f'<path class="link" d="M{x:.1f},{y[o]:.1f} V{y[i]:.1f}" stroke="#9ca3af" stroke-width="1.2"'
                    f' fill="none"{dash}/>')
        body.append(f'<circle class="fork" cx="{x:.1f}" cy="{y[o]:.1f}" r="2.2" fill="#374151"/>')
    for seg in tree.segments:
        x0, x1, yy = px(seg.start), px(seg.end), y[seg.sample]
        body.append(f'<path class="data seg" d="M{x0:.1f},{yy:.1f} H{x1:.1f}" stroke="{_color(0)}" stroke-width="3" '
                    f'fill="none"><title>sample #{seg.sample}: tokens {seg.start}–{seg.end} ({seg.tokens} tokens)'
                    f'</title></path>')
        if x1 - x0 >= 6 * len(str(seg.tokens)) + 4:
            body.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{yy - 4:.1f}" text-anchor="middle" class="seglabel">'
                        f'{seg.tokens}</text>')
    for i in rows:
        s = by[i]
        x, yy = px(s.length), y[i]
        reward = "–" if s.reward is None or not _ok(s.reward) else fmt(s.reward)
        if i in copies:
            what = f"copy of #{s.parent}"
        elif s.parent is None:
            what = f"{s.length} tokens"
        else:
            what = f"{s.length - tree.fork[i]} own tokens from {tree.fork[i]} (branched from #{s.parent})"
        body.append(f'<circle class="data leaf" data-sample="{i}" cx="{x:.1f}" cy="{yy:.1f}" r="4.5" '
                    f'fill="{leaf_color(s.reward)}" stroke="#fff" stroke-width="1"><title>sample #{i}: reward {reward}'
                    f' · {s.length} tokens · {escape(what)}</title></circle>')
        label = f"#{i} r={reward}" + (f" (copy of #{s.parent})" if i in copies else "")
        body.append(f'<text x="{x + 8:.1f}" y="{yy + 3.5:.1f}" class="leaflabel">{escape(label)}</text>')
    legend, lx = [], T_LEFT
    for name, color in (("reward > 0", RIGHT), ("reward ≤ 0", WRONG), ("no reward", UNSCORED)):
        legend.append(f'<circle cx="{lx + 5}" cy="13" r="4.5" fill="{color}"/><text x="{lx + 14}" y="17" '
                      f'class="legend">{escape(name)}</text>')
        lx += 26 + 7 * len(name)
    legend.append(f'<path d="M{lx},13 h18" stroke="#9ca3af" stroke-dasharray="3,2"/><text x="{lx + 22}" y="17" '
                  'class="legend">copy (no own tokens)</text>')
    body.extend(legend)
    aria = caption or f"tree of {len(rows)} samples"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {TREE_W} {height}" width="{TREE_W}" '
            f'height="{height}" role="img" aria-label="{escape(aria)}">' + "".join(body) + "</svg>")

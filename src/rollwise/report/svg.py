"""Tiny SVG charts drawn in Python: line charts, histograms and stacked bars, as inline markup.

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

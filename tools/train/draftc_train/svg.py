"""Line plots as SVG without a plotting dependency (loss curves).

    line_plot("loss.svg", "drafter loss",
              {"train": [(0, 5.1), (100, 3.2)], "eval": [(0, 5.0), (100, 3.4)]},
              xlabel="step", ylabel="loss", logy=False)
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) if lo else 1.0)
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * mag
        if step >= raw:
            break
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 12))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.0e}"
    if a >= 1000:
        return f"{v / 1000:g}k" if v % 1000 == 0 else f"{v:.0f}"
    return f"{v:.4g}"


def line_plot(path, title: str, series: dict[str, list[tuple[float, float]]],
              xlabel: str = "step", ylabel: str = "loss", logy: bool = False,
              width: int = 800, height: int = 480, logx: bool = False, markers: bool = False) -> None:
    """Writes an SVG line plot of the named ``series`` (lists of (x, y)) to ``path``.

    With ``logy`` the y axis is log10 (non-positive y values are skipped);
    with ``logx`` the x axis is log2, ticked at 1000·2^k (non-positive x
    values are skipped). ``markers`` draws a dot at every point.
    Non-finite points are skipped.
    """
    ml, mr, mt, mb = 70, 20, 40, 55
    legend_w = 0
    names = list(series)
    if names:
        legend_w = 30 + 7 * max(len(n) for n in names)
    pw, ph = width - ml - mr - legend_w, height - mt - mb

    def ok(x, y):
        return math.isfinite(x) and math.isfinite(y) and (y > 0 or not logy) and (x > 0 or not logx)

    tx = (lambda x: math.log2(x)) if logx else (lambda x: x)
    pts = {k: [(tx(float(x)), float(y)) for x, y in v if ok(float(x), float(y))] for k, v in series.items()}
    xs = [x for v in pts.values() for x, _ in v]
    ys = [y for v in pts.values() for _, y in v]
    if not xs:
        xs, ys = [0.0, 1.0], [1.0, 10.0] if logy else [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    ty = (lambda y: math.log10(y)) if logy else (lambda y: y)
    y0, y1 = min(ty(y) for y in ys), max(ty(y) for y in ys)
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = 0.04 * (y1 - y0)
    y0, y1 = y0 - pad, y1 + pad

    def sx(x):
        return ml + (x - x0) / (x1 - x0) * pw

    def sy(v):  # v already transformed
        return mt + ph - (v - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{ml + pw / 2:.1f}" y="24" text-anchor="middle" font-size="16">{escape(title)}</text>']
    # grid + ticks
    if logx:
        xticks = [(math.log2(1000 * 2.0 ** k), 1000 * 2.0 ** k) for k in range(-10, 30)
                  if x0 <= math.log2(1000 * 2.0 ** k) <= x1]
    else:
        xticks = [(t, t) for t in nice_ticks(x0, x1)]
    for t, label in xticks:
        X = sx(t)
        out.append(f'<line x1="{X:.1f}" y1="{mt}" x2="{X:.1f}" y2="{mt + ph}" stroke="#e5e5e5"/>')
        out.append(f'<line x1="{X:.1f}" y1="{mt + ph}" x2="{X:.1f}" y2="{mt + ph + 5}" stroke="black"/>')
        out.append(f'<text x="{X:.1f}" y="{mt + ph + 18}" text-anchor="middle">{_fmt(label)}</text>')
    if logy and y1 - y0 < 1.5:
        # Less than ~1.5 decades: round values in linear space, placed on the log axis.
        yticks = [(math.log10(t), t) for t in nice_ticks(10 ** y0, 10 ** y1, 7) if t > 0]
    elif logy:
        yticks = []
        for e in range(math.floor(y0), math.ceil(y1) + 1):
            for m in ((1, 2, 5) if y1 - y0 < 4 else (1,)):
                v = math.log10(m) + e
                if y0 <= v <= y1:
                    yticks.append((v, m * 10.0 ** e))
    else:
        yticks = [(t, t) for t in nice_ticks(y0, y1)]
    for v, label in yticks:
        Y = sy(v)
        out.append(f'<line x1="{ml}" y1="{Y:.1f}" x2="{ml + pw}" y2="{Y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<line x1="{ml - 5}" y1="{Y:.1f}" x2="{ml}" y2="{Y:.1f}" stroke="black"/>')
        out.append(f'<text x="{ml - 8}" y="{Y + 4:.1f}" text-anchor="end">{_fmt(label)}</text>')
    # axes
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    xlab = escape(xlabel + (" (log scale)" if logx else ""))
    out.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 12}" text-anchor="middle">{xlab}</text>')
    ylab = escape(ylabel + (" (log scale)" if logy else ""))
    out.append(f'<text x="16" y="{mt + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {mt + ph / 2:.1f})">{ylab}</text>')
    # series
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        p = sorted(pts[name])
        if len(p) == 1 or markers:
            for x, y in p:
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(ty(y)):.1f}" r="4" fill="{color}"/>')
        if len(p) > 1:
            d = " ".join(f"{sx(x):.1f},{sy(ty(y)):.1f}" for x, y in p)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{d}"/>')
        ly = mt + 10 + 18 * i
        lx = ml + pw + 12
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 18}" y2="{ly}" stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{lx + 24}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")

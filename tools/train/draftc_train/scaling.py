"""`python -m draftc_train scaling FILE.json [--out FILE.svg]`

Plots how a drafter's held-out accuracy grows with its training data and
where a log-linear extrapolation of that growth meets the accuracy a τ
target needs (docs/training.md, "What the data curve says").

FILE.json holds measured points, never computed ones:

    {"title": "...", "metric": "...",
     "needed": {"value": 0.574, "label": "..."},
     "pool": {"train_sequences": 42000, "label": "..."},
     "points": [{"series": "fresh runs", "train_sequences": 2850, "value": 0.34, "what": "..."}, ...],
     "slopes_from": ["fresh runs", "continued 3,000 steps"]}

Each series of `slopes_from` with two or more points gives a slope per
doubling of the training sequences (least squares on log2); the
extrapolation continues the highest point with their mean slope out to the
pool's size (every prompt the source holds) and to the needed value.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .svg import line_plot


def slope(points):
    """Least-squares slope of value over log2(train_sequences)."""
    xs = [math.log2(p["train_sequences"]) for p in points]
    ys = [p["value"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        raise ValueError("a series' points all have the same size")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


def by_series(points):
    """The points grouped by their series name, in first-seen order."""
    series = {}
    for p in points:
        series.setdefault(p["series"], []).append(p)
    return series


def analyse(spec):
    series = by_series(spec["points"])
    slopes = {name: slope(series[name]) for name in spec.get("slopes_from", []) if len(series.get(name, [])) > 1}
    if not slopes:
        raise ValueError("no series in slopes_from has two points")
    per_doubling = sum(slopes.values()) / len(slopes)
    top = max(spec["points"], key=lambda p: p["value"])
    needed = spec["needed"]["value"]
    doublings = (needed - top["value"]) / per_doubling if per_doubling > 0 else math.inf
    at_needed = top["train_sequences"] * 2 ** doublings if math.isfinite(doublings) else math.inf
    pool = spec["pool"]["train_sequences"]
    at_pool = top["value"] + per_doubling * math.log2(pool / top["train_sequences"])
    return dict(slopes=slopes, per_doubling=per_doubling, top=top, sequences_for_needed=at_needed,
                value_at_pool=at_pool)


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m draftc_train scaling")
    ap.add_argument("spec", type=Path, help="the measured points (JSON, see the module docstring)")
    ap.add_argument("--out", type=Path, default=None, help="SVG to write (default: the spec's path, .svg)")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    try:
        res = analyse(spec)
    except (KeyError, ValueError) as e:
        raise SystemExit(f"{args.spec}: {e}")
    top, pool = res["top"], spec["pool"]["train_sequences"]
    series = {name: [(p["train_sequences"], p["value"]) for p in points]
              for name, points in by_series(spec["points"]).items()}
    end = max(pool, min(res["sequences_for_needed"], 64 * pool))
    ext = [(top["train_sequences"], top["value"])]
    x = top["train_sequences"]
    while x < end:
        x = min(end, x * 2)
        ext.append((x, top["value"] + res["per_doubling"] * math.log2(x / top["train_sequences"])))
    series[f"log-linear extrapolation (+{res['per_doubling']:.3f} per doubling)"] = ext
    lo = min(p["train_sequences"] for p in spec["points"])
    series[spec["needed"]["label"]] = [(lo, spec["needed"]["value"]), (end, spec["needed"]["value"])]
    series[spec["pool"]["label"]] = [(pool, min(v for _, v in ext + series[spec["needed"]["label"]]) - 0.02),
                                     (pool, spec["needed"]["value"] + 0.02)]
    out = args.out or args.spec.with_suffix(".svg")
    line_plot(out, spec["title"], series, xlabel="training sequences", ylabel=spec["metric"],
              logx=True, markers=True, width=960)
    summary = dict(slopes_per_doubling={k: round(v, 4) for k, v in res["slopes"].items()},
                   mean_slope_per_doubling=round(res["per_doubling"], 4),
                   extrapolated_at_pool=round(res["value_at_pool"], 4),
                   training_sequences_for_needed=(round(res["sequences_for_needed"])
                                                  if res["sequences_for_needed"] < 1e12 else "over 1e12"))
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0

"""`python -m draftc_train curves DRAFTER --out DIR [--base-steps S] [...] [-- TRAIN-ARGS]`

Curves that separate training steps from training data (issue 32, item 1).
Runs `python -m draftc_train train DRAFTER` up to five times on the same records
and the same held-out split, each from the module's initialisation with its
own schedule (warm-up and cosine decay over the run's own steps):

- `s1`, `s2`, `s4`: every training sequence, for S, 2S and 4S steps
  (fixed data, steps doubled twice);
- `h1`, `h4`: the first half of the training sequences
  (`--train-sequences`), for S and 4S steps (fixed steps, half the data;
  against `s1` and `s4`: where the full data's training-split accuracy has
  pulled away from its held-out one, half the data shows whether data is
  what limits).

Every run also evaluates the result on the first `--eval-train` sequences
of its own training split with the held-out split's code, so `s4` (about
2k sequences seen many times) is the over-fitting probe: held-out accuracy
far below training-split accuracy means the drafter memorises; both low and
close means it underfits and more steps or capacity would help.

`--variant NAME="TRAIN-ARGS"` adds a run on every training sequence for 2S
steps (as `s2`) with further `train` arguments, for A/B tests of recipe
items at equal steps and data against `s2` (issue 32, item 2), e.g.
`--variant noise="--recipe noise=0.2"`.

A run whose summary exists is skipped, and an interrupted one resumes from
its checkpoint, so the command can be re-run until it completes. Writes
DIR/curves.json, DIR/curves.md (the table) and DIR/curves.svg (held-out and
training-split depth-1 accuracy against steps, the half-data run beside).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .svg import line_plot

RUNS = (  # name, steps multiple, data share
    ("s1", 1, 1.0),
    ("s2", 2, 1.0),
    ("s4", 4, 1.0),
    ("h1", 1, 0.5),
    ("h4", 4, 0.5),
)


def run_one(args, name, mult, share, extra):
    work = args.out / name
    summary = work / "summary.json"
    if summary.exists():
        print(f"[curves] {name}: done before ({summary})", flush=True)
        return json.loads(summary.read_text())
    cmd = [sys.executable, "-m", "draftc_train", "train", args.drafter, "--records", str(args.records),
           "--max-len", str(args.max_len), "--steps", str(args.base_steps * mult), "--threads", str(args.threads),
           "--work", str(work), "--resume", "--no-export", "--summary", str(summary),
           "--eval-train", str(args.eval_train), *extra]
    if share < 1.0:
        cmd += ["--train-sequences", str(max(1, int(args.train_sequences * share)))]
    print(f"[curves] {name}: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(summary.read_text())


def row(name, s, change=""):
    """One line of the table from a run's summary."""
    final, on_train = s["final"], s.get("train_split") or {}
    tau = final.get("chain", {}).get("chain_tau", {})
    depth = max(tau, key=int) if tau else None
    passes = s["steps"] * s["recipe"]["batch"]
    # Parallel drafters count draft positions from 0, autoregressive ones
    # their steps from 1: the first depth is the smallest.
    depths = sorted(int(k[3:]) for k in final if k.startswith("acc") and k[3:].isdigit())
    acc = [final[f"acc{d}"] for d in depths]
    d1 = depths[0] if depths else 1
    return dict(run=name, change=change, lr=s["recipe"].get("lr"), train_sequences=s["train_sequences"], steps=s["steps"], sequence_passes=passes,
                epochs=round(passes / max(1, s["train_sequences"]), 2), held_out_acc=acc,
                train_acc1=on_train.get(f"acc{d1}"), held_out_loss1=final.get(f"loss{d1}"),
                train_loss1=on_train.get(f"loss{d1}"),
                chain_tau=tau.get(depth) if depth else None, chain_depth=int(depth) if depth else None,
                train_wall_s=s.get("train_wall_s"))


def report(args, rows):
    (args.out / "curves.json").write_text(json.dumps(dict(drafter=args.drafter, records=args.records,
                                                          max_len=args.max_len, rows=rows), indent=2) + "\n")
    lines = [f"# {args.drafter}: steps against data ({args.records} records at {args.max_len} tokens)", "",
             "| run | change | training sequences | steps | sequence passes (epochs) | held-out accuracy by depth | "
             "training-split acc1 | held-out / training loss1 | chain τ | train wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        acc = " / ".join(f"{a:.3f}" for a in r["held_out_acc"])
        tau = f"{r['chain_tau']:.3f} at {r['chain_depth']}" if r["chain_tau"] else "—"
        tr = f"{r['train_acc1']:.3f}" if r["train_acc1"] is not None else "—"
        loss = f"{r['held_out_loss1']:.3f} / {r['train_loss1']:.3f}" if r["train_loss1"] is not None else "—"
        change = f"`{r['change']}`" if r["change"] else "—"
        lines.append(f"| {r['run']} | {change} | {r['train_sequences']} | {r['steps']} | {r['sequence_passes']} "
                     f"({r['epochs']}) | {acc} | {tr} | {loss} | {tau} | {r['train_wall_s']} |")
    (args.out / "curves.md").write_text("\n".join(lines) + "\n")
    full = [r for r in rows if r["run"] in ("s1", "s2", "s4")]
    half = [r for r in rows if r["run"] in ("h1", "h4")]
    series = {"held-out acc1, all data": [(r["steps"], r["held_out_acc"][0]) for r in full],
              "training-split acc1, all data": [(r["steps"], r["train_acc1"]) for r in full
                                                if r["train_acc1"] is not None],
              "held-out acc1, half the data": [(r["steps"], r["held_out_acc"][0]) for r in half],
              "training-split acc1, half the data": [(r["steps"], r["train_acc1"]) for r in half
                                                     if r["train_acc1"] is not None]}
    line_plot(args.out / "curves.svg", f"{args.drafter}: depth-1 accuracy against steps and data",
              {k: v for k, v in series.items() if v}, xlabel="steps", ylabel="accuracy", markers=True)
    print("\n".join(lines), flush=True)


def main(argv):
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    else:
        extra = []
    ap = argparse.ArgumentParser(prog="python -m draftc_train curves")
    ap.add_argument("drafter")
    ap.add_argument("--out", type=Path, required=True, help="directory of the runs and the report")
    ap.add_argument("--base-steps", type=int, default=300, help="S: the runs take S, 2S and 4S steps")
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--train-sequences", type=int, default=None,
                    help="the size of the training split of these records (the half-data run takes half; "
                         "default: what the first run reports)")
    ap.add_argument("--eval-train", type=int, default=256, help="training-split sequences each run evaluates")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--runs", default=",".join(n for n, _, _ in RUNS), help="a subset of s1,s2,s4,h1,h4 ('' for the variants alone)")
    ap.add_argument("--variant", action="append", default=[], metavar='NAME="TRAIN-ARGS"',
                    help="a run as s2 with these further `train` arguments (repeatable)")
    args = ap.parse_args(argv)
    variants = []
    for v in args.variant:
        name, sep, more = v.partition("=")
        if not sep or not name or name in {n for n, _, _ in RUNS} or "/" in name:
            raise SystemExit(f"--variant {v!r}: expected NAME=\"TRAIN-ARGS\" with a new NAME")
        variants.append((name, shlex.split(more)))
    args.out = args.out.resolve()
    wanted = [w for w in args.runs.split(",") if w]
    unknown = [w for w in wanted if w not in {n for n, _, _ in RUNS}]
    if unknown:
        raise SystemExit(f"--runs: unknown {unknown}; expected a subset of s1,s2,s4,h1,h4")
    rows = []
    for name, mult, share in RUNS:
        if name not in wanted:
            continue
        if share < 1.0 and args.train_sequences is None:
            # From a full-data run of this directory, this time or before.
            done = [json.loads(f.read_text()) for f in sorted(args.out.glob("s[124]/summary.json"))]
            full = [r["train_sequences"] for r in rows if r["run"].startswith("s")] + [
                d["train_sequences"] for d in done]
            if not full:
                raise SystemExit("--train-sequences: needed when no full-data run comes first")
            args.train_sequences = full[0]
        rows.append(row(name, run_one(args, name, mult, share, extra)))
    for name, more in variants:
        rows.append(row(name, run_one(args, name, 2, 1.0, extra + more), shlex.join(more)))
    report(args, rows)


if __name__ == "__main__":
    main(sys.argv[1:])

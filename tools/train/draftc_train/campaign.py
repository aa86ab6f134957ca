"""`python -m draftc_train campaign-report RUN_DIR --out report.md [--json report.json]`

The report of a tools/gpu/campaign.sh run: per drafter, the shipped
weights and the new ones on the same held-out split (the trainer's
`--eval-init` and final evaluation, from RUN_DIR/<drafter>/summary.json),
the steps and seconds each training took, whether the new weights beat the
shipped ones (chain τ at the drafter's full depth, on the held-out split),
the time each stage took (RUN_DIR/timings) and the bench tables
(RUN_DIR/bench-new.md, bench-shipped.md). No torch: it only reads files.
"""

import argparse
import json
from pathlib import Path


def first_depth(held):
    """Depth-1 acceptance (the first draft token's accuracy) and the chain
    τ at the deepest depth measured, with that depth."""
    if not held:
        return None, None, None
    chain = held.get("chain") or {}
    by_depth = chain.get("acceptance_by_depth") or []
    taus = chain.get("chain_tau") or {}
    depth = max((int(k) for k in taus), default=None)
    tau = taus.get(str(depth), taus.get(depth)) if depth is not None else None
    return (by_depth[0] if by_depth else None), tau, depth


def fmt(x, digits=4):
    return "—" if x is None else f"{x:.{digits}f}"


def row(run, name):
    d = run / name
    rc = (d / "rc").read_text().strip() if (d / "rc").is_file() else None
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else None
    r = dict(drafter=name, exit=rc, ok=bool(summary) and rc == "0")
    if summary:
        a0, t0, depth = first_depth(summary.get("init"))
        a1, t1, d1 = first_depth(summary.get("final"))
        # A drafter without shipped weights (no `--eval-init`): its own depth.
        depth = depth if depth is not None else d1
        r.update(shipped_acc1=a0, shipped_tau=t0, new_acc1=a1, new_tau=t1, depth=depth,
                 beats=None if t0 is None or t1 is None else t1 > t0,
                 steps=summary.get("steps", 0) - summary.get("first_step", 0),
                 train_s=summary.get("train_wall_s"), total_s=summary.get("wall_s"),
                 time_budget=summary.get("time_budget"), device=summary.get("device"),
                 sequences=summary.get("sequences"), train_sequences=summary.get("train_sequences"),
                 held_out_sequences=(summary.get("final") or {}).get("sequences"),
                 exported=summary.get("exported"), summary=summary)
    return r


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m draftc_train campaign-report")
    ap.add_argument("run", type=Path, help="the campaign's run directory (STAGE/run)")
    ap.add_argument("--drafters", default="beagle specformer medusa spire")
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--out", type=Path, default=None, help="report.md")
    ap.add_argument("--json", type=Path, default=None, help="everything, as JSON")
    ap.add_argument("--line", metavar="DRAFTER", default=None,
                    help="print one line on DRAFTER's training (shipped vs new) and write nothing")
    args = ap.parse_args(argv)
    if args.line:
        r = row(args.run, args.line)
        if "new_tau" not in r:
            print(f"no summary (exit {r['exit']})")
            return 1
        at = f"@{r['depth']}"
        verdict = ("no shipped weights" if r["shipped_tau"] is None
                   else "beats the shipped" if r["beats"] else "does not beat the shipped")
        print(f"shipped acc1 {fmt(r['shipped_acc1'])} tau{at} {fmt(r['shipped_tau'])} -> new acc1 "
              f"{fmt(r['new_acc1'])} tau{at} {fmt(r['new_tau'])} ({verdict}); {r['steps']} steps, "
              f"{fmt(r['train_s'], 0)} s training, {fmt(r['total_s'], 0)} s in all")
        return 0
    if args.out is None:
        ap.error("--out is required (or --line)")
    rows = [row(args.run, n) for n in args.drafters.split()]
    timings = {}
    tf = args.run / "timings"
    if tf.is_file():
        for line in tf.read_text().split("\n"):
            if line.strip():
                k, v = line.split()
                timings[k] = int(v)
    device = next((r["device"] for r in rows if r.get("device")), "?")
    lines = [f"# Training campaign: tools/gpu/campaign.sh ({device})", ""]
    if args.budget:
        lines.append(f"Budget {args.budget:.0f} s; stages took " + ", ".join(f"{k} {v} s" for k, v in timings.items())
                     + f" ({sum(timings.values())} s in all).")
        lines.append("")
    lines += [
        "Held-out split of data/train (the trainer's; the same sequences for both columns): acc1 is the "
        "depth-1 acceptance (the first draft token's accuracy), τ the chain τ at the drafter's full depth "
        "(@depth) from the trainer's simulated drafting. Shipped = models/weights before this run "
        "(`--eval-init`), new = after it. Ship only rows marked yes.",
        "",
        "| drafter | shipped acc1 | shipped chain τ | new acc1 | new chain τ | beats shipped | steps | train s "
        "| process s | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "new_tau" in r:
            at = f" (@{r['depth']})" if r.get("depth") else ""
            beats = {True: "**yes**", False: "no", None: "?"}[r["beats"]]
            beats = "no shipped weights" if r["shipped_tau"] is None else beats
            lines.append(f"| {r['drafter']} | {fmt(r['shipped_acc1'])} | {fmt(r['shipped_tau'])}{at} | "
                         f"{fmt(r['new_acc1'])} | {fmt(r['new_tau'])}{at} | {beats} | {r['steps']} | "
                         f"{fmt(r['train_s'], 0)} | {fmt(r['total_s'], 0)} | "
                         f"{'ok' if r['ok'] else 'exit ' + str(r['exit'])} |")
        else:
            lines.append(f"| {r['drafter']} | — | — | — | — | — | — | — | — | "
                         f"failed (exit {r['exit'] or 'none'}; see {r['drafter']}.tar log.txt) |")
    seqs = next((r for r in rows if r.get("sequences")), None)
    if seqs:
        lines += ["", f"Training data: {seqs['sequences']} sequences ({seqs['train_sequences']} in the training "
                      f"split), {seqs['held_out_sequences']} held-out sequences measured."]
    for name, what in (("new", "the new weights"), ("shipped", "the shipped weights")):
        p = args.run / f"bench-{name}.md"
        if p.is_file() and p.read_text().strip():
            lines += ["", f"## bench spec, {what}", "", p.read_text().strip()]
        else:
            lines += ["", f"## bench spec, {what}", "", "not run or failed (bench.tar has its stderr)"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps(dict(budget=args.budget, timings=timings, drafters=rows), indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)
    return 0

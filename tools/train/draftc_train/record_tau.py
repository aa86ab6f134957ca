"""`python -m draftc_train record-tau SPEC_JSON --command "..."`

Copies what `draftc bench spec` measured for each shipped drafter (τ,
acceptance by depth, k, tokens/s, speedup, lossless, batch, budget) from its
JSON report into `models/weights/<drafter>.json` under `held_out_tau`,
with the command that produced it, so a manifest's τ always names its
measurement. `--weights-dir DIR` records into the manifests in DIR instead
(weights trained for another target, `train --model ... --export-dir DIR`,
measured with `bench spec --model ... --drafter-weights DIR/NAME.safetensors`).
Only reports run on held-out prompts (`--prompts mt-bench`
or a file outside the training data) belong here; the command is recorded
so that a reader can check.
"""

import argparse
import json
import re
from pathlib import Path

# The repository root, as emitted.REPO (not imported from there: that pulls
# in torch, which recording a report does not need).
REPO = Path(__file__).resolve().parents[3]


LOOKUP = re.compile(r"\+lookup(\d)$")


def _without_cut(point):
    """The point's drafter name without its `--confidence` suffix: `bench
    spec` names a point measured with `--confidence KEEP,EXPAND`
    `<drafter> confidence KEEP,EXPAND` and keeps the cut in its own
    `confidence` field."""
    name, cut = point["drafter"], point.get("confidence")
    suffix = f" confidence {cut}"
    return name[: -len(suffix)] if cut and name.endswith(suffix) else name


def drafter_path(point):
    """The drafter of a report point, without its cut and without the
    `+lookupN` of a point measured behind prompt lookup (`--lookup N`)."""
    return LOOKUP.sub("", _without_cut(point))


def lookup_of(point):
    """The `--lookup N` of a report point (None without lookup); reports
    written before the `lookup` field existed name it only."""
    if point.get("lookup") is not None:
        return point["lookup"]
    m = LOOKUP.search(_without_cut(point))
    return int(m.group(1)) if m else None


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m draftc_train record-tau")
    ap.add_argument("report", type=Path, help="spec.json written by `draftc bench spec`")
    ap.add_argument("--command", required=True, help="the draftc command that wrote the report")
    ap.add_argument("--weights-dir", type=Path, default=REPO / "models/weights", metavar="DIR",
                    help="the weights manifests to record into (default models/weights)")
    args = ap.parse_args(argv)
    wdir = args.weights_dir.resolve()
    if "--prompts" not in args.command:
        raise SystemExit("the command has no --prompts: τ on the built-in prompts is not a held-out result")
    report = json.loads(args.report.read_text())
    done = 0
    for path in sorted(wdir.glob("*.json")):
        manifest = json.loads(path.read_text())
        if "weights" not in manifest or "drafter" not in manifest:
            continue
        own = (wdir / manifest["weights"]).resolve()
        points = [
            p for p in report["points"]
            if Path(drafter_path(p)).stem == manifest["drafter"] and p["weights"] != "target"
            # A report comparing other weights files of the same drafter
            # (e.g. the weights this run replaced) records only the shipped one.
            and (not p["weights"].endswith(".safetensors") or (REPO / p["weights"]).resolve() == own)
            # Another directory's manifests record their own file only.
            and (wdir == (REPO / "models/weights").resolve() or p["weights"].endswith(".safetensors"))
        ]
        if not points:
            continue
        manifest["held_out_tau"] = dict(
            command=args.command,
            device=report.get("device"),
            max_tokens=report.get("max_tokens"),
            **({"model": report.get("model")} if wdir != (REPO / "models/weights").resolve() else {}),
            points=[
                dict(
                    {k: p.get(k) for k in ("batch", "prompts", "budget", "speculate", "tree", "confidence", "tau", "k", "kappa", "tokens_per_s",
                                       "autoregressive_tokens_per_s", "speedup", "acceptance_by_depth", "lossless")},
                    **({"lookup": lookup_of(p), "lookup_rounds": p.get("lookup_rounds"), "seq_rounds": p.get("seq_rounds")}
                       if lookup_of(p) is not None else {}),
                )
                for p in points
            ],
        )
        manifest.pop("held_out_tau_note", None)
        path.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"{path.name}: recorded {len(points)} point(s)")
        done += 1
    if not done:
        raise SystemExit("no shipped drafter appears in the report")

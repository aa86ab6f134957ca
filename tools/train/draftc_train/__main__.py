"""CLI dispatcher: ``python -m draftc_train <command> [args...]``.

Each command's module is imported lazily (torch/transformers are heavy), and
its ``main(argv)`` gets the arguments after the command name.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module, one-line help). Modules expose main(argv: list[str]) -> int | None.
COMMANDS: dict[str, tuple[str, str]] = {
    "prompts": ("draftc_train.prompts", "extract training (ShareGPT) and eval (MT-Bench) prompts"),
    "data": ("draftc_train.data", "generate the target's greedy responses into data/train/shards"),
    "shards": ("draftc_train.shards", "summarise / verify the shards in a directory"),
    # Hook for the training loop: `python -m draftc_train train ...` dispatches to
    # draftc_train.train.main(argv) (module written separately, imported lazily).
    "train": ("draftc_train.train", "train a drafter (draftc_train/train.py)"),
    "heldout-prompts": ("draftc_train.heldout", "prompts of the trainer's held-out split (for tuning runtime settings, never MT-Bench)"),
    "record-tau": ("draftc_train.record_tau", "copy held-out τ from a `draftc bench spec` report into the weights manifests"),
    "curves": ("draftc_train.curves", "steps against data: S, 2S, 4S steps and half the data, with an over-fitting probe"),
    "scaling": ("draftc_train.scaling", "plot held-out accuracy against training data and extrapolate it to a τ target"),
    "ttt-parity": ("draftc_train.ttt_parity", "the training-time test against the engine's EAGLE drafter (runtime/tests/ttt_parity.rs)"),
    "campaign-report": ("draftc_train.campaign", "the report of a tools/gpu/campaign.sh run (shipped vs new weights, bench)"),
}


def usage() -> str:
    lines = ["usage: python -m draftc_train <command> [args...]", "", "commands:"]
    for name, (_, help_) in COMMANDS.items():
        lines.append(f"  {name:<8} {help_}")
    lines.append("")
    lines.append("`python -m draftc_train <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    rc = module.main(rest)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())

"""Prompts of the trainer's held-out split, for tuning runtime settings
(`draftc bench spec --prompts FILE`) on data no drafter trained on and that
is not the evaluation set: MT-Bench is never tuned on.

The split is the one `train.py` holds out: the last `max(8, n // 20)` of the
sequences `load_sequences(--max-len)` keeps. Each prompt is the user turn
decoded from the record's prompt ids (the chat template stripped), written
as JSON lines with a `prompt` field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
USER = "<|im_start|>user\n"
END = "<|im_end|>"


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m draftc_train heldout-prompts")
    ap.add_argument("--count", type=int, default=64, help="the first COUNT prompts of the split")
    ap.add_argument("--max-len", type=int, default=320, help="as `train --max-len` (it decides the split)")
    ap.add_argument("--out", type=Path, default=None, help="output file (default: standard output)")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    from . import train

    seqs = train.load_sequences(args.max_len)
    n_val = max(8, len(seqs) // 20)
    tok = Tokenizer.from_file(str(train.emitted.model_dir() / "tokenizer.json"))
    lines = []
    for ids, n_prompt in seqs[len(seqs) - n_val :][: args.count]:
        text = tok.decode(ids[:n_prompt].tolist(), skip_special_tokens=False)
        start = text.rfind(USER)
        if start < 0 or END not in text[start:]:
            raise SystemExit(f"a held-out prompt has no user turn: {text[:80]!r}")
        user = text[start + len(USER) :].split(END, 1)[0]
        lines.append(json.dumps({"prompt": user}, ensure_ascii=False))
    out = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(out)
        print(f"{len(lines)} held-out-split prompts -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(out)

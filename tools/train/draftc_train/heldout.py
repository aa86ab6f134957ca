"""Prompts of the trainer's held-out split, for tuning runtime settings
(`draftc bench spec --prompts FILE`) on data no drafter trained on and that
is not the evaluation set: MT-Bench is never tuned on.

The split is the one `train.py` holds out: the last `max(8, n // 20)` of the
sequences `load_sequences(--max-len)` keeps. Each prompt is the user turn
decoded from the record's prompt ids (the chat template stripped), written
as JSON lines with a `prompt` field. For a target without a chat template
(`--model`, a base model such as Gemma 3 270M, with its own `--data`) the
prompt is the selected ShareGPT text itself, which `draftc bench spec
--raw` encodes as the data did; for a target with another chat template
than ChatML (Llama 3's, Gemma's, ...) it is the selected text too, checked
to render and encode to the record's prompt ids (`bench spec` renders it
with the template, as the data did).

`--context N` writes long prompts instead, for measuring at long contexts:
per held-out conversation with a later human turn, its last one with the
ShareGPT turns before it (human as user, gpt as assistant: ShareGPT's own
answers), the oldest dropped until the conversation fits N tokens, as a
`messages` line (`bench spec` renders it with the chat template). A
conversation shorter than N / 2 tokens is skipped. Every turn comes from
the ShareGPT record of a held-out-split prompt, whose later turns the
trainer drops from the later-turn sets (`drop_held_out_conversations`).
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
    ap.add_argument("--model", default=None, metavar="DIR|NAME",
                    help="the target, as `train --model` (default SmolLM2-135M-Instruct)")
    ap.add_argument("--data", type=Path, default=None, metavar="DIR",
                    help="the shard set, as `train --data` (default data/train)")
    ap.add_argument("--context", type=int, default=0, metavar="TOKENS",
                    help="conversations of about TOKENS tokens (at least half) instead of first turns")
    args = ap.parse_args(argv)
    from . import prompts as P
    from . import targets, trainset

    spec = targets.TargetSpec(args.model)
    trainset.check_data_target(args.data or trainset.DEFAULT_DATA, spec)
    seqs, index = trainset.load_sequences(args.max_len, directory=args.data, with_index=True)
    n_val = max(8, len(seqs) // 20)
    tok = spec.tokenizer
    if args.context:
        if spec.chat == "raw":
            raise SystemExit("heldout-prompts --context: conversations need a chat template")
        lines = long_prompts(tok, index[len(seqs) - n_val :], args.context, args.count, spec)
    elif spec.chat == "chatml":
        lines = [first_turn(tok, ids, n_prompt) for ids, n_prompt in seqs[len(seqs) - n_val :][: args.count]]
    else:
        # Raw prompts, or another chat template's than ChatML: the
        # selection's text (the record's ids are its encoding, checked here).
        first, _ = P.training_prompts(tok, "first-turns")
        lines = []
        for (ids, n_prompt), pi in list(zip(seqs, index))[len(seqs) - n_val :][: args.count]:
            text = first[pi]["prompt"]
            if spec.encode_prompt(text) != ids[:n_prompt].tolist():
                raise SystemExit(f"held-out record {pi}: its prompt ids are not the encoding of prompt {pi}")
            lines.append(json.dumps({"prompt": text}, ensure_ascii=False))
    out = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(out)
        print(f"{len(lines)} held-out-split prompts -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(out)


def first_turn(tok, ids, n_prompt):
    """The `prompt` line of a held-out record: its user turn, decoded from
    its prompt ids with the chat template stripped."""
    text = tok.decode(ids[:n_prompt].tolist(), skip_special_tokens=False)
    start = text.rfind(USER)
    if start < 0 or END not in text[start:]:
        raise SystemExit(f"a held-out prompt has no user turn: {text[:80]!r}")
    user = text[start + len(USER) :].split(END, 1)[0]
    return json.dumps({"prompt": user}, ensure_ascii=False)


def long_prompts(tok, held_index, tokens, count, spec=None):
    """`--context`: the `messages` lines of the held-out conversations
    (first-turn prompt indices `held_index`) that reach `tokens` / 2. For
    a target with another chat template than ChatML (`spec.chat ==
    "template"`) a conversation's size is its rendered prompt's ids, and
    one the template refuses (roles that do not alternate, as Gemma's and
    Mistral's require) counts as too long: cut further, or skipped."""
    from . import prompts as P
    from .data import ROLES

    first, _ = P.training_prompts(tok, "first-turns")
    turns = P.conversations()
    if spec is not None and spec.chat == "template":
        from .targets import ChatRefused

        def size(conv):
            try:
                return len(spec.encode_messages(conv))
            except ChatRefused:
                return float("inf")
    else:
        # ChatML: "<|im_start|>role\n" + content + "<|im_end|>\n" per message.
        size = lambda conv: sum(len(tok.encode(m["content"]).ids) + 5 for m in conv)
    lines = []
    for pi in held_index:
        conv = [{"role": ROLES[t.get("from")], "content": (t.get("value") or "").strip()}
                for t in turns.get(first[pi]["id"], []) if t.get("from") in ROLES]
        last = max((i for i, m in enumerate(conv) if m["role"] == "user" and i > 0), default=None)
        if last is None:
            continue
        conv = conv[: last + 1]
        while size(conv) > tokens and len(conv) > 1:
            conv = conv[1:]
        # A conversation starts with the user (an answer cut from its question
        # goes too), and one turn alone may pass the limit: skipped.
        while conv and conv[0]["role"] != "user":
            conv = conv[1:]
        if len(conv) < 2 or not tokens // 2 <= size(conv) <= tokens:
            continue
        lines.append(json.dumps({"messages": conv}, ensure_ascii=False))
        if len(lines) == count:
            break
    if not lines:
        raise SystemExit(f"heldout-prompts --context {tokens}: no held-out conversation reaches {tokens // 2} tokens")
    return lines

"""The training set of `train`: the shard sets' sequences (`load_sequences`,
the held-out conversations, the data's target and source), padded batches
of them with their labels (`batch_of`), and the draft vocabulary's choice
and coverage. What needs the training device (the target's hidden states,
the target's own labels) stays in train.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from . import emitted, shards

REPO = emitted.REPO


DEFAULT_DATA = REPO / "data/train"


def load_sequences(max_len, limit=None, directory=None, with_index=False):
    """`(ids, prompt_len)` per usable record of a shard set (default
    data/train); `with_index` also returns each one's prompt index."""
    recs = list(shards.iter_records(shards.shards_dir(directory or DEFAULT_DATA), with_index=True))
    seqs, index = [], []
    for p, r, pi in recs[: limit or len(recs)]:
        ids = np.concatenate([p, r]).astype(np.int64)[:max_len]
        if len(r) == 0 or len(p) >= max_len - 2:
            continue
        seqs.append((torch.from_numpy(ids), len(p)))
        index.append(pi)
    return (seqs, index) if with_index else seqs


def data_name(directory):
    """A shard set's directory as manifests name it: relative to the
    repository when inside it."""
    d = Path(directory).resolve()
    return os.path.relpath(d, REPO) if d.is_relative_to(REPO) else str(d)


def check_data_target(directory, spec):
    """Refuses a shard set made by another target than `spec` (its
    manifest's tokenizer): its labels are another model's answers. Sets
    without a manifest, and the default target's own sets, are taken as
    they are."""
    m = Path(directory) / "MANIFEST.json"
    if not m.is_file():
        return
    gen = json.loads(m.read_text()).get("generator", {})
    if spec.is_default and "target" not in gen:
        return
    want = gen.get("tokenizer_json_sha256")
    if want and want != shards.sha256_file(spec.dir / "tokenizer.json"):
        made = gen.get("target", {}).get("model") or gen.get("model")
        raise SystemExit(f"{directory}: made with another target ({made}) than --model {spec.name}: pass the "
                         "target the set was made with (`--model`), or the set of this one (`--data`)")


def conversation(record_id):
    """ShareGPT's conversation of a record id: `KzJX1Wx_3` is part 3 of
    conversation `KzJX1Wx`; a later turn's id adds `#turn`."""
    return record_id.split("#", 1)[0].rsplit("_", 1)[0]


def drop_held_out_conversations(first_index, val_idx, more, more_index, source="later-turns"):
    """The records `more` of another shard set (prompts of `source`: later
    turns, or first turns answered again, e.g. sampled) whose ShareGPT
    conversation is not one the held-out split's first turns come from (a
    follow-up question of a held-out prompt, or another answer to one,
    would leak it into training)."""
    from tokenizers import Tokenizer

    from . import prompts as P

    tok = Tokenizer.from_file(str(emitted.model_dir() / "tokenizer.json"))
    first, _ = P.training_prompts(tok, "first-turns")
    theirs = first if source == "first-turns" else P.training_prompts(tok, source)[0]
    held = {conversation(first[first_index[i]]["id"]) for i in val_idx}
    keep = [j for j, pi in enumerate(more_index) if conversation(theirs[pi]["id"]) not in held]
    return [more[j] for j in keep], len(more) - len(keep)


def shard_set_info(directory):
    """What the trainer needs of a shard set's manifest: its prompt source
    (`first-turns` or `later-turns`) and sampling temperature (0: greedy)."""
    m = Path(directory) / "MANIFEST.json"
    if not m.is_file():
        return "later-turns", 0.0
    doc = json.loads(m.read_text())
    rules = doc.get("source", {}).get("selection_rules", "")
    source = "later-turns" if rules.startswith("later-") else "first-turns"
    return source, float(doc.get("generator", {}).get("temperature") or 0.0)


def save_atomic(obj, path):
    """torch.save through a temporary file: trainings run side by side may
    write the same cache."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def batch_of(seqs, feats, idx, taps, relabels=None):
    """Padded ids, validity, response mask, target states and next-token
    labels `[B, T-1]` of sequences `idx`: a record's own next token, or for
    a sampled set's records (`relabels`, from `relabel`) the target's argmax
    at its response positions."""
    T = max(len(seqs[i][0]) for i in idx)
    B = len(idx)
    ids = torch.zeros(B, T, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    resp = torch.zeros(B, T, dtype=torch.bool)  # position holds a response token
    hidden = {t: torch.zeros(B, T, feats[idx[0]][t].shape[-1]) for t in taps}
    for b, i in enumerate(idx):
        x, plen = seqs[i]
        n = len(x)
        ids[b, :n] = x
        valid[b, :n] = True
        resp[b, plen:n] = True
        for t in taps:
            hidden[t][b, :n] = feats[i][t].float()
    nxt = ids[:, 1:].clone()
    for b, i in enumerate(idx):
        own = relabels.get(i) if relabels else None
        if own is not None:
            at = own >= 0
            nxt[b, : len(own)][at] = own[at]
    return ids, valid, resp, hidden, nxt


def extra_labels(plabels, idx, T):
    """`[B, T-1]` labels of sequences `idx` from `prompt_labels` (the
    target's greedy token at prompt positions, -1 elsewhere), padded as
    `batch_of` pads to `T`."""
    extra = torch.full((len(idx), T - 1), -1, dtype=torch.long)
    for b, i in enumerate(idx):
        extra[b, : len(plabels[i])] = plabels[i]
    return extra


def draft_vocab(seqs, train_idx, n, vocab):
    """The `n` most frequent response tokens of the training split (ties to
    the lower id), sorted; with their coverage of the training split's
    response tokens."""
    counts = np.zeros(vocab, dtype=np.int64)
    for i in train_idx:
        x, plen = seqs[i]
        counts += np.bincount(x[plen:].numpy(), minlength=vocab)
    order = np.argsort(-counts, kind="stable")[:n]
    ids = np.sort(order)
    return torch.from_numpy(ids.astype(np.int64)), float(counts[ids].sum() / max(1, counts.sum()))


def coverage(seqs, idx, ids, vocab):
    """Share of the response tokens of sequences `idx` inside `ids`."""
    inside = torch.zeros(vocab, dtype=torch.bool)
    inside[ids] = True
    hit = tot = 0
    for i in idx:
        x, plen = seqs[i]
        tot += len(x) - plen
        hit += int(inside[x[plen:].to(inside.device)].sum())
    return hit / max(1, tot)

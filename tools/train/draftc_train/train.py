"""`python -m draftc_train train DRAFTER [--steps N] [--resume] ...`

Trains a drafter from its description file (the module `draftc emit
--backend torch` generates) on the self-distilled shards in data/train/
(plus, with `--extra-data DIR`, further shard sets that only add training
sequences, such as data/train-later/), and exports its weights to models/weights/<drafter>.safetensors (f16) with
a manifest. Each drafter's recipe follows its paper (docs/training.md):

- medusa: cross-entropy per head, head j weighted 0.8^j (Medusa).
- specformer: cross-entropy at each of the l draft positions (paper 000
  §4.1; the LM-head loss is computed one position at a time).
- beagle: early stage = parallel multi-token prediction through the
  inverse-block `train_mask` with a random offset per batch (paper 002
  §4.2, Eq. 4); late stage = s simulated drafting steps fed with the
  drafter's own predicted states, step i weighted k - i + 1 (Eq. 6);
  in both stages a smooth-L1 regression of each appended state onto the
  target's state it stands in for, coefficient 10 (§A.3).
- spire: pruned initialisation from the target's last two layers (paper
  004 §3.2); a teacher-forced stage, then k = 4 simulated steps over both
  feedback-memory streams (§3.3); MixedLoss(0.5) against the target's
  distribution (§3.4).

The target is SmolLM2-135M-Instruct unless `--model DIR|NAME` names another
converted checkpoint (draftc_train/targets.py): its shard set (`--data`,
made by `data --model ... --out`) and an export directory other than
models/weights (whose weights are SmolLM2's) go with it.

Labels: parallel drafters' row j at position p predicts the token at
p + 2 + j (docs/speculative.md); autoregressive drafters at position q
predict q + 1. Only response tokens (the target's greedy answers) are
labels. Target hidden states are computed once with the target's own
emitted module (its family's model file: models/llama.draft, models/gemma3.draft)
and cached under target/train/.

AdamW, linear warm-up then cosine decay, global gradient clipping, bf16
autocast (on the CPU, or on CUDA with `--device cuda`), checkpoints every --ckpt-every steps (resume with
--resume), progress with steps/s, loss and ETA, loss curves as SVG.
"""

import argparse
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from . import emitted, shards, targets
from .losses import Head, autoregressive_loss, make_target, parallel_loss, ttt_loss
from .schedule import Pacer, lr_at
from .progress import Progress
from .svg import line_plot
from .trainset import (
    DEFAULT_DATA,
    batch_of,
    check_data_target,
    coverage,
    data_name,
    draft_vocab,
    drop_held_out_conversations,
    extra_labels,
    load_sequences,
    save_atomic,
    shard_set_info,
)

REPO = emitted.REPO
# The torch device type training runs on (`--device`): "cpu", or "cuda" on a
# lent GPU, where it is also torch's default device, so every tensor the
# recipes and the emitted modules create lands there.
DEV = "cpu"

RECIPES = {
    # Learning rates and Beagle's regression from the one-change runs of
    # docs/bench/lavapipe/issue32-curves (from initialisation, 600-1,000
    # steps): Medusa 2e-3 over 1e-3, Beagle 1e-3 with paper 002's regression
    # loss (coefficient 10) over 5e-4 without.
    "medusa": dict(lr=2e-3, wd=0.0, warmup=30, clip=1.0, batch=8, decay=0.8, rows=384),
    # pos_mean=1: paper 000's mean over the l draft positions instead of
    # their sum (the same optimum; the gradient against clip 1.0 differs).
    "specformer": dict(lr=5e-4, wd=0.01, warmup=30, clip=1.0, batch=8, rows=384, pos_mean=0),
    "beagle": dict(lr=1e-3, wd=0.0, warmup=50, clip=0.5, batch=8, window=5, sim_steps=3, late_frac=0.3, noise=0.0,
                   train_mask=1, regression=10.0),
    # MixedLoss(0.5) against the target's distribution (its final state
    # HS[n] through its final norm and head), pruned from the target's last two layers, 4 simulated steps
    # (the chain of 4 it drafts). uniform_steps=1: paper 004's rollout,
    # every simulated step weighted 1/k, instead of Beagle's (k - i + 1)/k.
    "spire": dict(lr=3e-4, wd=0.0, warmup=50, clip=1.0, batch=8, sim_steps=4, late_frac=0.3,
                  mixed=0.5, soft_tap="n", pruned=True, uniform_steps=0),
    # Training-time test (`ttt_loss`): steps, step decay, loss and feature
    # regression come from the description's `train_*` settings (TRAIN),
    # filled in by `recipe_of`. The optimiser settings are Beagle's.
    "eagle3": dict(lr=5e-4, wd=0.0, warmup=50, clip=0.5, batch=8, soft_tap="n"),
    "eagle": dict(lr=5e-4, wd=0.0, warmup=50, clip=0.5, batch=8, soft_tap="n"),
}


# The preset a description that is not one of RECIPES trains with, by its
# drafter kind: parallel heads learn as Medusa's do (each head's token at its
# offset); an autoregressive drafter with a training-time test in its
# description (`train_steps`) as EAGLE's, one without as Beagle's (a
# teacher-forced stage, then simulated drafting steps over its own memory
# rows). A self-speculative drafter is the target under another mask: it
# has no weights (`draftc emit` says so).
KIND_PRESETS = {"parallel": "medusa", "autoregressive": "beagle"}


def preset_of(mod, preset=None):
    """The recipe preset a description trains with: `preset` when given,
    else the one its kind implies (KIND_PRESETS; EAGLE's when it sets
    `train_steps`)."""
    if preset is not None:
        if preset not in RECIPES:
            raise SystemExit(f"--preset {preset!r}: one of {', '.join(sorted(RECIPES))}")
        return preset
    train = getattr(mod, "TRAIN", {}) or {}
    if mod.KIND == "autoregressive" and "steps" in train:
        return "eagle"
    if mod.KIND not in KIND_PRESETS:
        raise SystemExit(f"drafter kind {mod.KIND!r} has no training preset (pass --preset NAME)")
    return KIND_PRESETS[mod.KIND]


def resolve_drafter(arg, description=None):
    """`(name, description file, preset or None)` of `train`'s DRAFTER: a
    preset name (`beagle`: models/beagle.draft, or --description's variant,
    with its own recipe) or a description file (`my/heads.draft`: named by
    its file stem, its preset chosen from its kind once loaded)."""
    if arg in RECIPES:
        return arg, Path(description or REPO / "models" / f"{arg}.draft"), arg
    path = Path(arg)
    if path.suffix != ".draft":
        raise SystemExit(f"{arg!r}: neither a preset ({', '.join(sorted(RECIPES))}) nor a description file "
                         "(FILE.draft)")
    if description is not None:
        raise SystemExit("--description is for a preset's variant; a description file is trained as itself")
    if not path.is_file():
        raise SystemExit(f"{path}: no such description file")
    return path.stem, path, None


def recipe_of(name, mod):
    """The recipe of preset `name`: RECIPES' entry, with the description's
    training schedule (`train_steps`, `train_decay`, `train_loss`,
    `train_token_weight`, `train_regression`) as numeric fields a `--recipe`
    may override: ttt_steps, decay, distill (1 distils, 0 is cross-entropy
    on the greedy token), token_weight, regression."""
    r = dict(RECIPES[name])
    train = getattr(mod, "TRAIN", {}) or {}
    if "steps" in train:
        r.update(ttt_steps=int(train["steps"]), decay=float(train.get("decay", 1.0)),
                 distill=1.0 if train.get("loss", "distill") == "distill" else 0.0,
                 token_weight=float(train.get("token_weight", 1.0)),
                 regression=float(train.get("regression", 0.0)))
    elif name in ("eagle", "eagle3"):
        raise SystemExit(f"the {name!r} preset needs the description's `train_steps` (its training-time test)")
    return r


def feature_cache(seqs, taps, max_len, tgt_tensors):
    """Target hidden states HS[i], i in `taps`, for every sequence (f16),
    computed once with the emitted target module and kept on disk."""
    h = hashlib.sha256()
    for x, plen in seqs:
        h.update(x.numpy().tobytes())
        h.update(plen.to_bytes(4, "little"))
    key = f"{emitted.target_tag()}n{len(seqs)}-len{max_len}-taps{'_'.join(map(str, sorted(taps)))}-{h.hexdigest()[:12]}"
    path = REPO / "target/train/features" / f"{key}.pt"
    # On a GPU the states are recomputed in seconds and stay in its memory,
    # up to `features_home`'s budget; past it in host memory, copied to the
    # device batch by batch (`batch_of`).
    on_disk = DEV == "cpu"
    if on_disk and path.exists():
        return torch.load(path)
    # A cache of the same sequences with more taps serves too.
    others = sorted(path.parent.glob(f"{emitted.target_tag()}n{len(seqs)}-len{max_len}-taps*-{h.hexdigest()[:12]}.pt")
                    ) if on_disk else []
    for other in others:
        have = {int(t) for t in other.name.split("-taps")[1].split("-")[0].split("_")}
        if set(taps) <= have:
            return [{t: f[t] for t in taps} for f in torch.load(other)]
    tgt = emitted.TargetModel(tgt_tensors)
    out = [dict() for _ in seqs]
    home = None
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    prog = Progress(len(seqs), "target hidden states", unit="seq")
    bs = 8 if DEV == "cpu" else 128
    # f16, unless a state passes its range: Gemma's first position (its
    # <bos> attention sink) reaches ~1e5, and an inf there makes every loss
    # NaN. Then the whole cache is bf16 (the states are computed under bf16
    # autocast: its range, their precision).
    store = torch.float16
    for s in range(0, len(order), bs):
        idx = order[s : s + bs]
        T = max(len(seqs[i][0]) for i in idx)
        ids = torch.zeros(len(idx), T, dtype=torch.long)
        valid = torch.zeros(len(idx), T, dtype=torch.bool)
        for b, i in enumerate(idx):
            n = len(seqs[i][0])
            ids[b, :n] = seqs[i][0]
            valid[b, :n] = True
        with torch.autocast(DEV, dtype=torch.bfloat16):
            hs = tgt.hidden(ids, valid, taps)
        if home is None:
            width = next(iter(hs.values())).shape[-1]
            home = features_home(sum(len(x) for x, _ in seqs) * len(taps) * width * 2)
        peak = max(float(v.abs().max()) for v in hs.values())
        if store == torch.float16 and peak > torch.finfo(torch.float16).max:
            print(f"target states reach {peak:.3g}, past f16's range: cached in bf16", flush=True)
            store = torch.bfloat16
            out = [{t: f[t].to(store) for t in f} for f in out]
        for b, i in enumerate(idx):
            n = len(seqs[i][0])
            # A copy, not a view that would keep the whole batch alive.
            out[i] = {t: hs[t][b, :n].to(home, store, copy=True) for t in taps}
        prog.update(len(idx))
    prog.close()
    if on_disk:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_atomic(out, path)
    return out


def features_home(nbytes):
    """Where `nbytes` more target states (f16) live: the training device,
    or on a GPU, once this process's GPU memory would pass
    `DRAFTC_FEATURES_GPU_GB` with them (default a quarter of the device:
    trainings run side by side, and EAGLE-3's four taps of a large set at
    1,024 tokens take tens of GB), host memory."""
    if DEV == "cpu":
        return "cpu"
    total = torch.cuda.get_device_properties(0).total_memory
    budget = float(os.environ.get("DRAFTC_FEATURES_GPU_GB", total / 4 / 2**30)) * 2**30
    held = torch.cuda.memory_allocated()
    if held + nbytes > budget:
        print(f"target states: {nbytes / 2**30:.1f} GiB more would pass the GPU budget of "
              f"{budget / 2**30:.1f} GiB ({held / 2**30:.1f} GiB held): kept in host memory, "
              "copied per batch", flush=True)
        return "cpu"
    return DEV


def prompt_labels(seqs, feats, tap, target):
    """The target's greedy next token at every prompt position after the
    system prefix all records share (the user's text and the template's
    closing tokens): argmax of the target's head over its final state
    HS[tap], from the feature cache. Per sequence a `[n - 1]` tensor, -1
    where there is no such label (the shared prefix, the response, whose
    labels are the records' own tokens). Kept on disk beside the features.
    Training on these positions too (`--prompt-labels`) is what EAGLE does
    with its fixed dataset: every position's target state is a sample of
    the target's next-token function, whoever wrote the token."""
    skip = 0
    while all(len(x) > skip and x[skip] == seqs[0][0][skip] for x, _ in seqs):
        skip += 1
    spans = [(i, skip, min(plen - 1, len(x) - 1)) for i, (x, plen) in enumerate(seqs)]
    return head_argmax(seqs, feats, tap, target, spans, "plabels", "prompt labels")


def relabel(seqs, feats, tap, target):
    """Labels of a sampled shard set: at every response position q (from
    the last prompt token on) the target's own argmax over its final state
    HS[tap] at q, not the sampled token q + 1, which stays an input only.
    Per sequence a `[n - 1]` tensor of next-token labels (-1 before the
    response). Kept on disk beside the features."""
    spans = [(i, plen - 1, len(x) - 1) for i, (x, plen) in enumerate(seqs)]
    return head_argmax(seqs, feats, tap, target, spans, "relabels", "target labels")


def head_argmax(seqs, feats, tap, target, spans, kind, what):
    """Per sequence a `[n - 1]` tensor holding, on each `(sequence, first,
    last)` span, the argmax of the target's head over its final state
    HS[tap] at those positions, and -1 elsewhere; cached on disk as `kind`."""
    h = hashlib.sha256()
    for x, plen in seqs:
        h.update(x.numpy().tobytes())
        h.update(plen.to_bytes(4, "little"))
    path = REPO / "target/train/features" / f"{emitted.target_tag()}{kind}-n{len(seqs)}-tap{tap}-{h.hexdigest()[:12]}.pt"
    if path.exists():
        return torch.load(path)
    # The target's final norm as `target.norm` applies it (x̂·w, or Gemma's
    # x̂·(1 + w)), in f32.
    w = target.final_norm.float() + target.norm_offset
    head = target.lm_head.float()
    out = [torch.full((len(x) - 1,), -1, dtype=torch.long) for x, _ in seqs]
    spans = [sp for sp in spans if sp[2] > sp[1]]
    prog = Progress(len(spans), what, unit="seq")
    with torch.no_grad():
        at = 0
        # Scored in chunks of ~2k rows.
        while at < len(spans):
            chunk, rows = [], 0
            while at < len(spans) and rows < 2048:
                chunk.append(spans[at])
                rows += spans[at][2] - spans[at][1]
                at += 1
            hs = torch.cat([feats[i][tap][a:b].float() for i, a, b in chunk]).to(DEV)
            hs = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + target.eps) * w
            top = F.linear(hs, head).argmax(-1)
            k = 0
            for i, a, b in chunk:
                out[i][a:b] = top[k : k + b - a]
                k += b - a
            prog.update(len(chunk))
    prog.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(out, path)
    return out


def pruned_init(net, tgt_tensors):
    """SPIRe's pruned initialisation (paper 004 §3.2), the rule of the
    runtime's `--drafter-weights pruned` (runtime/src/exec/weights.rs,
    `pruned_sources`): the drafter's `layers.{i}` are the target's last
    layers in order, other names (the final norm) are looked up under
    `model.`; tensors with no counterpart of the same shape keep the
    module's initialisation. Returns the names copied."""
    n_target = 1 + max(int(k.split(".")[2]) for k in tgt_tensors if k.startswith("model.layers."))
    own = net.state_dict()
    n_own = 1 + max((int(k.split(".")[1]) for k in own if k.startswith("layers.")), default=-1)
    copied = []
    with torch.no_grad():
        for name, t in own.items():
            if name.startswith("layers."):
                i, rest = name.split(".", 2)[1:]
                sources = [f"model.layers.{n_target - n_own + int(i)}.{rest}"]
            else:
                sources = [f"model.{name}", name]
            for src in sources:
                if src in tgt_tensors and tgt_tensors[src].shape == t.shape:
                    t.copy_(tgt_tensors[src].to(t.dtype))
                    copied.append(name)
                    break
    return copied


def load_weights(path):
    """A checkpoint (`ckpt.pt`) or shipped weights (`.safetensors`, f16):
    the state dict with floating tensors in f32, and the step it was saved
    at (None for shipped weights)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        sd, step = load_file(str(path)), None
    else:
        st = torch.load(path, map_location=DEV)
        sd, step = st["model"], st["step"]
    return {k: (v.float() if v.is_floating_point() else v).to(DEV) for k, v in sd.items()}, step


def load_state(net, sd, source):
    """Load state dict `sd` into `net`; only the draft vocabulary buffer
    (chosen from data, not trained) may be absent. Other mismatches are an
    error naming `source`."""
    missing, unexpected = net.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"draft_vocab.ids"}:
        raise SystemExit(f"{source}: does not match the module (missing {missing}, unexpected {unexpected})")


def taps_of(mod):
    taps = set()
    for src in mod.INPUTS.values():
        if src[0] == "hidden":
            taps.update(src[1])
    taps.update(mod.MEMORIES.values())
    for fused_taps, _ in getattr(mod, "MEMORIES_FUSED", {}).values():
        taps.update(fused_taps)
    return sorted(taps)


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m draftc_train train")
    ap.add_argument("drafter", metavar="DRAFTER",
                    help=f"a preset ({', '.join(sorted(RECIPES))}: models/NAME.draft with its tuned recipe) or any "
                         "description file (FILE.draft: trained with the preset its drafter kind implies, or "
                         "--preset's; its weights go to weights/ beside the file, where `--drafter FILE` finds them)")
    ap.add_argument("--preset", default=None, metavar="NAME",
                    help="for a description file: train with this preset's recipe instead of its kind's "
                         f"({', '.join(f'{k}: {v}' for k, v in KIND_PRESETS.items())}; autoregressive with "
                         "train_steps: eagle)")
    ap.add_argument("--model", default=None, metavar="DIR|NAME",
                    help="the target: a converted checkpoint directory or a model `draftc fetch` knows "
                         "(gemma-3-270m); default SmolLM2-135M-Instruct. Another target trains on its own --data "
                         "and exports elsewhere than models/weights (--export-dir, or --no-export)")
    ap.add_argument("--data", type=Path, default=None, metavar="DIR",
                    help="the shard set (its records' last 5%% are the held-out split); default data/train "
                         "(SmolLM2's answers)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--max-len", type=int, default=320)
    ap.add_argument("--records", type=int, default=None, help="use the first N records")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device (cuda on a lent GPU)")
    ap.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="fit the step count (at most --steps) so that the run (data loading, target states "
                         "and the final evaluation included) ends within SECONDS of wall time: re-fitted every 50 "
                         "steps from step 30 on, at the measured pace of each stage; the schedule decays over "
                         "the fitted run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--export-only", action="store_true",
                    help="export the --work checkpoint (implies --resume; an error without one)")
    ap.add_argument("--description", type=Path, default=None, metavar="FILE",
                    help="train this variant of the drafter's description instead of models/DRAFTER.draft "
                         "(A/B runs; the drafter's recipe and name stay; with --no-export or --export-dir)")
    ap.add_argument("--no-export", action="store_true", help="train and evaluate, leave models/weights alone")
    ap.add_argument("--export-dir", type=Path, default=None, metavar="DIR",
                    help="export the weights, manifest and loss curve into DIR instead of models/weights "
                         "(the manifest names models/DRAFTER.draft, or --description's file, as the description)")
    ap.add_argument("--eval-init", action="store_true",
                    help="with --init-from: evaluate those weights on this run's held-out split before training "
                         "(the baseline of the result, on the same sequences)")
    ap.add_argument("--summary", type=Path, default=None, metavar="PATH",
                    help="write the run's results as JSON: held-out split of the result (and of the --init-from "
                         "weights with --eval-init), steps, wall time")
    ap.add_argument("--work", type=Path, default=None, help="checkpoint directory (default target/train/DRAFTER)")
    ap.add_argument("--eval-only", type=Path, default=None, metavar="CKPT",
                    help="evaluate CKPT (a ckpt.pt or shipped .safetensors, with the draft vocabulary it "
                         "was trained with) on this run's held-out split and print the result, with the "
                         "chain acceptance it implies for autoregressive drafters; exports nothing")
    ap.add_argument("--init-from", type=Path, default=None, metavar="WEIGHTS",
                    help="start from these weights (e.g. models/weights/beagle.safetensors) instead of the "
                         "module's initialisation: a new schedule continues training shipped weights")
    ap.add_argument("--prompt-labels", action="store_true",
                    help="autoregressive drafters: also train on prompt positions, labelled with the target's "
                         "greedy token (recorded in the manifest's recipe)")
    ap.add_argument("--distill", type=float, default=None, metavar="OMEGA",
                    help="train against the target's distribution with SPIRe's MixedLoss(OMEGA) (paper 004 "
                         "§3.4: OMEGA x soft cross-entropy + (1 - OMEGA) x -acceptance) instead of cross-entropy "
                         "on its greedy token; parallel drafters (Medusa, SpecFormer) match the target's "
                         "distribution of each row's token (Medusa-2's self-distillation at 1); recorded in the "
                         "recipe")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's)")
    ap.add_argument("--recipe", action="append", default=[], metavar="KEY=VALUE",
                    help="override one numeric field of the recipe, e.g. train_mask=0 (Beagle's teacher-forced "
                         "stage through its inference mask: every query at draft depth 1) or late_frac=0.5; "
                         "recorded in the manifest's recipe")
    ap.add_argument("--extra-data", type=Path, action="append", default=[], metavar="DIR",
                    help="another shard set (e.g. data/train-later) whose records only add training sequences; "
                         "the held-out split and the draft vocabulary stay those of data/train")
    ap.add_argument("--train-sequences", type=int, default=None, metavar="N",
                    help="train on the first N sequences of data/train's training split only, for data-scaling "
                         "runs: the held-out split and its feature cache stay those of all the records, so runs "
                         "of different N are measured on the same sequences; the draft vocabulary is chosen "
                         "from these N")
    ap.add_argument("--micro-batches", type=int, default=1, metavar="N",
                    help="accumulate each step's gradients over N micro-batches (the same batch, less memory); "
                         "on CUDA running out of memory doubles N by itself")
    ap.add_argument("--eval-train", type=int, default=0, metavar="N",
                    help="also evaluate the result on the first N sequences of the training split, with the "
                         "held-out split's code (an over-fitting probe: summary field train_split)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="reduced draft vocabulary size when the description sets none")
    args = ap.parse_args(argv)
    if args.micro_batches < 1:
        raise SystemExit("--micro-batches: at least 1")
    # Exporting without the checkpoint would write the initial weights.
    args.resume = args.resume or args.export_only
    t_main = time.time()
    global DEV
    DEV = torch.device(args.device).type
    if DEV != "cpu":
        if DEV == "cuda" and not torch.cuda.is_available():
            raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
        torch.set_default_device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    spec = targets.TargetSpec(args.model)
    emitted.use_target(spec)
    args.data = Path(args.data) if args.data else DEFAULT_DATA
    check_data_target(args.data, spec)
    args.drafter, draft, preset = resolve_drafter(args.drafter, args.description)
    if preset is not None and args.preset is not None:
        raise SystemExit("--preset is for a description file; a preset trains with its own recipe")
    if not Path(draft).is_file():
        raise SystemExit(f"{draft}: no such description file")
    if args.description and not (args.no_export or args.export_dir):
        # models/weights/DRAFTER.* must stay the weights of models/DRAFTER.draft.
        raise SystemExit("--description trains a variant: add --no-export or --export-dir DIR")
    mod = emitted.load(draft)
    if preset is None:
        # A description file: weights beside it, where `--drafter FILE`
        # finds them (`shipped`: weights/STEM.safetensors next to the file).
        preset = preset_of(mod, args.preset)
        args.description = Path(draft)
        args.export_dir = args.export_dir or Path(draft).resolve().parent / "weights"
        print(f"{draft}: {mod.KIND} drafter, trained with the {preset!r} preset", flush=True)
    args.preset = preset
    weights_dir = (REPO / "models/weights").resolve()
    if not spec.is_default and not args.no_export and (
            args.export_dir is None or Path(args.export_dir).resolve() == weights_dir):
        # models/weights holds the default target's weights (`--drafter-weights
        # shipped`): another target's go elsewhere.
        raise SystemExit(f"--model {spec.name}: models/weights holds SmolLM2's drafters; export with "
                         "--export-dir DIR (or --no-export)")
    if not spec.is_default:
        print(f"target {spec.name}: {spec.model_type}, {spec.family_file.name}, vocabulary {spec.vocab}, "
              f"{'tied' if spec.tied else 'untied'} head, {spec.chat} prompts; data {args.data}", flush=True)
    r = recipe_of(preset, mod)
    if args.lr is not None:
        r["lr"] = args.lr
    if args.prompt_labels:
        if "ttt_steps" in r:
            raise SystemExit("--prompt-labels: not with a training-time test (it scores response positions)")
        r["prompt_labels"] = True
    if args.distill is not None:
        if "ttt_steps" in r or not 0.0 <= args.distill <= 1.0:
            raise SystemExit("--distill: OMEGA in [0, 1], for drafters without a training-time test (their "
                             "description's train_loss says whether they distil)")
        r["mixed"] = args.distill
        r.setdefault("soft_tap", "n")
    r.setdefault("beta2", 0.95)
    r.setdefault("eps", 1e-8)
    for kv in args.recipe:
        key, sep, value = kv.partition("=")
        if not sep or key not in r or isinstance(r[key], (bool, str)):
            numeric = sorted(k for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
            raise SystemExit(f"--recipe {kv!r}: expected KEY=VALUE with KEY one of {numeric}")
        try:
            r[key] = type(r[key])(value) if isinstance(r[key], int) and value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise SystemExit(f"--recipe {kv!r}: {value!r} is not a number")
    if r.get("window", 1) < 1 or any(r.get(f, 0) not in (0, 1) for f in ("train_mask", "pos_mean", "uniform_steps")):
        raise SystemExit("--recipe: window must be at least 1; train_mask, pos_mean and uniform_steps 0 or 1")
    if not isinstance(r["warmup"], int) or r["warmup"] < 0 or not 0.0 <= r.get("late_frac", 0.0) <= 1.0:
        raise SystemExit("--recipe: warmup is a whole number of steps, late_frac a share in [0, 1]")
    # Resolved once: export writes the loss curve from the same directory.
    work = args.work = args.work or REPO / "target/train" / args.drafter
    work.mkdir(parents=True, exist_ok=True)

    seqs, first_index = load_sequences(args.max_len, args.records, args.data, with_index=True)
    if not seqs:
        raise SystemExit(f"{args.data}: no usable records (run `python -m draftc_train data` first)")
    n_val = max(8, len(seqs) // 20)
    train_idx = list(range(len(seqs) - n_val))
    val_idx = list(range(len(seqs) - n_val, len(seqs)))
    if args.train_sequences is not None:
        if not 1 <= args.train_sequences <= len(train_idx):
            raise SystemExit(f"--train-sequences {args.train_sequences}: the training split holds "
                             f"{len(train_idx)} sequences")
        train_idx = train_idx[: args.train_sequences]
    # The draft vocabulary is chosen on the first-turn training split alone,
    # so extra data leaves it (and `--init-from` weights) unchanged.
    vocab_idx = list(train_idx)
    # Extra shard sets (`--extra-data`) only add training sequences: the
    # held-out split stays the first set's last n_val records.
    parts = [(0, len(seqs))]
    sampled_parts = []
    extra = []
    for d in args.extra_data:
        more, more_index = load_sequences(args.max_len, None, d, with_index=True)
        if not more:
            raise SystemExit(f"--extra-data {d}: no records")
        source, temperature = shard_set_info(d)
        more, dropped = drop_held_out_conversations(first_index, val_idx, more, more_index, source)
        if temperature > 0:
            sampled_parts.append((len(seqs), len(seqs) + len(more)))
        parts.append((len(seqs), len(seqs) + len(more)))
        train_idx += range(len(seqs), len(seqs) + len(more))
        seqs += more
        m = Path(d) / "MANIFEST.json"
        extra.append(dict(shards=os.path.relpath(Path(d).resolve(), REPO), sequences=len(more),
                          dropped_held_out_conversations=dropped, source=source, temperature=temperature,
                          manifest_sha256=shards.sha256_file(m) if m.is_file() else None))
        print(f"extra data {d}: {len(more)} training sequences ({dropped} dropped: their conversation "
              "opens a held-out prompt)", flush=True)
    tgt_tensors = {k: v.to(DEV) for k, v in emitted.load_target_tensors().items()}
    n_target = 1 + max(int(k.split(".")[2]) for k in tgt_tensors if k.startswith("model.layers."))
    if r.get("soft_tap") == "n":
        r = dict(r, soft_tap=n_target)
    taps = sorted(set(taps_of(mod)) | ({r["soft_tap"]} if "soft_tap" in r else set())
                  | ({n_target} if sampled_parts else set()))
    # Cached per shard set, so adding a set reuses the others' states.
    feats = [f for a, b in parts for f in feature_cache(seqs[a:b], taps, args.max_len, tgt_tensors)]
    target, lm_head = make_target(mod, tgt_tensors)
    vocab = lm_head.shape[0]
    own = getattr(mod, "OWN_HEAD", False)
    n_draft = getattr(mod, "DRAFT_VOCAB", None) or args.draft_vocab
    if getattr(mod, "DRAFT_VOCAB", None) and args.draft_vocab and args.draft_vocab != mod.DRAFT_VOCAB:
        raise SystemExit(f"--draft-vocab {args.draft_vocab}: the description sets draft_vocab {mod.DRAFT_VOCAB}")
    vocab_info = None
    if n_draft and n_draft < vocab:
        ids, _ = draft_vocab(seqs, vocab_idx, n_draft, vocab)
        head = Head(lm_head, ids, own=own)
        vocab_info = dict(size=len(ids), chosen_by="most frequent response tokens of the training split"
                          + (f" of {data_name(args.data)} (not the extra data)" if extra else ""),
                          train_coverage=round(coverage(seqs, train_idx, ids, vocab), 4),
                          **({"data_train_coverage": round(coverage(seqs, vocab_idx, ids, vocab), 4)} if extra else {}),
                          held_out_split_coverage=round(coverage(seqs, val_idx, ids, vocab), 4))
        print(f"draft vocabulary: {vocab_info}", flush=True)
    else:
        head = Head(lm_head, own=own)

    net = mod.Model()
    init_held = None
    if args.eval_only:
        # A run with more records has another held-out split: evaluating an
        # older checkpoint there compares data sizes on the same sequences
        # (none of them in either run's training split when the older run
        # used a prefix of the records).
        sd, step = load_weights(args.eval_only)
        load_state(net, sd, args.eval_only)
        # The head it was trained with: its draft vocabulary, or the
        # target's whole one (weights from before `draft_vocab`).
        head = Head(lm_head, sd["draft_vocab.ids"].long(), own=own) if "draft_vocab.ids" in sd else Head(lm_head, own=own)
        loss_fn = make_loss_fn(mod, net, target, head, seqs, feats, taps, r)
        res = dict(checkpoint=str(args.eval_only), step=step, **held_out_eval(net, loss_fn, val_idx, r["batch"]))
        res["chain"] = chain_tau(mod, net, target, head, seqs, feats, taps, r, val_idx[:256], r["batch"])
        if args.eval_train:
            res["train_split"] = held_out_eval(net, loss_fn, train_idx, r["batch"], limit=args.eval_train)
        print(json.dumps(res), flush=True)
        write_summary(args, t_main, eval_only=res)
        return
    if head.ids is not None and getattr(mod, "DRAFT_VOCAB", None):
        net.get_buffer("draft_vocab.ids").copy_(head.ids)
    if args.init_from and not (args.resume and (work / "ckpt.pt").exists()):
        sd, _ = load_weights(args.init_from)
        if "draft_vocab.ids" in sd and head.ids is not None and len(sd["draft_vocab.ids"]) != len(head.ids):
            # The description changed `draft_vocab`: the head is the target's
            # own, so only the selection of its rows changes (nothing trained
            # depends on it).
            print(f"{args.init_from}: draft vocabulary {len(sd['draft_vocab.ids'])} -> {len(head.ids)} tokens "
                  "(the description's draft_vocab)", flush=True)
        elif "draft_vocab.ids" in sd and head.ids is None:
            raise SystemExit(f"{args.init_from}: has a draft vocabulary, the description none")
        elif "draft_vocab.ids" in sd and not torch.equal(sd["draft_vocab.ids"].long(), head.ids):
            # Weights trained on other records (another --records, or before
            # more data) chose another subset: they go on with their own, the
            # rows their head was trained to rank.
            head = Head(lm_head, sd["draft_vocab.ids"].long(), own=own)
            if getattr(mod, "DRAFT_VOCAB", None):
                net.get_buffer("draft_vocab.ids").copy_(head.ids)
            vocab_info = dict(vocab_info or {}, size=len(head.ids), chosen_by=f"kept from the --init-from weights "
                              f"({os.path.basename(args.init_from)}), not this data's selection",
                              train_coverage=round(coverage(seqs, train_idx, head.ids, vocab), 4),
                              held_out_split_coverage=round(coverage(seqs, val_idx, head.ids, vocab), 4))
            vocab_info.pop("data_train_coverage", None)
            print(f"{args.init_from}: keeps its own draft vocabulary (this data selects another): {vocab_info}",
                  flush=True)
        sd.pop("draft_vocab.ids", None)
        load_state(net, sd, args.init_from)
        print(f"initialised from {args.init_from}", flush=True)
        if args.eval_init:
            # The weights continued, measured on this run's held-out split
            # before any step: the baseline the run's own result compares to.
            init_fn = make_loss_fn(mod, net, target, head, seqs, feats, taps, r)
            init_held = held_out_eval(net, init_fn, val_idx, r["batch"])
            init_held["chain"] = chain_tau(mod, net, target, head, seqs, feats, taps, r, val_idx[:256], r["batch"])
            print(f"held-out split, --init-from weights ({init_held['sequences']} sequences): {init_held}", flush=True)
    elif r.get("pruned") and not (args.resume and (work / "ckpt.pt").exists()):
        copied = pruned_init(net, tgt_tensors)
        print(f"pruned initialisation: {len(copied)} tensors from the target's last layers", flush=True)
    # AdamW's β2 and ε: 0.95 and 1e-8 unless the recipe sets them (`--recipe
    # beta2=0.999 --recipe eps=2e-4` is paper 000's App. A).
    opt = torch.optim.AdamW(net.parameters(), lr=r["lr"], betas=(0.9, r.get("beta2", 0.95)),
                            eps=r.get("eps", 1e-8), weight_decay=r["wd"])
    step, log = 0, []
    ckpt = work / "ckpt.pt"
    if args.export_only and not ckpt.exists():
        raise SystemExit(f"--export-only: no checkpoint {ckpt} (train first, or pass the run's --work)")
    if args.resume and ckpt.exists():
        st = torch.load(ckpt, map_location=DEV)
        # The draft vocabulary is chosen from the data, not trained.
        st["model"].pop("draft_vocab.ids", None)
        load_state(net, st["model"], ckpt)
        opt.load_state_dict(st["opt"])
        step, log = st["step"], st["log"]
        random.setstate(st["py_rng"])
        torch.set_rng_state(st["torch_rng"])
        print(f"resumed {args.drafter} at step {step}", flush=True)
    start_wall = time.time()
    first_step = step
    prior_wall = log[-1]["wall"] if log else 0.0
    micro = args.micro_batches

    plabels = None
    if r.get("prompt_labels"):
        if mod.KIND == "parallel":
            raise SystemExit("--prompt-labels: autoregressive drafters only")
        tap = max(mod.MEMORIES.values())
        plabels = [x for a, b in parts for x in prompt_labels(seqs[a:b], feats[a:b], tap, target)]
    # A sampled set's labels are the target's argmax, never its sampled tokens.
    relabels = {}
    for a, b in sampled_parts:
        relabels.update({a + k: x for k, x in enumerate(relabel(seqs[a:b], feats[a:b], n_target, target))})
    loss_fn = make_loss_fn(mod, net, target, head, seqs, feats, taps, r, plabels, relabels)
    eval_fn = make_loss_fn(mod, net, target, head, seqs, feats, taps, r, relabels=relabels)

    prog = None if args.export_only else Progress(args.steps - step, f"train {args.drafter}", unit="step")
    late_frac = r.get("late_frac") if mod.KIND != "parallel" else None
    pacer = None
    if args.time_budget:
        n_eval = -(-min(256, len(val_idx)) // r["batch"]) * (2 if late_frac is not None else 1)
        pacer = Pacer(args.time_budget, t_main, args.steps, late_frac, r.get("sim_steps", 1), n_eval)
    while step < args.steps and prog is not None:
        lr = lr_at(step, args.steps, r)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = random.sample(train_idx, r["batch"])
        net.train()
        opt.zero_grad()
        loss, stats, micro = backward_in_parts(loss_fn, idx, step / args.steps, micro, opt)
        gnorm = torch.nn.utils.clip_grad_norm_(net.parameters(), r["clip"]).item()
        opt.step()
        late = late_frac is not None and (step / args.steps) >= 1.0 - late_frac
        step += 1
        fit = pacer.after_step(step, args.steps, late) if pacer else None
        if fit is not None:
            early_ms, late_ms = (pacer.pace(x) for x in (False, True))
            if abs(fit - args.steps) > 0.02 * args.steps or pacer.n == 30:
                print(f"--time-budget {args.time_budget:.0f}s at {time.time() - t_main:.0f}s: "
                      + (f"{early_ms * 1e3:.1f} ms/step" if early_ms else "")
                      + (f", late stage {late_ms * 1e3:.1f} ms/step" if late_ms else "")
                      + f"; steps {args.steps} -> {fit}", flush=True)
            args.steps = fit
            prog.total = args.steps - first_step
        entry = dict(step=step, lr=lr, loss=loss, gnorm=gnorm, wall=prior_wall + time.time() - start_wall, **stats)
        log.append(entry)
        prog.update(1, loss=round(loss, 3), **{k: round(v, 3) for k, v in stats.items() if k.startswith("acc")})
        if step % args.ckpt_every == 0 or step == args.steps:
            net.eval()
            with torch.no_grad():
                vl, vs = eval_fn(val_idx[: r["batch"] * 2], False, step / args.steps)
            entry["val_loss"] = vl.item()
            entry.update({f"val_{k}": v for k, v in vs.items()})
            torch.save(
                dict(model=net.state_dict(), opt=opt.state_dict(), step=step, log=log,
                     py_rng=random.getstate(), torch_rng=torch.get_rng_state()),
                work / "ckpt.tmp",
            )
            os.replace(work / "ckpt.tmp", ckpt)
            plot(work, args.drafter, log)
    if prog is not None:
        prog.close()
    held = held_out_eval(net, eval_fn, val_idx, r["batch"])
    held["chain"] = chain_tau(mod, net, target, head, seqs, feats, taps, r, val_idx[:256], r["batch"])
    print(f"held-out split ({held['sequences']} sequences): {held}", flush=True)
    on_train = None
    if args.eval_train:
        # The same evaluation on sequences the run trained on: held-out
        # accuracy far below this one means the drafter memorises.
        on_train = held_out_eval(net, eval_fn, train_idx, r["batch"], limit=args.eval_train)
        print(f"training split ({on_train['sequences']} sequences): {on_train}", flush=True)
    exported = None
    if not args.no_export:
        exported = export(args, r, mod, net, log, len(seqs), len(train_idx), taps, head, vocab_info, held, extra)
    last = log[-1] if log else {}
    write_summary(args, t_main, init=init_held, final=held, steps=last.get("step", 0), first_step=first_step,
                  planned_steps=args.steps, train_wall_s=round(time.time() - start_wall, 1),
                  sequences=len(seqs), train_sequences=len(train_idx), recipe=r, train_split=on_train,
                  exported=str(exported) if exported else None)


def backward_in_parts(loss_fn, idx, frac, parts, opt):
    """The batch's gradients, accumulated over `parts` micro-batches (each
    loss weighted by its share of the sequences): (loss, stats, parts). On
    CUDA running out of memory the partial gradients are dropped and the
    batch retried in twice as many parts, kept for the steps after: a long
    batch (a training-time test over 1,024-token sequences) then still
    trains, at the same batch size."""
    while True:
        try:
            total, stats = 0.0, {}
            for k in range(parts):
                part = idx[k::parts]
                w = len(part) / len(idx)
                loss, st = loss_fn(part, True, frac)
                (loss * w).backward()
                total += loss.item() * w
                for key, v in st.items():
                    stats[key] = stats.get(key, 0.0) + v * w
            return total, stats, parts
        except torch.cuda.OutOfMemoryError:
            if parts >= len(idx):
                raise
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            parts *= 2
            print(f"out of device memory: the batch of {len(idx)} now runs in {parts} parts", flush=True)


def write_summary(args, t_main, **fields):
    """`--summary PATH`: the run's results as JSON (held-out splits of the
    --init-from weights and of the result, steps, wall time), for scripts."""
    if not args.summary:
        return
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    device = f"CPU, {args.threads} threads" if DEV == "cpu" else torch.cuda.get_device_name()
    doc = dict(drafter=args.drafter, device=device, time_budget=args.time_budget, init_from=str(args.init_from)
               if args.init_from else None, wall_s=round(time.time() - t_main, 1), **fields)
    args.summary.write_text(json.dumps(doc, indent=2) + "\n")


def make_loss_fn(mod, net, target, head, seqs, feats, taps, r, plabels=None, relabels=None):
    """The recipe's loss over sequences `idx`; `plabels` (training batches
    only) adds the prompt positions' labels, `relabels` are a sampled set's
    (`batch_of`)."""

    def loss_fn(idx, train, frac):
        ids, valid, resp, hidden, nxt = batch_of(seqs, feats, idx, taps, relabels)
        extra = extra_labels(plabels, idx, ids.shape[1]) if train and plabels is not None else None
        with torch.autocast(DEV, dtype=torch.bfloat16):
            if mod.KIND == "parallel":
                L = mod.SYMBOLS.get("l", 1)
                w = [r["decay"] ** j for j in range(L)] if "decay" in r else [1.0] * L
                if r.get("pos_mean"):
                    w = [x / L for x in w]
                rows = r.get("rows") if train and head.ids is None else None
                return parallel_loss(mod, net, target, head, ids, valid, resp, hidden, w, rows,
                                     mixed=r.get("mixed"), soft_tap=r.get("soft_tap"), nxt=nxt)
            if "ttt_steps" in r:
                return ttt_loss(mod, net, target, head, ids, valid, resp, hidden, r, train, nxt=nxt)
            return autoregressive_loss(mod, net, target, head, ids, valid, resp, hidden, r, frac, train,
                                       extra=extra, nxt=nxt)

    return loss_fn


def held_out_eval(net, loss_fn, val_idx, batch, limit=256):
    """Loss and accuracy per draft position (parallel) or simulated step
    (autoregressive) over up to `limit` held-out-split sequences, mean over
    batches: the checkpoints' validation uses only 2 batches."""
    net.eval()
    idx = val_idx[:limit]
    sums, n = {}, 0
    with torch.no_grad():
        for b in range(0, len(idx), batch):
            _, st = loss_fn(idx[b : b + batch], False, 1.0)
            for k, v in st.items():
                sums[k] = sums.get(k, 0.0) + v
            n += 1
    return dict(sequences=len(idx), **{k: round(v / max(1, n), 4) for k, v in sorted(sums.items())})


def chain_tau(mod, net, target, head, seqs, feats, taps, r, idx, batch):
    """What greedy chain drafting would accept on sequences `idx`.
    Autoregressive drafters, from the simulated steps: a round starting at
    query s accepts depth d when steps 1..d, queried at s..s+d-1, all match
    the target's greedy tokens. Parallel drafters (SpecFormer, Medusa): a
    round drafting from position p accepts depth d when rows 1..d at p all
    match. Returns the chain τ for each length 1..k and the cumulative
    acceptance by depth (as `draftc bench spec` reports it), over every
    response position of the sequences. This is what the runtime would
    measure on these sequences if drafting equals the training forward."""
    net.eval()
    parallel = mod.KIND == "parallel"
    sums, starts = None, 0
    with torch.no_grad():
        for b in range(0, len(idx), batch):
            # The held-out split is data/train's: greedy, its own labels.
            ids, valid, resp, hidden, _ = batch_of(seqs, feats, idx[b : b + batch], taps)
            keep = {}
            with torch.autocast(DEV, dtype=torch.bfloat16):
                if parallel:
                    L = mod.SYMBOLS.get("l", 1)
                    parallel_loss(mod, net, target, head, ids, valid, resp, hidden, [1.0] * L, keep=keep)
                elif "ttt_steps" in r:
                    ttt_loss(mod, net, target, head, ids, valid, resp, hidden, r, False, keep)
                else:
                    autoregressive_loss(mod, net, target, head, ids, valid, resp, hidden, r, 1.0, False, keep)
            k = len(keep)
            start = resp[:, 2:] if parallel else resp[:, 1:]
            run = start.clone()
            part = []
            for d in range(1, k + 1):
                hit = keep[d] if parallel else keep[d][:, d - 1 :]
                run = run[:, : hit.shape[1]] & hit
                part.append(float(run.sum()))
            sums = part if sums is None else [a + c for a, c in zip(sums, part)]
            starts += int(start.sum())
    by_depth = [round(x / max(1, starts), 4) for x in sums]
    return dict(rounds=starts, acceptance_by_depth=by_depth,
                chain_tau={d: round(1.0 + sum(by_depth[:d]), 4) for d in range(1, len(by_depth) + 1)})


def plot(work, name, log):
    series = {"train loss": [(e["step"], e["loss"]) for e in log]}
    val = [(e["step"], e["val_loss"]) for e in log if "val_loss" in e]
    if val:
        series["held-out loss (training split)"] = val
    line_plot(work / "loss.svg", f"{name}: training loss", series, "step", "loss")


def export(args, r, mod, net, log, n_seqs, n_train, taps, head, vocab_info, held, extra):
    out = args.export_dir or REPO / "models/weights"
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.detach() if not v.is_floating_point() else v.detach().to(torch.float16)).cpu().contiguous()
        for k, v in net.state_dict().items()
    }
    if head.ids is not None:
        # The reduced draft vocabulary ships with the weights (`draft_vocab N`):
        # the module's `draft_vocab.ids` buffer holds the subset training chose.
        tensors["draft_vocab.ids"] = head.ids.to(torch.int64).cpu().contiguous()
    path = out / f"{args.drafter}.safetensors"
    save_file(tensors, str(path), metadata={"drafter": args.drafter, "steps": str(log[-1]["step"] if log else 0)})
    plot_path = out / f"{args.drafter}.loss.svg"
    if log:
        # The run's own checkpoint directory (`--work`, resolved in `main`).
        plot(args.work, args.drafter, log)
        plot_path.write_bytes((args.work / "loss.svg").read_bytes())
    last = log[-1] if log else {}
    val = [e for e in log if "val_loss" in e]
    manifest = dict(
        drafter=args.drafter,
        description=str(args.description or f"models/{args.drafter}.draft"),
        preset=args.preset,
        module_sha256=mod.SOURCE_SHA256,
        weights=path.name,
        weights_sha256=shards.sha256_file(path),
        dtype="float16",
        parameters=sum(v.numel() for v in tensors.values() if v.is_floating_point()),
        draft_vocab=vocab_info,
        data=dict(shards=f"{data_name(args.data)}/shards (see {data_name(args.data)}/MANIFEST.json)",
                  manifest_sha256=shards.sha256_file(Path(args.data) / "MANIFEST.json"),
                  records_used=f"the first {args.records}" if args.records else "all",
                  sequences=n_seqs, train_sequences=n_train,
                  max_len=args.max_len, target_taps=taps,
                  **({"extra_training_data": extra} if extra else {})),
        recipe=r,
        steps=last.get("step", 0),
        planned_steps=args.steps,
        wall_s=round(last.get("wall", 0.0), 1),
        device=(f"CPU, {args.threads} threads" if DEV == "cpu" else torch.cuda.get_device_name())
        + f", torch {torch.__version__}, bf16 autocast",
        final=dict(train_loss=last.get("loss"), **{k: v for k, v in (val[-1] if val else {}).items() if k.startswith("val_")}),
        held_out_split=held,
        loss_curve=plot_path.name,
        held_out_tau=None,
        held_out_tau_note="not measured yet: `draftc bench spec --prompts mt-bench`, then `python -m draftc_train record-tau`",
    )
    spec = emitted.target_spec()
    if not spec.is_default:
        manifest["target"] = spec.describe()
    if args.init_from:
        # The weights this run continued: their own manifest (read before
        # it is overwritten) says how they were made.
        prior = Path(args.init_from).with_suffix(".json")
        before = json.loads(prior.read_text()) if prior.is_file() else {}
        manifest["continued_from"] = dict(
            weights=os.path.relpath(Path(args.init_from).resolve(), REPO), **{k: before.get(k) for k in
                                            ("weights_sha256", "recipe", "steps", "wall_s", "device", "held_out_split")})
        if before.get("wall_s") is not None:
            manifest["total_wall_s"] = round(before.get("total_wall_s", before["wall_s"]) + manifest["wall_s"], 1)
            manifest["total_steps"] = before.get("total_steps", before.get("steps", 0)) + manifest["steps"]
    (out / f"{args.drafter}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {args.drafter}.json", flush=True)
    return path

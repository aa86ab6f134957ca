"""The PyTorch modules draftc generates from description files.

`load(path)` runs `draftc emit PATH --backend torch`, keeps the text under
target/train/emitted/ and imports it: the .draft file is the only definition
of an architecture, and parameter names are the binder's names.
`TargetModel` is the target itself (its family's model file, models/llama.draft
for SmolLM2, through the same emitter) with the converted weights, for the
hidden states drafters read.

The target is SmolLM2-135M-Instruct unless `use_target` names another
(`train --model`): modules are then compiled against that checkpoint's
`config.json` (`draftc emit --target DIR`), as the runtime compiles them.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from . import targets as T

REPO = Path(__file__).resolve().parents[3]
# The target of this process (`use_target`); None: the default one.
_TARGET = None


def use_target(spec):
    """Make `spec` (a `targets.TargetSpec`) the target every module is
    emitted for and whose tensors and hidden states are read."""
    global _TARGET
    _TARGET = spec


def target_spec():
    global _TARGET
    if _TARGET is None:
        _TARGET = T.TargetSpec()
    return _TARGET


def target_tag():
    """A cache-key part naming the target: empty for the default target (its
    caches keep their names), else a digest of the checkpoint's config.json
    and tokenizer.json."""
    spec = target_spec()
    if spec.is_default:
        return ""
    h = hashlib.sha256((spec.dir / "config.json").read_bytes())
    h.update((spec.dir / "tokenizer.json").read_bytes())
    return f"{spec.model_type}-{h.hexdigest()[:10]}-"


def draftc_bin():
    env = os.environ.get("DRAFTC_BIN")
    if env:
        return env
    for p in (REPO / "target/release/draftc", REPO / "target/debug/draftc"):
        if p.is_file():
            return str(p)
    raise SystemExit("draftc binary not found: run `cargo build --release -p draftc-runtime` (or set DRAFTC_BIN)")


def emit(draft, sets=None):
    cmd = [draftc_bin(), "emit", str(draft), "--backend", "torch", *target_spec().emit_args()]
    for k, v in (sets or {}).items():
        cmd += ["--set", f"{k}={v}"]
    # The repository's target presets also serve a description kept
    # elsewhere (`train --description`): draftc looks next to the file first.
    env = {**os.environ, "DRAFTC_MODELS": os.environ.get("DRAFTC_MODELS", str(REPO / "models"))}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed:\n{r.stderr}")
    return r.stdout


def load(draft, sets=None):
    """Emits `draft` and imports it; returns the Python module (with `Model`,
    `PARAMS`, `INPUTS`, `MEMORIES`, `EXPORTS`, …)."""
    text = emit(draft, sets)
    full = hashlib.sha256(text.encode()).hexdigest()
    digest = full[:16]
    out = REPO / "target/train/emitted"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{Path(draft).stem}-{digest}.py"
    if not path.exists():
        # Atomically: trainings started together emit the same target module.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"draftc_emitted_{Path(draft).stem}_{digest}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    mod.SOURCE_SHA256 = full
    mod.SOURCE_PATH = str(path)
    return mod


def model_dir():
    d = target_spec().dir
    if not (d / "model.safetensors").is_file() and not (d / "model.safetensors.index.json").is_file():
        raise SystemExit(f"{d}/model.safetensors not found: run `draftc fetch` first")
    return d


def load_target_tensors():
    """The converted target's tensors (f32), by name."""
    d = model_dir()
    index = d / "model.safetensors.index.json"
    if (d / "model.safetensors").is_file() or not index.is_file():
        return load_file(str(d / "model.safetensors"))
    out = {}
    for f in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        out.update(load_file(str(d / f)))
    return out


class TargetModel:
    """The target through the module emitted from its family's model file
    (models/llama.draft for SmolLM2, models/gemma3.draft for Gemma 3)."""

    def __init__(self, tensors=None):
        self.dir = model_dir()
        self.mod = load(target_spec().family_file)
        self.tensors = tensors if tensors is not None else load_target_tensors()
        self.net = self.mod.Model()
        missing, unexpected = self.net.load_state_dict(
            {k: v for k, v in self.tensors.items() if k in dict(self.net.named_parameters())}, strict=False
        )
        if missing:
            raise SystemExit(f"target weights lack {missing[:5]}")
        self.net.requires_grad_(False)
        self.net.eval()
        self.config = json.loads((self.dir / "config.json").read_text())

    @torch.no_grad()
    def hidden(self, ids, valid, taps):
        """HS[i] for i in `taps`: ids [B, T] (right-padded, `valid` [B, T])."""
        B, T = ids.shape
        pos = torch.arange(T)[None, :].expand(B, T)
        ctx = self.mod.Ctx(pos, valid=valid)
        out = self.net({"ids": ids}, None, ctx)
        return {i: out[f"hidden[{i}]"] for i in taps}

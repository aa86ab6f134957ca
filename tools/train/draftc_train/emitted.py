"""The PyTorch modules draftc generates from description files.

`load(path)` runs `draftc emit PATH --backend torch`, keeps the text under
target/train/emitted/ and imports it: the .draft file is the only definition
of an architecture, and parameter names are the binder's names.
`TargetModel` is the target itself (models/llama.draft through the same
emitter) with the converted weights, for the hidden states drafters read.
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

from .data import default_model_dir

REPO = Path(__file__).resolve().parents[3]


def draftc_bin():
    env = os.environ.get("DRAFTC_BIN")
    if env:
        return env
    for p in (REPO / "target/release/draftc", REPO / "target/debug/draftc"):
        if p.is_file():
            return str(p)
    raise SystemExit("draftc binary not found: run `cargo build --release -p draftc-runtime` (or set DRAFTC_BIN)")


def emit(draft, sets=None):
    cmd = [draftc_bin(), "emit", str(draft), "--backend", "torch"]
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
    d = default_model_dir()
    if not (d / "model.safetensors").is_file():
        raise SystemExit(f"{d}/model.safetensors not found: run `draftc fetch` first")
    return d


def load_target_tensors():
    """The converted target's tensors (f32), by name."""
    return load_file(str(model_dir() / "model.safetensors"))


class TargetModel:
    """The target through the module emitted from models/llama.draft."""

    def __init__(self, tensors=None):
        self.dir = model_dir()
        self.mod = load(REPO / "models/llama.draft")
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

"""Parity check: the module `draftc emit --backend torch` generated against
the outputs draftc's executor computed on the same weights and inputs.

Usage: python parity.py DIR NAME...   (DIR/NAME.py and DIR/NAME.safetensors,
written by runtime/tests/torch_parity.rs). Exits 1 on any mismatch beyond
f32 1e-4 relative (|a - b| <= 1e-4 * max(1, |b|)). Needs only torch and
safetensors, so it runs without the draftc_train package installed.
"""

import importlib.util
import sys

import torch
from safetensors.torch import load_file


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(f"draftc_emitted_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check(dirname, name):
    mod = load_module(f"{dirname}/{name}.py", name)
    data = load_file(f"{dirname}/{name}.safetensors")
    params = {k[6:]: v for k, v in data.items() if k.startswith("param:")}
    tensors = {k[7:]: v for k, v in data.items() if k.startswith("target:")}
    model = mod.Model()
    missing, unexpected = model.load_state_dict(params, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{name}: state_dict names differ from the binder's: missing {missing}, unexpected {unexpected}")
    target = mod.Target.from_tensors(tensors, mod.EXPORTS, mod.EPS) if tensors else None
    inputs = {k[6:]: v.long() for k, v in data.items() if k.startswith("input:")}
    hidden = {int(k[7:]): v for k, v in data.items() if k.startswith("hidden:")}
    t = next(iter(hidden.values())).shape[1] if hidden else next(iter(inputs.values())).shape[1]
    positions = torch.arange(t)[None, :]
    memory = {}
    for k, v in data.items():
        if k.startswith("memory:"):
            # As the executor was given them: rows at the query positions,
            # under the attention's own mask only.
            memory[k[7:]] = mod.Memory(v, positions)
    ctx = mod.Ctx(positions, hidden=hidden, memory=memory)
    with torch.no_grad():
        out = model(inputs, target, ctx)
    worst = 0.0
    for k, want in data.items():
        if not k.startswith("expect:"):
            continue
        key = k[7:]
        got = out[key].reshape(want.shape).float()
        err = ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()
        worst = max(worst, err)
        if not err <= 1e-4:
            print(f"{name}: `{key}` differs: max relative error {err:.3e}")
            return False
    print(f"{name}: {len([k for k in data if k.startswith('expect:')])} outputs match (max relative error {worst:.2e})")
    return True


def main(argv):
    dirname, names = argv[0], argv[1:]
    ok = all([check(dirname, n) for n in names])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main(sys.argv[1:])

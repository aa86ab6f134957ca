"""Parity of the trainer's training-time test with the engine's EAGLE
drafter: ``python -m draftc_train ttt-parity DIR NAME...``.

DIR/NAME.py is the module `draftc emit --backend torch` generated and
DIR/NAME.safetensors what runtime/tests/ttt_parity.rs recorded: the tokens
(the committed ones up to the round's root, then the drafted chain), the
target states the drafter was given, the drafter's parameters, the target
tensors it shares, and the engine's chain (token and log-probability per
depth). `losses.ttt_steps` runs over the same inputs; step i's output at the
root + i - 1 must pick the engine's depth-i token, with its log-probability
within 1e-4. Exits 1 on any mismatch.
"""

import importlib.util

import torch
from safetensors.torch import load_file

from draftc_train.losses import ttt_steps


def check(dirname, name):
    spec = importlib.util.spec_from_file_location(f"draftc_ttt_{name}", f"{dirname}/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = load_file(f"{dirname}/{name}.safetensors")
    net = mod.Model()
    params = {k[6:]: v for k, v in data.items() if k.startswith("param:")}
    missing, unexpected = net.load_state_dict(params, strict=False)
    if unexpected or set(missing) - {"draft_vocab.ids"}:
        raise SystemExit(f"{name}: parameters differ: missing {missing}, unexpected {unexpected}")
    tensors = {k[7:]: v for k, v in data.items() if k.startswith("target:")}
    target = mod.Target.from_tensors(tensors, mod.EXPORTS, mod.EPS)
    ids = data["ids"].long()
    hidden = {int(k[7:]): v for k, v in data.items() if k.startswith("hidden:")}
    root = int(data["root"][0])
    draft = data["draft"].long().tolist()
    logprob = data["logprob"].tolist()
    valid = torch.ones(ids.shape, dtype=torch.bool)
    vocab = net.get_buffer("draft_vocab.ids") if getattr(mod, "DRAFT_VOCAB", None) else None
    worst, ok = 0.0, True
    with torch.no_grad():
        for i, out in ttt_steps(mod, net, target, ids, valid, hidden, len(draft)):
            lp = out[mod.OUTPUTS[0]][0, root + i - 1].float().log_softmax(-1)
            top = int(lp.argmax())
            token = int(vocab[top]) if vocab is not None else top
            err = abs(float(lp[top]) - logprob[i - 1])
            worst = max(worst, err)
            if token != draft[i - 1] or not err <= 1e-4:
                print(f"{name}: depth {i}: the simulation drafts {token} (log-prob {float(lp[top]):.6f}), "
                      f"the engine {draft[i - 1]} ({logprob[i - 1]:.6f})")
                ok = False
    if ok:
        print(f"{name}: {len(draft)} training-time-test steps equal the engine's chain "
              f"(max log-prob error {worst:.2e})")
    return ok


def main(argv):
    if len(argv) < 2:
        raise SystemExit("usage: python -m draftc_train ttt-parity DIR NAME...")
    ok = all([check(argv[0], n) for n in argv[1:]])
    return 0 if ok else 1

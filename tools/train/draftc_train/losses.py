"""The training losses of every recipe (docs/training.md): the parallel
drafters' per-row cross-entropy, the autoregressive drafters' teacher-forced
and simulated steps (Beagle, SPIRe), and the training-time test (EAGLE,
EAGLE-3); with the LM head they score through (`Head`, a reduced draft
vocabulary) and the target's distribution they distil."""

import random

import torch
import torch.nn.functional as F

# The output every learned drafter binds (its next-token logits).
OUT = "logits"

def make_target(mod, tgt_tensors):
    """The target tensors with `target.lm_head` deferred: the module returns
    features and the loss applies the head to the rows it scores."""
    base = mod.Target.from_tensors(tgt_tensors, mod.EXPORTS, mod.EPS)

    class Deferred(mod.Target):
        def head(self, x, rows=None):
            return x

    return Deferred(base.embed, base.final_norm, base.lm_head, base.eps, base.norm_offset), base.lm_head


class Head:
    """The LM head a drafter predicts through: the target's rows, or the
    rows of its reduced draft vocabulary `ids` (`draft_vocab N`). Labels
    outside the subset are never drafted: they carry no loss and count as
    misses in the accuracy. `own`: the drafter has a head of its own (the
    module's `OWN_HEAD`, EAGLE-3's `lm_head`): its outputs are logits over
    the draft vocabulary already, and the target's rows `w` serve only the
    teacher's distribution."""

    def __init__(self, lm_head, ids=None, own=False):
        ids = None if ids is None else ids.to(lm_head.device)
        self.ids = ids
        self.own = own
        self.w = lm_head if ids is None else lm_head[ids]
        self.t2d = None
        if ids is not None:
            self.t2d = torch.full((lm_head.shape[0],), -1, dtype=torch.long)
            self.t2d[ids] = torch.arange(len(ids))


def logits_of(feats, head):
    """The draft logits of output rows `feats`: through the target's rows,
    or as they are where the drafter has a head of its own."""
    if head.own:
        return feats.float()
    return F.linear(feats, head.w.to(feats.dtype)).float()


def ce_rows(feats, head, labels):
    """Cross-entropy of rows `feats` against `labels` (target ids), and per
    row whether the greedy draft equals the label (its mean is accuracy)."""
    logits = logits_of(feats, head)
    if head.t2d is None:
        loss = F.cross_entropy(logits, labels)
        return loss, logits.argmax(-1) == labels
    d = head.t2d[labels]
    loss = F.cross_entropy(logits, d.clamp(min=0), reduction="none")
    inside = (d >= 0).float()
    loss = (loss * inside).sum() / inside.sum().clamp(min=1.0)
    return loss, logits.argmax(-1) == d


def parallel_loss(mod, net, target, head, ids, valid, resp, hidden, weights, max_rows=None, keep=None,
                  mixed=None, soft_tap=None, nxt=None):
    """SpecFormer and Medusa: row j at position p predicts token p + 2 + j
    (the target's own next token p + 1 is known when the drafter runs).
    The loss is cross-entropy on the target's greedy token, or with `mixed`
    (ω) MixedLoss against the target's distribution for that token (its
    final state `soft_tap` at p + 1 + j): Medusa-2's self-distillation at
    ω = 1. `keep`, when given (evaluation: every row scored), receives per
    draft position j + 1 a `[B, T - 2 - j]` mask of the rows whose greedy
    draft equals the label (false where there is none): `chain_tau` reads
    it. `nxt` `[B, T-1]`: the label of each position's next token (default
    the sequence's own; `trainset.batch_of`)."""
    B, T = ids.shape
    nxt = ids[:, 1:] if nxt is None else nxt
    pos = torch.arange(T)[None, :].expand(B, T)
    ctx = mod.Ctx(pos, valid=valid, hidden=hidden)
    out = net({}, target, ctx)
    # The target's distribution of token q + 1 at every position q.
    p_all = target_probs(mod, target, head, hidden[soft_tap]) if mixed is not None else None
    feats = out["logits"]  # [B, T, l, d]
    total, stats = 0.0, {}
    for j, w in enumerate(weights):
        # row j at p predicts p + 2 + j
        sh = 2 + j
        if T <= sh:
            continue
        lab_ok = resp[:, sh:]
        rows = feats[:, : T - sh, j][lab_ok]
        labels = nxt[:, sh - 1 :][lab_ok]
        p_rows = p_all[:, sh - 1 : T - 1][lab_ok] if p_all is not None else None
        if keep is not None:
            keep[j + 1] = torch.zeros(B, T - sh, dtype=torch.bool)
        if labels.numel() == 0:
            continue
        if max_rows and labels.numel() > max_rows:
            # The LM head over 49k tokens dominates the step on a CPU:
            # score a random subset of the labelled rows (a reduced draft
            # vocabulary scores them all).
            pick = torch.randperm(labels.numel())[:max_rows]
            rows, labels = rows[pick], labels[pick]
            p_rows = p_rows[pick] if p_rows is not None else None
        if p_rows is None:
            loss, hit = ce_rows(rows, head, labels)
        else:
            loss, hit, alpha = mixed_rows(rows, head, labels, p_rows, mixed)
            stats[f"alpha{j}"] = alpha
        if keep is not None and not max_rows:
            keep[j + 1][lab_ok] = hit
        total = total + w * loss
        stats[f"loss{j}"] = loss.item()
        stats[f"acc{j}"] = hit.float().mean().item()
    return total, stats


def noisy(hidden, taps, scale):
    """A copy of `hidden` with Gaussian noise on `taps`, `scale` times each
    tap's standard deviation (paper 002 §A.3's noise on target states)."""
    hidden = dict(hidden)
    for tap in taps:
        hidden[tap] = hidden[tap] + torch.randn_like(hidden[tap]) * scale * hidden[tap].std()
    return hidden


def target_probs(mod, target, head, top):
    """The target's next-token distribution from its final states `top`
    (through its final norm and the head's rows), renormalised on the draft
    vocabulary: what the distilling losses match."""
    with torch.no_grad():
        tl = F.linear(target.norm(top.float()), head.w.float())
        return tl.softmax(-1)


def mixed_rows(feats, head, labels, p_target, omega):
    """SPIRe's MixedLoss(ω) (paper 004 §3.4): ω · cross-entropy against the
    target's distribution + (1 - ω) · (-α), α = Σ_i min(p_i, q_i) the
    expected acceptance probability. Both distributions are over the draft
    vocabulary (the target's renormalised on it: the rest is never drafted).
    Hits (per row; their mean is accuracy) are against the hard labels (the
    target's greedy tokens)."""
    logits = logits_of(feats, head)
    logq = logits.log_softmax(-1)
    distill = -(p_target * logq).sum(-1).mean()
    alpha = torch.minimum(p_target, logq.exp()).sum(-1).mean()
    loss = omega * distill + (1.0 - omega) * (-alpha)
    d = labels if head.t2d is None else head.t2d[labels]
    return loss, logits.argmax(-1) == d, alpha.item()


def stream_seeds(mod, target, hidden, names):
    """Each memory stream's seed rows (`names`): its target tap, through the
    target's final norm where the description norms it (`memory m =
    target.norm(target.hidden[i])`: a teacher-forced pass norms the tap
    itself, but rows the losses build or regress onto are given here)."""
    normed = set(getattr(mod, "MEMORIES_NORMED", []))
    return {n: target.norm(hidden[mod.MEMORIES[n]]) if n in normed
            else hidden[mod.MEMORIES[n]] for n in names}


def regression(out, seeds, names, lab_ok):
    """EAGLE-1's feature regression (the `vloss`; paper 002 §A.3 adds it to
    Beagle with coefficient 10): smooth-L1 between each stream's appended
    row at query q and the target's state it stands in for, the stream's
    seed at q, over the queries with a label."""
    total = 0.0
    for n in names:
        got = out[f"append:{n}"][:, :-1][lab_ok].float()
        total = total + F.smooth_l1_loss(got, seeds[n][:, :-1][lab_ok].float())
    return total


def autoregressive_loss(mod, net, target, head, ids, valid, resp, hidden, r, step_frac, train, keep=None,
                        extra=None, nxt=None):
    """Beagle (paper 002 §4.2) and SPIRe (paper 004 §3.3). Early stage: one
    teacher-forced pass, every memory row the target state it is seeded
    with (Beagle: through the inverse-block train mask, random offset).
    Late stage: `sim_steps` simulated drafting steps over the drafter's own
    appended rows, query q at step i belonging to the round that starts at
    q-i+1 (target rows before it, the drafter's rows of steps 1..i-1 at
    q-i+1..q-1), step i weighted k - i + 1. Every memory stream of the
    description (SPIRe has one per layer) is simulated the same way. The
    loss is cross-entropy on the target's greedy tokens, or MixedLoss when
    the recipe sets `mixed` (ω). `keep`, when given, receives per simulated
    step i a `[B, T-1]` mask of the queries whose greedy draft equals the
    label (false where there is no label): `chain_tau` reads it. `nxt`:
    as in `parallel_loss`."""
    B, T = ids.shape
    nxt = ids[:, 1:] if nxt is None else nxt
    pos = torch.arange(T)[None, :].expand(B, T)
    lab_ok = resp[:, 1:]
    labels = nxt[lab_ok]
    if extra is not None:
        # Prompt positions too, labelled with the target's greedy token.
        lab_ok = lab_ok | (extra >= 0)
        labels = torch.where(resp[:, 1:], nxt, extra)[lab_ok]
    # The distillation and regression targets are the target's own states;
    # the noise only perturbs what the drafter reads.
    clean = stream_seeds(mod, target, hidden, mod.MEMORIES) if r.get("regression") else None
    p_target = None
    if r.get("mixed") is not None:
        p_target = target_probs(mod, target, head, hidden[r["soft_tap"]][:, :-1][lab_ok])
    if train and r.get("noise"):
        hidden = noisy(hidden, set(mod.MEMORIES.values()), r["noise"])
    seeds = stream_seeds(mod, target, hidden, mod.MEMORIES)

    reg = r.get("regression", 0.0)

    def score(out, stats, key):
        feats = out[OUT][:, :-1][lab_ok]
        if p_target is None:
            loss, hit = ce_rows(feats, head, labels)
        else:
            loss, hit, alpha = mixed_rows(feats, head, labels, p_target, r["mixed"])
            stats[f"alpha{key}"] = alpha
        if reg:
            # Both stages (paper 002 §A.3), against the noise-free states.
            loss = loss + reg * regression(out, clean, list(mod.MEMORIES), lab_ok)
        stats[f"loss{key}"], stats[f"acc{key}"] = loss.item(), hit.float().mean().item()
        if keep is not None:
            keep[key] = torch.zeros(B, T - 1, dtype=torch.bool)
            keep[key][lab_ok] = hit
        return loss

    late = step_frac >= 1.0 - r["late_frac"] or keep is not None
    stats = {}
    if not late:
        offset = random.randrange(r["window"]) if "window" in r else None
        # train_mask=0: the description's inference mask (Beagle's
        # cross-diagonal: every query at draft depth 1) instead of its
        # training mask (inverse-block: depths 1..window).
        ctx = mod.Ctx(pos, valid=valid, hidden=hidden, train=bool(r.get("train_mask", 1)), block_offset=offset)
        # Step 1 of the simulation is what the teacher-forced pass trains.
        return score(net({"ids": ids}, target, ctx), stats, 1), stats
    k = r["sim_steps"]
    preds = {name: [] for name in mod.MEMORIES}  # rows of steps 1..i-1, [B, T, d] each
    total = 0.0
    q = pos[:, :, None]
    kp = pos[:, None, :]
    for i in range(1, k + 1):
        vis = torch.cat([kp < q - i + 1] + [kp == q - i + j for j in range(1, i)], 2)
        memory = {
            name: mod.Memory(torch.cat([seeds[name]] + preds[name], 1), torch.cat([pos] * i, 1),
                             torch.cat([valid] * i, 1), vis=vis)
            for name in mod.MEMORIES
        }
        ctx = mod.Ctx(pos, valid=valid, hidden=hidden, memory=memory)
        out = net({"ids": ids}, target, ctx)
        # Beagle's Eq. 6 weights step i by (k - i + 1)/k; uniform_steps
        # (paper 004's rollout) weights every step alike.
        w = 1.0 if r.get("uniform_steps") else (k - i + 1)
        total = total + w * score(out, stats, i) / k
        for name in mod.MEMORIES:
            preds[name].append(out[f"append:{name}"].float())
    return total, stats


def ttt_loss(mod, net, target, head, ids, valid, resp, hidden, r, train, keep=None, nxt=None):
    """EAGLE and EAGLE-3 (descriptions with `train_steps`): training-time
    test (EAGLE-3 §3.3; SafeAILab/EAGLE eagle/traineagle3). Step 1 is the
    teacher-forced pass: query q reads token q and, through `prev`, the
    stream's seed one position before (the fused target feature, or the
    target's normed last state). Step i > 1 simulates draft depth i of the
    round whose root is c = q - i + 1: query q reads the true token q and the
    drafter's own step-(i-1) output at q - 1, and its attention sees step
    1's rows at positions <= c and step j's row at c + j - 1 for 1 < j <= i
    (its round's drafted rows, itself last), as the runtime's cache holds
    them (engine/eagle_drafter.rs). Gradients flow through every step.

    Step i is scored at every query with a label whose round root is at
    position 1 or later, weighted decay^(i-1): distillation against the
    target's distribution renormalised on the draft vocabulary (`distill`;
    the reference does not renormalise) or cross-entropy on its greedy token
    (`ce`), times `token_weight`, plus `regression` x smooth-L1 between the
    output and the stream's seed at q (EAGLE-1's feature regression).
    `keep` receives per step i a `[B, T-1]` mask of the queries whose
    greedy draft equals the label, as `autoregressive_loss` gives it; `nxt`
    as in `parallel_loss`."""
    B, T = ids.shape
    nxt = ids[:, 1:] if nxt is None else nxt
    pos = torch.arange(T)[None, :].expand(B, T)
    k = int(r["ttt_steps"])
    if keep is not None:
        # Evaluation: as deep as the drafter drafts (`l`), however few steps
        # it trains.
        k = max(k, int(mod.SYMBOLS.get("l", 1)))
    names = list(mod.MEMORIES)
    fused = getattr(mod, "MEMORIES_FUSED", {})
    reg = r.get("regression", 0.0)
    if reg and any(n in fused for n in names):
        raise SystemExit("regression against a fused memory stream (a learned target) is not supported")
    # The distillation and regression targets are the target's own states;
    # the noise only perturbs what the drafter reads.
    lab_all = resp[:, 1:]
    p_all = target_probs(mod, target, head, hidden[r["soft_tap"]][:, :-1]) if r.get("distill") else None
    seeds = stream_seeds(mod, target, hidden, names) if reg else {}
    if train and r.get("noise"):
        hidden = noisy(hidden, {t for n in names for t in (fused[n][0] if n in fused else [mod.MEMORIES[n]])},
                       r["noise"])
    total, stats = 0.0, {}
    for i, out in ttt_steps(mod, net, target, ids, valid, hidden, k):
        lab_ok = lab_all & (pos[:, :-1] - i + 1 >= 1)
        labels = nxt[lab_ok]
        rows = out[OUT][:, :-1][lab_ok]
        if p_all is not None:
            tok, hit, alpha = mixed_rows(rows, head, labels, p_all[lab_ok], 1.0)
            stats[f"alpha{i}"] = alpha
        else:
            tok, hit = ce_rows(rows, head, labels)
        step = r.get("token_weight", 1.0) * tok
        if reg:
            step = step + reg * regression(out, seeds, names, lab_ok)
        total = total + r.get("decay", 1.0) ** (i - 1) * step
        stats[f"loss{i}"], stats[f"acc{i}"] = step.item(), hit.float().mean().item()
        if keep is not None:
            keep[i] = torch.zeros(B, T - 1, dtype=torch.bool)
            keep[i][lab_ok] = hit
    return total, stats


def ttt_steps(mod, net, target, ids, valid, hidden, k):
    """The `k` forward passes of a training-time test over `ids` [B, T]
    (`ttt_loss` says what step i computes): yields (i, outputs)."""
    B, T = ids.shape
    pos = torch.arange(T)[None, :].expand(B, T)
    qp = torch.arange(T)[:, None]
    kp = torch.arange(T)[None, :]
    caches, prev = {}, None
    # `prev_start skip`: position 0 has no row, so no query past it sees its
    # key (query 0 sees only itself: a row no round reads or scores, kept
    # so that its softmax has a key).
    first = (kp >= 1) | (qp == 0) if getattr(mod, "PREV_START", "zero") == "skip" else True
    for i in range(1, k + 1):
        # Keys: step 1's rows, then step 2's, ... then this step's own.
        blocks = [(kp <= qp - i + 1) & first] + [kp == qp - i + j for j in range(2, i + 1)]
        memory = {} if prev is None else {n: mod.Memory(prev[n], pos, valid) for n in mod.MEMORIES}
        ctx = mod.Ctx(pos, valid=valid, hidden=hidden, memory=memory, caches=caches,
                      key_vis={"*": torch.cat(blocks, 1)[None]})
        out = net({"ids": ids}, target, ctx)
        yield i, out
        prev = {n: out[f"append:{n}"] for n in mod.MEMORIES}

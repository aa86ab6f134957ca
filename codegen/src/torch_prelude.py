# ---------------------------------------------------------------------------
# draftc torch prelude: the description language's ops in PyTorch, with the
# same semantics as draftc's kernels and reference interpreter (ops/src/…).
# Every tensor carries a leading batch dimension B that the description's
# shapes leave implicit: a value typed [t, l, d] is a torch tensor [B, t, l, d].
# ---------------------------------------------------------------------------
import math

import torch
import torch.nn.functional as F
from torch import nn


class Target:
    """The target model's tensors a drafter reads (`target.embed`,
    `target.norm`, `target.lm_head`), frozen. `target.embed` is the table's
    row as stored (no embedding scale); `target.norm` scales by
    `norm_offset + w`, the module's FINAL_NORM_OFFSET unless given (1 for
    a target whose final norm is Gemma's x̂·(1 + w))."""

    def __init__(self, embed, final_norm, lm_head, eps, norm_offset=None):
        self.embed = embed
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.eps = eps
        self.norm_offset = FINAL_NORM_OFFSET if norm_offset is None else norm_offset

    @staticmethod
    def from_tensors(tensors, exports, eps, device=None, dtype=torch.float32, norm_offset=None):
        def get(key):
            # A drafter binds only the exports it reads; the others stay None.
            name = exports.get(key)
            if name not in tensors:
                return None
            return tensors[name].to(device=device, dtype=dtype)

        return Target(get("embed"), get("final_norm"), get("lm_head"), eps, norm_offset)

    def norm(self, x):
        """`target.norm(x)`: the target's final RMS norm."""
        return rms_norm(x, self.final_norm, self.eps, self.norm_offset)

    def head(self, x, rows=None):
        """`target.lm_head(x)`; over the head's `rows` only for a drafter with
        a reduced draft vocabulary. A trainer may override it (return `x`,
        the features, and apply the head to the rows it scores: paper 000
        computes the LM-head loss one position at a time to save memory)."""
        return F.linear(x, self.lm_head if rows is None else self.lm_head[rows])


class Ctx:
    """What one forward pass sees besides its named inputs.

    positions: [B, T] long, the text position of every query row.
    valid:     [B, T] bool or None; rows that are False (padding) are never keys.
    hidden:    dict int -> [B, T, d], the target's hidden states HS[i] (taps).
    memory:    dict stream name -> Memory; a stream not given here holds the
               target state it is seeded with (teacher forcing).
    caches:    dict cache name -> (k, v, pos, valid) or None; when a dict, every
               attention with `cache=` appends its new keys (generation).
    train:     use each attention's `train_mask` where the file gives one.
    block_offset: when set, the offset of every inverse-block mask (paper
               002 §4.2 draws it at random per batch, in [0, window)).
    key_vis:   dict cache name (or "*": every cache) -> [B or 1, T, M] bool,
               ANDed with the mask of an attention with that `cache=` over
               all M keys it sees (the cached ones, then its own): a
               trainer's training-time test lets each simulated step see its
               own round's rows only.
    """

    def __init__(self, positions, valid=None, hidden=None, memory=None, caches=None, train=False, block_offset=None,
                 key_vis=None):
        self.block_offset = block_offset
        self.key_vis = key_vis if key_vis is not None else {}
        self.positions = positions
        self.valid = valid
        self.hidden = hidden if hidden is not None else {}
        self.memory = memory if memory is not None else {}
        self.caches = caches
        self.train = train

    def tap(self, i):
        if i not in self.hidden:
            raise KeyError(f"target hidden state HS[{i}] not supplied")
        return self.hidden[i]


class Memory:
    """Rows of a memory stream: rows [B, M, d], their text positions [B, M],
    optional valid [B, M] and optional per-query visibility vis [B, T, M]
    (ANDed with the attention's mask, like the runtime's tree tail)."""

    def __init__(self, rows, positions, valid=None, vis=None):
        self.rows = rows
        self.positions = positions
        self.valid = valid
        self.vis = vis


def rms_norm(x, w, eps, offset=0.0):
    # offset 1.0: Gemma's x̂·(1 + w) (`unit_offset`).
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (w.float() + offset)).to(x.dtype)


def group_rms_norm(x, w, eps):
    # x [..., g, d], w [g, d]: one scale vector per group.
    return rms_norm(x, w, eps)


def swiglu(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def geglu(x, gate, up, down):
    return F.linear(F.gelu(F.linear(x, gate), approximate="tanh") * F.linear(x, up), down)


def scaled_embedding(ids, w, scale):
    # Gemma: rows times √d, the factor in the table's dtype.
    return F.embedding(ids, w) * torch.tensor(scale, dtype=w.dtype)


def layer_sum(x, w):
    # x [..., k, d], w [k]: sum_k softmax(w)_k x[..., k, :].
    p = torch.softmax(w.float(), dim=0).to(x.dtype)
    return torch.einsum("...kd,k->...d", x, p)


def rope(x, pos, theta):
    # x [B, T, heads, hd], pos [B, T]; HF rotate-half, inv_freq in f32.
    # `theta` a tuple (theta, factor, low_freq_factor, high_freq_factor,
    # original_context): Llama 3's scaled frequencies (`rope_scaling=llama3`).
    scaling = None
    if isinstance(theta, tuple):
        theta, *scaling = theta
    hd = x.shape[-1]
    half = hd // 2
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=x.device).float() / hd))
    if scaling is not None:
        factor, low, high, original = scaling
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > original / low, inv / factor, inv)
        smooth = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    ang = pos.float()[..., None] * inv  # [B, T, half]
    cos = torch.cos(ang)[:, :, None, :]
    sin = torch.sin(ang)[:, :, None, :]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


def visible(mask, qp, kp):
    """Whether a query at qp [..., Tq, 1] sees a key at kp [..., 1, Tk]
    (ops/src/attention/mask.rs)."""
    kind = mask[0]
    if kind == "full":
        return torch.ones(torch.broadcast_shapes(qp.shape, kp.shape), dtype=torch.bool, device=qp.device)
    if kind == "causal":
        return kp <= qp
    if kind == "cross_diagonal":
        return kp < qp
    if kind == "inverse_block":
        w, off = mask[1], mask[2]
        return torch.div(kp + w - 1 - off, w, rounding_mode="floor") < torch.div(qp + w - 1 - off, w, rounding_mode="floor")
    if kind == "sliding_window":
        w, sink = mask[1], mask[2]
        return (kp <= qp) & ((kp < sink) | (qp - kp < w))
    raise ValueError(f"mask {mask!r} has no training form")


def sdpa(q, k, v, vis, scale=None):
    """q [N, H, Tq, hd], k/v [N, Hkv, Tk, hd], vis [N, Tq, Tk] bool. A query
    row that sees no key gets zeros (draftc's convention). `scale`: the
    scores' scale (None: 1/√hd)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    any_key = vis.any(-1, keepdim=True)  # [N, Tq, 1]
    safe = vis | ~any_key
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=safe[:, None, :, :], scale=scale)
    return o * any_key[:, None, :, :].to(o.dtype)


def attention_seq(x, kv_src, w, h, hkv, hd, mask, theta, ctx, memory=None, cache=None, qk_norm=None, scale=None):
    """Sequence-axis attention with q/k/v/o projections `w` (a dict of
    weights, and `q_proj.bias` … when the attention has biases; `q_norm`
    and `k_norm` with `qk_norm` = (eps, offset): every query and key head
    RMS-normalised before RoPE). Keys come
    from `kv_src` at the query positions (self or `kv=`), from a memory
    stream (strictly earlier positions), or from a cache the new keys are
    appended to."""
    B, T, _ = x.shape
    qpos = ctx.positions
    q = F.linear(x, w["q_proj"], w.get("q_proj.bias")).reshape(B, T, h, hd)
    extra = None
    if memory is not None:
        src, kpos, kvalid, extra = memory.rows, memory.positions, memory.valid, memory.vis
    else:
        src, kpos, kvalid = kv_src, qpos, ctx.valid
    k = F.linear(src, w["k_proj"], w.get("k_proj.bias")).reshape(B, src.shape[1], hkv, hd)
    v = F.linear(src, w["v_proj"], w.get("v_proj.bias")).reshape(B, src.shape[1], hkv, hd)
    if qk_norm is not None:
        q = rms_norm(q, w["q_norm"], *qk_norm)
        k = rms_norm(k, w["k_norm"], *qk_norm)
    if theta is not None:
        q = rope(q, qpos, theta)
        k = rope(k, kpos, theta)
    if cache is not None and ctx.caches is not None:
        old = ctx.caches.get(cache)
        if kvalid is None:
            kvalid = torch.ones(kpos.shape, dtype=torch.bool, device=kpos.device)
        if old is not None:
            k = torch.cat([old[0], k], dim=1)
            v = torch.cat([old[1], v], dim=1)
            kpos = torch.cat([old[2], kpos], dim=1)
            kvalid = torch.cat([old[3], kvalid], dim=1)
        ctx.caches[cache] = (k, v, kpos, kvalid)
    if mask[0] == "inverse_block" and ctx.block_offset is not None:
        mask = (mask[0], mask[1], ctx.block_offset)
    vis = visible(mask, qpos[:, :, None], kpos[:, None, :])
    if kvalid is not None:
        vis = vis & kvalid[:, None, :]
    if extra is not None:
        vis = vis & extra
    key_vis = ctx.key_vis.get(cache, ctx.key_vis.get("*")) if cache is not None else None
    if key_vis is not None:
        vis = vis & key_vis
    o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), vis, scale)
    o = o.transpose(1, 2).reshape(B, T, h * hd)
    return F.linear(o, w["o_proj"])


def attention_draft(x, w, h, hkv, hd, mask, chunk):
    """Draft-axis attention (SpecFormer): x [B, T, l, d], attention over the
    l drafts of each token, the effective batch B*T processed `chunk` rows at
    a time (paper 000 §3.3.2)."""
    B, T, L, D = x.shape
    flat = x.reshape(B * T, L, D)
    pos = torch.arange(L, device=x.device)
    vis_one = visible(mask, pos[:, None], pos[None, :])
    outs = []
    step = chunk if chunk is not None else B * T
    for s in range(0, B * T, max(step, 1)):
        part = flat[s : s + step]
        n = part.shape[0]
        q = F.linear(part, w["q_proj"], w.get("q_proj.bias")).reshape(n, L, h, hd).transpose(1, 2)
        k = F.linear(part, w["k_proj"], w.get("k_proj.bias")).reshape(n, L, hkv, hd).transpose(1, 2)
        v = F.linear(part, w["v_proj"], w.get("v_proj.bias")).reshape(n, L, hkv, hd).transpose(1, 2)
        o = sdpa(q, k, v, vis_one.expand(n, L, L))
        outs.append(F.linear(o.transpose(1, 2).reshape(n, L, h * hd), w["o_proj"]))
    return torch.cat(outs, dim=0).reshape(B, T, L, -1)


def default_memory(ctx, name, seed, norm=None):
    """The rows a memory attention reads: `ctx.memory[name]` as given, else
    the target state the stream is seeded with at every position of the
    pass (teacher forcing), through the target's final norm when the stream
    is declared `target.norm(target.hidden[i])` (`norm` is then the
    `Target`), each query seeing only strictly earlier rows (a row at the
    query's own position never exists when drafting)."""
    m = ctx.memory.get(name)
    if m is not None:
        return m
    pos = ctx.positions
    rows = ctx.tap(seed)
    if norm is not None:
        rows = norm.norm(rows)
    return Memory(rows, pos, ctx.valid, vis=pos[:, None, :] < pos[:, :, None])


def memory_prev(ctx, name, seed, norm=None, fuse=None):
    """`prev(name)`: for every query, the stream's row one position before
    it (zeros where there is none): `ctx.memory[name]` as given (the
    drafter's own rows in simulated steps), else the stream's seed at every
    position (teacher forcing): target state `seed`, through the target's
    final norm when `norm` is the `Target`, or `fuse()`, the learned fusion
    of several taps."""
    m = ctx.memory.get(name)
    if m is None:
        if fuse is not None:
            rows = fuse()
        else:
            rows = ctx.tap(seed)
            if norm is not None:
                rows = norm.norm(rows)
        m = Memory(rows, ctx.positions, ctx.valid)
    hit = m.positions[:, None, :] == ctx.positions[:, :, None] - 1
    if m.valid is not None:
        hit = hit & m.valid[:, None, :].bool()
    return torch.bmm(hit.to(m.rows.dtype), m.rows)


class Params(nn.Module):
    """Registers parameters under their dotted binder names, so
    `state_dict()` keys are exactly the safetensors names draftc binds."""

    def _owner(self, name):
        """The submodule that holds dotted `name`, and its last part."""
        parts = name.split(".")
        mod = self
        for p in parts[:-1]:
            if not hasattr(mod, p) or not isinstance(getattr(mod, p), nn.Module):
                mod.add_module(p, nn.Module())
            mod = getattr(mod, p)
        return mod, parts[-1]

    def add(self, name, shape, init):
        t = torch.empty(shape)
        init(t)
        mod, leaf = self._owner(name)
        mod.register_parameter(leaf, nn.Parameter(t))

    def add_ids(self, name, n):
        """A reduced draft vocabulary's target ids (a buffer saved with the
        weights; training sets it, draftc maps draft ids back through it)."""
        mod, leaf = self._owner(name)
        mod.register_buffer(leaf, torch.arange(n, dtype=torch.long))


//! Lowering of one `attention` op (with its folded norm prologue and
//! residual epilogue) into `ops` launches.
//!
//! Fused self-attention with RoPE over a cache (the target's layers, the
//! drafters' own decoder layers): one linear over the stacked q, k and v
//! weights (`qkv_proj`, the norm in its prologue) whose epilogue rotates q
//! and k and writes the K/V rows into the cache (`Epilogue::RopeQkv`,
//! `ops::linear_rope`), the fused attention kernel, and o_proj with the
//! residual: 3 launches. Where that kernel does not apply (a grouped norm,
//! a stacked weight over one binding) the stacked projection is followed
//! by one `rope_qkv_append`. Otherwise (cross or memory attention, no RoPE
//! or no cache, unfused plans): q/k/v projections (the norm recomputed in
//! each projection's prologue), RoPE of q and k, the K/V rows into the
//! cache (fused: the projections write the cache's new rows directly;
//! unfused: a `kv_append`), the attention kernel (comptime mask, GQA;
//! draft-axis attention in chunks), and o_proj.
//!
//! Limits: ops has no single whole-attention kernel, so a fused
//! self-attention is 3 launches and any other 5–7; cache length is
//! `context + t` per sequence; memory attention projects only this pass's
//! new memory rows (earlier rows' K/V are in the memory's cache).

use draftc_ir::graph::ValueId;
use draftc_ir::op::{AttentionAttrs, Axis, Cache, Mask};

use super::blocks::{Epi, Lin, Pro};
use super::Lowerer;
use crate::error::CodegenError;
use crate::kernel::{Epilogue, Kernel, Prologue};

/// The largest weight one binding holds (`draftc_ops::launch::MAX_BINDING_BYTES`):
/// a stacked q/k/v weight above it keeps the two-launch form.
const MAX_BINDING_BYTES: i64 = 128 << 20;
use crate::plan::{BufferClass, BufferId};

impl Lowerer<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &mut self,
        main: ValueId,
        a: &AttentionAttrs,
        pro: Option<&Pro>,
        residual: Option<(ValueId, BufferId)>,
        x: BufferId,
        out: BufferId,
        fused: bool,
    ) -> Result<(), CodegenError> {
        let name = self.graph().node(main).name.clone();
        let (rows, dm) = self.rows_last(self.input(main, 0)?)?;
        let (qw, kvw) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        let batch = self.batch();
        let mut pro_nodes: Vec<ValueId> = pro.map(|p| p.nodes.clone()).unwrap_or_default();
        pro_nodes.push(main);
        // Where K/V are projected from, and how many new rows.
        let (kv_x, kv_rows_new, dkv, kv_pro) = if a.cross {
            let kv_val = self.input(main, 1)?;
            let (r, d) = self.rows_last(kv_val)?;
            (self.buf(kv_val)?, r, d, None)
        } else if let Some(mem) = &a.memory {
            let b = self.state(mem.to_string(), vec![rows, dm], BufferClass::Input);
            (b, rows, dm, None)
        } else {
            (x, rows, dm, pro)
        };
        let cache = match (&a.cache, &a.memory) {
            (Cache::Own(s), _) => Some(s.to_string()),
            (Cache::Target(s), _) => Some(format!("target.{s}")),
            (Cache::None, Some(m)) => Some(format!("{m}.kv")),
            (Cache::None, None) => None,
        };
        let wq = self.weight(main, "q_proj.weight", vec![qw, dm])?;
        let wk = self.weight(main, "k_proj.weight", vec![kvw, dkv])?;
        let wv = self.weight(main, "v_proj.weight", vec![kvw, dkv])?;
        // `out=`: the output's width (EAGLE-3 attends from 2d to d).
        let dout = a.out.unwrap_or(dm);
        let wo = self.weight(main, "o_proj.weight", vec![dout, qw])?;
        // `bias`: q/k/v biases, added by each projection's epilogue.
        let bias = |lw: &Self, part: &str, n: i64| -> Result<Epi, CodegenError> {
            Ok(if a.bias {
                Epi::Bias(lw.weight(main, &format!("{part}.bias"), vec![n])?)
            } else {
                Epi::None
            })
        };
        let q = self.temp(format!("{name}.q"), vec![rows, qw]);
        let kv_nodes = if kv_pro.is_some() {
            pro_nodes.clone()
        } else {
            vec![main]
        };
        let per_seq_new = kv_rows_new / batch.max(1);
        let cache_rows = batch * (self.context() + per_seq_new);
        let caches = cache.as_ref().map(|c| {
            let k = self.state(format!("{c}.k"), vec![cache_rows, kvw], BufferClass::State);
            let v = self.state(format!("{c}.v"), vec![cache_rows, kvw], BufferClass::State);
            (k, v)
        });
        // `qk_norm`: the new K rows are normalised and rotated in a
        // temporary before they are appended, so the projections do not
        // write the cache.
        let direct = fused && caches.is_some() && a.qk_norm.is_none();
        let self_attention = !a.cross && a.memory.is_none() && a.axis == Axis::Sequence;
        let (k_read, v_read) = match (caches, a.rope) {
            // The stacked q/k/v launches take no biases and no head norms:
            // with `bias` or `qk_norm` each projection is its own launch
            // below (`direct` is off with `qk_norm`).
            (Some((kc, vc)), Some(theta)) if direct && self_attention && !a.bias => {
                let n = qw + 2 * kvw;
                let grouped = matches!(pro.map(|p| p.kind), Some(Prologue::GroupRmsNorm { .. }));
                let bytes = n * dm * self.cfg.dtype.size();
                if !grouped && bytes <= MAX_BINDING_BYTES {
                    // One launch: the stacked projection with RoPE and both
                    // cache appends as its epilogue.
                    let mut weights = Vec::new();
                    let prologue = match pro {
                        Some(p) => {
                            weights.push(p.gamma.clone());
                            p.kind
                        }
                        None => Prologue::None,
                    };
                    weights.extend([wq, wk, wv]);
                    let elem = self.cfg.dtype.size() as usize;
                    let norm = prologue != Prologue::None;
                    let layout = self
                        .cfg
                        .device
                        .linear_layout(rows, dm, n, 1, elem, norm, false);
                    let kernel = Kernel::Linear {
                        m: rows,
                        k: dm,
                        n,
                        prologue,
                        epilogue: Epilogue::RopeQkv {
                            heads: a.heads,
                            kv_heads: a.kv_heads,
                            head_dim: a.head_dim,
                            theta,
                        },
                        into_cache: true,
                        parts: 3,
                        layout,
                    };
                    self.launch(
                        kernel,
                        "qkv_proj",
                        pro_nodes,
                        vec![x],
                        vec![q, kc, vc],
                        weights,
                        None,
                    );
                } else {
                    // The stacked projection, then one launch for RoPE on
                    // q and k and both cache appends.
                    let qkv = self.temp(format!("{name}.qkv"), vec![rows, n]);
                    let l = Lin {
                        part: "qkv_proj",
                        nodes: pro_nodes,
                        x,
                        m: rows,
                        k: dm,
                        n,
                        pro,
                        weight: wq,
                        epi: Epi::None,
                        out: qkv,
                        into_cache: false,
                    };
                    self.lin_concat(l, vec![wk, wv]);
                    let kernel = Kernel::RopeQkvAppend {
                        tokens: rows,
                        heads: a.heads,
                        kv_heads: a.kv_heads,
                        head_dim: a.head_dim,
                        theta,
                    };
                    self.launch(
                        kernel,
                        "rope qkv",
                        vec![main],
                        vec![qkv],
                        vec![q, kc, vc],
                        Vec::new(),
                        None,
                    );
                }
                (kc, vc)
            }
            _ => {
                let epi = bias(self, "q_proj", qw)?;
                self.lin(Lin {
                    part: "q_proj",
                    nodes: pro_nodes.clone(),
                    x,
                    m: rows,
                    k: dm,
                    n: qw,
                    pro,
                    weight: wq,
                    epi,
                    out: q,
                    into_cache: false,
                });
                let (k, v) = match caches {
                    Some(kv) if direct => kv,
                    _ => (
                        self.temp(format!("{name}.k"), vec![kv_rows_new, kvw]),
                        self.temp(format!("{name}.v"), vec![kv_rows_new, kvw]),
                    ),
                };
                for (part, w, o) in [("k_proj", wk, k), ("v_proj", wv, v)] {
                    let epi = bias(self, part, kvw)?;
                    self.lin(Lin {
                        part,
                        nodes: kv_nodes.clone(),
                        x: kv_x,
                        m: kv_rows_new,
                        k: dkv,
                        n: kvw,
                        pro: kv_pro,
                        weight: w,
                        epi,
                        out: o,
                        into_cache: direct,
                    });
                }
                if let Some(norm) = a.qk_norm.as_deref() {
                    // Each head normalised, then rotated, in one launch.
                    for (part, b, r, h) in [
                        ("q_norm", q, rows, a.heads),
                        ("k_norm", k, kv_rows_new, a.kv_heads),
                    ] {
                        let w = self.weight(main, &format!("{part}.weight"), vec![a.head_dim])?;
                        let kernel = Kernel::HeadNorm {
                            tokens: r,
                            heads: h,
                            head_dim: a.head_dim,
                            eps: norm.eps,
                            weight: norm.weight,
                            theta: a.rope,
                        };
                        self.launch(kernel, part, vec![main], vec![b], vec![b], vec![w], Some(0));
                    }
                } else if let Some(theta) = a.rope {
                    for (part, b, r, h) in [
                        ("rope q", q, rows, a.heads),
                        ("rope k", k, kv_rows_new, a.kv_heads),
                    ] {
                        let kernel = Kernel::Rope {
                            tokens: r,
                            heads: h,
                            head_dim: a.head_dim,
                            theta,
                        };
                        self.launch(
                            kernel,
                            part,
                            vec![main],
                            vec![b],
                            vec![b],
                            Vec::new(),
                            Some(0),
                        );
                    }
                }
                match caches {
                    Some((kc, vc)) => {
                        if !direct {
                            let kernel = Kernel::KvAppend {
                                rows: kv_rows_new,
                                width: kvw,
                            };
                            self.launch(
                                kernel,
                                "",
                                vec![main],
                                vec![k, v],
                                vec![kc, vc],
                                Vec::new(),
                                None,
                            );
                        }
                        (kc, vc)
                    }
                    None => (k, v),
                }
            }
        };
        let o = self.temp(format!("{name}.o"), vec![rows, qw]);
        let kernel = match a.axis {
            Axis::Draft => {
                let l = self.symbol("l");
                let bt = rows / l.max(1);
                Kernel::DraftDimAttention {
                    bt,
                    l,
                    heads: a.heads,
                    kv_heads: a.kv_heads,
                    head_dim: a.head_dim,
                    chunk: a.chunk.unwrap_or(bt),
                }
            }
            Axis::Sequence => {
                let per_seq = if caches.is_some() {
                    self.context() + per_seq_new
                } else {
                    per_seq_new
                };
                let keys = match a.mask {
                    Mask::SlidingWindow { window, sink } => per_seq.min(window + sink),
                    Mask::Causal
                    | Mask::Full
                    | Mask::CrossDiagonal
                    | Mask::InverseBlock { .. }
                    | Mask::Tree => per_seq,
                };
                let read_rows = match a.mask {
                    Mask::SlidingWindow { window, sink } => {
                        per_seq.min(window + sink + per_seq_new)
                    }
                    Mask::Causal
                    | Mask::Full
                    | Mask::CrossDiagonal
                    | Mask::InverseBlock { .. }
                    | Mask::Tree => per_seq,
                };
                Kernel::Attention {
                    q_rows: rows,
                    kv_rows: batch * read_rows,
                    keys,
                    heads: a.heads,
                    kv_heads: a.kv_heads,
                    head_dim: a.head_dim,
                    mask: a.mask,
                    layout: self
                        .cfg
                        .device
                        .attention_layout(a.heads, a.kv_heads, a.head_dim),
                    scale: a.scale,
                }
            }
        };
        self.launch(
            kernel,
            "core",
            vec![main],
            vec![q, k_read, v_read],
            vec![o],
            Vec::new(),
            None,
        );
        let epi = match residual {
            Some((_, r)) => Epi::Residual(r),
            None => Epi::None,
        };
        let last: Vec<ValueId> = std::iter::once(main).chain(residual.map(|r| r.0)).collect();
        self.lin(Lin {
            part: "o_proj",
            nodes: last,
            x: o,
            m: rows,
            k: qw,
            n: dout,
            pro: None,
            weight: wo,
            epi,
            out,
            into_cache: false,
        });
        Ok(())
    }
}

//! Lowering of the weight ops — `linear`, `target.lm_head`, `attention`,
//! `swiglu` — into `ops` launches, with an optional norm prologue (folded
//! into every projection that reads the normed input) and residual epilogue
//! (folded into the last projection, in place when the residual dies).
//!
//! Unfused (`fused = false`) they expand to one launch per primitive:
//! attention = q, k, v projections, RoPE of q and k, KV append, the fused
//! attention kernel, o_proj; SwiGLU = gate, up, silu·mul, down. Fused: K/V
//! projections write the cache's new rows directly, and gate/up are one
//! linear with the SwiGLU epilogue.

use draftc_ir::graph::ValueId;
use draftc_ir::op::{AttentionAttrs, Axis, Cache, Mask, Op};

use super::Lowerer;
use crate::error::CodegenError;
use crate::fuse::FusedGroup;
use crate::kernel::{ElementwiseOp, Epilogue, Kernel, Prologue};
use crate::plan::{BufferClass, BufferId, WeightRef};

/// A norm folded into a linear's input.
pub(crate) struct Pro {
    kind: Prologue,
    gamma: WeightRef,
    /// The norm's input (what the linear reads).
    x: BufferId,
    /// The norm node and the views after it.
    nodes: Vec<ValueId>,
}

/// What a linear does after the product.
enum Epi {
    None,
    Bias(WeightRef),
    Residual(BufferId),
    SwiGlu(WeightRef),
}

/// One linear launch.
struct Lin<'p> {
    part: &'static str,
    nodes: Vec<ValueId>,
    x: BufferId,
    m: i64,
    k: i64,
    n: i64,
    pro: Option<&'p Pro>,
    weight: WeightRef,
    epi: Epi,
    out: BufferId,
    into_cache: bool,
}

impl Lowerer<'_> {
    pub(crate) fn fused(&mut self, group: &FusedGroup) -> Result<(), CodegenError> {
        let pro = match group.prologue {
            Some(n) => Some(self.prologue(n, &group.prologue_views)?),
            None => None,
        };
        let residual = match group.residual {
            Some((add, other)) => Some((add, self.buf(other)?)),
            None => None,
        };
        let out = self.value_buffer(group.output())?;
        self.weight_op(group.main, pro.as_ref(), residual, out, true)
    }

    fn prologue(&mut self, norm: ValueId, views: &[ValueId]) -> Result<Pro, CodegenError> {
        let x = self.buf(self.input(norm, 0)?)?;
        let node = self.graph().node(norm);
        let dims = self.shape(norm)?;
        let d = dims.last().copied().unwrap_or(1);
        let (kind, gamma) = match &node.op {
            Op::RmsNorm { eps } => (
                Prologue::RmsNorm { eps: *eps },
                self.weight(norm, "weight", vec![d])?,
            ),
            Op::TargetNorm => {
                let name = format!("{}.weight", self.export(norm, "final_norm")?);
                let eps = self.target.eps;
                (Prologue::RmsNorm { eps }, self.weight_named(name, vec![d]))
            }
            Op::GroupRmsNorm { eps } => {
                let groups = dims
                    .len()
                    .checked_sub(2)
                    .and_then(|i| dims.get(i))
                    .copied()
                    .unwrap_or(1);
                let w = self.weight(norm, "weight", vec![groups, d])?;
                (Prologue::GroupRmsNorm { groups, eps: *eps }, w)
            }
            other => {
                return Err(CodegenError::Internal(format!(
                    "`{}` ({}) is not a norm prologue",
                    node.name,
                    other.name()
                )))
            }
        };
        let mut nodes = vec![norm];
        nodes.extend_from_slice(views);
        Ok(Pro {
            kind,
            gamma,
            x,
            nodes,
        })
    }

    /// Lower weight op `main` writing `out`; `residual` = (add node, residual buffer).
    pub(crate) fn weight_op(
        &mut self,
        main: ValueId,
        pro: Option<&Pro>,
        residual: Option<(ValueId, BufferId)>,
        out: BufferId,
        fused: bool,
    ) -> Result<(), CodegenError> {
        let op = self.graph().node(main).op.clone();
        let x_val = self.input(main, 0)?;
        let (m, k) = self.rows_last(x_val)?;
        let mut nodes: Vec<ValueId> = pro.map(|p| p.nodes.clone()).unwrap_or_default();
        nodes.push(main);
        nodes.extend(residual.map(|r| r.0));
        let x = match pro {
            Some(p) => p.x,
            None => self.buf(x_val)?,
        };
        let epi_res = |e: Epi| match residual {
            Some((_, r)) => Epi::Residual(r),
            None => e,
        };
        match op {
            Op::Linear { out: n, bias } => {
                let n = self.eval(main, &n)?;
                let weight = self.weight(main, "weight", vec![n, k])?;
                let epi = if bias {
                    Epi::Bias(self.weight(main, "bias", vec![n])?)
                } else {
                    Epi::None
                };
                let epi = epi_res(epi);
                self.lin(Lin {
                    part: "",
                    nodes,
                    x,
                    m,
                    k,
                    n,
                    pro,
                    weight,
                    epi,
                    out,
                    into_cache: false,
                });
            }
            Op::TargetLmHead => {
                let n = self.vocab();
                let name = format!("{}.weight", self.export(main, "lm_head")?);
                let weight = self.weight_named(name, vec![n, k]);
                let epi = epi_res(Epi::None);
                self.lin(Lin {
                    part: "",
                    nodes,
                    x,
                    m,
                    k,
                    n,
                    pro,
                    weight,
                    epi,
                    out,
                    into_cache: false,
                });
            }
            Op::SwiGlu { hidden } => {
                let f = self.eval(main, &hidden)?;
                let gate = self.weight(main, "gate_proj.weight", vec![f, k])?;
                let up = self.weight(main, "up_proj.weight", vec![f, k])?;
                let down = self.weight(main, "down_proj.weight", vec![k, f])?;
                let name = self.graph().node(main).name.clone();
                let h = self.temp(format!("{name}.h"), vec![m, f]);
                let first: Vec<ValueId> = nodes
                    .iter()
                    .copied()
                    .filter(|n| Some(*n) != residual.map(|r| r.0))
                    .collect();
                if fused {
                    self.lin(Lin {
                        part: "gate·up",
                        nodes: first,
                        x,
                        m,
                        k,
                        n: f,
                        pro,
                        weight: gate,
                        epi: Epi::SwiGlu(up),
                        out: h,
                        into_cache: false,
                    });
                } else {
                    let g = self.temp(format!("{name}.gate"), vec![m, f]);
                    let u = self.temp(format!("{name}.up"), vec![m, f]);
                    self.lin(Lin {
                        part: "gate",
                        nodes: first.clone(),
                        x,
                        m,
                        k,
                        n: f,
                        pro,
                        weight: gate,
                        epi: Epi::None,
                        out: g,
                        into_cache: false,
                    });
                    self.lin(Lin {
                        part: "up",
                        nodes: first,
                        x,
                        m,
                        k,
                        n: f,
                        pro,
                        weight: up,
                        epi: Epi::None,
                        out: u,
                        into_cache: false,
                    });
                    let kernel = Kernel::Elementwise {
                        op: ElementwiseOp::SwiGlu,
                        numel: m * f,
                        b_numel: m * f,
                    };
                    self.launch(
                        kernel,
                        "silu·mul",
                        vec![main],
                        vec![g, u],
                        vec![h],
                        Vec::new(),
                        None,
                    );
                }
                let last: Vec<ValueId> =
                    std::iter::once(main).chain(residual.map(|r| r.0)).collect();
                let epi = epi_res(Epi::None);
                self.lin(Lin {
                    part: "down",
                    nodes: last,
                    x: h,
                    m,
                    k: f,
                    n: k,
                    pro: None,
                    weight: down,
                    epi,
                    out,
                    into_cache: false,
                });
            }
            Op::Attention(a) => self.attention(main, &a, pro, residual, x, out, fused)?,
            Op::Input(_)
            | Op::RmsNorm { .. }
            | Op::GroupRmsNorm { .. }
            | Op::Rope { .. }
            | Op::Embedding { .. }
            | Op::TargetEmbed
            | Op::TargetNorm
            | Op::Reshape { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Stack { .. }
            | Op::Add
            | Op::Mul
            | Op::Silu
            | Op::LayerSum => {
                return Err(CodegenError::Internal(format!(
                    "`{}` is not a weight op",
                    op.name()
                )))
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
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
        let wo = self.weight(main, "o_proj.weight", vec![dm, qw])?;
        let q = self.temp(format!("{name}.q"), vec![rows, qw]);
        let kv_nodes = if kv_pro.is_some() {
            pro_nodes.clone()
        } else {
            vec![main]
        };
        self.lin(Lin {
            part: "q_proj",
            nodes: pro_nodes,
            x,
            m: rows,
            k: dm,
            n: qw,
            pro,
            weight: wq,
            epi: Epi::None,
            out: q,
            into_cache: false,
        });
        let per_seq_new = kv_rows_new / batch.max(1);
        let cache_rows = batch * (self.context() + per_seq_new);
        let caches = cache.as_ref().map(|c| {
            let k = self.state(format!("{c}.k"), vec![cache_rows, kvw], BufferClass::State);
            let v = self.state(format!("{c}.v"), vec![cache_rows, kvw], BufferClass::State);
            (k, v)
        });
        let direct = fused && caches.is_some();
        let (k, v) = match caches {
            Some(kv) if direct => kv,
            _ => (
                self.temp(format!("{name}.k"), vec![kv_rows_new, kvw]),
                self.temp(format!("{name}.v"), vec![kv_rows_new, kvw]),
            ),
        };
        for (part, w, o) in [("k_proj", wk, k), ("v_proj", wv, v)] {
            self.lin(Lin {
                part,
                nodes: kv_nodes.clone(),
                x: kv_x,
                m: kv_rows_new,
                k: dkv,
                n: kvw,
                pro: kv_pro,
                weight: w,
                epi: Epi::None,
                out: o,
                into_cache: direct,
            });
        }
        if let Some(theta) = a.rope {
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
        let (k_read, v_read) = match caches {
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
            n: dm,
            pro: None,
            weight: wo,
            epi,
            out,
            into_cache: false,
        });
        Ok(())
    }

    fn lin(&mut self, l: Lin<'_>) {
        let mut inputs = vec![l.x];
        let mut weights = Vec::new();
        let prologue = match l.pro {
            Some(p) => {
                weights.push(p.gamma.clone());
                p.kind
            }
            None => Prologue::None,
        };
        weights.push(l.weight);
        let mut alias = None;
        let epilogue = match l.epi {
            Epi::None => Epilogue::None,
            Epi::Bias(b) => {
                weights.push(b);
                Epilogue::Bias
            }
            Epi::Residual(r) => {
                inputs.push(r);
                alias = Some(1);
                Epilogue::Residual
            }
            Epi::SwiGlu(up) => {
                weights.push(up);
                Epilogue::SwiGlu
            }
        };
        let kernel = Kernel::Linear {
            m: l.m,
            k: l.k,
            n: l.n,
            prologue,
            epilogue,
            into_cache: l.into_cache,
        };
        self.launch(kernel, l.part, l.nodes, inputs, vec![l.out], weights, alias);
    }
}

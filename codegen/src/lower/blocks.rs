//! Lowering of the weight ops — `linear`, `target.lm_head`, `attention`,
//! `swiglu` — into `ops` launches, with an optional norm prologue (folded
//! into every projection that reads the normed input) and residual epilogue
//! (folded into the last projection, in place when the residual dies).
//!
//! Unfused (`fused = false`) they expand to one launch per primitive:
//! attention = q, k, v projections, RoPE of q and k, KV append, the fused
//! attention kernel, o_proj; SwiGLU = gate, up, silu·mul, down. Fused: K/V
//! projections write the cache's new rows directly, and gate/up are one
//! linear with the SwiGLU epilogue. Attention lives in `attention.rs`.

use draftc_ir::graph::ValueId;
use draftc_ir::op::{GateAct, Op};

use super::Lowerer;
use crate::error::CodegenError;
use crate::fuse::FusedGroup;
use crate::kernel::{ElementwiseOp, Epilogue, Kernel, Prologue};
use crate::plan::{BufferId, WeightRef};

/// A norm folded into a linear's input.
pub(crate) struct Pro {
    pub(super) kind: Prologue,
    pub(super) gamma: WeightRef,
    /// The norm's input (what the linear reads).
    pub(super) x: BufferId,
    /// The norm node and the views after it.
    pub(super) nodes: Vec<ValueId>,
}

/// What a linear does after the product.
pub(super) enum Epi {
    None,
    Bias(WeightRef),
    Residual(BufferId),
    SwiGlu(WeightRef),
    GeGlu(WeightRef),
}

/// One linear launch.
pub(super) struct Lin<'p> {
    pub(super) part: &'static str,
    pub(super) nodes: Vec<ValueId>,
    pub(super) x: BufferId,
    pub(super) m: i64,
    pub(super) k: i64,
    pub(super) n: i64,
    pub(super) pro: Option<&'p Pro>,
    pub(super) weight: WeightRef,
    pub(super) epi: Epi,
    pub(super) out: BufferId,
    pub(super) into_cache: bool,
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
            Op::RmsNorm { eps, weight } => (
                Prologue::RmsNorm { eps: *eps },
                self.weight(norm, "weight", vec![d])?.with_norm(*weight),
            ),
            Op::TargetNorm => {
                let name = format!("{}.weight", self.export(norm, "final_norm")?);
                let eps = self.target.eps;
                let w = self
                    .weight_named(name, vec![d])
                    .with_norm(self.target.final_norm);
                (Prologue::RmsNorm { eps }, w)
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
            Op::Linear { .. } | Op::TargetLmHead => {
                let (n, weight, epi) = if let Op::Linear { out: n, bias } = op {
                    let n = self.eval(main, &n)?;
                    let weight = self.weight(main, "weight", vec![n, k])?;
                    let epi = if bias {
                        Epi::Bias(self.weight(main, "bias", vec![n])?)
                    } else {
                        Epi::None
                    };
                    (n, weight, epi)
                } else {
                    // The LM head. A reduced draft vocabulary reads its own
                    // rows of the head, gathered by the runtime
                    // (`DRAFT_VOCAB_HEAD`).
                    let (n, name) = match self.graph().meta.reduced_vocab(self.vocab()) {
                        Some(n) => (n, crate::bind::DRAFT_VOCAB_HEAD.to_string()),
                        None => (
                            self.vocab(),
                            format!("{}.weight", self.export(main, "lm_head")?),
                        ),
                    };
                    (n, self.weight_named(name, vec![n, k]), Epi::None)
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
            Op::SwiGlu { hidden, act } => {
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
                        epi: match act {
                            GateAct::Silu => Epi::SwiGlu(up),
                            GateAct::GeluTanh => Epi::GeGlu(up),
                        },
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
                    let (op, part) = match act {
                        GateAct::Silu => (ElementwiseOp::SwiGlu, "silu·mul"),
                        GateAct::GeluTanh => (ElementwiseOp::GeGlu, "gelu·mul"),
                    };
                    let kernel = Kernel::Elementwise {
                        op,
                        numel: m * f,
                        b_numel: m * f,
                    };
                    self.launch(
                        kernel,
                        part,
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
            // Only weight ops reach here: `fuse::is_weight_op` (exhaustive
            // over `Op`) classifies them, and `single` sends the same ops.
            _ => {
                return Err(CodegenError::Internal(format!(
                    "`{}` is not a weight op",
                    op.name()
                )))
            }
        }
        Ok(())
    }

    pub(super) fn lin(&mut self, l: Lin<'_>) {
        self.lin_concat(l, Vec::new());
    }

    /// [`Self::lin`] whose weight is `l.weight` with the matrices `more`
    /// stacked under it along the output (one launch for the q, k and v
    /// projections of a self-attention); `l.n` counts all their rows.
    pub(super) fn lin_concat(&mut self, l: Lin<'_>, more: Vec<WeightRef>) {
        let mut inputs = vec![l.x];
        let mut weights = Vec::new();
        let prologue = match l.pro {
            Some(p) => {
                weights.push(p.gamma.clone());
                p.kind
            }
            None => Prologue::None,
        };
        let parts = 1 + more.len() as i64;
        weights.push(l.weight);
        weights.extend(more);
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
            Epi::GeGlu(up) => {
                weights.push(up);
                Epilogue::GeGlu
            }
        };
        let groups = match prologue {
            Prologue::GroupRmsNorm { groups, .. } => groups,
            _ => 1,
        };
        let layout = self.cfg.device.linear_layout(
            l.m,
            l.k,
            l.n,
            groups,
            self.cfg.dtype.size() as usize,
            prologue != Prologue::None,
            matches!(epilogue, Epilogue::SwiGlu | Epilogue::GeGlu),
        );
        let kernel = Kernel::Linear {
            m: l.m,
            k: l.k,
            n: l.n,
            prologue,
            epilogue,
            into_cache: l.into_cache,
            parts,
            layout,
        };
        self.launch(kernel, l.part, l.nodes, inputs, vec![l.out], weights, alias);
    }
}

//! Pass 3, lower: fused groups → kernel launches for one concrete
//! configuration. Evaluates every dim (`t` = tokens, `b` = batch, `l` and
//! other symbols from the graph or `--set`), creates the buffer table
//! (values, launch temporaries, KV caches), names every weight tensor, and
//! emits each group's launches in order.
//!
//! | file | lowers |
//! | --- | --- |
//! | `single.rs` | one op on its own (`Single` groups, everything unfused) |
//! | `blocks.rs` | the weight ops: linear / LM head and SwiGLU, with or without a fused prologue/epilogue |
//! | `attention.rs` | attention: projections, RoPE, KV cache, the fused kernel, o_proj |
//!
//! Rows of all sequences are packed (`[batch·t, …]`), as `draftc-ops`
//! expects. Limits: the cache length is `context + t` for every sequence.

mod attention;
mod blocks;
mod single;

use std::collections::BTreeMap;

use draftc_ir::graph::{Graph, ValueId};
use draftc_ir::op::{NormWeight, Op, F64};
use draftc_ir::types::{DType, TensorType};
use draftc_ir::TargetConfig;

use crate::error::CodegenError;
use crate::fuse::{FusedGroup, GroupKind};
use crate::kernel::Kernel;
use crate::plan::{Buffer, BufferClass, BufferId, Launch, LaunchId, PlanConfig, WeightRef};

/// What the target's `target.embed` / `target.norm` / `target.lm_head` bind
/// to: the target model file's exports (`embed`, `final_norm`, `lm_head`
/// tensor prefixes), its vocabulary size and its RMS norm epsilon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetWeights {
    pub exports: BTreeMap<String, String>,
    pub vocab: i64,
    pub eps: F64,
    /// How the target's final norm scales (`target.norm`): Gemma's is
    /// `x̂·(1 + w)`.
    pub final_norm: NormWeight,
}

impl TargetWeights {
    /// From a target preset and the target model file's `Graph.meta.exports`.
    pub fn new(cfg: &TargetConfig, exports: &BTreeMap<String, String>) -> TargetWeights {
        TargetWeights {
            exports: exports.clone(),
            vocab: cfg.int("v").unwrap_or(0),
            eps: F64::new(cfg.floats.get("eps").copied().unwrap_or(1e-5)),
            final_norm: NormWeight::Plain,
        }
    }

    /// With the final norm's kind as the target's graph `g` applies it
    /// (the RMS norm whose weights are the `final_norm` export).
    pub fn with_final_norm_of(mut self, g: &Graph) -> TargetWeights {
        let Some(prefix) = self.exports.get("final_norm") else {
            return self;
        };
        for node in &g.nodes {
            if let Op::RmsNorm { weight, .. } = node.op {
                if node.weights.as_deref() == Some(prefix.as_str()) {
                    self.final_norm = weight;
                }
            }
        }
        self
    }
}

/// Launches and buffers produced by lowering.
pub struct Lowered {
    pub launches: Vec<Launch>,
    pub buffers: Vec<Buffer>,
    pub symbols: Vec<(String, i64)>,
}

pub(crate) struct Lowerer<'a> {
    g: &'a Graph,
    cfg: &'a PlanConfig,
    target: &'a TargetWeights,
    vals: BTreeMap<String, i64>,
    root: Vec<bool>,
    value_buf: Vec<Option<BufferId>>,
    states: BTreeMap<String, BufferId>,
    buffers: Vec<Buffer>,
    launches: Vec<Launch>,
}

/// Lower `groups` (from `fuse`) of the canonical graph `g`.
pub fn lower(
    g: &Graph,
    groups: &[FusedGroup],
    target: &TargetWeights,
    cfg: &PlanConfig,
) -> Result<Lowered, CodegenError> {
    if cfg.tokens < 1 || cfg.batch < 1 || cfg.context < 0 {
        return Err(CodegenError::Config(format!(
            "tokens and batch must be >= 1 and context >= 0, got t = {}, batch = {}, context = {}",
            cfg.tokens, cfg.batch, cfg.context
        )));
    }
    let mut vals = g.symbol_values.clone();
    vals.insert("t".into(), cfg.tokens);
    vals.insert("b".into(), cfg.batch);
    let mut lw = Lowerer {
        g,
        cfg,
        target,
        vals,
        root: g.is_root(),
        value_buf: vec![None; g.nodes.len()],
        states: BTreeMap::new(),
        buffers: Vec::new(),
        launches: Vec::new(),
    };
    for group in groups {
        match group.kind {
            GroupKind::Input => {
                lw.value_buffer(group.main)?;
            }
            GroupKind::View => {
                let src = lw.input(group.main, 0)?;
                let buf = lw.buf(src)?;
                if lw.root[group.main.index()] {
                    lw.buffers[buf.index()].class = BufferClass::Output;
                }
                lw.value_buf[group.main.index()] = Some(buf);
            }
            GroupKind::Single => lw.single(group.main)?,
            GroupKind::Fused => lw.fused(group)?,
        }
    }
    let symbols = lw.vals.iter().map(|(k, v)| (k.clone(), *v)).collect();
    Ok(Lowered {
        launches: lw.launches,
        buffers: lw.buffers,
        symbols,
    })
}

impl Lowerer<'_> {
    fn node_name(&self, v: ValueId) -> String {
        self.g.node(v).name.clone()
    }

    fn input(&self, v: ValueId, i: usize) -> Result<ValueId, CodegenError> {
        self.g.node(v).inputs.get(i).copied().ok_or_else(|| {
            CodegenError::Internal(format!("`{}` has no input {i}", self.node_name(v)))
        })
    }

    /// Bytes per element of a value's dtype in this plan.
    fn elem(&self, dtype: DType) -> i64 {
        match dtype {
            DType::Float => self.cfg.dtype.size(),
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Evaluated shape of `ty` (of node `v`), rows of the batch packed into dim 0.
    fn eval_shape(&self, v: ValueId, ty: &TensorType) -> Result<Vec<i64>, CodegenError> {
        let mut out = Vec::with_capacity(ty.dims.len());
        let mut batched = false;
        for d in &ty.dims {
            batched |= d.symbols().any(|s| s == "b");
            out.push(d.eval(&self.vals).ok_or_else(|| CodegenError::Dim {
                node: self.node_name(v),
                dim: d.to_string(),
                reason: "a symbol has no value (use --set NAME=VALUE) or it overflows".into(),
            })?);
        }
        if !batched {
            if let Some(first) = out.first_mut() {
                *first *= self.cfg.batch;
            }
        }
        Ok(out)
    }

    pub(crate) fn shape(&self, v: ValueId) -> Result<Vec<i64>, CodegenError> {
        self.eval_shape(v, &self.g.node(v).ty)
    }

    /// `(rows, last)` of a value: all leading dims are rows.
    pub(crate) fn rows_last(&self, v: ValueId) -> Result<(i64, i64), CodegenError> {
        let s = self.shape(v)?;
        let last = s.last().copied().unwrap_or(1);
        Ok((s.iter().product::<i64>() / last.max(1), last))
    }

    pub(crate) fn eval(&self, v: ValueId, d: &draftc_ir::dim::Dim) -> Result<i64, CodegenError> {
        d.eval(&self.vals).ok_or_else(|| CodegenError::Dim {
            node: self.node_name(v),
            dim: d.to_string(),
            reason: "a symbol has no value".into(),
        })
    }

    fn push_buffer(
        &mut self,
        name: String,
        value: Option<ValueId>,
        shape: Vec<i64>,
        elem: i64,
        class: BufferClass,
    ) -> BufferId {
        let id = BufferId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            id,
            name,
            value,
            shape,
            elem,
            class,
            slot: None,
        });
        id
    }

    /// The buffer holding value `v`, created on first request.
    pub(crate) fn value_buffer(&mut self, v: ValueId) -> Result<BufferId, CodegenError> {
        if let Some(b) = self.value_buf[v.index()] {
            return Ok(b);
        }
        let node = self.g.node(v);
        let class = match node.op {
            Op::Input(_) => BufferClass::Input,
            _ if self.root[v.index()] => BufferClass::Output,
            _ => BufferClass::Temp,
        };
        let shape = self.shape(v)?;
        let elem = self.elem(node.ty.dtype);
        let b = self.push_buffer(node.name.clone(), Some(v), shape, elem, class);
        self.value_buf[v.index()] = Some(b);
        Ok(b)
    }

    /// The buffer of an already computed value.
    pub(crate) fn buf(&self, v: ValueId) -> Result<BufferId, CodegenError> {
        self.value_buf[v.index()].ok_or_else(|| {
            CodegenError::Internal(format!(
                "`{}` used before it was lowered",
                self.node_name(v)
            ))
        })
    }

    pub(crate) fn temp(&mut self, name: String, shape: Vec<i64>) -> BufferId {
        let e = self.cfg.dtype.size();
        self.push_buffer(name, None, shape, e, BufferClass::Temp)
    }

    /// A per-sequence state buffer (KV cache half, memory rows), shared by name.
    pub(crate) fn state(&mut self, name: String, shape: Vec<i64>, class: BufferClass) -> BufferId {
        if let Some(b) = self.states.get(&name) {
            return *b;
        }
        let e = self.cfg.dtype.size();
        let b = self.push_buffer(name.clone(), None, shape, e, class);
        self.states.insert(name, b);
        b
    }

    /// `{prefix}.{suffix}` with `shape`.
    pub(crate) fn weight(
        &self,
        v: ValueId,
        suffix: &str,
        shape: Vec<i64>,
    ) -> Result<WeightRef, CodegenError> {
        let prefix = self.g.node(v).weights.as_ref().ok_or_else(|| {
            CodegenError::Internal(format!("`{}` has no weight prefix", self.node_name(v)))
        })?;
        Ok(self.weight_named(format!("{prefix}.{suffix}"), shape))
    }

    pub(crate) fn weight_named(&self, name: String, shape: Vec<i64>) -> WeightRef {
        WeightRef {
            name,
            shape,
            dtype: self.cfg.dtype,
            plus_one: false,
        }
    }

    /// The target tensor prefix behind `export` (`embed`, `final_norm`, `lm_head`).
    pub(crate) fn export(&self, v: ValueId, export: &'static str) -> Result<String, CodegenError> {
        self.target
            .exports
            .get(export)
            .cloned()
            .ok_or(CodegenError::MissingExport {
                op: self.g.node(v).op.name(),
                node: self.node_name(v),
                export,
            })
    }

    pub(crate) fn vocab(&self) -> i64 {
        self.target.vocab
    }

    pub(crate) fn context(&self) -> i64 {
        self.cfg.context
    }

    pub(crate) fn batch(&self) -> i64 {
        self.cfg.batch
    }

    pub(crate) fn symbol(&self, s: &str) -> i64 {
        self.vals.get(s).copied().unwrap_or(1)
    }

    pub(crate) fn graph(&self) -> &Graph {
        self.g
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &mut self,
        kernel: Kernel,
        part: &'static str,
        nodes: Vec<ValueId>,
        inputs: Vec<BufferId>,
        outputs: Vec<BufferId>,
        weights: Vec<WeightRef>,
        alias: Option<usize>,
    ) {
        let cost = kernel.cost(self.cfg.dtype.size());
        self.launches.push(Launch {
            id: LaunchId(self.launches.len() as u32),
            kernel,
            part,
            nodes,
            inputs,
            outputs,
            weights,
            cost,
            alias,
            in_place: false,
        });
    }
}

//! The reference interpreter: evaluates a [`Graph`] node by node on the
//! host with the `draftc-ops` plain-Rust references (linear, RMS norm,
//! grouped RMS norm, RoPE, attention, embedding, layer sum). It shares the
//! executor's conventions — rows of all sequences packed, the [`Step`] for
//! positions and sequence boundaries, caches contiguous per sequence — but
//! none of its code: no plan, no fusion, no buffers. The executor must agree
//! with it (`runtime/tests/executor_matches_interpreter.rs`).

use std::collections::BTreeMap;

use draftc_codegen::TargetWeights;
use draftc_ir::graph::{Graph, ValueId};
use draftc_ir::op::{AttentionAttrs, Axis, Cache, GateAct, InputSource, NormWeight, Op};
use draftc_ops::attention::{attention_ref, AttnDims, SeqBatch};
use draftc_ops::linear::reference::{linear, Epilogue, Prologue};

use super::cache::HostCaches;
use super::executor::{broadcast_rows, ops_mask, ExecError};
use super::step::{HostTensor, Inputs, Step};
use super::weights::HostWeights;

/// Outputs by name, as [`super::Outputs`] names them.
#[derive(Clone, Debug, PartialEq)]
pub struct HostOutputs {
    pub tensors: BTreeMap<String, HostTensor>,
}

#[derive(Clone, Debug)]
struct Val {
    shape: Vec<usize>,
    data: Vec<f32>,
}

struct Interp<'a> {
    g: &'a Graph,
    target: &'a TargetWeights,
    w: &'a HostWeights,
    step: &'a Step,
    vals: BTreeMap<String, i64>,
}

/// Evaluates `graph` for `step` with `inputs` by name, appending to `caches`
/// (and `target_caches` for `target.kv[i]`) like the executor does.
pub fn interpret(
    graph: &Graph,
    target: &TargetWeights,
    weights: &HostWeights,
    step: &Step,
    inputs: &Inputs,
    caches: &mut HostCaches,
    mut target_caches: Option<&mut HostCaches>,
) -> Result<HostOutputs, ExecError> {
    let mut vals = graph.symbol_values.clone();
    vals.insert("t".into(), step.rows() as i64);
    vals.insert("b".into(), 1);
    let it = Interp {
        g: graph,
        target,
        w: weights,
        step,
        vals,
    };
    let mut env: Vec<Option<Val>> = vec![None; graph.nodes.len()];
    for id in graph.ids() {
        let v = it.node(id, &env, inputs, caches, target_caches.as_deref_mut())?;
        env[id.index()] = Some(v);
    }
    let mut tensors = BTreeMap::new();
    let get = |v: ValueId| {
        let x = env[v.index()].clone().expect("evaluated");
        HostTensor::f32(x.shape, x.data)
    };
    for &o in &graph.outputs {
        tensors.insert(graph.node(o).name.clone(), get(o));
    }
    for (s, i, v) in &graph.emits {
        tensors.insert(format!("{s}[{i}]"), get(*v));
    }
    for (s, v) in &graph.appends {
        tensors.insert(s.to_string(), get(*v));
    }
    Ok(HostOutputs { tensors })
}

impl Interp<'_> {
    fn shape(&self, id: ValueId) -> Result<Vec<usize>, ExecError> {
        self.g
            .node(id)
            .ty
            .dims
            .iter()
            .map(|d| {
                d.eval(&self.vals).map(|x| x as usize).ok_or_else(|| {
                    ExecError::Internal(format!("dim `{d}` of `{}`", self.g.node(id).name))
                })
            })
            .collect()
    }

    fn weight(&self, name: &str) -> Result<&[f32], ExecError> {
        self.w
            .get(name)
            .map(|(_, d)| d.as_slice())
            .ok_or_else(|| ExecError::Internal(format!("weight `{name}` missing")))
    }

    fn prefixed(&self, id: ValueId, suffix: &str) -> Result<&[f32], ExecError> {
        let prefix = self.g.node(id).weights.clone().unwrap_or_default();
        self.weight(&format!("{prefix}.{suffix}"))
    }

    fn export(&self, export: &str) -> Result<String, ExecError> {
        self.target
            .exports
            .get(export)
            .map(|p| format!("{p}.weight"))
            .ok_or_else(|| ExecError::Internal(format!("target export `{export}` missing")))
    }

    fn node(
        &self,
        id: ValueId,
        env: &[Option<Val>],
        inputs: &Inputs,
        caches: &mut HostCaches,
        target_caches: Option<&mut HostCaches>,
    ) -> Result<Val, ExecError> {
        let node = self.g.node(id);
        let arg = |i: usize| -> &Val { env[node.inputs[i].index()].as_ref().expect("topological") };
        let shape = self.shape(id)?;
        let last = *shape.last().unwrap_or(&1);
        let data = match &node.op {
            Op::Input(src) => {
                let t = inputs
                    .get(&node.name)
                    .ok_or_else(|| ExecError::MissingInput {
                        name: node.name.clone(),
                        expected: match src {
                            InputSource::External => format!("shape {shape:?}"),
                            InputSource::TargetHidden { .. } => {
                                format!("target hidden-state taps, shape {shape:?}")
                            }
                            InputSource::MemoryPrev(m) => {
                                format!("the previous rows of memory `{m}`, shape {shape:?}")
                            }
                        },
                    })?;
                if t.numel() != shape.iter().product::<usize>() {
                    return Err(ExecError::InputShape {
                        name: node.name.clone(),
                        expected: shape.iter().map(|&d| d as i64).collect(),
                        found: t.numel(),
                    });
                }
                t.to_f32()
            }
            Op::Linear { bias, .. } => {
                let x = arg(0);
                let k = *x.shape.last().unwrap_or(&1);
                let w = self.prefixed(id, "weight")?;
                let epi = if *bias {
                    Epilogue::Bias(self.prefixed(id, "bias")?)
                } else {
                    Epilogue::None
                };
                linear(&x.data, w, k, Prologue::None, epi)
            }
            Op::TargetLmHead => {
                let x = arg(0);
                let w = if self.g.meta.reduced_vocab(self.target.vocab).is_some() {
                    self.weight(draftc_codegen::bind::DRAFT_VOCAB_HEAD)?
                } else {
                    self.weight(&self.export("lm_head")?)?
                };
                linear(
                    &x.data,
                    w,
                    *x.shape.last().unwrap_or(&1),
                    Prologue::None,
                    Epilogue::None,
                )
            }
            Op::RmsNorm { eps, weight } => {
                let w = norm_scale(self.prefixed(id, "weight")?, *weight);
                draftc_ops::rms_norm::reference::rms_norm(&arg(0).data, &w, eps.get() as f32)
            }
            Op::TargetNorm => {
                let w = self.weight(&self.export("final_norm")?)?;
                let w = norm_scale(w, self.target.final_norm);
                draftc_ops::rms_norm::reference::rms_norm(
                    &arg(0).data,
                    &w,
                    self.target.eps.get() as f32,
                )
            }
            Op::GroupRmsNorm { eps } => {
                let w = self.prefixed(id, "weight")?;
                draftc_ops::group_rms_norm::reference::group_rms_norm(
                    &arg(0).data,
                    w,
                    last,
                    eps.get() as f32,
                )
            }
            Op::Rope { theta } => {
                let (t, h, hd) = (shape[0], shape[1], shape[2]);
                let pos = self.step.positions();
                if pos.len() != t {
                    return Err(ExecError::Unsupported(format!(
                        "rope over {t} rows but the pass has {} positions",
                        pos.len()
                    )));
                }
                draftc_ops::rope::reference::rope(&arg(0).data, &pos, h, hd, theta.get() as f32)
            }
            Op::Attention(a) => {
                let kv_in = node
                    .inputs
                    .get(1)
                    .map(|v| env[v.index()].as_ref().expect("topological"));
                self.attention(id, a, arg(0), kv_in, caches, target_caches)?
            }
            Op::SwiGlu { act, .. } => {
                let x = arg(0);
                let k = *x.shape.last().unwrap_or(&1);
                let gate = self.prefixed(id, "gate_proj.weight")?;
                let up = self.prefixed(id, "up_proj.weight")?;
                let down = self.prefixed(id, "down_proj.weight")?;
                let epi = match act {
                    GateAct::Silu => Epilogue::SwiGlu { up },
                    GateAct::GeluTanh => Epilogue::GeGlu { up },
                };
                let h = linear(&x.data, gate, k, Prologue::None, epi);
                let f = gate.len() / k;
                linear(&h, down, f, Prologue::None, Epilogue::None)
            }
            Op::Embedding { scale, .. } => {
                let table = self.prefixed(id, "weight")?;
                let mut rows = self.embed(table, last, &arg(0).data)?;
                if let Some(s) = scale {
                    let s = s.get() as f32;
                    rows.iter_mut().for_each(|x| *x *= s);
                }
                rows
            }
            Op::TargetEmbed => {
                let table = self.weight(&self.export("embed")?)?;
                self.embed(table, last, &arg(0).data)?
            }
            Op::Reshape { .. } => arg(0).data.clone(),
            Op::Concat { axis } | Op::Stack { axis } => {
                let outer: usize = shape[..*axis].iter().product();
                let mut out = Vec::with_capacity(shape.iter().product());
                for o in 0..outer {
                    for i in 0..node.inputs.len() {
                        let x = arg(i);
                        let block = x.data.len() / outer.max(1);
                        out.extend_from_slice(&x.data[o * block..(o + 1) * block]);
                    }
                }
                out
            }
            Op::Split { axis, parts, index } => {
                let x = arg(0);
                let outer: usize = x.shape[..*axis].iter().product();
                let whole = x.data.len() / outer.max(1);
                let part = whole / parts;
                let mut out = Vec::with_capacity(outer * part);
                for o in 0..outer {
                    out.extend_from_slice(&x.data[o * whole + index * part..][..part]);
                }
                out
            }
            Op::Add | Op::Mul => {
                let (a, b) = (arg(0), arg(1));
                let sh = |v: &Val| v.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
                let big: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                let expand = |v: &Val| -> Result<Vec<f32>, ExecError> {
                    if v.data.len() == shape.iter().product::<usize>() {
                        return Ok(v.data.clone());
                    }
                    let (width, rows) = broadcast_rows(&big, &sh(v))?;
                    Ok(rows
                        .iter()
                        .flat_map(|&r| v.data[r as usize * width..][..width].iter().copied())
                        .collect())
                };
                let (a, b) = (expand(a)?, expand(b)?);
                a.iter()
                    .zip(&b)
                    .map(|(x, y)| if node.op == Op::Add { x + y } else { x * y })
                    .collect()
            }
            Op::Silu => arg(0)
                .data
                .iter()
                .map(|&x| draftc_ops::elementwise::reference::silu(x))
                .collect(),
            Op::LayerSum => {
                let x = arg(0);
                let r = x.shape.len();
                let (layers, d) = (x.shape[r - 2], x.shape[r - 1]);
                let t = x.data.len() / (layers * d);
                let mut moved = vec![0.0; x.data.len()];
                for ti in 0..t {
                    for j in 0..layers {
                        moved[(j * t + ti) * d..][..d]
                            .copy_from_slice(&x.data[(ti * layers + j) * d..][..d]);
                    }
                }
                draftc_ops::layer_sum::reference::layer_sum(&moved, self.prefixed(id, "weight")?)
            }
        };
        Ok(Val { shape, data })
    }

    fn embed(&self, table: &[f32], d: usize, ids: &[f32]) -> Result<Vec<f32>, ExecError> {
        let vocab = table.len() / d.max(1);
        let ids: Vec<u32> = ids.iter().map(|&x| x as u32).collect();
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(ExecError::Unsupported(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        Ok(draftc_ops::embedding::reference::embedding(table, d, &ids))
    }

    fn attention(
        &self,
        id: ValueId,
        a: &AttentionAttrs,
        x: &Val,
        kv_in: Option<&Val>,
        caches: &mut HostCaches,
        target_caches: Option<&mut HostCaches>,
    ) -> Result<Vec<f32>, ExecError> {
        let dm = *x.shape.last().unwrap_or(&1);
        let rows = x.data.len() / dm;
        let (h, hkv, hd) = (a.heads as usize, a.kv_heads as usize, a.head_dim as usize);
        let dims = AttnDims {
            heads: h,
            kv_heads: hkv,
            head_dim: hd,
        };
        // `part`'s projection, plus its bias with `bias` (never `o_proj`'s).
        let lin = |x: &[f32], k: usize, part: &str| -> Result<Vec<f32>, ExecError> {
            let epi = if a.bias && part != "o_proj" {
                Epilogue::Bias(self.prefixed(id, &format!("{part}.bias"))?)
            } else {
                Epilogue::None
            };
            Ok(linear(
                x,
                self.prefixed(id, &format!("{part}.weight"))?,
                k,
                Prologue::None,
                epi,
            ))
        };
        let mut q = lin(&x.data, dm, "q_proj")?;
        let q_pos = self.step.positions();
        let q_lens = self.step.lens();
        // Source of the new K/V rows and their positions / per-sequence counts.
        let (src, dsrc, k_pos_new, k_lens_new) =
            if a.cross {
                let kv = kv_in
                    .ok_or_else(|| ExecError::Internal("cross attention without kv".into()))?;
                let d = *kv.shape.last().unwrap_or(&1);
                (kv.data.clone(), d, q_pos.clone(), q_lens.clone())
            } else if let Some(m) = &a.memory {
                let rows = self.step.memory.get(&m.to_string()).ok_or_else(|| {
                    ExecError::MissingInput {
                        name: m.to_string(),
                        expected: "new memory rows in the step".into(),
                    }
                })?;
                (
                    rows.data.clone(),
                    dm,
                    rows.positions.clone(),
                    rows.lens.clone(),
                )
            } else {
                (x.data.clone(), dm, q_pos.clone(), q_lens.clone())
            };
        let mut k = lin(&src, dsrc, "k_proj")?;
        let v = lin(&src, dsrc, "v_proj")?;
        if let Some(norm) = a.qk_norm.as_deref() {
            let unit_offset = norm.weight == NormWeight::UnitOffset;
            let eps = norm.eps.get() as f32;
            let w = self.prefixed(id, "q_norm.weight")?;
            q = draftc_ops::head_norm::reference::head_norm_rope(
                &q,
                w,
                h,
                hd,
                eps,
                unit_offset,
                None,
            );
            let w = self.prefixed(id, "k_norm.weight")?;
            k = draftc_ops::head_norm::reference::head_norm_rope(
                &k,
                w,
                hkv,
                hd,
                eps,
                unit_offset,
                None,
            );
        }
        if let Some(theta) = a.rope {
            let freqs = super::executor::rope_inv_freq(hd, theta.get(), a.rope_scaling.as_deref());
            q = draftc_ops::rope::reference::rope_with(&q, &q_pos, h, hd, &freqs);
            k = draftc_ops::rope::reference::rope_with(&k, &k_pos_new, hkv, hd, &freqs);
        }
        if let Some(s) = a.scale {
            // `scale=`: the reference scales by 1/√hd, so the queries carry
            // the rest of the factor.
            let f = (s.get() * (hd as f64).sqrt()) as f32;
            q.iter_mut().for_each(|x| *x *= f);
        }
        let width = hkv * hd;
        let cache = match (&a.cache, &a.memory) {
            (Cache::Own(s), _) => Some((s.to_string(), false)),
            (Cache::Target(s), _) => Some((s.to_string(), true)),
            (Cache::None, Some(m)) => Some((format!("{m}.kv"), false)),
            (Cache::None, None) => None,
        };
        let o = match (a.axis, cache) {
            (Axis::Draft, _) => {
                let l = *self.vals.get("l").unwrap_or(&1) as usize;
                let bt = rows / l.max(1);
                attention_ref(
                    &q,
                    &k,
                    &v,
                    dims,
                    &SeqBatch::uniform(bt, l),
                    ops_mask(a.mask),
                )
            }
            (Axis::Sequence, None) => {
                let batch = SeqBatch {
                    q_lens: q_lens.clone(),
                    k_lens: k_lens_new,
                    q_pos,
                    k_pos: k_pos_new,
                    parents: Vec::new(),
                    tail: None,
                };
                attention_ref(&q, &k, &v, dims, &batch, ops_mask(a.mask))
            }
            (Axis::Sequence, Some((name, in_target))) => {
                let store = if in_target {
                    target_caches.ok_or_else(|| {
                        ExecError::Unsupported(format!(
                            "`target.{name}` read without the target's caches"
                        ))
                    })?
                } else {
                    caches
                };
                let mut at = 0;
                let mut kk = Vec::new();
                let mut vv = Vec::new();
                let mut k_pos = Vec::new();
                let mut k_lens = Vec::new();
                for (s, seq) in self.step.seqs.iter().enumerate() {
                    let n = k_lens_new[s];
                    let r = store.slot_mut(&name, seq.slot);
                    r.k.extend_from_slice(&k[at * width..(at + n) * width]);
                    r.v.extend_from_slice(&v[at * width..(at + n) * width]);
                    r.pos.extend_from_slice(&k_pos_new[at..at + n]);
                    at += n;
                    kk.extend_from_slice(&r.k);
                    vv.extend_from_slice(&r.v);
                    k_pos.extend_from_slice(&r.pos);
                    k_lens.push(r.pos.len());
                }
                let (batch, mask) =
                    self.step
                        .cache_batch(ops_mask(a.mask), k_lens, k_pos, a.memory.is_some())?;
                batch.validate("attention", &mask)?;
                attention_ref(&q, &kk, &vv, dims, &batch, mask)
            }
        };
        lin(&o, h * hd, "o_proj")
    }
}

/// A norm's scale as it multiplies: `w`, or `1 + w` (Gemma's `unit_offset`).
fn norm_scale(w: &[f32], kind: NormWeight) -> Vec<f32> {
    match kind {
        NormWeight::Plain => w.to_vec(),
        NormWeight::UnitOffset => w.iter().map(|x| 1.0 + x).collect(),
    }
}

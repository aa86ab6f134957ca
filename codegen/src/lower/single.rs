//! Lowering of one op on its own (a `Single` group): norms, RoPE,
//! embeddings, element-wise ops, layer sums and layout copies each become
//! one launch; weight ops go through `blocks.rs` without prologue/epilogue.
//!
//! Limits: a stack/concat/split that is not a view is one block copy per
//! input (`StridedCopy`); element-wise broadcasting is recorded as
//! `b_numel < numel` (ops' element-wise kernels need equal shapes, so the
//! executor expands the smaller operand or uses a broadcasting kernel).

use draftc_ir::graph::ValueId;
use draftc_ir::op::Op;

use super::Lowerer;
use crate::error::CodegenError;
use crate::kernel::{ElementwiseOp, Kernel};

impl Lowerer<'_> {
    pub(crate) fn single(&mut self, v: ValueId) -> Result<(), CodegenError> {
        let op = self.graph().node(v).op.clone();
        let nodes = vec![v];
        match op {
            Op::Input(_) => {
                self.value_buffer(v)?;
            }
            Op::Linear { .. } | Op::TargetLmHead | Op::Attention(_) | Op::SwiGlu { .. } => {
                let out = self.value_buffer(v)?;
                self.weight_op(v, None, None, out, false)?;
            }
            Op::RmsNorm { eps, weight } => {
                let x = self.buf(self.input(v, 0)?)?;
                let (rows, d) = self.rows_last(v)?;
                let w = self.weight(v, "weight", vec![d])?.with_norm(weight);
                let out = self.value_buffer(v)?;
                let kernel = Kernel::RmsNorm { rows, d, eps };
                self.launch(kernel, "", nodes, vec![x], vec![out], vec![w], None);
            }
            Op::TargetNorm => {
                let x = self.buf(self.input(v, 0)?)?;
                let (rows, d) = self.rows_last(v)?;
                let name = format!("{}.weight", self.export(v, "final_norm")?);
                let w = self
                    .weight_named(name, vec![d])
                    .with_norm(self.target.final_norm);
                let out = self.value_buffer(v)?;
                let kernel = Kernel::RmsNorm {
                    rows,
                    d,
                    eps: self.target.eps,
                };
                self.launch(kernel, "", nodes, vec![x], vec![out], vec![w], None);
            }
            Op::GroupRmsNorm { eps } => {
                let x = self.buf(self.input(v, 0)?)?;
                let s = self.shape(v)?;
                let d = s.last().copied().unwrap_or(1);
                let groups = s
                    .len()
                    .checked_sub(2)
                    .and_then(|i| s.get(i))
                    .copied()
                    .unwrap_or(1);
                let rows = s.iter().product::<i64>() / (groups * d).max(1);
                let w = self.weight(v, "weight", vec![groups, d])?;
                let out = self.value_buffer(v)?;
                let kernel = Kernel::GroupRmsNorm {
                    rows,
                    groups,
                    d,
                    eps,
                };
                self.launch(kernel, "", nodes, vec![x], vec![out], vec![w], None);
            }
            Op::Rope { theta } => {
                let x = self.buf(self.input(v, 0)?)?;
                let s = self.shape(v)?;
                let (tokens, heads, head_dim) = match s.as_slice() {
                    [t, h, d] => (*t, *h, *d),
                    _ => {
                        return Err(CodegenError::Internal(format!(
                            "rope `{}` is not rank 3",
                            self.node_name(v)
                        )))
                    }
                };
                let out = self.value_buffer(v)?;
                let kernel = Kernel::Rope {
                    tokens,
                    heads,
                    head_dim,
                    theta,
                };
                self.launch(kernel, "", nodes, vec![x], vec![out], Vec::new(), None);
            }
            Op::Embedding { vocab, dim, scale } => {
                let ids = self.buf(self.input(v, 0)?)?;
                let (vocab, d) = (self.eval(v, &vocab)?, self.eval(v, &dim)?);
                let tokens = self.rows_last(v)?.0;
                let w = self.weight(v, "weight", vec![vocab, d])?;
                let out = self.value_buffer(v)?;
                let kernel = Kernel::Embedding {
                    tokens,
                    vocab,
                    d,
                    scale,
                };
                self.launch(kernel, "", nodes, vec![ids], vec![out], vec![w], None);
            }
            Op::TargetEmbed => {
                let ids = self.buf(self.input(v, 0)?)?;
                let (tokens, d) = self.rows_last(v)?;
                let vocab = self.vocab();
                let name = format!("{}.weight", self.export(v, "embed")?);
                let w = self.weight_named(name, vec![vocab, d]);
                let out = self.value_buffer(v)?;
                let kernel = Kernel::Embedding {
                    tokens,
                    vocab,
                    d,
                    scale: None,
                };
                self.launch(kernel, "", nodes, vec![ids], vec![out], vec![w], None);
            }
            Op::Add | Op::Mul => {
                let (a, b) = (self.input(v, 0)?, self.input(v, 1)?);
                let numel = self.shape(v)?.iter().product::<i64>();
                let na = self.shape(a)?.iter().product::<i64>();
                let nb = self.shape(b)?.iter().product::<i64>();
                // The full-size operand first, the (possibly broadcast) one second.
                let (big, small, b_numel) = if na >= nb { (a, b, nb) } else { (b, a, na) };
                let inputs = vec![self.buf(big)?, self.buf(small)?];
                let out = self.value_buffer(v)?;
                let ew = if op == Op::Add {
                    ElementwiseOp::Add
                } else {
                    ElementwiseOp::Mul
                };
                // In place into the full-size operand when it dies here.
                let alias = (na.max(nb) == numel).then_some(0);
                let kernel = Kernel::Elementwise {
                    op: ew,
                    numel,
                    b_numel,
                };
                self.launch(kernel, "", nodes, inputs, vec![out], Vec::new(), alias);
            }
            Op::Silu => {
                let x = self.buf(self.input(v, 0)?)?;
                let numel = self.shape(v)?.iter().product::<i64>();
                let out = self.value_buffer(v)?;
                let kernel = Kernel::Elementwise {
                    op: ElementwiseOp::Silu,
                    numel,
                    b_numel: numel,
                };
                self.launch(kernel, "", nodes, vec![x], vec![out], Vec::new(), Some(0));
            }
            Op::LayerSum => {
                let x = self.buf(self.input(v, 0)?)?;
                let s = self.shape(self.input(v, 0)?)?;
                let layers = s
                    .len()
                    .checked_sub(2)
                    .and_then(|i| s.get(i))
                    .copied()
                    .unwrap_or(1);
                let numel = self.shape(v)?.iter().product::<i64>();
                let w = self.weight(v, "weight", vec![layers])?;
                let out = self.value_buffer(v)?;
                let kernel = Kernel::LayerSum { layers, numel };
                self.launch(kernel, "", nodes, vec![x], vec![out], vec![w], None);
            }
            Op::Reshape { .. } => {
                // Reshapes are always views; a group of kind Single never holds one.
                return Err(CodegenError::Internal(format!(
                    "reshape `{}` lowered as a launch",
                    self.node_name(v)
                )));
            }
            Op::Stack { axis } | Op::Concat { axis } => self.gather(v, axis)?,
            Op::Split { axis, parts, index } => {
                let src = self.input(v, 0)?;
                let s = self.shape(src)?;
                let blocks: i64 = s.iter().take(axis).product();
                let whole: i64 = s.iter().skip(axis).product();
                let block_len = whole / (parts as i64).max(1);
                let x = self.buf(src)?;
                let out = self.value_buffer(v)?;
                let kernel = Kernel::StridedCopy {
                    blocks,
                    block_len,
                    src_stride: whole,
                    src_offset: index as i64 * block_len,
                    dst_stride: block_len,
                    dst_offset: 0,
                };
                self.launch(kernel, "", nodes, vec![x], vec![out], Vec::new(), None);
            }
        }
        Ok(())
    }

    /// A stack or concat along `axis` (of the output): one block copy per
    /// input, each a block of its dims from `axis` on.
    fn gather(&mut self, v: ValueId, axis: usize) -> Result<(), CodegenError> {
        let out_shape = self.shape(v)?;
        let blocks: i64 = out_shape.iter().take(axis).product();
        let dst_stride: i64 = out_shape.iter().skip(axis).product();
        let out = self.value_buffer(v)?;
        let mut offset = 0;
        for i in 0..self.graph().node(v).inputs.len() {
            let inp = self.input(v, i)?;
            let s = self.shape(inp)?;
            let block_len: i64 = s.iter().skip(axis).product();
            let x = self.buf(inp)?;
            let kernel = Kernel::StridedCopy {
                blocks,
                block_len,
                src_stride: block_len,
                src_offset: 0,
                dst_stride,
                dst_offset: offset,
            };
            self.launch(kernel, "", vec![v], vec![x], vec![out], Vec::new(), None);
            offset += block_len;
        }
        Ok(())
    }
}

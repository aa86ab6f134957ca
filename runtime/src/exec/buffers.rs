//! The buffers of one pass ([`Run`]): binding the caller's inputs, the
//! tensor behind each plan buffer (a temporary slot, a kept output,
//! or a fresh one), and what a pass uploads once and shares (positions per
//! row source, RoPE frequencies).

use std::collections::BTreeMap;

use cubecl::prelude::*;
use draftc_codegen::{BufferClass, BufferId};
use draftc_ir::types::DType as IrDType;
use draftc_ops::{DType, DeviceTensor};

use super::executor::{us, ExecError, RowSource, Run};

impl<R: Runtime> Run<'_, R> {
    pub(super) fn buffer_dtype(&self, b: BufferId) -> DType {
        let buf = self.plan.buffer(b);
        match buf.value.map(|v| self.graph.node(v).ty.dtype) {
            Some(IrDType::U32) => DType::U32,
            _ => self.dtype,
        }
    }

    pub(super) fn is_cache(&self, b: BufferId) -> bool {
        self.plan.buffer(b).class == BufferClass::State
    }

    /// A memory stream's input buffer (state, no graph value).
    pub(super) fn memory_name(&self, b: BufferId) -> Option<String> {
        let buf = self.plan.buffer(b);
        (buf.class == BufferClass::Input && buf.value.is_none()).then(|| buf.name.clone())
    }

    pub(super) fn bind_inputs(
        &mut self,
        inputs: &BTreeMap<String, DeviceTensor<R>>,
    ) -> Result<(), ExecError> {
        self.tail_bits = inputs.get(super::MEMORY_TAIL_BITS).cloned();
        if let Some(p) = inputs.get(super::STEP_POSITIONS) {
            self.positions.push((RowSource::Step, p.clone()));
        }
        for buf in &self.plan.buffers {
            if buf.class != BufferClass::Input {
                continue;
            }
            match buf.value {
                Some(_) => {
                    let t = inputs
                        .get(&buf.name)
                        .ok_or_else(|| ExecError::MissingInput {
                            name: buf.name.clone(),
                            expected: format!("shape {:?}", buf.shape),
                        })?;
                    let need: i64 = buf.shape.iter().product();
                    if t.numel() as i64 != need {
                        return Err(ExecError::InputShape {
                            name: buf.name.clone(),
                            expected: buf.shape.clone(),
                            found: t.numel(),
                        });
                    }
                    self.bufs[buf.id.index()] = Some(t.reshape(&us(&buf.shape))?);
                }
                None => {
                    let m =
                        self.step
                            .memory
                            .get(&buf.name)
                            .ok_or_else(|| ExecError::MissingInput {
                                name: buf.name.clone(),
                                expected: "new memory rows in the step".into(),
                            })?;
                    let d = *buf.shape.last().unwrap_or(&1) as usize;
                    let rows = m.lens.iter().sum::<usize>();
                    if m.positions.len() != rows {
                        return Err(ExecError::InputShape {
                            name: format!("{} positions", buf.name),
                            expected: vec![rows as i64],
                            found: m.positions.len(),
                        });
                    }
                    // Rows already on the device (an input named after the
                    // stream) or uploaded from the step.
                    let t = match inputs.get(&buf.name) {
                        Some(t) if t.numel() == rows * d => t.reshape(&[rows, d])?,
                        Some(t) => {
                            return Err(ExecError::InputShape {
                                name: buf.name.clone(),
                                expected: vec![rows as i64, d as i64],
                                found: t.numel(),
                            })
                        }
                        None if m.data.len() == rows * d => {
                            DeviceTensor::upload_f32(self.client, &m.data, &[rows, d], self.dtype)?
                        }
                        None => {
                            return Err(ExecError::InputShape {
                                name: buf.name.clone(),
                                expected: vec![rows as i64, d as i64],
                                found: m.data.len(),
                            })
                        }
                    };
                    self.memory.insert(buf.name.clone(), t);
                }
            }
        }
        Ok(())
    }

    /// The tensor of buffer `b` (allocated on first use), in its plan shape.
    pub(super) fn tensor(&mut self, b: BufferId) -> Result<DeviceTensor<R>, ExecError> {
        if let Some(t) = &self.bufs[b.index()] {
            return Ok(t.clone());
        }
        let buf = self.plan.buffer(b);
        let shape = us(&buf.shape);
        let dtype = self.buffer_dtype(b);
        let t = match (buf.class.clone(), buf.slot) {
            (BufferClass::Temp, Some(slot)) => {
                DeviceTensor::from_handle(self.slot_handles[slot as usize].clone(), &shape, dtype)?
            }
            (BufferClass::Input, _) => {
                return Err(ExecError::MissingInput {
                    name: buf.name.clone(),
                    expected: format!("shape {:?}", buf.shape),
                })
            }
            (BufferClass::State, _) => {
                return Err(ExecError::Internal(format!(
                    "cache buffer `{}` used as a plain tensor",
                    buf.name
                )))
            }
            (BufferClass::Output, _) => {
                // Kept across passes; reused only once the caller has
                // dropped every tensor of it (`arena.rs`).
                let bytes = draftc_ops::tensor::padded_bytes(shape.iter().product(), dtype);
                let h = super::arena::pass_buffer(self.client, self.step.rows(), bytes);
                DeviceTensor::from_handle(h, &shape, dtype)?
            }
            _ => DeviceTensor::empty(self.client, &shape, dtype),
        };
        self.bufs[b.index()] = Some(t.clone());
        Ok(t)
    }

    pub(super) fn positions_of(&self, src: &RowSource) -> Result<Vec<u32>, ExecError> {
        match src {
            RowSource::Step => Ok(self.step.positions()),
            RowSource::Memory(name) => Ok(self.step.memory[name].positions.clone()),
        }
    }

    /// Whether this pass uploaded the positions of `src`'s rows already.
    pub(super) fn has_positions(&self, src: &RowSource) -> bool {
        self.positions.iter().any(|(s, _)| s == src)
    }

    /// The positions of `src`'s rows on the device, uploaded once per pass
    /// (every RoPE of a pass rotates the same rows).
    pub(super) fn positions_tensor(
        &mut self,
        src: &RowSource,
    ) -> Result<DeviceTensor<R>, ExecError> {
        if let Some((_, t)) = self.positions.iter().find(|(s, _)| s == src) {
            return Ok(t.clone());
        }
        let t = self.upload_u32(&self.positions_of(src)?)?;
        self.positions.push((src.clone(), t.clone()));
        Ok(t)
    }

    /// RoPE frequencies for (head_dim, theta bits), built on the
    /// executor's first RoPE of that shape and kept (a per-model constant).
    pub(super) fn rope_freqs(
        &mut self,
        head_dim: usize,
        theta_bits: u64,
    ) -> Result<DeviceTensor<R>, ExecError> {
        if let Some(f) = self.rope_freqs.get(&(head_dim, theta_bits)) {
            return Ok(f.clone());
        }
        let f =
            draftc_ops::rope::rope_freqs(self.client, head_dim, f64::from_bits(theta_bits) as f32)?;
        self.rope_freqs.insert((head_dim, theta_bits), f.clone());
        Ok(f)
    }

    pub(super) fn lens_of(&self, src: &RowSource) -> Vec<usize> {
        match src {
            RowSource::Step => self.step.lens(),
            RowSource::Memory(name) => self.step.memory[name].lens.clone(),
        }
    }

    pub(super) fn upload_u32(&self, data: &[u32]) -> Result<DeviceTensor<R>, ExecError> {
        Ok(DeviceTensor::upload_u32(self.client, data, &[data.len()])?)
    }
}

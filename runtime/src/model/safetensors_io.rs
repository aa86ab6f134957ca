//! safetensors I/O: a streaming writer (header first, then one tensor at a
//! time, so conversion never holds the whole model in memory) and a reader
//! that checks names, shapes and dtypes and converts F32/F16/BF16 to f32.
//!
//! The writer emits the format of the `safetensors` crate (little-endian u64
//! header length, JSON header padded with spaces to a multiple of 8, then
//! the data in header order); reading goes through that crate, so anything
//! it rejects is reported as [`ModelError::Safetensors`] with the path.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

use super::error::{ModelError, Result};

/// Element types draftc writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    F16,
    F32,
}

impl WeightDtype {
    pub fn size(self) -> u64 {
        match self {
            WeightDtype::F16 => 2,
            WeightDtype::F32 => 4,
        }
    }

    /// Name in a safetensors header and in HF `torch_dtype`.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            WeightDtype::F16 => "F16",
            WeightDtype::F32 => "F32",
        }
    }

    pub fn torch_name(self) -> &'static str {
        match self {
            WeightDtype::F16 => "float16",
            WeightDtype::F32 => "float32",
        }
    }

    /// Encodes f32 values as little-endian bytes of this dtype.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            WeightDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            WeightDtype::F16 => values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
        }
    }
}

/// Writes a safetensors file whose tensor list is fixed up front; call
/// [`SafetensorsWriter::write_tensor`] once per tensor in declaration order,
/// then [`SafetensorsWriter::finish`].
pub struct SafetensorsWriter {
    out: BufWriter<File>,
    path: PathBuf,
    entries: Vec<(String, Vec<u64>, u64)>,
    next: usize,
    dtype: WeightDtype,
}

impl SafetensorsWriter {
    pub fn create(
        path: &Path,
        dtype: WeightDtype,
        tensors: &[(String, Vec<u64>)],
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert("__metadata__".into(), serde_json::json!(metadata));
        }
        let mut offset = 0u64;
        let mut entries = Vec::with_capacity(tensors.len());
        for (name, shape) in tensors {
            let bytes = shape.iter().product::<u64>() * dtype.size();
            header.insert(
                name.clone(),
                serde_json::json!({
                    "dtype": dtype.safetensors_name(),
                    "shape": shape,
                    "data_offsets": [offset, offset + bytes],
                }),
            );
            entries.push((name.clone(), shape.clone(), bytes));
            offset += bytes;
        }
        let mut json = serde_json::Value::Object(header).to_string().into_bytes();
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let file = File::create(path).map_err(|e| ModelError::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let io = |e| ModelError::io(path, e);
        out.write_all(&(json.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&json).map_err(io)?;
        Ok(SafetensorsWriter {
            out,
            path: path.to_path_buf(),
            entries,
            next: 0,
            dtype,
        })
    }

    /// Writes the next tensor; its name and element count must match the
    /// declaration.
    pub fn write_tensor(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let Some((expected, shape, bytes)) = self.entries.get(self.next) else {
            return Err(self.error(format!("tensor `{name}` written but not declared")));
        };
        if expected != name || values.len() as u64 * self.dtype.size() != *bytes {
            return Err(self.error(format!(
                "tensor `{name}` ({} values) written where `{expected}` of shape {shape:?} was declared",
                values.len()
            )));
        }
        let data = self.dtype.encode(values);
        self.out
            .write_all(&data)
            .map_err(|e| ModelError::io(&self.path, e))?;
        self.next += 1;
        Ok(())
    }

    pub fn finish(mut self) -> Result<()> {
        if self.next != self.entries.len() {
            let missing = &self.entries[self.next].0;
            return Err(self.error(format!("tensor `{missing}` declared but never written")));
        }
        self.out
            .flush()
            .map_err(|e| ModelError::io(&self.path, e))?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(|e| ModelError::io(&self.path, e))
    }

    fn error(&self, detail: String) -> ModelError {
        ModelError::Safetensors {
            path: self.path.clone(),
            detail,
        }
    }
}

/// Checks that `shape` finds every `(name, shape)` of `expected` with that
/// shape; reports the first missing or mis-shaped tensor.
pub(crate) fn check_shapes(
    expected: &[(String, Vec<u64>)],
    shape: impl Fn(&str) -> Result<Vec<u64>>,
) -> Result<()> {
    for (name, want) in expected {
        let found = shape(name)?;
        if &found != want {
            return Err(ModelError::ShapeMismatch {
                tensor: name.clone(),
                expected: want.clone(),
                found,
            });
        }
    }
    Ok(())
}

/// A safetensors file read into memory.
pub struct SafetensorsFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        let file = SafetensorsFile {
            path: path.to_path_buf(),
            bytes,
        };
        file.view()?; // validate the header now
        Ok(file)
    }

    fn view(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.bytes).map_err(|e| ModelError::Safetensors {
            path: self.path.clone(),
            detail: e.to_string(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self.view()?.names().into_iter().map(String::from).collect();
        names.sort();
        Ok(names)
    }

    /// Shape of a tensor; [`ModelError::MissingTensor`] if absent.
    pub fn shape(&self, name: &str) -> Result<Vec<u64>> {
        let view = self.view()?;
        let t = view.tensor(name).map_err(|_| self.missing(name))?;
        Ok(t.shape().iter().map(|&d| d as u64).collect())
    }

    /// A tensor as f32 (from F32, F16 or BF16; I64 or I32 when every value
    /// is an integer f32 holds exactly), checking its shape.
    pub fn tensor_f32(&self, name: &str, expected_shape: &[u64]) -> Result<Vec<f32>> {
        let view = self.view()?;
        let t = view.tensor(name).map_err(|_| self.missing(name))?;
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        if shape != expected_shape {
            return Err(ModelError::ShapeMismatch {
                tensor: name.to_string(),
                expected: expected_shape.to_vec(),
                found: shape,
            });
        }
        let data = t.data();
        Ok(match t.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            // Integer tensors (token ids) whose values f32 holds exactly.
            Dtype::I64 | Dtype::I32 => {
                let w = if t.dtype() == Dtype::I64 { 8 } else { 4 };
                let mut out = Vec::with_capacity(data.len() / w);
                for b in data.chunks_exact(w) {
                    let mut x = [0u8; 8];
                    x[..w].copy_from_slice(b);
                    let v = if w == 8 {
                        i64::from_le_bytes(x)
                    } else {
                        i32::from_le_bytes([x[0], x[1], x[2], x[3]]) as i64
                    };
                    if v.unsigned_abs() > 1 << 24 {
                        return Err(ModelError::DtypeMismatch {
                            tensor: name.to_string(),
                            expected: "integers within ±2^24".into(),
                            found: format!("{:?} value {v}", t.dtype()),
                        });
                    }
                    out.push(v as f32);
                }
                out
            }
            other => {
                return Err(ModelError::DtypeMismatch {
                    tensor: name.to_string(),
                    expected: "F32, F16, BF16 (or I64/I32 ids)".into(),
                    found: format!("{other:?}"),
                })
            }
        })
    }

    /// Checks that every `(name, shape)` is present with that shape; reports
    /// the first missing or mis-shaped tensor.
    pub fn check_tensors(&self, expected: &[(String, Vec<u64>)]) -> Result<()> {
        check_shapes(expected, |n| self.shape(n))
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensor {
            tensor: name.to_string(),
            source_name: self.path.display().to_string(),
        }
    }
}

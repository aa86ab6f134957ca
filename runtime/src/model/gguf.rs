//! GGUF parser (format versions 2 and 3): header, metadata key/values (every
//! value type, nested arrays), tensor infos, alignment and the data section.
//!
//! Reference: ggml's `docs/gguf.md` and `gguf.c`. The whole file is read into
//! memory (the SmolLM2 GGUF is 98 MB) and every read goes through a bounds-
//! checked [`Cursor`], so a truncated or corrupt file yields a [`ModelError`]
//! with the byte offset and what was being read — never a panic, never an
//! allocation sized by an unchecked count. Version 1 (32-bit counts) is not
//! supported.

use std::path::Path;

use super::dequant::{self, GgmlType};
use super::error::{ModelError, Result};
use super::gguf_value::{GgufValue, GgufValueType, MetadataExt};

/// "GGUF" as the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;

/// One tensor's description from the header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (fastest) dimension. The
    /// row-major (PyTorch / safetensors) shape is `dims` reversed.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row-major shape, outermost first (`dims` reversed).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed GGUF file, owning its bytes.
#[derive(Debug)]
pub struct Gguf {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
    bytes: Vec<u8>,
}

impl MetadataExt for Gguf {
    fn get_value(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl Gguf {
    /// Reads and parses a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        Self::parse(bytes)
    }

    /// Parses GGUF bytes: header, metadata and tensor infos, checking that
    /// every tensor's data lies inside the file.
    pub fn parse(bytes: Vec<u8>) -> Result<Self> {
        let mut c = Cursor {
            bytes: &bytes,
            pos: 0,
        };
        let magic: [u8; 4] = c.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(ModelError::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::UnsupportedVersion { found: version });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes, a
        // tensor info at least 8 + 4 + 4 + 8: reject absurd counts up front.
        c.check_count(n_kv, 13, "metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key #{i}"))?;
            let tag = c.u32(&format!("type of metadata `{key}`"))?;
            let value = c.value(tag, &key, 0)?;
            metadata.push((key, value));
        }
        c.check_count(n_tensors, 24, "tensor count")?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            tensors.push(c.tensor_info(i)?);
        }
        let mut gguf = Gguf {
            version,
            metadata,
            tensors,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
            bytes: Vec::new(),
        };
        gguf.alignment = match gguf.get_value("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| {
                    ModelError::Corrupt {
                        what: "metadata `general.alignment`".into(),
                        offset: 0,
                        detail: format!("{v:?} is not a power of two"),
                    }
                })?;
                a
            }
        };
        let header_end = c.pos as u64;
        gguf.data_offset = header_end.div_ceil(gguf.alignment) * gguf.alignment;
        let data_len = (bytes.len() as u64).saturating_sub(gguf.data_offset);
        for t in &gguf.tensors {
            if t.offset % gguf.alignment != 0 {
                return Err(ModelError::Corrupt {
                    what: format!("tensor info `{}`", t.name),
                    offset: header_end,
                    detail: format!(
                        "data offset {} is not a multiple of the alignment {}",
                        t.offset, gguf.alignment
                    ),
                });
            }
            let size = dequant::byte_size(t.ty, &t.dims, &t.name)?;
            let end = t.offset.saturating_add(size);
            if end > data_len {
                return Err(ModelError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: t.offset,
                    end,
                    len: data_len,
                });
            }
        }
        gguf.bytes = bytes;
        Ok(gguf)
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: name.to_string(),
                source_name: "the GGUF file".into(),
            })
    }

    /// The raw (possibly quantised) bytes of a tensor. Bounds were checked in
    /// [`Gguf::parse`]; they are checked again here rather than trusted.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        let size = dequant::byte_size(t.ty, &t.dims, &t.name)?;
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.bytes.len() as u64 => {
                Ok(&self.bytes[s as usize..e as usize])
            }
            _ => Err(ModelError::TensorOutOfBounds {
                tensor: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(size),
                len: (self.bytes.len() as u64).saturating_sub(self.data_offset),
            }),
        }
    }

    /// Dequantises a tensor to f32, in row-major order of [`TensorInfo::shape`].
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        dequant::dequantize(t.ty, self.tensor_bytes(t)?, t.n_elements(), &t.name)
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }
}

/// Bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// Nesting limit for arrays of arrays (the format allows it; files never nest
/// deeply, and unbounded recursion on corrupt input would overflow the stack).
const MAX_ARRAY_DEPTH: u32 = 8;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let available = (self.bytes.len() - self.pos) as u64;
        if n > available {
            return Err(ModelError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Fails when `count` items of at least `min_size` bytes cannot fit in
    /// what is left of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        let available = (self.bytes.len() - self.pos) as u64;
        let needed = count.saturating_mul(min_size);
        if needed > available {
            return Err(ModelError::Truncated {
                what: format!("{what} ({count} entries)"),
                offset: self.pos as u64,
                needed,
                available,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let start = self.pos as u64;
        let len = self.u64(&format!("length of {what}"))?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|e| ModelError::Corrupt {
            what: what.to_string(),
            offset: start,
            detail: format!("string is not valid UTF-8 ({e})"),
        })
    }

    fn value(&mut self, tag: u32, key: &str, depth: u32) -> Result<GgufValue> {
        let offset = self.pos as u64;
        let ty = GgufValueType::from_tag(tag).ok_or_else(|| ModelError::Corrupt {
            what: format!("metadata `{key}`"),
            offset,
            detail: format!("unknown value type {tag} (known: 0..=12)"),
        })?;
        let what = format!("value of metadata `{key}`");
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(&what)?)),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(&what)?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            GgufValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(ModelError::Corrupt {
                        what,
                        offset,
                        detail: format!("bool byte is {b}, expected 0 or 1"),
                    })
                }
            },
            GgufValueType::String => GgufValue::String(self.string(&what)?),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(ModelError::Corrupt {
                        what,
                        offset,
                        detail: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let elem_tag = self.u32(&format!("element type of `{key}`"))?;
                let elem =
                    GgufValueType::from_tag(elem_tag).ok_or_else(|| ModelError::Corrupt {
                        what: format!("element type of metadata `{key}`"),
                        offset,
                        detail: format!("unknown value type {elem_tag} (known: 0..=12)"),
                    })?;
                let len = self.u64(&format!("length of array `{key}`"))?;
                self.check_count(len, min_value_size(elem), &format!("array `{key}`"))?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_tag, key, depth + 1)?);
                }
                GgufValue::Array(elem, items)
            }
        })
    }

    fn tensor_info(&mut self, index: u64) -> Result<TensorInfo> {
        let name = self.string(&format!("name of tensor #{index}"))?;
        let offset = self.pos as u64;
        let n_dims = self.u32(&format!("dimension count of tensor `{name}`"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(ModelError::Corrupt {
                what: format!("tensor info `{name}`"),
                offset,
                detail: format!("{n_dims} dimensions (expected 1..={MAX_DIMS})"),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(&format!("dimension {d} of tensor `{name}`"))?);
        }
        let elems = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        if elems.is_none_or(|n| n == 0 || n > (1 << 40)) {
            return Err(ModelError::Corrupt {
                what: format!("tensor info `{name}`"),
                offset,
                detail: format!("implausible dimensions {dims:?}"),
            });
        }
        let ty_offset = self.pos as u64;
        let tag = self.u32(&format!("type of tensor `{name}`"))?;
        let ty = GgmlType::from_tag(tag).ok_or_else(|| ModelError::Corrupt {
            what: format!("tensor info `{name}`"),
            offset: ty_offset,
            detail: format!("unknown ggml type {tag}"),
        })?;
        let data_offset = self.u64(&format!("data offset of tensor `{name}`"))?;
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset: data_offset,
        })
    }
}

/// Smallest encoded size of a value of this type (strings: the length only).
fn min_value_size(ty: GgufValueType) -> u64 {
    use GgufValueType::*;
    match ty {
        U8 | I8 | Bool => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 | String => 8,
        Array => 12,
    }
}

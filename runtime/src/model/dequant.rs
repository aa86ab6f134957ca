//! ggml tensor types and dequantisation to f32.
//!
//! Every ggml type is known by name and size (so a file holding types draftc
//! cannot decode still parses, and the error names the type). Decoded: F32,
//! F16, BF16, Q8_0, Q4_0, Q4_1 here, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and
//! Q6_K in [`super::dequant_k`] — the block layouts of ggml-quants.c
//! (`dequantize_row_q4_0` etc.): a block of 32 weights stores an f16 scale
//! `d` (and for Q4_1 an f16 minimum `m`) followed by the quants; for the 4-bit
//! types byte `j` holds weight `j` in its low nibble and weight `j + 16` in its
//! high nibble.

use half::{bf16, f16};

use super::dequant_k;
use super::error::{ModelError, Result};

/// A ggml tensor type (`enum ggml_type`), by its on-disk tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType(pub u32);

/// Name, elements per block and bytes per block, indexed by tag (`None` for
/// tags ggml has retired or never used).
const TYPES: [Option<(&str, u64, u64)>; 40] = [
    Some(("F32", 1, 4)),
    Some(("F16", 1, 2)),
    Some(("Q4_0", 32, 18)),
    Some(("Q4_1", 32, 20)),
    None,
    None,
    Some(("Q5_0", 32, 22)),
    Some(("Q5_1", 32, 24)),
    Some(("Q8_0", 32, 34)),
    Some(("Q8_1", 32, 36)),
    Some(("Q2_K", 256, 84)),
    Some(("Q3_K", 256, 110)),
    Some(("Q4_K", 256, 144)),
    Some(("Q5_K", 256, 176)),
    Some(("Q6_K", 256, 210)),
    Some(("Q8_K", 256, 292)),
    Some(("IQ2_XXS", 256, 66)),
    Some(("IQ2_XS", 256, 74)),
    Some(("IQ3_XXS", 256, 98)),
    Some(("IQ1_S", 256, 50)),
    Some(("IQ4_NL", 32, 18)),
    Some(("IQ3_S", 256, 110)),
    Some(("IQ2_S", 256, 82)),
    Some(("IQ4_XS", 256, 136)),
    Some(("I8", 1, 1)),
    Some(("I16", 1, 2)),
    Some(("I32", 1, 4)),
    Some(("I64", 1, 8)),
    Some(("F64", 1, 8)),
    Some(("IQ1_M", 256, 56)),
    Some(("BF16", 1, 2)),
    None,
    None,
    None,
    Some(("TQ1_0", 256, 54)),
    Some(("TQ2_0", 256, 66)),
    None,
    None,
    None,
    Some(("MXFP4", 32, 17)),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q3_K: GgmlType = GgmlType(11);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);

    /// `None` for a tag that is not a ggml type.
    pub fn from_tag(tag: u32) -> Option<Self> {
        TYPES
            .get(tag as usize)
            .copied()
            .flatten()
            .map(|_| GgmlType(tag))
    }

    fn info(self) -> (&'static str, u64, u64) {
        TYPES
            .get(self.0 as usize)
            .copied()
            .flatten()
            .unwrap_or(("?", 1, 1))
    }

    pub fn name(self) -> &'static str {
        self.info().0
    }

    /// Elements per quantisation block.
    pub fn block_size(self) -> u64 {
        self.info().1
    }

    /// Bytes per quantisation block.
    pub fn block_bytes(self) -> u64 {
        self.info().2
    }

    /// Whether [`dequantize`] decodes this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (tag {})", self.name(), self.0)
    }
}

/// Bytes a tensor of this type and ggml dims occupies. Fails when the
/// contiguous dimension is not a whole number of blocks or the size overflows.
pub fn byte_size(ty: GgmlType, dims: &[u64], tensor: &str) -> Result<u64> {
    let row = dims.first().copied().unwrap_or(1);
    let bad = |detail: String| ModelError::Corrupt {
        what: format!("tensor info `{tensor}`"),
        offset: 0,
        detail,
    };
    if row % ty.block_size() != 0 {
        return Err(bad(format!(
            "row length {row} is not a multiple of the {} block size {}",
            ty.name(),
            ty.block_size()
        )));
    }
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| (n / ty.block_size()).checked_mul(ty.block_bytes()))
        .ok_or_else(|| bad(format!("size of dimensions {dims:?} overflows")))
}

/// Decodes `n_elements` values of type `ty` from `bytes` into f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n_elements: u64, tensor: &str) -> Result<Vec<f32>> {
    if !ty.is_supported() {
        return Err(ModelError::UnsupportedType {
            tensor: tensor.to_string(),
            ty: ty.to_string(),
        });
    }
    let expected = byte_size(ty, &[n_elements], tensor)?;
    if bytes.len() as u64 != expected {
        return Err(ModelError::Corrupt {
            what: format!("data of tensor `{tensor}`"),
            offset: 0,
            detail: format!(
                "{} bytes for {n_elements} {} elements, expected {expected}",
                bytes.len(),
                ty.name()
            ),
        });
    }
    let mut out = Vec::with_capacity(n_elements as usize);
    let block = ty.block_bytes() as usize;
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(block) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                out.extend(b[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
        GgmlType::Q4_0 => {
            for b in bytes.chunks_exact(block) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| (f32::from(q & 0x0f) - 8.0) * d));
                out.extend(qs.iter().map(|&q| (f32::from(q >> 4) - 8.0) * d));
            }
        }
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(block) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| f32::from(q & 0x0f) * d + m));
                out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
            }
        }
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K => {
            let decode = match ty {
                GgmlType::Q5_0 => dequant_k::q5_0,
                GgmlType::Q5_1 => dequant_k::q5_1,
                GgmlType::Q2_K => dequant_k::q2_k,
                GgmlType::Q3_K => dequant_k::q3_k,
                GgmlType::Q4_K => dequant_k::q4_k,
                GgmlType::Q5_K => dequant_k::q5_k,
                _ => dequant_k::q6_k,
            };
            bytes.chunks_exact(block).for_each(|b| decode(b, &mut out));
        }
        _ => {
            return Err(ModelError::UnsupportedType {
                tensor: tensor.to_string(),
                ty: ty.to_string(),
            })
        }
    }
    Ok(out)
}

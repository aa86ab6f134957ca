//! Element types and tensor types of graph values.

use std::fmt;

use crate::dim::{fmt_shape, Dim};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// The model's compute dtype, chosen when a plan is built (f32 or f16).
    Float,
    F32,
    F16,
    BF16,
    /// Token ids and indices.
    U32,
}

impl DType {
    pub fn is_float(self) -> bool {
        !matches!(self, DType::U32)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Float => "float",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "float" => DType::Float,
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "u32" => DType::U32,
            _ => return None,
        })
    }

    pub const NAMES: &'static [&'static str] = &["float", "f32", "f16", "bf16", "u32"];
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Shape and element type of a value. Rank 0 with `Unit` is a side effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dims: Vec<Dim>,
    pub dtype: DType,
}

impl TensorType {
    pub fn new(dims: Vec<Dim>, dtype: DType) -> TensorType {
        TensorType { dims, dtype }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn last(&self) -> Option<&Dim> {
        self.dims.last()
    }

    /// Product of all dims.
    pub fn numel(&self) -> Option<Dim> {
        self.dims
            .iter()
            .try_fold(Dim::constant(1), |acc, d| acc.checked_mul(d))
    }
}

impl fmt::Display for TensorType {
    /// `[t, 576] float` — the syntax of a type annotation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", fmt_shape(&self.dims), self.dtype)
    }
}

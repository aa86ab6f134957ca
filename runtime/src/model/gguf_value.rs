//! GGUF metadata values: the 13 value types of the format (scalars, strings,
//! nested arrays) and typed accessors that turn a wrong type into a
//! [`ModelError::MetadataType`] naming the key.

use std::fmt;

use super::error::{ModelError, Result};

/// The on-disk value type tag of a metadata entry (GGUF spec `gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    /// Decodes the u32 tag; `None` for an unknown tag.
    pub fn from_tag(tag: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match tag {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The u32 tag written on disk.
    pub fn tag(self) -> u32 {
        self as u32
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type (kept so empty arrays stay typed) and the elements.
    Array(GgufValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(..) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Any integer type that fits in a u64 (negative values do not).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer or float type, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Typed look-ups into a metadata list, with errors that name the key.
pub trait MetadataExt {
    fn get_value(&self, key: &str) -> Option<&GgufValue>;

    fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get_value(key)
            .ok_or_else(|| ModelError::MissingMetadata {
                key: key.to_string(),
            })
    }

    fn require_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| type_error(key, "an unsigned integer", v))
    }

    fn require_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| type_error(key, "a number", v))
    }

    fn require_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| type_error(key, "a string", v))
    }

    fn require_array(&self, key: &str) -> Result<&[GgufValue]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| type_error(key, "an array", v))
    }

    /// An array whose elements must all be strings.
    fn require_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.require_array(key)?
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| type_error(key, "an array of strings", item))
            })
            .collect()
    }
}

fn type_error(key: &str, expected: &str, found: &GgufValue) -> ModelError {
    ModelError::MetadataType {
        key: key.to_string(),
        expected: expected.to_string(),
        found: found.value_type().to_string(),
    }
}

//! Pass 5, bind: the plan's weight table (every safetensors tensor the
//! launches read, with its shape and dtype, deduplicated — tied weights
//! appear once) and the check of that table against the tensors a weights
//! file actually holds. The check runs BEFORE anything is launched and
//! reports every problem, each naming the tensor, what was expected and
//! what was found.
//!
//! Target-owned weights (`target.embed` / `target.norm` / `target.lm_head`,
//! and everything of a self-speculative drafter) are already named after the
//! target's tensors by `lower`, through the target model's exports. A
//! drafter with a reduced draft vocabulary reads [`DRAFT_VOCAB_HEAD`]
//! instead of the whole LM head.
//!
//! Limits: dtype conversion is not planned here — the expected dtype is the
//! plan's compute dtype; an executor that converts on load should pass the
//! converted dtype as "available".

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

use crate::plan::{Plan, PlanDType};

/// The rows of the target's LM head a drafter with a reduced draft
/// vocabulary (`draft_vocab N`) reads: `[N, d]`, gathered by the runtime
/// from the target's head in the order of [`DRAFT_VOCAB_IDS`]. Never stored
/// in a weights file.
pub const DRAFT_VOCAB_HEAD: &str = "draft_vocab.lm_head";

/// The target token ids of a reduced draft vocabulary, `[N]` integers in a
/// drafter's weights file: draft id `i` is target id `ids[i]`.
pub const DRAFT_VOCAB_IDS: &str = "draft_vocab.ids";

/// One tensor the plan needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WeightSpec {
    pub name: String,
    pub shape: Vec<i64>,
    pub dtype: PlanDType,
}

/// One tensor a weights file holds (dtype as safetensors spells it: `F32`, `F16`, `BF16`, …).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AvailableTensor {
    pub name: String,
    pub shape: Vec<i64>,
    pub dtype: String,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum BindError {
    #[error(
        "weight `{tensor}` is missing: expected {} {expected_dtype}",
        Shape(expected)
    )]
    Missing {
        tensor: String,
        expected: Vec<i64>,
        expected_dtype: &'static str,
    },
    #[error(
        "weight `{tensor}` has the wrong shape: expected {}, found {}",
        Shape(expected),
        Shape(found)
    )]
    WrongShape {
        tensor: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    #[error("weight `{tensor}` has the wrong dtype: expected {expected}, found {found}")]
    WrongDType {
        tensor: String,
        expected: &'static str,
        found: String,
    },
    /// The plan itself names one tensor with two shapes.
    #[error(
        "weight `{tensor}` is used with two shapes: {} and {}",
        Shape(first),
        Shape(second)
    )]
    Conflict {
        tensor: String,
        first: Vec<i64>,
        second: Vec<i64>,
    },
}

/// `[576, 2304]`
struct Shape<'a>(&'a [i64]);

impl fmt::Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        write!(f, "[{}]", v.join(", "))
    }
}

/// Every weight of `plan` in first-use order, once.
pub fn weight_table(plan: &Plan) -> Result<Vec<WeightSpec>, Vec<BindError>> {
    let mut out: Vec<WeightSpec> = Vec::new();
    let mut errors = Vec::new();
    let launched = plan.launches.iter().flat_map(|l| l.weights.iter());
    for w in launched.chain(&plan.seed_weights) {
        match out.iter().find(|s| s.name == w.name) {
            Some(s) if s.shape != w.shape => errors.push(BindError::Conflict {
                tensor: w.name.clone(),
                first: s.shape.clone(),
                second: w.shape.clone(),
            }),
            Some(_) => {}
            None => out.push(WeightSpec {
                name: w.name.clone(),
                shape: w.shape.clone(),
                dtype: w.dtype,
            }),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Check `table` against `available`; every problem is reported.
pub fn check(table: &[WeightSpec], available: &[AvailableTensor]) -> Result<(), Vec<BindError>> {
    let by_name: BTreeMap<&str, &AvailableTensor> =
        available.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut errors = Vec::new();
    for w in table {
        let expected_dtype = w.dtype.name();
        match by_name.get(w.name.as_str()) {
            None => errors.push(BindError::Missing {
                tensor: w.name.clone(),
                expected: w.shape.clone(),
                expected_dtype,
            }),
            Some(t) => {
                if t.shape != w.shape {
                    errors.push(BindError::WrongShape {
                        tensor: w.name.clone(),
                        expected: w.shape.clone(),
                        found: t.shape.clone(),
                    });
                }
                if !t.dtype.eq_ignore_ascii_case(expected_dtype) {
                    errors.push(BindError::WrongDType {
                        tensor: w.name.clone(),
                        expected: expected_dtype,
                        found: t.dtype.clone(),
                    });
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

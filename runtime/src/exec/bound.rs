//! The executor's weights on the device: every tensor of a plan's weight
//! table that some launch reads alone, and the stacked weight of each fused
//! projection (a self-attention's q, k and v projections as one `[qw + 2 ·
//! kvw, d]` matrix, `Kernel::Linear { parts: 3, .. }`), uploaded once. A
//! tensor read only as part of a stack is not uploaded alone, so fusing the
//! projections costs no device memory.

use std::collections::{BTreeMap, BTreeSet};

use cubecl::prelude::*;
use draftc_codegen::bind::WeightSpec;
use draftc_codegen::{Kernel, Launch, Plan};
use draftc_ops::{DType, DeviceTensor};

use super::executor::ExecError;
use super::weights::HostWeights;

/// Device weights by binder name (stacks under [`stack_name`]).
pub(crate) type DeviceWeights<R> = BTreeMap<String, DeviceTensor<R>>;

/// The weight matrices launch `l` stacks, from its weight `from` on, when
/// it is a linear over more than one (`None` otherwise).
fn stack_of(l: &Launch, from: usize) -> Option<Vec<&str>> {
    match l.kernel {
        Kernel::Linear { parts, .. } if parts > 1 => Some(
            l.weights
                .iter()
                .skip(from)
                .take(parts as usize)
                .map(|w| w.name.as_str())
                .collect(),
        ),
        _ => None,
    }
}

/// The first weight of a linear's matrix (after its norm's scale, if any).
pub(crate) fn matrix_index(l: &Launch) -> usize {
    match l.kernel {
        Kernel::Linear { prologue, .. } => {
            usize::from(prologue != draftc_codegen::kernel::Prologue::None)
        }
        _ => 0,
    }
}

/// The device name of a stack of weights.
pub(crate) fn stack_name(names: &[&str]) -> String {
    names.join(" + ")
}

/// Uploads `plan`'s weights from `host` (checked against `table` already)
/// as `dtype`: the tensors read alone, and each stack concatenated along
/// the output (rows of `[out, in]` matrices one after another).
pub(crate) fn upload<R: Runtime>(
    client: &ComputeClient<R>,
    plan: &Plan,
    table: &[WeightSpec],
    host: &HostWeights,
    dtype: DType,
) -> Result<DeviceWeights<R>, ExecError> {
    let get = |name: &str| {
        host.get(name)
            .ok_or_else(|| ExecError::Internal(format!("weight `{name}` vanished after the check")))
    };
    let mut stacks: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut alone: BTreeSet<&str> = BTreeSet::new();
    // Norm scales read as `1 + w` (Gemma's `unit_offset`), by tensor name.
    let mut plus_one: BTreeSet<&str> = BTreeSet::new();
    for l in &plan.launches {
        let from = matrix_index(l);
        let stack = stack_of(l, from);
        let stacked = stack.as_ref().map_or(0..0, |s| from..from + s.len());
        for (i, w) in l.weights.iter().enumerate() {
            if stacked.contains(&i) {
                continue;
            }
            if w.plus_one {
                plus_one.insert(w.name.as_str());
            } else {
                alone.insert(w.name.as_str());
            }
        }
        if let Some(s) = stack {
            stacks.insert(stack_name(&s), s);
        }
    }
    // Applied by the runtime outside the launches (memory fusion).
    alone.extend(plan.seed_weights.iter().map(|w| w.name.as_str()));
    let mut dev = BTreeMap::new();
    for spec in table.iter().filter(|s| alone.contains(s.name.as_str())) {
        let (shape, data) = get(&spec.name)?;
        let t = DeviceTensor::upload_f32(client, data, shape, dtype)?;
        dev.insert(spec.name.clone(), t);
    }
    for spec in table.iter().filter(|s| plus_one.contains(s.name.as_str())) {
        let (shape, data) = get(&spec.name)?;
        // `1 + w` in f32, then stored in the plan's dtype.
        let shifted: Vec<f32> = data.iter().map(|w| 1.0 + w).collect();
        let t = DeviceTensor::upload_f32(client, &shifted, shape, dtype)?;
        dev.insert(format!("1 + {}", spec.name), t);
    }
    for (name, parts) in stacks {
        let mut data = Vec::new();
        let mut rows = 0;
        let mut cols = None;
        for p in &parts {
            let (shape, d) = get(p)?;
            let [r, c] = shape[..] else {
                return Err(ExecError::Internal(format!(
                    "stacked weight `{p}` is not a matrix: {shape:?}"
                )));
            };
            if cols.is_some_and(|k| k != c) {
                return Err(ExecError::Internal(format!(
                    "stacked weights `{name}` disagree on their input width"
                )));
            }
            cols = Some(c);
            rows += r;
            data.extend_from_slice(d);
        }
        let t = DeviceTensor::upload_f32(client, &data, &[rows, cols.unwrap_or(0)], dtype)?;
        dev.insert(name, t);
    }
    Ok(dev)
}

/// The stacked weight launch `l` reads from its weight `from` on.
pub(crate) fn stacked<'w, R: Runtime>(
    weights: &'w DeviceWeights<R>,
    l: &Launch,
    from: usize,
) -> Result<Option<&'w DeviceTensor<R>>, ExecError> {
    let Some(s) = stack_of(l, from) else {
        return Ok(None);
    };
    let name = stack_name(&s);
    weights.get(&name).map(Some).ok_or_else(|| {
        ExecError::Internal(format!(
            "stacked weight `{name}` was not uploaded (a plan built after the first \
             stacks weights the first did not)"
        ))
    })
}

/// Weight `i` of `launch`, uploaded.
pub(crate) fn weight<'w, R: Runtime>(
    weights: &'w DeviceWeights<R>,
    launch: &draftc_codegen::Launch,
    i: usize,
) -> Result<&'w DeviceTensor<R>, ExecError> {
    let name = launch
        .weights
        .get(i)
        .ok_or_else(|| ExecError::Internal(format!("launch #{} lacks weight {i}", launch.id.0)))?
        .device_name();
    weights
        .get(name.as_ref())
        .ok_or_else(|| ExecError::Internal(format!("weight `{name}` not uploaded")))
}

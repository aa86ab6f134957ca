//! Safe launch functions for tree acceptance: validate the trees on the host,
//! launch one cube per tree, read the accepted paths back.

use cubecl::prelude::*;

use super::kernel::{accept_greedy, accept_sampling};
use super::{AcceptMode, Acceptance, BLOCK, MAX_NODES};
use crate::attention::{validate_parents, TREE_ROOT};
use crate::error::{OpsError, Result};
use crate::launch::{
    expect_bindable, expect_dtype, expect_float, expect_shape, finish, MAX_CUBES_PER_DIM,
};
use crate::tensor::{DType, DeviceTensor};

const OP: &str = "accept_tree";

/// Accepts one tree. `tokens`, `parents`: `[n]` (host); `logits` and the
/// optional draft probabilities `q`: `[n, vocab]` on the device. See the
/// module docs for the conventions.
pub fn accept_tree<R: Runtime>(
    client: &ComputeClient<R>,
    tokens: &[u32],
    parents: &[u32],
    logits: &DeviceTensor<R>,
    q: Option<&DeviceTensor<R>>,
    mode: AcceptMode,
) -> Result<Acceptance> {
    let lift = |t: &DeviceTensor<R>| match t.shape() {
        &[n, v] => t.reshape(&[1, n, v]),
        s => Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "logits",
            expected: "[n, vocab]".into(),
            found: s.to_vec(),
        }),
    };
    let logits3 = lift(logits)?;
    let q3 = q.map(lift).transpose()?;
    let mut all = accept_trees(client, tokens, parents, &logits3, q3.as_ref(), mode)?;
    all.pop().ok_or(OpsError::EmptyInput {
        op: OP,
        arg: "tokens",
        shape: vec![0],
    })
}

/// Accepts a batch of `b` trees of `n` nodes each in one launch: `tokens`,
/// `parents` `[b·n]` (host), `logits`/`q` `[b, n, vocab]`. Tree `i` uses the
/// RNG stream `(seed, step + i)` in sampling mode.
pub fn accept_trees<R: Runtime>(
    client: &ComputeClient<R>,
    tokens: &[u32],
    parents: &[u32],
    logits: &DeviceTensor<R>,
    q: Option<&DeviceTensor<R>>,
    mode: AcceptMode,
) -> Result<Vec<Acceptance>> {
    expect_float(client, OP, "logits", logits)?;
    let &[b, n, vocab] = logits.shape() else {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "logits",
            expected: "[trees, n, vocab]".into(),
            found: logits.shape().to_vec(),
        });
    };
    if b == 0 || n == 0 || vocab == 0 {
        return Err(OpsError::EmptyInput {
            op: OP,
            arg: "logits",
            shape: logits.shape().to_vec(),
        });
    }
    if n > MAX_NODES || b > MAX_CUBES_PER_DIM {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!(
                "{b} trees of {n} nodes: at most {MAX_CUBES_PER_DIM} trees of {MAX_NODES} nodes"
            ),
        });
    }
    for (arg, len) in [("tokens", tokens.len()), ("parents", parents.len())] {
        if len != b * n {
            return Err(OpsError::ShapeMismatch {
                op: OP,
                arg,
                expected: format!("[{}]", b * n),
                found: vec![len],
            });
        }
    }
    for tree in 0..b {
        let p = &parents[tree * n..(tree + 1) * n];
        if p[0] != TREE_ROOT {
            return Err(OpsError::InvalidArgument {
                op: OP,
                reason: format!(
                    "tree {tree}: node 0 is the root and must have parent TREE_ROOT, found {}",
                    p[0]
                ),
            });
        }
        validate_parents(OP, p)?;
    }
    if let Some(pos) = tokens.iter().position(|&t| t as usize >= vocab) {
        return Err(OpsError::IndexOutOfRange {
            op: OP,
            arg: "tokens",
            position: pos,
            index: tokens[pos] as u64,
            bound: vocab,
        });
    }
    if let Some(q) = q {
        expect_shape(OP, "q", q, logits.shape())?;
        expect_dtype(OP, "q", q, logits.dtype())?;
    }
    expect_bindable(OP, "logits", logits)?;
    let tok = DeviceTensor::<R>::upload_u32(client, tokens, &[b * n])?;
    let par = DeviceTensor::<R>::upload_u32(client, parents, &[b * n])?;
    let out = DeviceTensor::<R>::zeros(client, &[b, n + 1], DType::U32);
    let count = CubeCount::Static(b as u32, 1, 1);
    let dim = CubeDim::new_1d(BLOCK as u32);
    match mode {
        AcceptMode::Greedy => crate::dispatch_float!(logits.dtype(), OP, F => {
            // SAFETY: shapes validated above; each cube reads its own tree's
            // `n` nodes and `n·vocab` logits and writes its own `n + 1` words.
            unsafe {
                accept_greedy::launch_unchecked::<F, R>(client, count, dim, logits.array_arg(), tok.array_arg(),
                    par.array_arg(), out.array_arg(), n as u32, vocab as u32, BLOCK)
            }
        })?,
        AcceptMode::Sampling {
            temperature,
            seed,
            step,
        } => {
            if !(temperature > 0.0 && temperature.is_finite()) {
                return Err(OpsError::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "temperature must be finite and > 0, got {temperature} (use Greedy for 0)"
                    ),
                });
            }
            let work = DeviceTensor::<R>::empty(client, &[b, vocab], DType::F32);
            expect_bindable(OP, "work", &work)?;
            let q_arg = q.unwrap_or(logits);
            crate::dispatch_float!(logits.dtype(), OP, F => {
                // SAFETY: as above; `q` (or the logits as a stand-in when
                // absent, never read) has the logits' shape; `work` holds
                // `vocab` f32 per tree.
                unsafe {
                    accept_sampling::launch_unchecked::<F, R>(client, count, dim, logits.array_arg(), q_arg.array_arg(),
                        tok.array_arg(), par.array_arg(), work.array_arg(), out.array_arg(), n as u32, vocab as u32,
                        1.0 / temperature, seed as u32, (seed >> 32) as u32, step, q.is_some(), BLOCK)
                }
            })?
        }
    }
    finish(client, OP)?;
    let words = out.download_u32(client)?;
    Ok(words
        .chunks(n + 1)
        .map(|w| {
            let len = (w[0] as usize).min(n - 1);
            Acceptance {
                accepted: w[2..2 + len].to_vec(),
                bonus: w[1],
            }
        })
        .collect())
}

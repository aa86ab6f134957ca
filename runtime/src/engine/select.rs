//! Picking the next token of every row of a logits tensor, on the device:
//! greedy (`temperature == 0`: argmax, ties to the lowest id, exactly what
//! the speculative engine's greedy acceptance compares against) or sampling
//! with temperature, top-k and top-p from a counter-based RNG keyed by
//! `(seed, row, step)` (`draftc_ops::sampling`).

use cubecl::prelude::*;
use cubecl::server::Handle;
use draftc_ops::sampling::SamplingParams;
use draftc_ops::{DType, DeviceTensor};

use super::target::EngineError;

/// How tokens are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no top-k cut.
    pub top_k: usize,
    /// 1 = no nucleus cut.
    pub top_p: f32,
    pub seed: u64,
}

impl Sampling {
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks the values a user can type.
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(EngineError::Invalid(format!(
                "--temperature must be a finite number >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Invalid(format!(
                "--top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// One token per row of `logits` (`[rows, vocab]`); `step` keys the RNG.
pub fn select_tokens<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    sampling: &Sampling,
    step: u32,
) -> Result<Vec<u32>, EngineError> {
    select_tokens_into(client, logits, sampling, step, &mut SelectOut::default())
}

/// The last output buffer of a loop's step, remembered so that the next
/// step can read it on the device ([`SelectOut::last`]). Reuse needs no
/// bookkeeping here: `DeviceTensor::empty` hands out the thread's kept
/// buffers (`draftc_ops::kept`), so a steady-state step allocates none
/// (issue 31).
#[derive(Default)]
pub struct Kept(Option<Handle>);

impl Kept {
    /// A tensor of `shape` over a kept buffer, remembered as the last.
    pub fn take<R: Runtime>(
        &mut self,
        client: &ComputeClient<R>,
        shape: &[usize],
        dtype: DType,
    ) -> DeviceTensor<R> {
        // Let go of the last one first: when nothing else holds it (the
        // pass that read it as ids has been issued), the same buffer comes
        // back, so the next step's ids input keeps one address and a
        // replayed step finds the buffer it recorded (`exec/replay.rs`).
        // Work queued on it earlier runs first (one in-order stream).
        self.0 = None;
        let t = DeviceTensor::<R>::empty(client, shape, dtype);
        self.0 = Some(t.handle.clone());
        t
    }
}

/// The selection's output buffer, kept by a decoding loop across its steps
/// so that a steady-state step allocates none for it (issue 31).
#[derive(Default)]
pub struct SelectOut(Kept);

impl SelectOut {
    /// A `[rows]` u32 tensor over a kept buffer, remembered as the last.
    fn take<R: Runtime>(&mut self, client: &ComputeClient<R>, rows: usize) -> DeviceTensor<R> {
        self.0.take(client, &[rows], DType::U32)
    }
}

/// The buffers of [`top_candidates_into`] (probabilities, values and
/// indices), kept by a drafter across its depths and rounds.
#[derive(Default)]
pub struct TopOut {
    probs: Kept,
    values: Kept,
    indices: Kept,
}

impl SelectOut {
    /// The last selection's `rows` tokens on the device (the next decode
    /// step's ids), if the kept buffer holds that many.
    pub fn last<R: Runtime>(&self, rows: usize) -> Option<DeviceTensor<R>> {
        let h = self.0 .0.as_ref()?;
        DeviceTensor::from_handle(h.clone(), &[rows], DType::U32).ok()
    }
}

/// The greedy tokens of every row of `logits`, left on the device in
/// `out`'s kept buffer (no read: a caller that reads several selections at
/// once waits for the device once).
pub fn argmax_on_device<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    out: &mut SelectOut,
) -> Result<DeviceTensor<R>, EngineError> {
    let vocab = *logits.shape().last().unwrap_or(&1);
    let rows = logits.numel() / vocab.max(1);
    let logits = logits.reshape(&[rows, vocab])?;
    let t = out.take(client, rows);
    draftc_ops::argmax_topk::argmax(client, &logits, &t)?;
    Ok(t)
}

/// [`select_tokens`] writing into `out`'s kept buffer.
pub fn select_tokens_into<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    sampling: &Sampling,
    step: u32,
    out: &mut SelectOut,
) -> Result<Vec<u32>, EngineError> {
    if sampling.is_greedy() {
        return Ok(argmax_on_device(client, logits, out)?.download_u32(client)?);
    }
    let vocab = *logits.shape().last().unwrap_or(&1);
    let rows = logits.numel() / vocab.max(1);
    let logits = logits.reshape(&[rows, vocab])?;
    let out = out.take(client, rows);
    let params = SamplingParams {
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        seed: sampling.seed,
        step,
    };
    draftc_ops::sampling::sample(client, &logits, params, &out)?;
    Ok(out.download_u32(client)?)
}

/// The `k` most likely tokens of every row of `logits` (`[rows, vocab]`)
/// with their log-probabilities (softmax at temperature 1), most likely
/// first — the candidates a drafter expands a tree node with. `k = 1`
/// without log-probabilities needed is [`select_tokens`]' argmax.
pub fn top_candidates<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    k: usize,
) -> Result<Vec<Vec<(u32, f32)>>, EngineError> {
    top_candidates_into(client, logits, k, &mut TopOut::default())
}

/// The top `k` of every row's probabilities, left on the device in `out`'s
/// kept buffers: (probabilities `[rows, k]` in the logits' dtype, ids
/// `[rows, k]` u32), best first.
pub fn top_candidates_on_device<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    k: usize,
    out: &mut TopOut,
) -> Result<(DeviceTensor<R>, DeviceTensor<R>), EngineError> {
    let vocab = *logits.shape().last().unwrap_or(&1);
    let rows = logits.numel() / vocab.max(1);
    let k = k.clamp(1, vocab.max(1));
    let logits = logits.reshape(&[rows, vocab])?;
    let probs = out.probs.take(client, &[rows, vocab], logits.dtype());
    draftc_ops::softmax::softmax(client, &logits, 1.0, &probs)?;
    let values = out.values.take(client, &[rows, k], logits.dtype());
    let indices = out.indices.take(client, &[rows, k], DType::U32);
    draftc_ops::argmax_topk::topk(client, &probs, k, &values, &indices)?;
    Ok((values, indices))
}

/// [`top_candidates`] in `out`'s kept buffers.
pub fn top_candidates_into<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    k: usize,
    out: &mut TopOut,
) -> Result<Vec<Vec<(u32, f32)>>, EngineError> {
    let (values, indices) = top_candidates_on_device(client, logits, k, out)?;
    let (rows, k) = (values.shape()[0], values.shape()[1]);
    // One read for both: a tree drafter waits on this once per depth.
    let (p, ids) = DeviceTensor::download_f32_and_u32(client, &values, &indices)?;
    Ok((0..rows)
        .map(|r| {
            (0..k)
                .map(|j| (ids[r * k + j], p[r * k + j].max(0.0).ln()))
                .collect()
        })
        .collect())
}

/// The target's choice at each of `rows` (row of `logits`, sampling,
/// position the row predicts): one argmax over the pass for the greedy
/// rows, a sample per sampled row keyed by the sequence's seed and that
/// position. One read of the device for all.
pub(super) fn choose_rows<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    vocab: usize,
    rows: &[(u32, Sampling, u32)],
    selected: &mut SelectOut,
) -> Result<Vec<u32>, EngineError> {
    let all_rows = logits.numel() / vocab.max(1);
    let all = logits.reshape(&[all_rows, vocab])?;
    let mut reads: Vec<DeviceTensor<R>> = Vec::new();
    let any_greedy = rows.iter().any(|r| r.1.is_greedy());
    if any_greedy {
        reads.push(argmax_on_device(client, &all, selected)?);
    }
    for &(row, s, pos) in rows.iter().filter(|r| !r.1.is_greedy()) {
        let one = DeviceTensor::<R>::empty(client, &[1, vocab], all.dtype());
        draftc_ops::kv::gather_rows(client, &all, &[row], &one, &[0])?;
        let out = DeviceTensor::<R>::empty(client, &[1], DType::U32);
        let params = SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            seed: s.seed,
            step: pos,
        };
        draftc_ops::sampling::sample(client, &one, params, &out)?;
        reads.push(out);
    }
    let refs: Vec<&DeviceTensor<R>> = reads.iter().collect();
    let got = DeviceTensor::download_u32_all(client, &refs)?;
    let mut sampled = got.iter().skip(usize::from(any_greedy));
    let greedy = if any_greedy { got.first() } else { None };
    Ok(rows
        .iter()
        .map(|&(row, s, _)| {
            if s.is_greedy() {
                greedy
                    .and_then(|g| g.get(row as usize).copied())
                    .unwrap_or(0)
            } else {
                sampled.next().and_then(|v| v.first().copied()).unwrap_or(0)
            }
        })
        .collect())
}

//! The end of a batch (`Planner::finishes_sooner`): draftc runs a fixed
//! batch until its last sequence is done, so a draft that pays per round
//! can lose over the run. Sequences that draft finish at different rounds,
//! and the batch runs its last rounds with fewer sequences, at a higher
//! cost per token, while autoregressive decoding keeps sequences of equal
//! length in step to the end. On lavapipe a pass over three rows costs
//! nearly what one over four does (its linears block rows by four), so a
//! sequence that finishes early saves almost nothing: traced at four
//! sequences, prompt lookup drafted a copying sequence to its end in 18
//! rounds, and the other three ran 13 more rounds at three quarters of
//! the batch's rate (0.89x over the run; the round model predicted 1.2x).
//!
//! Each sequence `i` with `R_i` tokens left (its room before
//! `max_tokens`; an end-of-sequence token may end it sooner) that emits
//! `X_i` tokens a round (mean `μ_i`, variance `σ_i²`, from its acceptance
//! estimates) needs about `m_i = R_i / μ_i` rounds, give or take
//! `s_i = √(R_i σ_i² / μ_i³)` (renewal theory). Sequences finish in the
//! order of `m_i`, the `r`-th of `b` at `m + s·z_r`, `z_r` the expected
//! `r`-th smallest of `b` standard normals (Blom's approximation); between
//! two finishes the rounds run over the sequences still going, each at its
//! measured cost (`V` of their rows, plus the drafter call). The sum is the
//! expected time to finish the batch, compared with the same sum for no
//! draft (every sequence at one token a round). At one sequence it is the
//! round model; for long runs the spread shrinks as `1/√R`.

use super::Planner;

/// Mean and variance of the tokens a round emits for a sequence whose
/// first `k` draft tokens are accepted with the path probabilities
/// `reach` (`P(j)`: the first `j` all accepted): `1 + A` with
/// `E[A] = Σ P(j)` and `E[A²] = Σ (2j − 1) P(j)`.
pub fn emission(reach: &[f64], k: usize) -> (f64, f64) {
    let (mut mean, mut sq) = (0.0, 0.0);
    for (j, &p) in reach.iter().take(k).enumerate() {
        mean += p;
        sq += (2 * j + 1) as f64 * p;
    }
    (1.0 + mean, (sq - mean * mean).max(0.0))
}

/// What a round's drafter call costs in [`Planner::finishes_sooner`].
#[derive(Clone, Copy, Debug)]
pub enum DrafterCall {
    /// Planned: the drafter's measured call for the sequences still going.
    Planned,
    /// Already spent this round (seconds), paid with or without a draft.
    Spent(f64),
}

impl Planner {
    /// The tokens each active sequence may still emit this run (slot,
    /// room), set every round by the engine; without them the planner
    /// sees no end to the batch.
    pub fn set_rooms(&mut self, rooms: impl IntoIterator<Item = (usize, usize)>) {
        self.rooms.clear();
        self.rooms.extend(rooms);
    }

    /// Whether drafting `counts[i]` tokens for sequence `slots[i]` (its
    /// path probabilities `reach[i]`) every round finishes the batch
    /// sooner than no draft. True when a sequence's room or a cost is
    /// unknown.
    pub(super) fn finishes_sooner(
        &self,
        slots: &[usize],
        reach: &[Vec<f64>],
        counts: &[usize],
        call: DrafterCall,
    ) -> bool {
        let mut drafted = Vec::with_capacity(slots.len());
        let mut plain = Vec::with_capacity(slots.len());
        for ((slot, p), &k) in slots.iter().zip(reach).zip(counts) {
            let Some(&room) = self.rooms.get(slot) else {
                return true;
            };
            let r = room as f64;
            let (mu, var) = emission(p, k);
            drafted.push((r / mu, (r * var / mu.powi(3)).sqrt(), k));
            plain.push((r, 0.0, 0));
        }
        match (
            self.batch_time(&mut drafted, call),
            self.batch_time(&mut plain, call),
        ) {
            (Some(with), Some(without)) => with < without,
            _ => true,
        }
    }

    /// Expected seconds until every sequence `(m, s, k)` (expected rounds
    /// to finish, their spread, draft tokens a round) is done.
    fn batch_time(&self, seqs: &mut [(f64, f64, usize)], call: DrafterCall) -> Option<f64> {
        seqs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let b = seqs.len();
        let (mut t, mut done_at) = (0.0, 0.0f64);
        for r in 0..b {
            let z = normal_quantile((r as f64 + 1.0 - 0.375) / (b as f64 + 0.25));
            let (m, s, _) = seqs[r];
            let finish = (m + s * z).max(done_at);
            let going = &seqs[r..];
            let rows: usize = going.iter().map(|&(_, _, k)| 1 + k).sum();
            let depth = going.iter().map(|&(_, _, k)| k).max().unwrap_or(0);
            let draft = match call {
                DrafterCall::Planned if depth > 0 => self.draft_time(going.len(), depth)?,
                DrafterCall::Planned => 0.0,
                DrafterCall::Spent(x) => x,
            };
            t += (finish - done_at) * (draft + self.verify_time(rows)?);
            done_at = finish;
        }
        Some(t)
    }
}

/// The standard normal quantile (Acklam's rational approximation, relative
/// error below 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

//! `draftc bench replay`: replayed target passes against eager ones, bit
//! for bit (issue 56). Two copies of the target run the same passes, one
//! eagerly (`Executor::set_replay(false)`), one replaying (and, on CUDA,
//! launching its captured graphs): a prefill pass a prompt, then decode
//! steps fed the
//! eager copy's greedy choices, then repeated tree verifications (four rows
//! a sequence, two branches, truncated after each pass as a rejected draft
//! is). Every pass's logits must be equal bit for bit. On a GPU this is the
//! check that the recorder, the upload rebuilt on the host and the graphs
//! give what the eager launches give.

use cubecl::prelude::*;
use serde::Serialize;

use crate::engine::{EngineError, TargetModel};
use crate::exec::{SeqStep, Step};

/// One kind of pass checked at one batch size.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayCheck {
    pub batch: usize,
    /// `prefill + decode` (a prefill pass a prompt, then the decode steps)
    /// or `tree verify`.
    pub pass: &'static str,
    pub passes: usize,
    /// Passes the replaying copy replayed, and graphs it captured.
    pub replayed: u64,
    pub graphs: u64,
    /// The first pass (in order, from 0) whose logits differ (`None`: all
    /// equal).
    pub first_difference: Option<usize>,
    /// Why the replaying copy's last recording or graph capture was
    /// refused, if one was.
    pub refusal: Option<String>,
    pub graph_refusal: Option<String>,
}

/// Logits of a pass, as bits.
fn logits<R: Runtime>(
    t: &mut TargetModel<R>,
    step: &Step,
    ids: &[u32],
) -> Result<Vec<u32>, EngineError> {
    let out = t.forward(step, ids)?;
    let l = out.get("logits")?.download_f32(t.client())?;
    Ok(l.iter().map(|x| x.to_bits()).collect())
}

/// The greedy choice of each sequence's last row of `logits` (rows of
/// `lens` per sequence).
fn greedy(logits: &[u32], vocab: usize, lens: &[usize]) -> Vec<u32> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            at += n;
            let row = &logits[(at - 1) * vocab..at * vocab];
            (0..vocab)
                .max_by(|&i, &j| f32::from_bits(row[i]).total_cmp(&f32::from_bits(row[j])))
                .unwrap_or(0) as u32
        })
        .collect()
}

/// Runs the same passes on `eager` and `fast` (two copies of one target
/// with at least `prompts.len()` slots): the prompts' prefill, `steps`
/// decode steps, then `steps` tree verifications. `fast` should replay;
/// `eager` should not.
pub fn check_replay<R: Runtime>(
    eager: &mut TargetModel<R>,
    fast: &mut TargetModel<R>,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Result<Vec<ReplayCheck>, EngineError> {
    let b = prompts.len();
    if b == 0 || prompts.iter().any(Vec::is_empty) {
        return Err(EngineError::Invalid("replay check: empty prompts".into()));
    }
    eager.exec.set_replay(false);
    for t in [&mut *eager, &mut *fast] {
        for s in 0..b {
            t.caches.reset(s);
        }
    }
    let vocab = eager.vocab;
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    // One prefill pass a prompt (a whole batch's prompt rows of logits
    // would pass a device's binding limit).
    let mut first = None;
    let mut next = Vec::with_capacity(b);
    for (s, p) in prompts.iter().enumerate() {
        let step = Step {
            seqs: vec![SeqStep::chain(s, 0, p.len())],
            ..Default::default()
        };
        let a = logits(eager, &step, p)?;
        if first.is_none() && a != logits(fast, &step, p)? {
            first = Some(s);
        }
        next.extend(greedy(&a, vocab, &[p.len()]));
    }
    let mut out = Vec::new();
    let (replayed0, graphs0) = (fast.exec.replay_stats().0, fast.exec.graph_stats().0);
    for k in 0..steps {
        let step = Step {
            seqs: (0..b)
                .map(|s| SeqStep::chain(s, (lens[s] + k) as u32, 1))
                .collect(),
            ..Default::default()
        };
        let a = logits(eager, &step, &next)?;
        if first.is_none() && a != logits(fast, &step, &next)? {
            first = Some(b + k);
        }
        next = greedy(&a, vocab, &vec![1; b]);
    }
    out.push(summary(
        fast,
        b,
        "prefill + decode",
        b + steps,
        first,
        replayed0,
        graphs0,
    ));
    // Tree verifications at the context the decode steps reached: rows
    // (root, its two children, the first child's child), truncated after
    // each pass.
    let (replayed0, graphs0) = (fast.exec.replay_stats().0, fast.exec.graph_stats().0);
    let mut first = None;
    for k in 0..steps {
        let mut seqs = Vec::new();
        let mut ids = Vec::new();
        for (s, &n) in lens.iter().enumerate() {
            let p = (n + steps) as u32;
            seqs.push(SeqStep {
                slot: s,
                positions: vec![p, p + 1, p + 1, p + 2],
                parents: Some(vec![draftc_ops::attention::TREE_ROOT, 0, 0, 1]),
                memory_tail: None,
            });
            let v = vocab as u32;
            ids.extend((0..4).map(|r| (next[s] + (k * 4 + r) as u32 * 13) % v));
        }
        let step = Step {
            seqs,
            ..Default::default()
        };
        let a = logits(eager, &step, &ids)?;
        if first.is_none() && a != logits(fast, &step, &ids)? {
            first = Some(k);
        }
        for (s, &n) in lens.iter().enumerate() {
            eager.caches.truncate(s, n + steps);
            fast.caches.truncate(s, n + steps);
        }
    }
    out.push(summary(
        fast,
        b,
        "tree verify",
        steps,
        first,
        replayed0,
        graphs0,
    ));
    Ok(out)
}

fn summary<R: Runtime>(
    fast: &TargetModel<R>,
    batch: usize,
    pass: &'static str,
    passes: usize,
    first_difference: Option<usize>,
    replayed0: u64,
    graphs0: u64,
) -> ReplayCheck {
    let (replayed, _, refusal) = fast.exec.replay_stats();
    let (graphs, graph_refusal) = fast.exec.graph_stats();
    ReplayCheck {
        batch,
        pass,
        passes,
        replayed: replayed - replayed0,
        graphs: graphs - graphs0,
        first_difference,
        refusal: refusal.map(str::to_string),
        graph_refusal: graph_refusal.map(str::to_string),
    }
}

/// The markdown table `draftc bench replay` prints.
pub fn table(device: &str, checks: &[ReplayCheck]) -> String {
    let mut s = format!(
        "## replayed passes against eager ones, bit for bit — {device}\n\n\
         | batch | pass | passes | replayed | graphs | logits | refusal |\n|---|---|---|---|---|---|---|\n"
    );
    for c in checks {
        let equal = match c.first_difference {
            None => "equal".to_string(),
            Some(k) => format!("**differ from pass {k}**"),
        };
        let why = [&c.refusal, &c.graph_refusal]
            .into_iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c.batch, c.pass, c.passes, c.replayed, c.graphs, equal, why
        ));
    }
    s
}

/// `draftc bench replay` on a converted model: two copies of the target,
/// the checks of [`check_replay`] at every batch size in `batches`.
pub fn run_replay<R: Runtime>(
    client: &ComputeClient<R>,
    model: &crate::model::ConvertedModel,
    batches: &[usize],
    steps: usize,
    dtype: draftc_codegen::PlanDType,
    progress: &super::Progress,
) -> Result<Vec<ReplayCheck>, EngineError> {
    use crate::model::tokenizer::ChatMessage;
    let max_b = batches.iter().copied().max().unwrap_or(0);
    if max_b == 0 || batches.contains(&0) || steps == 0 {
        return Err(EngineError::Invalid(
            "give batch sizes >= 1 and at least one step".into(),
        ));
    }
    let mut prompts = Vec::with_capacity(max_b);
    for i in 0..max_b {
        let p = super::prompts::prompt(i);
        prompts.push(
            model
                .tokenizer
                .encode_chat(&[ChatMessage::new("user", p.text)])?,
        );
    }
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + steps + 8;
    progress.message(&format!("loading {} twice …", model.dir.display()));
    let mut eager = TargetModel::load(client, model, max_b, capacity, dtype)?;
    let mut fast = TargetModel::load(client, model, max_b, capacity, dtype)?;
    let mut out = Vec::new();
    for (i, &b) in batches.iter().enumerate() {
        progress.step(
            i,
            batches.len(),
            &format!("batch {b}: prefill, decode, tree verify"),
        );
        out.extend(check_replay(&mut eager, &mut fast, &prompts[..b], steps)?);
    }
    progress.finish();
    Ok(out)
}

//! Concurrent drafting (paper 003, DuoDecoding): the drafter runs on its own
//! thread — with its own CubeCL client, on another device or on the CPU —
//! and drafts round `r + 1` while the target verifies round `r`.
//!
//! * [`TokenDrafter`]: a drafter that needs only token ids (no target
//!   device tensors), so it can live on another thread: prompt lookup, or
//!   [`LmDrafter`], a small language model (by default the target's first
//!   layers, "early exit") with its own KV cache.
//! * [`DraftWorker`]: the thread; jobs in, trees out, each reply timed.
//! * [`ConcurrentDrafter`]: the engine-facing [`Drafter`]. When the engine
//!   is about to verify round `r`'s trees it sends, per sequence, the
//!   context *as if the best path of its tree were accepted*, and returns
//!   at once; the worker drafts the continuation while the target runs.
//!   At round `r + 1` the reply is re-rooted on what was really committed:
//!   if the whole assumed path was accepted, the committed tokens extend
//!   the context by the bonus token, and the subtree under the matching
//!   first-level node is the new tree; otherwise the draft is discarded and
//!   the round is a plain target step (the drafter meanwhile drafts from
//!   the true context) — paper 003's "if none of the sequences are
//!   verified, we sample a token … and append it to the prefix".
//!   Verification is the engine's usual lossless tree verification, so the
//!   output is exact whatever the drafter proposes.
//! * The draft length follows paper 003's hardware-aware budget:
//!   [`BudgetController`] with [`Schedule::Concurrent`], fed with the
//!   measured drafter time per level and target verify time per round.
//!
//! [`SyncTokenDrafter`] runs any [`TokenDrafter`] on the engine's thread
//! (the sequential baseline for the same drafter).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use cubecl::prelude::*;

use super::drafters::{DraftCall, Drafter, PromptLookupDrafter, SeqView};
use super::select::top_candidates;
use super::target::{EngineError, TargetModel};
use crate::exec::{SeqStep, Step};
use crate::speculation::tree::Candidate;
use crate::speculation::{
    BudgetConfig, BudgetController, DraftTree, Schedule, TreeBuilder, TreeShape,
};

/// One sequence's drafting job: continue `context` (its last token is the
/// newest; the first draft level predicts the token after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftRequest {
    pub slot: usize,
    pub context: Vec<u32>,
    pub budget: usize,
}

/// A drafter that works from token ids alone and can run on any thread.
pub trait TokenDrafter: Send {
    fn name(&self) -> String;

    /// One tree per request, each of at most its budget nodes.
    fn draft(&mut self, requests: &[DraftRequest]) -> Result<Vec<DraftTree>, String>;

    /// Forget the sequence in `slot`.
    fn reset(&mut self, _slot: usize) {}
}

impl TokenDrafter for PromptLookupDrafter {
    fn name(&self) -> String {
        "prompt-lookup".into()
    }

    fn draft(&mut self, requests: &[DraftRequest]) -> Result<Vec<DraftTree>, String> {
        requests
            .iter()
            .map(|r| {
                self.propose(&r.context, r.budget)
                    .map_err(|e| e.to_string())
            })
            .collect()
    }
}

/// A language model drafting from ids: a [`TargetModel`] (any llama-family
/// graph: a smaller model, or the target's first layers) with its own KV
/// caches, drafting trees of `shape` level by level. Each level is one
/// batched pass over `[last token, tree so far]` with the tree mask, whose
/// rows are dropped again afterwards; the committed context stays cached
/// between rounds and only its new suffix is prefilled.
pub struct LmDrafter<R: Runtime> {
    model: TargetModel<R>,
    shape: TreeShape,
    name: String,
    /// Per slot: the tokens whose rows are in the cache.
    cached: Vec<Vec<u32>>,
}

impl<R: Runtime> LmDrafter<R> {
    pub fn new(model: TargetModel<R>, shape: TreeShape, name: &str) -> Self {
        let slots = model.caches.slots();
        LmDrafter {
            model,
            shape,
            name: name.to_string(),
            cached: vec![Vec::new(); slots],
        }
    }

    /// Brings each request's cache to `context[..len - 1]`: keeps the
    /// common prefix, prefills the rest in passes of at most `max_rows`.
    fn sync_caches(&mut self, requests: &[DraftRequest]) -> Result<(), EngineError> {
        let mut todo: Vec<(usize, usize, &[u32])> = Vec::new();
        for r in requests {
            let want = &r.context[..r.context.len() - 1];
            let have = &self.cached[r.slot];
            let common = have.iter().zip(want).take_while(|(a, b)| a == b).count();
            self.model.caches.truncate(r.slot, common);
            self.cached[r.slot] = want.to_vec();
            if common < want.len() {
                todo.push((r.slot, common, &r.context[common..want.len()]));
            }
        }
        while !todo.is_empty() {
            let mut step = Step::default();
            let mut ids = Vec::new();
            for (slot, start, rest) in todo.iter_mut() {
                let room = self.model.max_rows - ids.len();
                if room == 0 {
                    break;
                }
                let n = room.min(rest.len());
                step.seqs.push(SeqStep::chain(*slot, *start as u32, n));
                ids.extend_from_slice(&rest[..n]);
                *start += n;
                *rest = &rest[n..];
            }
            self.model.forward(&step, &ids)?;
            todo.retain(|t| !t.2.is_empty());
        }
        Ok(())
    }

    fn draft_trees(&mut self, requests: &[DraftRequest]) -> Result<Vec<DraftTree>, EngineError> {
        let capacity = self.model.caches.capacity();
        for r in requests {
            if r.context.is_empty() {
                return Err(EngineError::Invalid("an empty drafting context".into()));
            }
            if r.slot >= self.cached.len() {
                return Err(EngineError::Invalid(format!(
                    "slot {} but the draft model has {} slots",
                    r.slot,
                    self.cached.len()
                )));
            }
            if r.context.len() + r.budget > capacity {
                return Err(EngineError::Invalid(format!(
                    "context of {} tokens + {} draft tokens exceeds the draft model's capacity {capacity}",
                    r.context.len(),
                    r.budget
                )));
            }
        }
        self.sync_caches(requests)?;
        let mut builders: Vec<TreeBuilder> = requests
            .iter()
            .map(|r| TreeBuilder::new(&self.shape, r.budget))
            .collect();
        loop {
            let active: Vec<usize> = (0..requests.len())
                .filter(|&i| !builders[i].is_done())
                .collect();
            if active.is_empty() {
                break;
            }
            let mut step = Step::default();
            let mut ids = Vec::new();
            let mut rows_of = Vec::new();
            for &i in &active {
                let r = &requests[i];
                let work = builders[i].work();
                let committed = r.context.len() - 1;
                let base = ids.len();
                let mut positions = vec![committed as u32];
                positions.extend(work.positions(committed + 1));
                step.seqs.push(SeqStep {
                    slot: r.slot,
                    positions,
                    parents: Some(work.verify_parents()),
                    memory_tail: None,
                });
                ids.extend(work.verify_tokens(*r.context.last().unwrap_or(&0)));
                rows_of.push(
                    builders[i]
                        .pending()
                        .iter()
                        .map(|p| (base + p.map_or(0, |n| n + 1)) as u32)
                        .collect::<Vec<u32>>(),
                );
            }
            let out = self.model.forward(&step, &ids)?;
            for &i in &active {
                let r = &requests[i];
                self.model.caches.truncate(r.slot, r.context.len() - 1);
            }
            let logits = out.get("logits")?;
            let rows: Vec<u32> = rows_of.iter().flatten().copied().collect();
            let wants = active
                .iter()
                .map(|&i| builders[i].wants())
                .max()
                .unwrap_or(1);
            let picked = self.model.gather(logits, &rows)?;
            let mut cands = top_candidates(self.model.client(), &picked, wants)?.into_iter();
            for (&i, rows) in active.iter().zip(&rows_of) {
                let kids: Vec<Vec<Candidate>> = rows
                    .iter()
                    .map(|_| {
                        let mut c = cands.next().unwrap_or_default();
                        c.truncate(builders[i].wants());
                        c
                    })
                    .collect();
                builders[i]
                    .feed(kids)
                    .map_err(|e| EngineError::Invalid(e.to_string()))?;
            }
        }
        Ok(builders.into_iter().map(TreeBuilder::finish).collect())
    }
}

impl<R: Runtime> TokenDrafter for LmDrafter<R>
where
    TargetModel<R>: Send,
{
    fn name(&self) -> String {
        self.name.clone()
    }

    fn draft(&mut self, requests: &[DraftRequest]) -> Result<Vec<DraftTree>, String> {
        self.draft_trees(requests).map_err(|e| e.to_string())
    }

    fn reset(&mut self, slot: usize) {
        if slot < self.cached.len() {
            self.model.caches.reset(slot);
            self.cached[slot].clear();
        }
    }
}

/// What the worker thread is asked to do.
enum Job {
    Draft(Vec<DraftRequest>),
    Reset(usize),
}

/// A timed reply: the trees and the seconds the drafter spent on them.
struct Reply {
    trees: Result<Vec<DraftTree>, String>,
    seconds: f64,
}

/// A [`TokenDrafter`] on its own thread.
pub struct DraftWorker {
    name: String,
    jobs: Option<Sender<Job>>,
    replies: Receiver<Reply>,
    thread: Option<JoinHandle<()>>,
}

impl DraftWorker {
    /// Starts the thread and builds the drafter on it with `make` (so a
    /// drafter holding a device client is created where it runs).
    pub fn spawn<F>(make: F) -> Result<DraftWorker, String>
    where
        F: FnOnce() -> Result<Box<dyn TokenDrafter>, String> + Send + 'static,
    {
        let (job_tx, job_rx) = channel::<Job>();
        let (reply_tx, reply_rx) = channel::<Reply>();
        let (ready_tx, ready_rx) = channel::<Result<String, String>>();
        let thread = std::thread::Builder::new()
            .name("draftc-drafter".into())
            .spawn(move || {
                let mut drafter = match make() {
                    Ok(d) => {
                        let _ = ready_tx.send(Ok(d.name()));
                        d
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for job in job_rx {
                    match job {
                        Job::Draft(requests) => {
                            let t = Instant::now();
                            let trees = drafter.draft(&requests);
                            let seconds = t.elapsed().as_secs_f64();
                            if reply_tx.send(Reply { trees, seconds }).is_err() {
                                return;
                            }
                        }
                        Job::Reset(slot) => drafter.reset(slot),
                    }
                }
            })
            .map_err(|e| format!("cannot start the drafter thread: {e}"))?;
        let name = match ready_rx.recv() {
            Ok(Ok(name)) => name,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("the drafter thread stopped while starting".into()),
        };
        Ok(DraftWorker {
            name,
            jobs: Some(job_tx),
            replies: reply_rx,
            thread: Some(thread),
        })
    }

    fn send(&self, job: Job) -> Result<(), EngineError> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| EngineError::Invalid("the drafter thread has stopped".into()))
    }

    fn receive(&self) -> Result<Reply, EngineError> {
        self.replies
            .recv()
            .map_err(|_| EngineError::Invalid("the drafter thread has stopped".into()))
    }
}

impl Drop for DraftWorker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The subtree of `tree` reached by following `tokens` from the root
/// (`tokens` empty: the whole tree), re-rooted; `None` if the path leaves
/// the tree.
pub fn reroot(tree: &DraftTree, tokens: &[u32]) -> Option<DraftTree> {
    let mut at: Option<usize> = None;
    for &t in tokens {
        at = Some(
            tree.children(at)
                .into_iter()
                .find(|&c| tree.node(c).token == t)?,
        );
    }
    let mut out = DraftTree::new();
    let mut map: Vec<Option<usize>> = vec![None; tree.len()];
    for (i, n) in tree.nodes().iter().enumerate() {
        let parent = if n.parent == at {
            Some(None)
        } else {
            n.parent.and_then(|p| map[p]).map(Some)
        };
        if let Some(parent) = parent {
            map[i] = out.push(parent, n.token, n.logprob).ok();
        }
    }
    Some(out)
}

/// The tokens of `tree`'s most probable root-to-leaf path (ties: the deeper).
pub fn best_path(tree: &DraftTree) -> Vec<u32> {
    tree.leaves()
        .into_iter()
        .max_by(|&a, &b| {
            let (na, nb) = (tree.node(a), tree.node(b));
            (na.cum_logprob, na.depth)
                .partial_cmp(&(nb.cum_logprob, nb.depth))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .map(|n| tree.path_tokens(n))
        .unwrap_or_default()
}

/// Requests and the trees the worker returned for them.
type Answered = (Vec<DraftRequest>, Vec<DraftTree>);

/// Draft-length policy of a [`ConcurrentDrafter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetPolicy {
    /// Always the engine's budget.
    Fixed,
    /// Paper 003's hardware-aware budget, at most the engine's.
    HardwareAware,
}

/// Drafts round `r + 1` on a [`DraftWorker`] while the target verifies
/// round `r` (see the module docs).
pub struct ConcurrentDrafter {
    worker: DraftWorker,
    policy: BudgetPolicy,
    controller: Option<BudgetController>,
    /// Requests sent and not yet answered.
    in_flight: Option<Vec<DraftRequest>>,
    /// Draft length of the requests in flight.
    k: usize,
    /// The engine's budget (the largest draft length).
    max: usize,
    /// Rounds whose draft was re-rooted onto the committed tokens, and
    /// rounds that had to discard it.
    pub reused: usize,
    pub discarded: usize,
    /// Draft lengths chosen, one per round.
    pub budgets: Vec<usize>,
}

impl ConcurrentDrafter {
    pub fn new(worker: DraftWorker, policy: BudgetPolicy) -> Self {
        ConcurrentDrafter {
            worker,
            policy,
            controller: None,
            in_flight: None,
            k: 0,
            max: 1,
            reused: 0,
            discarded: 0,
            budgets: Vec::new(),
        }
    }

    /// The draft length for the next requests, at most `budget`.
    fn choose(&mut self, budget: usize) -> usize {
        let budget = budget.max(1);
        let k = match self.policy {
            BudgetPolicy::Fixed => budget,
            BudgetPolicy::HardwareAware => {
                let c = self.controller.get_or_insert_with(|| {
                    BudgetController::new(BudgetConfig {
                        max: budget,
                        initial: budget.div_ceil(2),
                        smoothing: 0.3,
                        schedule: Schedule::Concurrent,
                    })
                    .unwrap_or_else(|_| unreachable!("budget >= 1 and smoothing in (0, 1]"))
                });
                c.choose().min(budget)
            }
        };
        self.k = k;
        self.budgets.push(k);
        k
    }

    /// Waits for the trees in flight.
    fn collect(&mut self) -> Result<Option<Answered>, EngineError> {
        let Some(requests) = self.in_flight.take() else {
            return Ok(None);
        };
        let reply = self.worker.receive()?;
        let trees = reply.trees.map_err(EngineError::Invalid)?;
        if let Some(c) = &mut self.controller {
            let levels = trees.iter().map(DraftTree::levels).max().unwrap_or(0);
            c.observe_draft(levels.max(1), reply.seconds);
        }
        if trees.len() != requests.len() {
            return Err(EngineError::Invalid(format!(
                "the drafter returned {} trees for {} requests",
                trees.len(),
                requests.len()
            )));
        }
        Ok(Some((requests, trees)))
    }
}

impl<R: Runtime> Drafter<R> for ConcurrentDrafter {
    fn name(&self) -> String {
        format!("{} (concurrent)", self.worker.name)
    }

    fn length(&self) -> usize {
        self.k
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (seqs, budget) = (call.seqs, call.budget);
        self.max = budget.max(1);
        let answered = match self.collect()? {
            Some(a) => a,
            None => {
                // First round: nothing was drafted ahead; draft now.
                let k = self.choose(budget);
                let requests: Vec<DraftRequest> = seqs
                    .iter()
                    .map(|s| DraftRequest {
                        slot: s.slot,
                        context: s.tokens.to_vec(),
                        budget: k,
                    })
                    .collect();
                self.worker.send(Job::Draft(requests.clone()))?;
                self.in_flight = Some(requests);
                self.collect()?.unwrap_or_default()
            }
        };
        let (requests, trees) = answered;
        Ok(seqs
            .iter()
            .map(|s| {
                let found = requests.iter().zip(&trees).find_map(|(r, t)| {
                    let rest = s.tokens.strip_prefix(r.context.as_slice())?;
                    (r.slot == s.slot).then(|| reroot(t, rest)).flatten()
                });
                match found {
                    Some(t) => {
                        self.reused += 1;
                        t
                    }
                    None => {
                        self.discarded += 1;
                        DraftTree::new()
                    }
                }
            })
            .collect())
    }

    fn verifying(&mut self, seqs: &[SeqView<'_>], trees: &[DraftTree]) -> Result<(), EngineError> {
        let k = self.choose(self.max);
        let requests: Vec<DraftRequest> = seqs
            .iter()
            .zip(trees)
            .map(|(s, t)| {
                let mut context = s.tokens.to_vec();
                context.extend(best_path(t));
                // One more than `k`: the first level guesses the bonus
                // token of the round being verified.
                DraftRequest {
                    slot: s.slot,
                    context,
                    budget: k + 1,
                }
            })
            .collect();
        self.worker.send(Job::Draft(requests.clone()))?;
        self.in_flight = Some(requests);
        Ok(())
    }

    fn verified(&mut self, seconds: f64, draft_tokens: usize, rounds: &[(usize, usize)]) {
        if let Some(c) = &mut self.controller {
            c.observe_verify(draft_tokens, seconds);
            for &(drafted, accepted) in rounds {
                c.observe_round(drafted, accepted);
            }
        }
    }

    fn finished(&mut self) -> Result<(), EngineError> {
        // Drain the reply nobody will use, so the next run starts clean;
        // a draft error there no longer matters.
        let _ = self.collect();
        Ok(())
    }

    fn reset(&mut self, slot: usize) {
        let _ = self.worker.send(Job::Reset(slot));
    }
}

/// Runs a [`TokenDrafter`] on the engine's own thread (sequential drafting).
pub struct SyncTokenDrafter(pub Box<dyn TokenDrafter>);

impl<R: Runtime> Drafter<R> for SyncTokenDrafter {
    fn name(&self) -> String {
        self.0.name()
    }

    fn length(&self) -> usize {
        0
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (seqs, budget) = (call.seqs, call.budget);
        let requests: Vec<DraftRequest> = seqs
            .iter()
            .map(|s| DraftRequest {
                slot: s.slot,
                context: s.tokens.to_vec(),
                budget,
            })
            .collect();
        self.0.draft(&requests).map_err(EngineError::Invalid)
    }

    fn reset(&mut self, slot: usize) {
        self.0.reset(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0:a ─ 1:b ─ 3:d
    ///     └ 2:c
    /// 4:e
    fn tree() -> DraftTree {
        let mut t = DraftTree::new();
        let a = t.push(None, 10, -0.1).unwrap();
        let b = t.push(Some(a), 11, -0.2).unwrap();
        t.push(Some(a), 12, -0.3).unwrap();
        t.push(Some(b), 13, -0.2).unwrap();
        t.push(None, 14, -2.0).unwrap();
        t
    }

    #[test]
    fn reroot_follows_the_committed_tokens() {
        let t = tree();
        assert_eq!(reroot(&t, &[]).unwrap(), t);
        let under_a = reroot(&t, &[10]).unwrap();
        assert_eq!(under_a.tokens(), vec![11, 12, 13]);
        assert_eq!(under_a.node(0).parent, None);
        assert_eq!(under_a.node(1).parent, None);
        assert_eq!(under_a.node(2).parent, Some(0));
        assert_eq!(under_a.node(2).depth, 1);
        assert_eq!(reroot(&t, &[10, 11]).unwrap().tokens(), vec![13]);
        assert!(reroot(&t, &[10, 11, 13]).unwrap().is_empty());
        assert!(reroot(&t, &[14, 1]).is_none());
        assert!(reroot(&t, &[99]).is_none());
    }

    #[test]
    fn best_path_is_the_most_probable_leaf() {
        assert_eq!(best_path(&tree()), vec![10, 12]);
        assert_eq!(best_path(&DraftTree::new()), Vec::<u32>::new());
        let chain = DraftTree::chain(&[1, 2, 3], &[0.0; 3]).unwrap();
        assert_eq!(best_path(&chain), vec![1, 2, 3]);
    }
}

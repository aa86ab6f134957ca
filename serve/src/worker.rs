//! The engine thread: it owns the device, loads the target and drafter,
//! warms up, then runs [`Engine`] rounds while anything is queued or
//! running. Handlers reach it through a bounded channel of [`Job`]s; each
//! job carries the sender its tokens go back on. A job whose receiver is
//! gone (the client disconnected, or its stop string was met) is cancelled
//! before the next round, so its slot is free within one round.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use cubecl::prelude::*;
use draftc_runtime::cli::drafter::{make_drafter, DrafterChoice};
use draftc_runtime::cli::generate::{speculate_policy, DEFAULT_BUDGET};
use draftc_runtime::device::{Backend, OnClient};
use draftc_runtime::engine::{
    DraftPolicy, Drafter, Engine, EngineConfig, Finish, Sampling, SeqParams, TargetModel,
};
use draftc_runtime::model::tokenizer::ChatMessage;
use draftc_runtime::model::ConvertedModel;
use draftc_runtime::speculation::{PlanMode, Planner, PlannerConfig};
use tokio::sync::mpsc::UnboundedSender;

use crate::args::ServeArgs;
use crate::state::{Health, Shared};

/// What the engine sends back for a job.
#[derive(Debug)]
pub enum Ev {
    Tokens(Vec<u32>),
    Done(Finish),
    /// The engine failed the request (500).
    Failed(String),
}

/// One request for the engine.
pub struct Job {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: SeqParams,
    pub events: UnboundedSender<Ev>,
}

/// Runs the engine thread's whole life on `args.backend`'s device.
pub fn run(args: ServeArgs, model: Arc<ConvertedModel>, shared: Arc<Shared>, jobs: Receiver<Job>) {
    let backend = match Backend::parse(&args.backend) {
        Ok(b) => b,
        Err(e) => return shared.fail(e),
    };
    let r = backend.run(Worker {
        args: &args,
        model: &model,
        shared: &shared,
        jobs,
    });
    if let Err(e) = r {
        shared.fail(e);
    }
}

struct Worker<'a> {
    args: &'a ServeArgs,
    model: &'a ConvertedModel,
    shared: &'a Arc<Shared>,
    jobs: Receiver<Job>,
}

impl OnClient for Worker<'_> {
    type Output = ();
    fn on<R: Runtime>(self, client: &ComputeClient<R>) -> Result<(), String> {
        let engine = load(client, self.args, self.model)?;
        serve_loop(engine, self.shared, &self.jobs);
        Ok(())
    }
}

/// The target, the drafter and the policy, warmed up.
fn load<R: Runtime>(
    client: &ComputeClient<R>,
    args: &ServeArgs,
    model: &ConvertedModel,
) -> Result<Engine<R>, String> {
    let dtype = draftc_runtime::device::resolve_dtype(&args.dtype, client)?;
    // One slot more than --max-running for the prefix cache.
    let mut target = TargetModel::load(
        client,
        model,
        args.max_running + usize::from(!args.no_prefix_cache),
        args.max_model_len + 1,
        dtype,
    )
    .map_err(|e| e.to_string())?;
    let (mut drafter, mut policy): (Option<Box<dyn Drafter<R>>>, DraftPolicy) = if args.no_spec {
        (None, DraftPolicy::Fixed(0))
    } else {
        let mut choice = DrafterChoice::plain(
            &args.drafter,
            &args.drafter_weights,
            args.budget.unwrap_or(DEFAULT_BUDGET),
            args.tree.as_deref(),
        )?;
        if args.tree.is_none() && args.budget.is_none() {
            let class = draftc_runtime::device::profile(client).class;
            if let Some(t) = draftc_runtime::cli::tuned::tuned_for(&choice, class)? {
                eprintln!(
                    "{}: settings tuned for {}: {}",
                    args.drafter,
                    t.class,
                    t.flags()
                );
                t.apply(&mut choice);
            }
        }
        let mut policy = speculate_policy(&args.speculate, choice.budget, false)?;
        let key = draftc_runtime::cli::calibrate::cost_key(
            &draftc_runtime::bench::device_name(client),
            model,
            dtype.name(),
            &choice,
        );
        if let DraftPolicy::Planned(p) = &mut policy {
            if let Some(c) = draftc_runtime::cli::calibrate::load_costs(&key) {
                p.seed_costs(&c);
            }
        }
        let d = make_drafter(client, &choice, model, &target, dtype)?.drafter;
        (Some(d), policy)
    };
    let cfg = EngineConfig {
        prefill_chunk: args.prefill_chunk,
        prefix_cache: !args.no_prefix_cache,
    };
    if !args.no_warmup {
        let t0 = std::time::Instant::now();
        // Without the prefix cache: its copies would skip the prompt shapes
        // that real traffic compiles.
        let plain = EngineConfig {
            prefix_cache: false,
            ..cfg
        };
        let (t, d, p) = warm(target, drafter, policy, model, args, plain)?;
        (target, drafter, policy) = (t, d, p);
        eprintln!("warmed up in {:.1} s", t0.elapsed().as_secs_f64());
    }
    Ok(Engine::new(target, drafter, policy, cfg))
}

/// Runs the engine over a chat request at batch sizes 1, 2, 4, … up to
/// `--max-running`, before serving: every kernel shape those batches meet
/// compiles now (on lavapipe a new shape costs a fraction of a second
/// inside a request otherwise), and a planner takes the round costs
/// measured on the way (its cycle of draft budgets, as `draftc generate`'s
/// warm-up), so it plans from the first request.
type Parts<R> = (TargetModel<R>, Option<Box<dyn Drafter<R>>>, DraftPolicy);

fn warm<R: Runtime>(
    target: TargetModel<R>,
    drafter: Option<Box<dyn Drafter<R>>>,
    mut policy: DraftPolicy,
    model: &ConvertedModel,
    args: &ServeArgs,
    cfg: EngineConfig,
) -> Result<Parts<R>, String> {
    eprintln!("warming up …");
    // A chat request like the ones served (not an evaluation question).
    let prompt = model
        .tokenizer
        .encode_chat(&[ChatMessage::new(
            "user",
            "Give me three tips for staying focused while studying, with a short reason for each.",
        )])
        .or_else(|_| {
            model
                .tokenizer
                .encode("The quick brown fox jumps over the lazy dog.")
        })
        .map_err(|e| e.to_string())?;
    let tokens = 24.min(args.max_model_len.saturating_sub(1) / 2).max(1);
    let prompt: Vec<u32> = prompt
        .into_iter()
        .take(args.max_model_len.saturating_sub(tokens).max(1))
        .collect();
    let max = policy.max_budget();
    let warm_policy = match &policy {
        DraftPolicy::Planned(_) => {
            let cfg = PlannerConfig {
                mode: PlanMode::Cycle,
                ..PlannerConfig::auto(max.max(1))
            };
            DraftPolicy::Planned(Box::new(Planner::new(cfg).map_err(|e| e.to_string())?))
        }
        DraftPolicy::Fixed(k) => DraftPolicy::Fixed(*k),
    };
    let mut engine = Engine::new(target, drafter, warm_policy, cfg);
    let mut batch = 1;
    let mut id = 0u64;
    loop {
        let b = batch.min(args.max_running);
        for _ in 0..b {
            id += 1;
            let params = SeqParams {
                max_tokens: tokens,
                sampling: Sampling::GREEDY,
                stop_ids: Vec::new(),
            };
            engine
                .add(id, prompt.clone(), params)
                .map_err(|e| format!("warm-up: {e}"))?;
        }
        while engine.running() > 0 {
            engine.step().map_err(|e| format!("warm-up: {e}"))?;
        }
        if b == args.max_running {
            break;
        }
        batch *= 2;
    }
    let (target, drafter, warmed) = engine.into_parts();
    if let (DraftPolicy::Planned(p), DraftPolicy::Planned(w)) = (&mut policy, &warmed) {
        p.adopt_costs(w);
    }
    Ok((target, drafter, policy))
}

/// Takes jobs and runs rounds until the job channel closes.
fn serve_loop<R: Runtime>(mut engine: Engine<R>, shared: &Shared, jobs: &Receiver<Job>) {
    let g = &shared.gauges;
    g.kv_slots
        .store(engine.free_slots() as u64, Ordering::Relaxed);
    shared.set_health(Health::Ready);
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut live: HashMap<u64, UnboundedSender<Ev>> = HashMap::new();
    loop {
        if engine.running() == 0 && queue.is_empty() {
            match jobs.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => queue.push_back(job),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            queue.push_back(job);
        }
        // Clients that went away: queued ones leave the queue, running ones
        // the batch (their slots are free for this round).
        let before = queue.len();
        queue.retain(|j| !j.events.is_closed());
        shared.dequeued(before - queue.len());
        live.retain(|&id, tx| {
            let gone = tx.is_closed();
            if gone {
                engine.cancel(id);
            }
            !gone
        });
        while engine.free_slots() > 0 {
            let Some(job) = queue.pop_front() else { break };
            shared.dequeued(1);
            match engine.add(job.id, job.prompt, job.params) {
                Ok(()) => {
                    live.insert(job.id, job.events);
                }
                Err(e) => {
                    let _ = job.events.send(Ev::Failed(e.to_string()));
                }
            }
        }
        match engine.step() {
            Ok(emitted) => {
                for e in emitted {
                    let Some(tx) = live.get(&e.id) else { continue };
                    let mut ok = tx.send(Ev::Tokens(e.tokens)).is_ok();
                    if let Some(f) = e.finish {
                        ok &= tx.send(Ev::Done(f)).is_ok();
                        live.remove(&e.id);
                    }
                    if !ok {
                        engine.cancel(e.id);
                        live.remove(&e.id);
                    }
                }
            }
            Err(err) => {
                // The caches may be dirty: every running request fails
                // (500) and the engine starts over empty.
                let msg = format!("engine error: {err}");
                for (_, tx) in live.drain() {
                    let _ = tx.send(Ev::Failed(msg.clone()));
                }
                engine.cancel_all();
                shared.fail(msg);
            }
        }
        let s = engine.stats();
        g.running.store(engine.running() as u64, Ordering::Relaxed);
        g.kv_slots_used
            .store(engine.running() as u64, Ordering::Relaxed);
        g.kv_rows.store(engine.kv_rows() as u64, Ordering::Relaxed);
        g.rounds.store(s.rounds as u64, Ordering::Relaxed);
        g.no_draft_rounds
            .store(s.no_draft_rounds as u64, Ordering::Relaxed);
        g.draft_proposed.store(s.drafted as u64, Ordering::Relaxed);
        g.draft_accepted.store(s.accepted as u64, Ordering::Relaxed);
        g.prefix_rows.store(s.prefix_rows as u64, Ordering::Relaxed);
        let (replayed, recorded, graphs) = engine.replay_counts();
        g.passes_replayed.store(replayed, Ordering::Relaxed);
        g.passes_recorded.store(recorded, Ordering::Relaxed);
        g.graphs_captured.store(graphs, Ordering::Relaxed);
    }
}

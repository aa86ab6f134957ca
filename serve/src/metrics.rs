//! The server's counters and histograms, rendered as Prometheus text
//! (`GET /metrics`, every name prefixed `draftc_`). The engine thread
//! publishes its gauges and draft counters into [`EngineGauges`]; the
//! handlers record requests, latencies and tokens into [`Metrics`].

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Latency buckets in seconds (le).
const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
];

/// A Prometheus histogram with fixed buckets.
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn latency() -> Histogram {
        Histogram {
            bounds: LATENCY_BOUNDS,
            counts: vec![0; LATENCY_BOUNDS.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if x <= *b {
                *c += 1;
            }
        }
        self.sum += x;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// What the handlers record.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Finished requests by HTTP status.
    pub requests: BTreeMap<u16, u64>,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Requests whose client went away before the end.
    pub cancelled: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: BTreeMap::new(),
            ttft: Histogram::latency(),
            itl: Histogram::latency(),
            e2e: Histogram::latency(),
            prompt_tokens: 0,
            generated_tokens: 0,
            cancelled: 0,
        }
    }
}

/// What the engine thread publishes after every round.
#[derive(Debug, Default)]
pub struct EngineGauges {
    pub queued: AtomicU64,
    pub running: AtomicU64,
    pub kv_slots_used: AtomicU64,
    pub kv_slots: AtomicU64,
    pub kv_rows: AtomicU64,
    pub rounds: AtomicU64,
    pub no_draft_rounds: AtomicU64,
    pub draft_proposed: AtomicU64,
    pub draft_accepted: AtomicU64,
    pub prefix_rows: AtomicU64,
    pub passes_replayed: AtomicU64,
    pub passes_recorded: AtomicU64,
    pub graphs_captured: AtomicU64,
}

impl EngineGauges {
    pub fn get(x: &AtomicU64) -> u64 {
        x.load(Ordering::Relaxed)
    }
}

/// The Prometheus text of both.
pub fn render(m: &Metrics, g: &EngineGauges) -> String {
    let mut out = String::new();
    let get = EngineGauges::get;
    let _ = writeln!(
        out,
        "# HELP draftc_requests_total Finished HTTP requests by status code.\n# TYPE draftc_requests_total counter"
    );
    if m.requests.is_empty() {
        let _ = writeln!(out, "draftc_requests_total{{status=\"200\"}} 0");
    }
    for (status, n) in &m.requests {
        let _ = writeln!(out, "draftc_requests_total{{status=\"{status}\"}} {n}");
    }
    let counters = [
        (
            "draftc_requests_cancelled_total",
            "Requests whose client disconnected before the end.",
            m.cancelled,
        ),
        (
            "draftc_prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            m.prompt_tokens,
        ),
        (
            "draftc_generation_tokens_total",
            "Completion tokens sent.",
            m.generated_tokens,
        ),
        (
            "draftc_rounds_total",
            "Engine rounds (target passes).",
            get(&g.rounds),
        ),
        (
            "draftc_rounds_without_draft_total",
            "Rounds with decoding sequences and no draft.",
            get(&g.no_draft_rounds),
        ),
        (
            "draftc_draft_tokens_proposed_total",
            "Draft tokens verified.",
            get(&g.draft_proposed),
        ),
        (
            "draftc_draft_tokens_accepted_total",
            "Draft tokens accepted.",
            get(&g.draft_accepted),
        ),
        (
            "draftc_prefix_rows_reused_total",
            "Prompt rows copied from the prefix cache instead of computed.",
            get(&g.prefix_rows),
        ),
        (
            "draftc_passes_replayed_total",
            "Target passes reissued from a recording instead of launched op by op.",
            get(&g.passes_replayed),
        ),
        (
            "draftc_passes_recorded_total",
            "Target passes run eagerly inside a capture window (recorded for replay).",
            get(&g.passes_recorded),
        ),
        (
            "draftc_graphs_captured_total",
            "Recordings captured as CUDA graphs.",
            get(&g.graphs_captured),
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
    let gauges = [
        (
            "draftc_queue_depth",
            "Requests waiting for a slot.",
            get(&g.queued),
        ),
        (
            "draftc_running_sequences",
            "Sequences in the running batch.",
            get(&g.running),
        ),
        (
            "draftc_kv_slots_used",
            "KV cache slots held by running sequences.",
            get(&g.kv_slots_used),
        ),
        (
            "draftc_kv_slots",
            "KV cache slots in all.",
            get(&g.kv_slots),
        ),
        (
            "draftc_kv_rows_used",
            "KV cache rows held by running sequences.",
            get(&g.kv_rows),
        ),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    m.ttft.render(
        &mut out,
        "draftc_time_to_first_token_seconds",
        "Time from request to its first token.",
    );
    m.itl.render(
        &mut out,
        "draftc_inter_token_latency_seconds",
        "Time between a request's tokens (a round's tokens share its wait).",
    );
    m.e2e.render(
        &mut out,
        "draftc_e2e_request_latency_seconds",
        "Time from request to its last token.",
    );
    out
}

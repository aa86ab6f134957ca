//! What the handlers and the engine thread share: health, the queue
//! counter that admission control reads, the metrics, and the model facts a
//! handler needs to tokenize and check a request.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use draftc_runtime::model::ConvertedModel;

use crate::metrics::{EngineGauges, Metrics};

/// The server's state as `/health` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Loading the model and warming up: 503.
    Loading = 0,
    /// Accepting work: 200.
    Ready = 1,
    /// SIGTERM: finishing running requests, refusing new ones: 503.
    Draining = 2,
    /// The engine failed (device or load error): 503 with the error.
    Failed = 3,
}

/// Handler-side settings.
#[derive(Clone, Debug)]
pub struct Limits {
    pub served_model_name: String,
    pub max_queued: usize,
    /// Prompt plus completion tokens at most.
    pub max_model_len: usize,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
}

pub struct Shared {
    health: AtomicU8,
    failure: Mutex<Option<String>>,
    pub limits: Limits,
    pub model: Arc<ConvertedModel>,
    pub metrics: Mutex<Metrics>,
    pub gauges: EngineGauges,
    /// Requests whose handler is still running (drain waits for them).
    pub in_flight: AtomicU64,
    next_id: AtomicU64,
    /// Seconds since the epoch at start-up (`created` of /v1/models).
    pub started: u64,
}

impl Shared {
    pub fn new(limits: Limits, model: Arc<ConvertedModel>) -> Shared {
        Shared {
            health: AtomicU8::new(Health::Loading as u8),
            failure: Mutex::new(None),
            limits,
            model,
            metrics: Mutex::new(Metrics::default()),
            gauges: EngineGauges::default(),
            in_flight: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            started: now_s(),
        }
    }

    pub fn health(&self) -> Health {
        match self.health.load(Ordering::SeqCst) {
            0 => Health::Loading,
            1 => Health::Ready,
            2 => Health::Draining,
            _ => Health::Failed,
        }
    }

    pub fn set_health(&self, h: Health) {
        // A failed server stays failed; draining is not undone by the
        // engine becoming ready.
        let _ = self
            .health
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                let keep = cur == Health::Failed as u8
                    || (cur == Health::Draining as u8 && h == Health::Ready);
                (!keep).then_some(h as u8)
            });
    }

    /// The engine cannot serve (load failed, or it died).
    pub fn fail(&self, msg: String) {
        eprintln!("error: {msg}");
        if let Ok(mut f) = self.failure.lock() {
            *f = Some(msg);
        }
        self.health.store(Health::Failed as u8, Ordering::SeqCst);
    }

    /// A round failed: its requests got 500; `/health` reports it.
    pub fn record_engine_error(&self, msg: String) {
        self.fail(msg);
    }

    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// Takes a queue place, unless `max_queued` are waiting.
    pub fn enqueue(&self) -> bool {
        let max = self.limits.max_queued as u64;
        self.gauges
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q < max).then_some(q + 1)
            })
            .is_ok()
    }

    /// `n` queued requests left the queue (admitted or gone).
    pub fn dequeued(&self, n: usize) {
        if n > 0 {
            let _ = self
                .gauges
                .queued
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                    Some(q.saturating_sub(n as u64))
                });
        }
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn record_status(&self, status: u16) {
        if let Ok(mut m) = self.metrics.lock() {
            *m.requests.entry(status).or_insert(0) += 1;
        }
    }
}

pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

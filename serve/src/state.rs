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

    /// The engine cannot serve (load failed, it died, or a round failed and
    /// its requests got 500): `/health` reports it.
    pub fn fail(&self, msg: String) {
        eprintln!("error: {msg}");
        if let Ok(mut f) = self.failure.lock() {
            *f = Some(msg);
        }
        self.health.store(Health::Failed as u8, Ordering::SeqCst);
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

/// `secs` since the epoch as RFC 3339 UTC (`2026-11-28T14:24:22Z`).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_795_875_862), "2026-11-28T14:24:22Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}

//! A bounded load with faults: 64 requests at concurrency 16 on the tiny
//! model, greedy and seeded-sampled, streamed and not; one in ten hangs up
//! mid-stream and one in twenty is malformed. Every other request gets the
//! text it gets alone, and afterwards the queue and the batch are empty and
//! `/health` says 200.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};
use support::*;

const N: usize = 64;
const CONCURRENCY: usize = 16;
const PROMPTS: [&str; 4] = ["Once upon a time", "ab ab ab ab", "The sea", "1 2 3 4"];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Malformed,
    HangUp,
    Normal,
}

fn kind(i: usize) -> Kind {
    if i % 20 == 7 {
        Kind::Malformed
    } else if i % 10 == 3 {
        Kind::HangUp
    } else {
        Kind::Normal
    }
}

fn body(i: usize, stream: bool) -> Value {
    let mut b = json!({
        "model": MODEL,
        "prompt": PROMPTS[i % PROMPTS.len()],
        "max_tokens": 12,
        "stream": stream,
    });
    if i.is_multiple_of(2) {
        b["temperature"] = json!(0);
    } else {
        b["temperature"] = json!(0.8);
        b["seed"] = json!(i);
    }
    b
}

fn text(s: &Server, b: &Value) -> String {
    if b["stream"] == json!(true) {
        let (code, ev) = s.stream("/v1/completions", b);
        assert_eq!(code, 200);
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
        ev.iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
            .collect()
    } else {
        let (code, r) = s.post("/v1/completions", b);
        assert_eq!(code, 200, "{r}");
        r["choices"][0]["text"].as_str().unwrap().to_string()
    }
}

fn hang_up(s: &Server, i: usize) {
    let mut b = body(i, true);
    b["max_tokens"] = json!(60);
    b["ignore_eos"] = json!(true);
    drop(s.raw_stream_started("/v1/completions", &b));
}

#[test]
fn sixty_four_requests_with_hang_ups_and_garbage_all_end_well() {
    let s = Server::start(&[
        "--drafter",
        "prompt-lookup",
        "--max-running",
        "8",
        "--max-queued",
        "64",
    ]);
    // Each normal request alone first: its reference text.
    let want: Vec<Option<String>> = (0..N)
        .map(|i| (kind(i) == Kind::Normal).then(|| text(&s, &body(i, false))))
        .collect();
    let next = AtomicUsize::new(0);
    let failures: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                let (s, next, want) = (&s, &next, &want);
                sc.spawn(move || {
                    let mut bad = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= N {
                            return bad;
                        }
                        match kind(i) {
                            Kind::Malformed => {
                                let (c, r) = s.post_raw("/v1/completions", b"{\"model\": [", &[]);
                                if c != 400 || !r["error"]["message"].is_string() {
                                    bad.push(format!("{i}: malformed got {c} {r}"));
                                }
                            }
                            Kind::HangUp => hang_up(s, i),
                            Kind::Normal => {
                                let got = text(s, &body(i, i % 3 == 0));
                                if Some(&got) != want[i].as_ref() {
                                    bad.push(format!("{i}: {got:?} != {:?}", want[i]));
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{failures:#?}");
    s.until("the queue and the batch empty", |s| {
        s.metric("draftc_running_sequences") == 0.0
            && s.metric("draftc_queue_depth") == 0.0
            && s.metric("draftc_kv_slots_used") == 0.0
    });
    assert_eq!(s.get("/health").0, 200);
    let hung = (0..N).filter(|&i| kind(i) == Kind::HangUp).count() as f64;
    assert!(s.metric("draftc_requests_cancelled_total") >= hung - 1.0);
}

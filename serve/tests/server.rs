//! `draftc-serve` over loopback on the tiny random model: the OpenAI
//! surface (chat, completions, streaming, usage, models, loads, metrics),
//! each error class, losslessness under concurrency (every greedy request
//! equals the same prompt decoded alone), cancellation, overload, SIGTERM's
//! drain, and a bounded load with faults.

mod support;

use std::io::Read;
use std::net::TcpStream;

use serde_json::{json, Value};
use support::*;

fn chat_body(content: &str, max: usize) -> Value {
    json!({
        "model": MODEL,
        // A short system turn: the tiny byte-level vocabulary makes the
        // default one most of the tiny model's context.
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "max_tokens": max,
        "temperature": 0,
    })
}

const PROMPTS: [&str; 8] = [
    "Hello there",
    "What is the capital of France?",
    "ab ab ab ab ab",
    "Write a poem about the sea",
    "x",
    "Tell me a story about a dragon and a knight",
    "1 2 3 4 5 6",
    "Why is the sky blue?",
];

#[test]
fn chat_and_completions_answer_in_openais_shape_with_exact_usage() {
    let s = Server::start(&["--no-spec"]);
    let (code, r) = s.post("/v1/chat/completions", &chat_body(PROMPTS[0], 10));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["model"], MODEL);
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let c = &r["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    assert_eq!(
        c["message"]["content"],
        solo_text(Some(PROMPTS[0]), None, 10)
    );
    assert!(matches!(
        c["finish_reason"].as_str(),
        Some("stop" | "length")
    ));
    let u = &r["usage"];
    let (p, n) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 5 && (1..=10).contains(&n), "{u}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + n);
    // Completions: a raw prompt, `max_tokens` reached exactly.
    let body = json!({"model": MODEL, "prompt": "Once upon", "max_tokens": 7, "temperature": 0, "ignore_eos": true});
    let (code, r) = s.post("/v1/completions", &body);
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 7);
    // Token ids as the prompt.
    let body = json!({"model": MODEL, "prompt": [5, 17, 3], "max_tokens": 3, "temperature": 0});
    assert_eq!(s.post("/v1/completions", &body).0, 200);
    // Models, loads, health, metrics.
    let (code, m) = s.get("/v1/models");
    assert_eq!(code, 200);
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["owned_by"], "draftc");
    let (code, l) = s.get("/v1/loads");
    assert_eq!(code, 200);
    let l: Value = serde_json::from_str(&l).unwrap();
    assert_eq!(l["loads"][0]["num_running_reqs"], 0);
    assert!(l["loads"][0]["token_usage"].is_number());
    assert!(l["timestamp"].is_string());
    assert_eq!(s.metric("draftc_requests_total"), 3.0);
    assert!(s.metric("draftc_generation_tokens_total") >= 10.0);
    assert_eq!(s.metric("draftc_time_to_first_token_seconds_count"), 3.0);
}

#[test]
fn streamed_text_equals_non_streamed_text() {
    let s = Server::start(&["--drafter", "prompt-lookup"]);
    for (path, chat) in [("/v1/chat/completions", true), ("/v1/completions", false)] {
        let mut body = if chat {
            chat_body(PROMPTS[3], 24)
        } else {
            json!({"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 24, "temperature": 0})
        };
        let (_, whole) = s.post(path, &body);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (code, events) = s.stream(path, &body);
        assert_eq!(code, 200);
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{events:?}"
        );
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let id = &chunks[0]["id"];
        assert!(chunks.iter().all(|c| &c["id"] == id), "the id changed");
        let text: String = chunks
            .iter()
            .filter_map(|c| {
                let ch = c["choices"].get(0)?;
                if chat {
                    ch["delta"]["content"].as_str().map(str::to_string)
                } else {
                    ch["text"].as_str().map(str::to_string)
                }
            })
            .collect();
        let want = if chat {
            whole["choices"][0]["message"]["content"].as_str().unwrap()
        } else {
            whole["choices"][0]["text"].as_str().unwrap()
        };
        assert_eq!(text, want, "{path}");
        if chat {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        }
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], whole["usage"], "{path}");
        let last = &chunks[chunks.len() - 2]["choices"][0];
        assert_eq!(last["finish_reason"], whole["choices"][0]["finish_reason"]);
    }
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let s = Server::start(&["--no-spec"]);
    let want = solo_text(None, Some("Once upon"), 30);
    // A stop string from the middle of the greedy text.
    let chars: Vec<char> = want.chars().collect();
    assert!(chars.len() >= 8, "too short to cut: {want:?}");
    let stop: String = chars[4..7].iter().collect();
    let cut = &want[..want.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = json!({"model": MODEL, "prompt": "Once upon", "max_tokens": 30,
            "temperature": 0, "stop": [stop.clone(), "\u{1F600}never"], "stream": stream});
        let text = if stream {
            let (_, ev) = s.stream("/v1/completions", &body);
            ev.iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok())
                .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
                .collect::<String>()
        } else {
            let (_, r) = s.post("/v1/completions", &body);
            assert_eq!(r["choices"][0]["finish_reason"], "stop");
            r["choices"][0]["text"].as_str().unwrap().to_string()
        };
        assert_eq!(text, cut, "stream {stream}");
    }
    s.until("the stopped sequences leave", |s| {
        s.metric("draftc_running_sequences") == 0.0
    });
}

/// Eight requests at once, each equal to its prompt decoded alone.
fn eight_concurrent(args: &[&str]) {
    let s = Server::start(&[&["--max-running", "8"], args].concat());
    let want: Vec<String> = PROMPTS
        .iter()
        .map(|p| solo_text(Some(p), None, 16))
        .collect();
    // One request first, so the prefix cache holds the system turn whatever
    // order the eight arrive in (all eight could join before any prompt is
    // prefilled, and then none finds it).
    assert_eq!(s.post("/v1/chat/completions", &chat_body("warm", 2)).0, 200);
    let got: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    let (code, r) = s.post("/v1/chat/completions", &chat_body(p, 16));
                    assert_eq!(code, 200, "{r}");
                    r["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want, "{args:?}");
    // The engine's target passes went through replay's capture window
    // (and, once a batch's shape repeated, were replayed), losslessly.
    let (recorded, replayed) = (
        s.metric("draftc_passes_recorded_total"),
        s.metric("draftc_passes_replayed_total"),
    );
    eprintln!("{args:?}: {recorded} passes recorded, {replayed} replayed");
    assert!(recorded > 0.0, "{args:?}");
    if args.contains(&"--no-spec") {
        // The shared system turn came from the prefix cache.
        assert!(s.metric("draftc_prefix_rows_reused_total") > 0.0);
    }
}

#[test]
fn eight_concurrent_greedy_requests_equal_their_solo_output_without_a_drafter() {
    eight_concurrent(&["--no-spec"]);
}

#[test]
fn eight_concurrent_greedy_requests_equal_their_solo_output_with_drafters() {
    eight_concurrent(&[
        "--drafter",
        "prompt-lookup",
        "--speculate",
        "fixed",
        "--budget",
        "4",
    ]);
    eight_concurrent(&[
        "--drafter",
        "models/beagle.draft",
        "--drafter-weights",
        "random:3",
        "--budget",
        "3",
    ]);
}

#[test]
fn every_error_class_gets_its_status_and_openais_shape() {
    let s = Server::start(&["--no-spec", "--max-body-bytes", "20000"]);
    let err = |code: u16, r: &Value, param: Option<&str>| {
        let e = &r["error"];
        assert!(e["message"].is_string(), "{r}");
        assert!(e["type"].is_string(), "{r}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{r}");
        }
        code
    };
    let path = "/v1/chat/completions";
    let (c, r) = s.post_raw(path, b"{\"model\": ", &[]);
    assert_eq!(err(c, &r, None), 400);
    let (c, r) = s.post_raw(
        path,
        b"{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",
        &[],
    );
    assert_eq!(err(c, &r, None), 400);
    let mut bad = chat_body("hi", 4);
    bad["temperature"] = json!("hot");
    let (c, r) = s.post(path, &bad);
    assert_eq!(err(c, &r, Some("temperature")), 400);
    for (k, v) in [
        ("n", json!(2)),
        ("logit_bias", json!({"5": 10})),
        ("tools", json!([{"type": "function"}])),
        ("presence_penalty", json!(0.5)),
        ("frobnicate", json!(true)),
    ] {
        let mut b = chat_body("hi", 4);
        b[k] = v;
        let (c, r) = s.post(path, &b);
        assert_eq!(err(c, &r, Some(k)), 400, "{k}");
    }
    let mut b = chat_body("hi", 4);
    b["presence_penalty"] = json!(0);
    b["user"] = json!("someone");
    assert_eq!(s.post(path, &b).0, 200, "zero penalties change nothing");
    let mut b = chat_body("hi", 4);
    b["model"] = json!("gpt-4");
    let (c, r) = s.post(path, &b);
    assert_eq!(err(c, &r, Some("model")), 404);
    let long = "word ".repeat(200);
    let (c, r) = s.post(path, &chat_body(&long, 4));
    assert_eq!(err(c, &r, None), 400);
    assert_eq!(r["error"]["code"], "context_length_exceeded");
    let (c, r) = s.post(path, &chat_body("hi", 500));
    assert_eq!(err(c, &r, None), 400);
    let huge = chat_body(&"x".repeat(30_000), 4);
    let (c, r) = s.post(path, &huge);
    assert_eq!(err(c, &r, None), 413);
    let (c, _) = s.get("/v1/nothing");
    assert_eq!(c, 404);
    // Every refusal is OpenAI-shaped, a wrong method included.
    let (c, body) = s.get("/v1/chat/completions");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err(c, &r, None), 405);
    let (c, body) = s.get("/v1/nothing");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err(c, &r, None), 404);
    // Nothing above reached the engine.
    assert_eq!(s.metric("draftc_running_sequences"), 0.0);
    assert_eq!(s.get("/health").0, 200);
}

#[test]
fn an_api_key_is_required_when_set() {
    let s = Server::start(&["--no-spec", "--api-key", "sesame"]);
    let path = "/v1/chat/completions";
    let body = chat_body("hi", 2).to_string();
    let (c, r) = s.post_raw(path, body.as_bytes(), &[]);
    assert_eq!(c, 401, "{r}");
    assert_eq!(r["error"]["type"], "authentication_error");
    let (c, _) = s.post_raw(path, body.as_bytes(), &[("Authorization", "Bearer sesamf")]);
    assert_eq!(c, 401);
    let (c, _) = s.post_raw(path, body.as_bytes(), &[("Authorization", "Bearer sesame")]);
    assert_eq!(c, 200);
    assert_eq!(s.get("/v1/models").0, 401);
    assert_eq!(s.get("/health").0, 200, "health needs no key");
}

/// Starts a streamed request and reads until its first content chunk.
fn start_stream(s: &Server, max: usize) -> TcpStream {
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": max,
        "temperature": 0, "ignore_eos": true, "stream": true});
    let (c, started) = s.raw_stream_started("/v1/completions", &body);
    assert!(started, "the stream ended early");
    c
}

#[test]
fn a_client_that_disconnects_is_cancelled_and_its_slot_freed() {
    let s = Server::start(&["--drafter", "prompt-lookup"]);
    let c = start_stream(&s, 100);
    assert_eq!(s.metric("draftc_running_sequences"), 1.0);
    drop(c);
    s.until("the slot is freed", |s| {
        s.metric("draftc_running_sequences") == 0.0 && s.metric("draftc_kv_slots_used") == 0.0
    });
    assert!(s.metric("draftc_generation_tokens_total") < 100.0);
    assert_eq!(s.metric("draftc_requests_cancelled_total"), 1.0);
    // Still serving.
    assert_eq!(s.post("/v1/chat/completions", &chat_body("hi", 3)).0, 200);
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let s = Server::start(&["--no-spec", "--max-running", "1", "--max-queued", "1"]);
    let running = start_stream(&s, 100);
    s.until("one running", |s| {
        s.metric("draftc_running_sequences") == 1.0
    });
    let queued = start_stream_nowait(&s);
    s.until("one queued", |s| s.metric("draftc_queue_depth") == 1.0);
    let r = agent()
        .post(&s.url("/v1/chat/completions"))
        .send_json(chat_body("hi", 2));
    match r {
        Err(ureq::Error::Status(429, resp)) => {
            assert_eq!(resp.header("Retry-After"), Some("1"));
            let v: Value = resp.into_json().unwrap();
            assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        }
        other => panic!("expected 429, got {:?}", other.map(|r| r.status())),
    }
    drop(running);
    drop(queued);
    s.until("empty again", |s| {
        s.metric("draftc_running_sequences") == 0.0 && s.metric("draftc_queue_depth") == 0.0
    });
}

/// A streamed request that is sent and not read.
fn start_stream_nowait(s: &Server) -> TcpStream {
    let body = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 50, "stream": true});
    s.raw_post("/v1/completions", &body)
}

#[test]
fn sigterm_drains_running_requests_then_exits_0() {
    let mut s = Server::start(&["--drafter", "prompt-lookup", "--drain-timeout", "60"]);
    let mut c = start_stream(&s, 60);
    s.signal(libc::SIGTERM);
    s.until("health turns 503", |s| s.get("/health").0 == 503);
    let (code, r) = s.post("/v1/chat/completions", &chat_body("hi", 2));
    assert_eq!(code, 503, "{r}");
    // The running request still finishes.
    let mut rest = String::new();
    let _ = c.read_to_string(&mut rest);
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let status = s.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", s.log());
    // A clean stop says so and reports no error (the engine's job channel
    // closing after the drain is not a failure). The log's reader sees
    // the pipe close right after the exit.
    let t = std::time::Instant::now();
    while !s.log().contains("draftc serve: stopped") && t.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = s.log();
    assert!(log.contains("draftc serve: stopped"), "{log}");
    assert!(
        !log.contains("error:"),
        "a clean stop printed an error:\n{log}"
    );
}

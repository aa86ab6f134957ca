//! The HTTP surface: `/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/v1/loads`, `/health` and `/metrics`. Handlers parse and
//! check a request, take a queue place (429 beyond `--max-queued`), hand
//! the job to the engine thread and turn its tokens into an OpenAI
//! response or an event stream.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use draftc_runtime::engine::Finish;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::metrics::{render, EngineGauges};
use crate::request::{parse, Parsed};
use crate::state::{now_s, Health, Shared};
use crate::text::{FinishReason, TextOut};
use crate::worker::{Ev, Job};

#[derive(Clone)]
pub struct App {
    pub shared: Arc<Shared>,
    pub jobs: SyncSender<Job>,
}

pub fn router(app: App) -> Router {
    let limit = app.shared.limits.max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/loads", get(loads))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found_route() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

/// Counts a request's handler (and its stream) as in flight.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: &Arc<Shared>) -> InFlight {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn authorize(headers: &HeaderMap, shared: &Shared) -> Result<(), ApiError> {
    let Some(key) = &shared.limits.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Constant time over the bytes (the length is not secret).
    if bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

fn accepting(shared: &Shared) -> Result<(), ApiError> {
    match shared.health() {
        Health::Ready => Ok(()),
        Health::Loading => Err(ApiError::unavailable("the model is still loading")),
        Health::Draining => Err(ApiError::unavailable("the server is shutting down")),
        Health::Failed => Err(ApiError::unavailable(format!(
            "the engine failed: {}",
            shared.failure().unwrap_or_default()
        ))),
    }
}

async fn health(State(app): State<App>) -> Response {
    let s = &app.shared;
    let (code, body) = match s.health() {
        Health::Ready => (StatusCode::OK, json!({"status": "ok"})),
        Health::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading"}),
        ),
        Health::Draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining"}),
        ),
        Health::Failed => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "error", "error": s.failure()}),
        ),
    };
    (code, Json(body)).into_response()
}

/// The served model as `/v1/models` lists it.
fn model_card(shared: &Shared) -> Value {
    let l = &shared.limits;
    json!({
        "id": l.served_model_name,
        "object": "model",
        "created": shared.started,
        "owned_by": "draftc",
        "root": l.served_model_name,
        "max_model_len": l.max_model_len,
    })
}

async fn models(State(app): State<App>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&headers, &app.shared) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [model_card(&app.shared)]})).into_response()
}

/// `GET /v1/models/{id}` (the OpenAI client's `models.retrieve`).
async fn model(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(e) = authorize(&headers, &app.shared) {
        return e.into_response();
    }
    let served = &app.shared.limits.served_model_name;
    if &id != served {
        return ApiError::model_not_found(&id, served).into_response();
    }
    Json(model_card(&app.shared)).into_response()
}

/// The load report the SGLang Model Gateway's load-aware policies read.
async fn loads(State(app): State<App>) -> Response {
    let g = &app.shared.gauges;
    let get = EngineGauges::get;
    let running = get(&g.running);
    let queued = get(&g.queued);
    let slots = get(&g.kv_slots).max(1);
    let rows = get(&g.kv_rows);
    let capacity = slots * app.shared.limits.max_model_len as u64;
    Json(json!({
        "timestamp": crate::state::rfc3339(now_s()),
        "dp_rank_count": 1,
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": queued,
            "num_total_reqs": running + queued,
            "num_used_tokens": rows,
            "max_total_num_tokens": capacity,
            "token_usage": rows as f64 / capacity.max(1) as f64,
            "max_running_requests": slots,
        }]
    }))
    .into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    let text = match app.shared.metrics.lock() {
        Ok(m) => render(&m, &app.shared.gauges),
        Err(_) => String::new(),
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn chat(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(app, headers, body, true).await
}

async fn completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(app, headers, body, false).await
}

async fn complete(
    app: App,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Response {
    let guard = InFlight::new(&app.shared);
    match start(&app, &headers, body, chat) {
        Ok((parsed, rx)) => {
            if parsed.stream {
                stream(app, parsed, rx, chat, guard)
            } else {
                collect(app, parsed, rx, chat).await
            }
        }
        Err(e) => {
            app.shared.record_status(e.status.as_u16());
            e.into_response()
        }
    }
}

/// Checks, parses and queues a request.
fn start(
    app: &App,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    chat: bool,
) -> Result<(Parsed, UnboundedReceiver<Ev>), ApiError> {
    let shared = &app.shared;
    authorize(headers, shared)?;
    accepting(shared)?;
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(shared.limits.max_body_bytes)
        } else {
            ApiError::invalid("", format!("the body could not be read: {r}"))
        }
    })?;
    let parsed = parse(&body, chat, shared)?;
    if !shared.enqueue() {
        return Err(ApiError::overloaded());
    }
    let (tx, rx) = unbounded_channel();
    let job = Job {
        id: shared.next_id(),
        prompt: parsed.prompt.clone(),
        params: parsed.params.clone(),
        events: tx,
    };
    match app.jobs.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            shared.dequeued(1);
            return Err(ApiError::overloaded());
        }
        Err(TrySendError::Disconnected(_)) => {
            shared.dequeued(1);
            return Err(ApiError::unavailable("the engine has stopped"));
        }
    }
    if let Ok(mut m) = shared.metrics.lock() {
        m.prompt_tokens += parsed.prompt.len() as u64;
    }
    Ok((parsed, rx))
}

fn finish_reason(f: Finish) -> FinishReason {
    match f {
        Finish::Stop => FinishReason::Stop,
        Finish::Length => FinishReason::Length,
    }
}

/// Latencies of one request, recorded as its tokens arrive.
struct Clock {
    start: Instant,
    last: Option<Instant>,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            start: Instant::now(),
            last: None,
        }
    }

    fn tokens(&mut self, shared: &Shared, n: usize) {
        let now = Instant::now();
        if let Ok(mut m) = shared.metrics.lock() {
            match self.last {
                None => m.ttft.observe((now - self.start).as_secs_f64()),
                Some(l) if n > 0 => {
                    let gap = (now - l).as_secs_f64() / n as f64;
                    for _ in 0..n {
                        m.itl.observe(gap);
                    }
                }
                Some(_) => {}
            }
        }
        self.last = Some(now);
    }

    fn done(&self, shared: &Shared, tokens: usize, status: u16) {
        if let Ok(mut m) = shared.metrics.lock() {
            m.e2e.observe(self.start.elapsed().as_secs_f64());
            m.generated_tokens += tokens as u64;
            *m.requests.entry(status).or_insert(0) += 1;
        }
    }
}

/// What a stream of engine events became.
enum Outcome {
    Done,
    Failed(String),
}

/// A non-streamed response: every token, then one JSON body.
async fn collect(app: App, p: Parsed, mut rx: UnboundedReceiver<Ev>, chat: bool) -> Response {
    let shared = &app.shared;
    let tok = &shared.model.tokenizer;
    let mut out = TextOut::new(p.stops.clone(), p.params.stop_ids.clone());
    let mut clock = Clock::new();
    let outcome = loop {
        match rx.recv().await {
            Some(Ev::Tokens(t)) => {
                clock.tokens(shared, t.len());
                for id in t {
                    out.push(tok, id);
                }
                if out.finish.is_some() {
                    break Outcome::Done;
                }
            }
            Some(Ev::Done(f)) => {
                out.end(finish_reason(f));
                break Outcome::Done;
            }
            Some(Ev::Failed(m)) => break Outcome::Failed(m),
            None => break Outcome::Failed("the engine stopped".into()),
        }
    };
    // Dropping the receiver ends the sequence in the engine (a stop string
    // ends it before its token budget).
    drop(rx);
    if let Outcome::Failed(m) = outcome {
        clock.done(shared, out.tokens, 500);
        return ApiError::internal(m).into_response();
    }
    clock.done(shared, out.tokens, 200);
    let reason = out.finish.unwrap_or(FinishReason::Length).as_str();
    let usage = json!({
        "prompt_tokens": p.prompt.len(),
        "completion_tokens": out.tokens,
        "total_tokens": p.prompt.len() + out.tokens,
    });
    let id = format!(
        "{}-{:x}",
        if chat { "chatcmpl" } else { "cmpl" },
        shared.next_id()
    );
    let body = if chat {
        json!({
            "id": id,
            "object": "chat.completion",
            "created": now_s(),
            "model": p.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": out.text()},
                "logprobs": null,
                "finish_reason": reason,
            }],
            "usage": usage,
        })
    } else {
        json!({
            "id": id,
            "object": "text_completion",
            "created": now_s(),
            "model": p.model,
            "choices": [{
                "index": 0,
                "text": out.text(),
                "logprobs": null,
                "finish_reason": reason,
            }],
            "usage": usage,
        })
    };
    Json(body).into_response()
}

/// One chunk of a stream.
struct Chunks {
    id: String,
    created: u64,
    model: String,
    chat: bool,
    include_usage: bool,
}

impl Chunks {
    fn chunk(&self, content: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        let mut v = if self.chat {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(c) = content {
                delta.insert("content".into(), json!(c));
            }
            json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            })
        } else {
            json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": content.unwrap_or(""), "logprobs": null, "finish_reason": finish}],
            })
        };
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn usage(&self, prompt: usize, completion: usize) -> Value {
        json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        })
    }
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A streamed response: `text/event-stream` chunks written by a task that
/// follows the engine's events; a client that goes away ends the task,
/// which drops the engine's receiver, which cancels the sequence.
fn stream(
    app: App,
    p: Parsed,
    mut rx: UnboundedReceiver<Ev>,
    chat: bool,
    guard: InFlight,
) -> Response {
    let (btx, brx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    let shared = app.shared.clone();
    let chunks = Chunks {
        id: format!(
            "{}-{:x}",
            if chat { "chatcmpl" } else { "cmpl" },
            shared.next_id()
        ),
        created: now_s(),
        model: p.model.clone(),
        chat,
        include_usage: p.include_usage,
    };
    tokio::spawn(async move {
        let _guard = guard;
        let tok = &shared.model.tokenizer;
        let mut out = TextOut::new(p.stops.clone(), p.params.stop_ids.clone());
        let mut clock = Clock::new();
        if chat
            && btx
                .send(Ok(event(&chunks.chunk(Some(""), true, None))))
                .await
                .is_err()
        {
            return cancelled(&shared, &clock, &out);
        }
        let outcome = loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = btx.closed() => return cancelled(&shared, &clock, &out),
            };
            let piece = match ev {
                Some(Ev::Tokens(t)) => {
                    clock.tokens(&shared, t.len());
                    let mut s = String::new();
                    for id in t {
                        s.push_str(&out.push(tok, id));
                    }
                    s
                }
                Some(Ev::Done(f)) => out.end(finish_reason(f)),
                Some(Ev::Failed(m)) => break Outcome::Failed(m),
                None => break Outcome::Failed("the engine stopped".into()),
            };
            if !piece.is_empty()
                && btx
                    .send(Ok(event(&chunks.chunk(Some(&piece), false, None))))
                    .await
                    .is_err()
            {
                return cancelled(&shared, &clock, &out);
            }
            if out.finish.is_some() {
                break Outcome::Done;
            }
        };
        drop(rx);
        if let Outcome::Failed(m) = outcome {
            clock.done(&shared, out.tokens, 500);
            let _ = btx.send(Ok(event(&ApiError::internal(m).body()))).await;
            return;
        }
        let reason = out.finish.unwrap_or(FinishReason::Length).as_str();
        let mut tail = vec![event(&chunks.chunk(None, false, Some(reason)))];
        if chunks.include_usage {
            tail.push(event(&chunks.usage(p.prompt.len(), out.tokens)));
        }
        tail.push(Bytes::from_static(b"data: [DONE]\n\n"));
        for b in tail {
            if btx.send(Ok(b)).await.is_err() {
                return cancelled(&shared, &clock, &out);
            }
        }
        clock.done(&shared, out.tokens, 200);
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(ReceiverStream::new(brx)))
        .unwrap_or_else(|_| ApiError::internal("response").into_response())
}

/// The client went away mid-stream.
fn cancelled(shared: &Shared, clock: &Clock, out: &TextOut) {
    if let Ok(mut m) = shared.metrics.lock() {
        m.cancelled += 1;
    }
    // nginx's "client closed request".
    clock.done(shared, out.tokens, 499);
}

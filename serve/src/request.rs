//! Parsing and checking an OpenAI request body into what the engine runs:
//! the prompt's token ids (chat template for `messages`), the sampling
//! settings, the token budget and the stop strings. Every wrong type or
//! value is a 400 naming its field; a field that would change the output
//! and is not supported is a 400 too, never silently ignored.

use draftc_ops::sampling::MAX_CANDIDATES;
use draftc_runtime::engine::{check_request, Sampling, SeqParams};
use draftc_runtime::model::tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::state::Shared;

/// A checked request.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub model: String,
    pub prompt: Vec<u32>,
    pub params: SeqParams,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Fields accepted and not used (they change nothing in the output).
const HARMLESS: &[&str] = &["user", "metadata", "store", "service_tier"];

/// Parses `/v1/chat/completions` (`chat`) or `/v1/completions` bodies.
pub fn parse(body: &[u8], chat: bool, shared: &Shared) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::invalid("", "the body must be a JSON object"));
    };
    let prompt_field = if chat { "messages" } else { "prompt" };
    for (k, val) in &o {
        check_field(k, val, chat)?;
    }
    let model = match o.get("model") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
        None => return Err(ApiError::invalid("model", "`model` is required")),
    };
    let served = &shared.limits.served_model_name;
    if &model != served {
        return Err(ApiError::model_not_found(&model, served));
    }
    let tok = &shared.model.tokenizer;
    let prompt = if chat {
        let messages = messages(o.get("messages"))?;
        if tok.chat_template().is_none() {
            return Err(ApiError::invalid(
                "messages",
                "this model has no chat template; use /v1/completions with a `prompt`",
            ));
        }
        tok.encode_chat(&messages)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?
    } else {
        prompt_ids(o.get("prompt"), shared)?
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(prompt_field, "the prompt has no tokens"));
    }
    let max_len = shared.limits.max_model_len;
    if prompt.len() >= max_len {
        return Err(ApiError::context_length(format!(
            "the prompt has {} tokens; this server's context is {max_len} tokens",
            prompt.len()
        )));
    }
    let max_tokens = match (uint(&o, "max_completion_tokens")?, uint(&o, "max_tokens")?) {
        (Some(n), _) | (None, Some(n)) => n,
        // OpenAI's defaults: the rest of the context for chat, 16 for
        // completions.
        (None, None) if chat => max_len - prompt.len(),
        (None, None) => 16.min(max_len - prompt.len()),
    };
    if max_tokens == 0 {
        return Err(ApiError::invalid(
            "max_tokens",
            "`max_tokens` must be at least 1",
        ));
    }
    if prompt.len().saturating_add(max_tokens) > max_len {
        return Err(ApiError::context_length(format!(
            "the prompt ({} tokens) and max_tokens ({max_tokens}) exceed this server's context of \
             {max_len} tokens",
            prompt.len()
        )));
    }
    let temperature = number(&o, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            "`temperature` must be between 0 and 2",
        ));
    }
    let top_p = number(&o, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
    }
    let top_k = match o.get("top_k") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64() {
            Some(-1 | 0) => 0,
            Some(k) if (1..=MAX_CANDIDATES as i64).contains(&k) => k as usize,
            _ => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!(
                        "`top_k` must be an integer from 1 to {} (or -1 / 0 for none)",
                        MAX_CANDIDATES
                    ),
                ))
            }
        },
    };
    let seed = match o.get("seed") {
        None | Some(Value::Null) => fresh_seed(shared),
        Some(v) => v
            .as_i64()
            .map(|s| s as u64)
            .or_else(|| v.as_u64())
            .ok_or_else(|| ApiError::invalid("seed", "`seed` must be an integer"))?,
    };
    let stops = stop_strings(o.get("stop"))?;
    let stream = boolean(&o, "stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => {
            if let Some(k) = so.keys().find(|k| *k != "include_usage") {
                return Err(ApiError::unsupported(
                    "stream_options",
                    format!("`stream_options.{k}` is not supported"),
                ));
            }
            match so.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "stream_options",
                        "`stream_options.include_usage` must be a boolean",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    if include_usage && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    let ignore_eos = boolean(&o, "ignore_eos")?.unwrap_or(false);
    let eos = &shared.model.config.eos_token_id;
    let params = SeqParams {
        max_tokens,
        sampling: Sampling {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            seed,
        },
        stop_ids: if ignore_eos { Vec::new() } else { eos.clone() },
    };
    check_request(&prompt, &params, shared.model.config.vocab_size, max_len)
        .map_err(|e| ApiError::invalid(prompt_field, e.to_string()))?;
    Ok(Parsed {
        model,
        prompt,
        params,
        stops,
        stream,
        include_usage,
    })
}

/// A seed for a request that gave none: distinct per request.
fn fresh_seed(shared: &Shared) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = t ^ shared.next_id().wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

/// Rejects fields that are not supported and would change the output.
fn check_field(k: &str, v: &Value, chat: bool) -> Result<(), ApiError> {
    let null_or = |ok: bool| v.is_null() || ok;
    let fine = match k {
        "model" | "max_tokens" | "temperature" | "top_p" | "seed" | "stop" | "stream"
        | "stream_options" | "top_k" | "ignore_eos" => true,
        "messages" => chat,
        "max_completion_tokens" => chat,
        "prompt" => !chat,
        "n" | "best_of" => null_or(v.as_i64() == Some(1)),
        "presence_penalty" | "frequency_penalty" => null_or(v.as_f64() == Some(0.0)),
        "repetition_penalty" => null_or(v.as_f64() == Some(1.0)),
        "min_tokens" => null_or(v.as_i64() == Some(0)),
        "logit_bias" => null_or(v.as_object().is_some_and(Map::is_empty)),
        "logprobs" => null_or(v.as_bool() == Some(false)),
        "top_logprobs" => v.is_null(),
        "echo" => null_or(v.as_bool() == Some(false)),
        "suffix" => v.is_null(),
        "tools" | "functions" => null_or(v.as_array().is_some_and(Vec::is_empty)),
        "tool_choice" | "function_call" => null_or(v.as_str() == Some("none")),
        "parallel_tool_calls" => true,
        "response_format" => null_or(v.get("type").and_then(Value::as_str) == Some("text")),
        k if HARMLESS.contains(&k) => true,
        _ => {
            return Err(ApiError::unsupported(
                k,
                format!("`{k}` is not supported by this server"),
            ))
        }
    };
    if fine {
        Ok(())
    } else if matches!(k, "n" | "best_of") {
        Err(ApiError::unsupported(
            k,
            format!("`{k}` must be 1: this server returns one choice per request"),
        ))
    } else {
        Err(ApiError::unsupported(
            k,
            format!("`{k}` = {v} is not supported by this server (it would change the output)"),
        ))
    }
}

fn uint(o: &Map<String, Value>, k: &str) -> Result<Option<usize>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n.min(usize::MAX as u64) as usize))
            .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a non-negative integer"))),
    }
}

fn number(o: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a number"))),
    }
}

fn boolean(o: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(k, format!("`{k}` must be a boolean"))),
    }
}

fn stop_strings(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "stop",
            "`stop` must be a string or an array of up to 4 strings",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
            .collect(),
        Some(_) => Err(bad()),
    }
}

fn messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(items)) = v else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must be a non-empty array of {role, content}",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(&at, format!("`{at}` must be an object")));
        };
        for k in m.keys() {
            if !matches!(k.as_str(), "role" | "content" | "name") {
                return Err(ApiError::unsupported(
                    &format!("{at}.{k}"),
                    format!("`{at}.{k}` is not supported by this server"),
                ));
            }
        }
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("system" | "developer" | "user" | "assistant")) => {
                if r == "developer" {
                    "system"
                } else {
                    r
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    &format!("{at}.role"),
                    format!("`{at}.role` must be system, user or assistant"),
                ))
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => s.push_str(t),
                        _ => {
                            return Err(ApiError::unsupported(
                                &format!("{at}.content"),
                                "only text content parts are supported",
                            ))
                        }
                    }
                }
                s
            }
            _ => {
                return Err(ApiError::invalid(
                    &format!("{at}.content"),
                    format!("`{at}.content` must be a string"),
                ))
            }
        };
        out.push(ChatMessage::new(role, &content));
    }
    Ok(out)
}

/// A completion's prompt: a string, or token ids (one prompt per request).
fn prompt_ids(v: Option<&Value>, shared: &Shared) -> Result<Vec<u32>, ApiError> {
    let tok = &shared.model.tokenizer;
    let text = |s: &str| {
        tok.encode(s)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))
    };
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&t| t <= u32::MAX as u64)
                    .map(|t| t as u32)
                    .ok_or_else(|| ApiError::invalid("prompt", "token ids must be integers"))
            })
            .collect()
    };
    let one = || ApiError::unsupported("prompt", "one prompt per request");
    match v {
        Some(Value::String(s)) => text(s),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) && !a.is_empty() => ids(a),
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => text(s),
            Value::Array(inner) => ids(inner),
            _ => Err(ApiError::invalid(
                "prompt",
                "`prompt` must be a string or token ids",
            )),
        },
        Some(Value::Array(a)) if a.len() > 1 => Err(one()),
        _ => Err(ApiError::invalid(
            "prompt",
            "`prompt` must be a string or an array of token ids",
        )),
    }
}

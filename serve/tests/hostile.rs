//! No input panics the server: request bodies of random bytes and random
//! mutations of valid requests are parsed into a request or a 400-class
//! error naming what is wrong (property tests over `request::parse`), and
//! garbage on the socket leaves a running server healthy.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use draftc_runtime::model::ConvertedModel;
use draftc_serve::request::parse;
use draftc_serve::state::{Limits, Shared};
use proptest::prelude::*;
use serde_json::{json, Value};
use support::*;

fn shared() -> &'static Shared {
    static S: OnceLock<Shared> = OnceLock::new();
    S.get_or_init(|| {
        let model = Arc::new(ConvertedModel::open(model_dir()).unwrap());
        let limits = Limits {
            served_model_name: MODEL.into(),
            max_queued: 4,
            max_model_len: 120,
            api_key: None,
            max_body_bytes: 1 << 20,
        };
        Shared::new(limits, model)
    })
}

/// A valid request of either endpoint.
fn valid(chat: bool) -> Value {
    if chat {
        json!({"model": MODEL, "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": "hi there"}], "max_tokens": 5, "temperature": 0.5,
            "top_p": 0.9, "top_k": 4, "seed": 3, "stop": ["x", "y"], "stream": true,
            "stream_options": {"include_usage": true}, "n": 1, "user": "u"})
    } else {
        json!({"model": MODEL, "prompt": "hello", "max_tokens": 5, "stop": "z", "ignore_eos": true})
    }
}

/// Values of every JSON kind, awkward ones included.
fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|x| json!(x)),
        any::<u64>().prop_map(|x| json!(x)),
        any::<f64>()
            .prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
        proptest::collection::vec(".{0,6}".prop_map(Value::String), 0..6).prop_map(Value::Array),
        Just(json!([{"role": "user"}])),
        Just(json!([{"type": "image_url"}])),
        Just(json!({"include_usage": "yes"})),
        Just(json!([1, -1, 4294967296u64])),
    ]
}

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
    "ignore_eos",
    "logit_bias",
    "tools",
    "presence_penalty",
    "logprobs",
    "best_of",
    "echo",
    "whatever",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), chat in any::<bool>()) {
        if let Err(e) = parse(&bytes, chat, shared()) {
            prop_assert!(e.status.is_client_error(), "{e:?}");
        }
    }

    #[test]
    fn mutated_requests_parse_or_name_their_problem(
        chat in any::<bool>(),
        edits in proptest::collection::vec((0..FIELDS.len(), any_value(), any::<bool>()), 1..4),
    ) {
        let mut v = valid(chat);
        for (f, val, remove) in edits {
            let o = v.as_object_mut().unwrap();
            if remove {
                o.remove(FIELDS[f]);
            } else {
                o.insert(FIELDS[f].to_string(), val);
            }
        }
        match parse(v.to_string().as_bytes(), chat, shared()) {
            Ok(p) => {
                prop_assert!(!p.prompt.is_empty());
                prop_assert!(p.prompt.len() + p.params.max_tokens <= 120);
            }
            Err(e) => {
                prop_assert!(e.status.is_client_error(), "{e:?}");
                prop_assert!(!e.message.is_empty());
            }
        }
    }
}

#[test]
fn valid_requests_parse() {
    for chat in [true, false] {
        let p = parse(valid(chat).to_string().as_bytes(), chat, shared()).unwrap();
        assert_eq!(p.params.max_tokens, 5);
    }
}

#[test]
fn garbage_on_the_socket_leaves_the_server_healthy() {
    let s = Server::start(&["--no-spec"]);
    let addr = s.base.trim_start_matches("http://").to_string();
    let junk: [&[u8]; 5] = [
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"mo",
        b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ];
    for j in junk {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = c.write_all(j);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
    }
    assert_eq!(s.get("/health").0, 200);
    let (code, _) = s.post(
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(code, 200);
}

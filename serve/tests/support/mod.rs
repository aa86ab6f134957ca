//! Test support for the server tests: the tiny random Llama (written as a
//! GGUF by the runtime's test support and converted, so nothing is
//! downloaded), a `draftc-serve` child process on a free loopback port, a
//! blocking HTTP client, and the reference a greedy request must equal:
//! autoregressive decoding of the same prompt alone.
#![allow(dead_code)]

#[path = "../../../runtime/tests/model_support/mod.rs"]
mod model_support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use draftc_codegen::PlanDType;
use draftc_runtime::engine::{generate, Request, Sampling, TargetModel};
use draftc_runtime::model::convert::{convert_gguf, ConvertOptions};
use draftc_runtime::model::safetensors_io::WeightDtype;
use draftc_runtime::model::tokenizer::ChatMessage;
use draftc_runtime::model::ConvertedModel;
use serde_json::Value;

/// The served model's name in every test.
pub const MODEL: &str = "tiny";

/// The system turn of the tests' chat requests.
pub const SYSTEM: &str = "Be brief.";

/// The converted tiny model, made once per test binary.
pub fn model_dir() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let gguf = tmp.path().join("tiny.gguf");
        std::fs::write(&gguf, model_support::tiny_llama().build()).unwrap();
        let out = tmp.path().join("model");
        let opts = ConvertOptions {
            dtype: WeightDtype::F32,
            progress: false,
        };
        convert_gguf(&gguf, &out, &opts).unwrap();
        (tmp, out)
    })
    .1
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A running `draftc-serve`; killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the server on the tiny model with `args` and waits until
    /// `/health` says 200.
    pub fn start(args: &[&str]) -> Server {
        let s = Server::spawn(args);
        s.wait_ready();
        s
    }

    /// Starts it without waiting for the model.
    pub fn spawn(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_draftc-serve"))
            .current_dir(repo())
            .args(["--model", model_dir().to_str().unwrap()])
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(["--served-model-name", MODEL, "--max-model-len", "120"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(at) = line.find("http://") {
                        let addr: String = line[at..]
                            .chars()
                            .take_while(|c| !c.is_whitespace())
                            .collect();
                        let _ = tx.send(addr);
                        sent = true;
                    }
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("the server did not start: {}", log.lock().unwrap()));
        Server { child, base, log }
    }

    pub fn wait_ready(&self) {
        let t0 = Instant::now();
        loop {
            if self.get("/health").0 == 200 {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "not ready: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        respond(agent().get(&self.url(path)).call())
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().as_bytes(), &[])
    }

    pub fn post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> (u16, Value) {
        let mut r = agent()
            .post(&self.url(path))
            .set("Content-Type", "application/json");
        for (k, v) in headers {
            r = r.set(k, v);
        }
        let (code, text) = respond(r.send_bytes(body));
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A streamed request: every `data:` payload, in order.
    pub fn stream(&self, path: &str, body: &Value) -> (u16, Vec<String>) {
        match agent().post(&self.url(path)).send_json(body.clone()) {
            Ok(r) => {
                let code = r.status();
                let mut text = String::new();
                r.into_reader().read_to_string(&mut text).unwrap();
                (code, sse_data(&text))
            }
            Err(ureq::Error::Status(code, r)) => (code, vec![r.into_string().unwrap_or_default()]),
            Err(e) => panic!("{e}"),
        }
    }

    /// A metric's value from `/metrics` (first sample of `name`).
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    /// Waits until `cond` holds (bounded).
    pub fn until(&self, what: &str, cond: impl Fn(&Server) -> bool) {
        let t0 = Instant::now();
        while !cond(self) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{what}: timed out\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `body` to `path` on a raw connection (a client that may hang
    /// up or never read) and returns the connection unread.
    pub fn raw_post(&self, path: &str, body: &Value) -> std::net::TcpStream {
        use std::io::Write;
        let addr = self.base.trim_start_matches("http://").to_string();
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        let b = body.to_string();
        write!(
            c,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        c
    }

    /// [`Server::raw_post`], read until the first streamed text (or the end).
    pub fn raw_stream_started(&self, path: &str, body: &Value) -> (std::net::TcpStream, bool) {
        let mut c = self.raw_post(path, body);
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("\"text\"") {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => return (c, false),
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        (c, true)
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(300))
        .build()
}

fn respond(r: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{e}"),
    }
}

/// The `data:` payloads of an event stream.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The text autoregressive decoding gives `messages` (or a raw `prompt`)
/// alone, greedy, `max` tokens, stopping at the end-of-sequence id.
pub fn solo_text(chat: Option<&str>, prompt: Option<&str>, max: usize) -> String {
    let model = ConvertedModel::open(model_dir()).unwrap();
    let ids = match (chat, prompt) {
        (Some(c), _) => model
            .tokenizer
            .encode_chat(&[
                ChatMessage::new("system", SYSTEM),
                ChatMessage::new("user", c),
            ])
            .unwrap(),
        (_, Some(p)) => model.tokenizer.encode(p).unwrap(),
        _ => unreachable!(),
    };
    let client = draftc_runtime::device::wgpu_client().unwrap();
    let mut t = TargetModel::load(&client, &model, 1, ids.len() + max + 1, PlanDType::F32).unwrap();
    let eos = model.config.eos_token_id[0];
    let g = generate(
        &mut t,
        &[Request { prompt: ids }],
        max,
        &Sampling::GREEDY,
        Some(eos),
        &mut |_, _| {},
    )
    .unwrap();
    let toks: Vec<u32> = g.tokens[0].iter().copied().filter(|&t| t != eos).collect();
    model.tokenizer.decode(&toks).unwrap()
}

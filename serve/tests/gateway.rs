//! Two replicas behind the SGLang Model Gateway (`tools/serve-cluster.sh`,
//! which installs PyPI `smg` into .venv-gateway): both serve, and killing
//! one loses no later request (the gateway retries on the other). Ignored
//! by default: it downloads the gateway (37 MB); `.ci/run` runs it with the
//! other slow tests.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
#[ignore = "downloads the SGLang Model Gateway from PyPI"]
fn two_replicas_behind_the_gateway_both_serve_and_one_may_die() {
    let run = tempfile::tempdir().unwrap();
    let gw = free_port();
    // Two consecutive free ports for the replicas (B+1, B+2); a bounded
    // search.
    let base = (0..100)
        .map(|_| free_port())
        .find(|&p| {
            p < 65000
                && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
                && std::net::TcpListener::bind(("127.0.0.1", p + 2)).is_ok()
        })
        .expect("no two consecutive free loopback ports in 100 tries");
    let mut cluster = Command::new("bash")
        .current_dir(repo())
        .arg("tools/serve-cluster.sh")
        .arg("2")
        .args(["--gateway-port", &gw.to_string()])
        .args(["--replica-port-base", &base.to_string()])
        .args(["--run-dir", run.path().to_str().unwrap()])
        .args(["--policy", "round_robin", "--"])
        .args(["--model", model_dir().to_str().unwrap()])
        .args([
            "--served-model-name",
            MODEL,
            "--max-model-len",
            "120",
            "--no-spec",
        ])
        .env("DRAFTC_SERVE_BIN", env!("CARGO_BIN_EXE_draftc-serve"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = cluster.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("gateway http://") {
                let _ = tx.send(line);
            }
        }
    });
    let up = rx.recv_timeout(Duration::from_secs(900));
    let logs = || {
        ["replica-1.log", "replica-2.log", "gateway.log"]
            .iter()
            .map(|f| std::fs::read_to_string(run.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    assert!(up.is_ok(), "the cluster did not come up:\n{}", logs());
    let url = format!("http://127.0.0.1:{gw}/v1/completions");
    let want = solo_text(None, Some("Once upon a time"), 8);
    let ask = || {
        let r = agent().post(&url).send_json(json!({
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0
        }));
        match r {
            Ok(r) => {
                let v: serde_json::Value = r.into_json().unwrap();
                assert_eq!(v["choices"][0]["text"], want.as_str());
            }
            Err(e) => panic!("through the gateway: {e}\n{}", logs()),
        }
    };
    for _ in 0..8 {
        ask();
    }
    for i in 1..=2 {
        let (_, m) = respond_get(&format!("http://127.0.0.1:{}/metrics", base + i));
        let served: f64 = m
            .lines()
            .filter(|l| l.starts_with("draftc_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(served > 0.0, "replica {i} served nothing");
    }
    let pid = std::fs::read_to_string(run.path().join("replica-1.pid")).unwrap();
    let status = Command::new("kill").arg(pid.trim()).status().unwrap();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..8 {
        ask();
    }
    let _ = Command::new("kill").arg(cluster.id().to_string()).status();
    let _ = cluster.wait();
}

fn respond_get(url: &str) -> (u16, String) {
    match agent().get(url).call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{e}"),
    }
}

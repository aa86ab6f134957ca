//! The official OpenAI Python client against `draftc-serve` on the tiny
//! model (tools/serve/client_check.py, in the pinned virtualenv that
//! tools/serve/venv.sh makes; no torch): chat, completions, streaming,
//! usage, and each error class as the client raises it.

mod support;

use std::process::Command;

use support::*;

#[test]
fn the_official_openai_client_gets_what_it_expects() {
    let venv = Command::new("bash")
        .arg(repo().join("tools/serve/venv.sh"))
        .output()
        .expect("bash");
    assert!(
        venv.status.success(),
        "tools/serve/venv.sh failed (python3 with venv and pip, and PyPI, are needed): {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8_lossy(&venv.stdout).trim().to_string();
    let plain = Server::start(&["--drafter", "prompt-lookup"]);
    let keyed = Server::start(&["--no-spec", "--api-key", "open-sesame"]);
    let full = Server::start(&["--no-spec", "--max-queued", "0"]);
    let out = Command::new(&python)
        .arg(repo().join("tools/serve/client_check.py"))
        .args(["--base", &plain.base, "--model", MODEL])
        .args(["--keyed", &keyed.base, "--key", "open-sesame"])
        .args(["--full", &full.base])
        .output()
        .expect("python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}\nserver log:\n{}", plain.log());
    assert!(text.contains("all client checks passed"), "{text}");
}

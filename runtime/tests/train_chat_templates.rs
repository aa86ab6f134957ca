//! The training tools' prompt ids are the runtime's: for checkpoint
//! directories with chat templates of several kinds (the styles of
//! `tests/fixtures/chat_templates.json`, Gemma 3's instruction template, a
//! Llama 3.1-style dated one, SmolLM2's ChatML; the real SmolLM2 and Gemma 3
//! tokenizers when `draftc fetch` has cached them), the ids
//! `draftc_train.targets.TargetSpec` gives a conversation (what `data`
//! writes as a record's prompt) are `Tokenizer::encode_chat`'s (what
//! `draftc generate` / `bench spec` feed the target), a conversation one
//! side's template refuses is refused by the other with the same message,
//! and the eos ids the tools call the runtime's are `config.json`'s as the
//! runtime reads it.
//!
//! The directories and the tools' side come from
//! `tools/train/tests/chat_template_cases.py` (run with the training
//! virtualenv's python; without it the test says so and passes).

mod tiny;

use std::path::Path;
use std::process::Command;

use draftc_runtime::model::config::LlamaConfig;
use draftc_runtime::model::tokenizer::Tokenizer;
use tiny::{json_ids as ids, python, repo};

fn cases(py: &Path, out: &Path) -> Vec<serde_json::Value> {
    let (ok, text) = tiny::run_checked(
        Command::new(py)
            .arg(repo().join("tools/train/tests/chat_template_cases.py"))
            .arg(out),
    );
    assert!(ok, "chat_template_cases.py failed:\n{text}");
    println!("{}", text.trim_end());
    let f = std::fs::read_to_string(out.join("cases.json")).unwrap();
    serde_json::from_str::<Vec<serde_json::Value>>(&f).unwrap()
}

#[test]
fn training_prompt_ids_are_the_runtimes_for_any_chat_template() {
    let Some(py) = python() else { return };
    let out = tempfile::tempdir().unwrap();
    let cases = cases(&py, out.path());
    let (mut same, mut refused, mut chatml) = (0, 0, 0);
    let mut dirs = std::collections::BTreeSet::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let conv_index = &case["conversation"];
        let dir = Path::new(case["dir"].as_str().unwrap());
        let tok = Tokenizer::from_dir(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let messages = tiny::chat_messages(&case["messages"]);
        let what = format!("{name}, conversation {conv_index}");
        match (case.get("ids"), case.get("error")) {
            (Some(want), _) => {
                if let Some(text) = case.get("text") {
                    assert_eq!(
                        tok.chat_prompt(&messages).unwrap(),
                        text.as_str().unwrap(),
                        "{what}: rendered text"
                    );
                } else {
                    chatml += 1;
                }
                assert_eq!(
                    tok.encode_chat(&messages).unwrap(),
                    ids(want),
                    "{what}: prompt ids"
                );
                same += 1;
            }
            (None, Some(message)) => {
                let e = tok.encode_chat(&messages).unwrap_err().to_string();
                assert!(
                    e.contains("refused the conversation") && e.contains(message.as_str().unwrap()),
                    "{what}: the tools refused it ({message}), the runtime says: {e}"
                );
                refused += 1;
            }
            _ => panic!("{what}: neither ids nor error"),
        }
        if dirs.insert(name.to_string()) {
            let config = LlamaConfig::load(&dir.join("config.json")).unwrap();
            let mut runtime_eos = config.eos_token_id.clone();
            runtime_eos.sort_unstable();
            runtime_eos.dedup();
            assert_eq!(
                runtime_eos,
                ids(&case["runtime_eos_ids"]),
                "{name}: eos ids"
            );
            // What the tools stop an answer on includes what the runtime
            // stops on.
            let tools_eos = ids(&case["eos_ids"]);
            assert!(
                runtime_eos.iter().all(|e| tools_eos.contains(e)),
                "{name}: the tools' eos ids {tools_eos:?} miss the runtime's {runtime_eos:?}"
            );
        }
    }
    println!(
        "{same} conversations' prompt ids equal the runtime's ({chatml} on the ChatML path), \
         {refused} refused by both, over {} checkpoint directories",
        dirs.len()
    );
    assert!(
        same >= 40 && refused >= 8 && dirs.len() >= 9,
        "too few cases"
    );
}

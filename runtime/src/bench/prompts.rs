//! The fixed prompt set of `draftc bench`: one prompt per kind of workload
//! the papers measure (chat, code, summarisation that copies from its input,
//! math). A batch of `b` sequences cycles through them, so every batch size
//! sees the same mix.

use crate::model::tokenizer::ChatMessage;

/// A benchmark prompt and its workload kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchPrompt {
    pub kind: &'static str,
    pub text: &'static str,
}

/// The prompts, in cycling order.
pub const PROMPTS: [BenchPrompt; 4] = [
    BenchPrompt {
        kind: "chat",
        text: "What are three good habits for staying healthy while working from home?",
    },
    BenchPrompt {
        kind: "code",
        text: "Write a Python function that returns the n-th Fibonacci number iteratively.",
    },
    BenchPrompt {
        kind: "summarisation",
        text: "Summarise this paragraph, reusing its wording: The city council met on Monday \
               evening to discuss the new park. The council agreed that the new park will open \
               in the spring, that the new park will have a playground and a small lake, and \
               that the new park will be free for everyone who lives in the city.",
    },
    BenchPrompt {
        kind: "math",
        text: "A train travels 60 kilometres per hour for 3 hours. How far does it travel? \
               Explain step by step.",
    },
];

/// The prompt of sequence `i` in a batch.
pub fn prompt(i: usize) -> BenchPrompt {
    PROMPTS[i % PROMPTS.len()]
}

/// A prompt of `draftc bench spec`: a conversation that ends with the
/// user's turn (one user message for a plain prompt), rendered with the
/// model's chat template.
pub type Conversation = Vec<ChatMessage>;

/// `--prompts` of `draftc bench spec`: `builtin` (the four prompts above),
/// `mt-bench` (the 80 first-turn MT-Bench questions of
/// `data/eval/mt-bench.jsonl`, held out from training), or a file with one
/// prompt per line (`.jsonl`: objects with a `prompt` string, or with
/// `messages`, a conversation of `{"role", "content"}` objects, roles
/// `system`, `user` and `assistant`, that ends with a user turn: a prompt
/// with its context).
pub fn load_prompts(spec: &str) -> Result<Vec<Conversation>, String> {
    if spec == "builtin" {
        return Ok(PROMPTS
            .iter()
            .map(|p| vec![ChatMessage::new("user", p.text)])
            .collect());
    }
    let path = if spec == "mt-bench" {
        mt_bench_path()?
    } else {
        std::path::PathBuf::from(spec)
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("--prompts {}: {e}", path.display()))?;
    let jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if jsonl {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            let conv =
                conversation_of(&v).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            out.push(conv);
        } else {
            out.push(vec![ChatMessage::new("user", line)]);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "--prompts {}: no prompts in the file",
            path.display()
        ));
    }
    Ok(out)
}

/// One `.jsonl` line's prompt: a `prompt` string, or a `messages`
/// conversation that ends with a user turn.
fn conversation_of(v: &serde_json::Value) -> Result<Conversation, String> {
    if let Some(p) = v.get("prompt").and_then(|p| p.as_str()) {
        return Ok(vec![ChatMessage::new("user", p)]);
    }
    let expected = "expected an object with a string `prompt` or a `messages` array";
    let msgs = v
        .get("messages")
        .and_then(|m| m.as_array())
        .ok_or(expected)?;
    let mut conv = Vec::with_capacity(msgs.len());
    for (j, m) in msgs.iter().enumerate() {
        let field = |name: &str| {
            m.get(name).and_then(|x| x.as_str()).ok_or_else(|| {
                format!("messages[{j}]: expected an object with strings `role` and `content`")
            })
        };
        let (role, content) = (field("role")?, field("content")?);
        if !matches!(role, "system" | "user" | "assistant") {
            return Err(format!(
                "messages[{j}]: role `{role}` (expected system, user or assistant)"
            ));
        }
        conv.push(ChatMessage::new(role, content));
    }
    if conv.last().is_none_or(|m| m.role != "user") {
        return Err("`messages` must end with a user turn (the prompt to answer)".into());
    }
    Ok(conv)
}

/// `data/eval/mt-bench.jsonl` under the current directory or the repository
/// this binary was built from.
fn mt_bench_path() -> Result<std::path::PathBuf, String> {
    let rel = std::path::Path::new("data/eval/mt-bench.jsonl");
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    [rel.to_path_buf(), built]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "--prompts mt-bench: data/eval/mt-bench.jsonl not found (run draftc from the repository root; \
             `python -m draftc_train prompts` writes it)"
                .to_string()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lines` as a `.jsonl` prompts file of its own (tests run in parallel).
    fn load(lines: &str) -> Result<Vec<Conversation>, String> {
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("draftc-prompts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("p{n}.jsonl"));
        std::fs::write(&path, lines).map_err(|e| e.to_string())?;
        load_prompts(&path.to_string_lossy())
    }

    #[test]
    fn a_jsonl_line_is_a_prompt_or_a_conversation() {
        let got = load(concat!(
            "{\"prompt\": \"hi\"}\n",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, ",
            "{\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}]}\n",
        ))
        .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], vec![ChatMessage::new("user", "hi")]);
        let roles: Vec<&str> = got[1].iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(got[1][2].content, "c");
    }

    #[test]
    fn a_bad_conversation_names_its_line() {
        let ends_with_answer = load(concat!(
            "{\"prompt\": \"ok\"}\n",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n",
        ))
        .unwrap_err();
        assert!(
            ends_with_answer.contains(":2:") && ends_with_answer.contains("user turn"),
            "{ends_with_answer}"
        );
        let bad_role =
            load("{\"messages\": [{\"role\": \"tool\", \"content\": \"a\"}]}\n").unwrap_err();
        assert!(
            bad_role.contains(":1:") && bad_role.contains("`tool`"),
            "{bad_role}"
        );
        let no_content = load("{\"messages\": [{\"role\": \"user\"}]}\n").unwrap_err();
        assert!(no_content.contains("messages[0]"), "{no_content}");
        let neither = load("{\"text\": \"a\"}\n").unwrap_err();
        assert!(neither.contains("`prompt` or a `messages`"), "{neither}");
    }
}

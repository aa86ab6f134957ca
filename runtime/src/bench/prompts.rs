//! The fixed prompt set of `draftc bench`: one prompt per kind of workload
//! the papers measure (chat, code, summarisation that copies from its input,
//! math). A batch of `b` sequences cycles through them, so every batch size
//! sees the same mix.

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

/// `--prompts` of `draftc bench spec`: `builtin` (the four prompts above),
/// `mt-bench` (the 80 first-turn MT-Bench questions of
/// `data/eval/mt-bench.jsonl`, held out from training), or a file with one
/// prompt per line (`.jsonl`: objects with a `prompt` field).
pub fn load_prompts(spec: &str) -> Result<Vec<String>, String> {
    if spec == "builtin" {
        return Ok(PROMPTS.iter().map(|p| p.text.to_string()).collect());
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
            let p = v.get("prompt").and_then(|p| p.as_str()).ok_or_else(|| {
                format!(
                    "{}:{}: expected an object with a string `prompt`",
                    path.display(),
                    i + 1
                )
            })?;
            out.push(p.to_string());
        } else {
            out.push(line.to_string());
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

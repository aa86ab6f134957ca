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

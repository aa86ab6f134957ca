//! `draftc serve`'s command line.

use std::path::PathBuf;

use clap::Parser;

/// An OpenAI-compatible server over the continuous-batching engine.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "draftc serve",
    version,
    about = "Serve the target model over an OpenAI-compatible HTTP API (continuous batching, speculative decoding per sequence)"
)]
pub struct ServeArgs {
    /// Address to bind (loopback by default; give 0.0.0.0 to serve a network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// A converted model directory (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// `prompt-lookup` (default) or a drafter description file, as in `draftc generate`.
    #[arg(long, default_value = "prompt-lookup")]
    pub drafter: String,
    /// Weights of a model drafter: `shipped`, `random:SEED`, `pruned[:SEED]` or a file.
    #[arg(long, default_value = "shipped")]
    pub drafter_weights: String,
    /// Plain autoregressive decoding (no drafter).
    #[arg(long)]
    pub no_spec: bool,
    /// Draft tokens per sequence per round at most (default: the weights'
    /// tuned settings, else 8).
    #[arg(long)]
    pub budget: Option<usize>,
    /// Draft tree of an autoregressive drafter (`chain`, `static(3,2,1)`, …).
    #[arg(long)]
    pub tree: Option<String>,
    /// `auto` (the planner sizes each sequence's draft every round, down to
    /// none under load) or `fixed` (the budget every round).
    #[arg(long, default_value = "auto")]
    pub speculate: String,
    /// The model name clients send (default: the model directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Sequences in the running batch at most (KV slots).
    #[arg(long, default_value_t = 16)]
    pub max_running: usize,
    /// Requests waiting for a slot at most; beyond it a request gets 429.
    #[arg(long, default_value_t = 64)]
    pub max_queued: usize,
    /// Prompt plus completion tokens a request may hold at most.
    #[arg(long, default_value_t = 1024)]
    pub max_model_len: usize,
    /// Prompt rows prefilled per round while other sequences decode.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Do not keep the last prompt's KV rows for the next prompt that shares
    /// its prefix (a chat template's system turn).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long, env = "DRAFTC_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds SIGTERM lets running requests finish before exiting.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Request bodies larger than this get 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Skip the start-up warm-up (kernels then compile on the first requests).
    #[arg(long)]
    pub no_warmup: bool,
    /// Compute dtype: f32, f16 or auto (f16 on a GPU, f32 on lavapipe).
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// wgpu (Vulkan; lavapipe without a GPU) or cuda (a build with the `cuda` feature).
    #[arg(long, default_value = "wgpu")]
    pub backend: String,
}

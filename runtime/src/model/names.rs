//! Tensor naming: llama.cpp GGUF names (`blk.3.attn_q.weight`) to
//! HuggingFace Llama names (`model.layers.3.self_attn.q_proj.weight`), and
//! the full list of tensors (with row-major shapes) a Llama checkpoint of a
//! given [`LlamaConfig`] must contain.

use super::config::LlamaConfig;

/// What a converted tensor needs besides renaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixup {
    None,
    /// Undo llama.cpp's per-head row interleaving of Q/K (for this many heads).
    UnpermuteRows {
        heads: usize,
    },
    /// Subtract one: llama.cpp stores Gemma's norm weights shifted (`1 + w`,
    /// `Gemma3Model.norm_shift`), the checkpoint's `w` is an offset.
    MinusOne,
}

/// Maps a GGUF tensor name to its HF name and fix-up; `None` if unknown.
pub fn hf_name(gguf_name: &str, config: &LlamaConfig) -> Option<(String, Fixup)> {
    let gemma = config.gemma.is_some();
    // Gemma's norms, stored as 1 + w.
    let norm = if gemma { Fixup::MinusOne } else { Fixup::None };
    let fixed = match gguf_name {
        "token_embd.weight" => Some(("model.embed_tokens.weight", Fixup::None)),
        "output_norm.weight" => Some(("model.norm.weight", norm)),
        "output.weight" => Some(("lm_head.weight", Fixup::None)),
        _ => None,
    };
    if let Some((name, fixup)) = fixed {
        return Some((name.to_string(), fixup));
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= config.num_hidden_layers {
        return None;
    }
    // llama.cpp permutes Llama's Q/K rows for its RoPE layout; Qwen 2's it
    // keeps as they are.
    let permuted = config.model_type == "llama";
    let unpermute = |heads: usize| {
        if permuted {
            Fixup::UnpermuteRows { heads }
        } else {
            Fixup::None
        }
    };
    let (hf, fixup) = match suffix {
        "attn_norm.weight" => ("input_layernorm.weight", norm),
        // Gemma's norm before the MLP; Llama's (and Qwen's) only norm there.
        "ffn_norm.weight" if gemma => ("pre_feedforward_layernorm.weight", norm),
        "ffn_norm.weight" => ("post_attention_layernorm.weight", Fixup::None),
        "post_attention_norm.weight" if gemma => ("post_attention_layernorm.weight", norm),
        "post_ffw_norm.weight" if gemma => ("post_feedforward_layernorm.weight", norm),
        "attn_q_norm.weight" if gemma || config.model_type == "qwen3" => {
            ("self_attn.q_norm.weight", norm)
        }
        "attn_k_norm.weight" if gemma || config.model_type == "qwen3" => {
            ("self_attn.k_norm.weight", norm)
        }
        "attn_q.weight" => (
            "self_attn.q_proj.weight",
            unpermute(config.num_attention_heads),
        ),
        "attn_k.weight" => (
            "self_attn.k_proj.weight",
            unpermute(config.num_key_value_heads),
        ),
        "attn_q.bias" | "attn_k.bias" | "attn_v.bias" if !permuted => {
            let part = &suffix[5..6];
            return Some((
                format!("model.layers.{layer}.self_attn.{part}_proj.bias"),
                Fixup::None,
            ));
        }
        "attn_v.weight" => ("self_attn.v_proj.weight", Fixup::None),
        "attn_output.weight" => ("self_attn.o_proj.weight", Fixup::None),
        "ffn_gate.weight" => ("mlp.gate_proj.weight", Fixup::None),
        "ffn_up.weight" => ("mlp.up_proj.weight", Fixup::None),
        "ffn_down.weight" => ("mlp.down_proj.weight", Fixup::None),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf}"), fixup))
}

/// Every tensor (HF name, row-major shape) of a Llama (or Qwen 2: q/k/v
/// biases too; Qwen 3: per-head q/k norms) model with this config, in a
/// stable order: embeddings, layers, final norm, LM head.
pub fn expected_tensors(config: &LlamaConfig) -> Vec<(String, Vec<u64>)> {
    let d = config.hidden_size as u64;
    let f = config.intermediate_size as u64;
    let kv = (config.num_key_value_heads * config.head_dim) as u64;
    // The query width: heads · head_dim, which Qwen 3 sets apart from d.
    let q = (config.num_attention_heads * config.head_dim) as u64;
    let hd = config.head_dim as u64;
    let v = config.vocab_size as u64;
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, d]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, d]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, d]));
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![d, q]));
        if config.model_type == "qwen3" || config.gemma.is_some() {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        }
        if config.gemma.is_some() {
            out.push((format!("{p}.pre_feedforward_layernorm.weight"), vec![d]));
            out.push((format!("{p}.post_feedforward_layernorm.weight"), vec![d]));
        }
        if config.model_type == "qwen2" {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, f]));
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !config.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, d]));
    }
    out
}

/// Undoes llama.cpp's `permute` of a Q or K projection (row-major
/// `[heads * head_dim, cols]`): llama.cpp stores, per head, row `2i + j` of
/// its layout at HF row `j * head_dim/2 + i`. Equivalent to numpy's
/// `w.reshape(heads, head_dim/2, 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
/// Returns `None` if the shape does not split into `heads` even-sized heads.
pub fn unpermute_rows(w: &[f32], rows: usize, cols: usize, heads: usize) -> Option<Vec<f32>> {
    if heads == 0
        || !rows.is_multiple_of(heads)
        || !(rows / heads).is_multiple_of(2)
        || w.len() != rows * cols
    {
        return None;
    }
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0.0f32; w.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let dst = h * head_dim + j * half + i;
                let src = h * head_dim + 2 * i + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    Some(out)
}

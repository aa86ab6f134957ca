//! The shipped model files: each checks against the SmolLM2-135M preset,
//! round-trips through the printer, and SpecFormer's parameter count matches
//! the hand computation of paper 000 (m_p = d² + d per draft position).

mod common;

use draftc_ir::stats::param_stats;

#[test]
fn every_model_checks_against_smollm2() {
    let cfg = common::smollm2();
    for (name, src) in common::MODELS {
        let g = common::compile(src, &cfg).unwrap_or_else(|d| panic!("{name}: {d:#?}"));
        assert!(!g.outputs.is_empty(), "{name}");
        draftc_ir::verify::verify(&g).unwrap();
    }
}

#[test]
fn every_model_round_trips_through_the_printer() {
    let cfg = common::smollm2();
    for (name, src) in common::MODELS {
        let g1 = common::compile(src, &cfg).unwrap();
        let printed = draftc_ir::print::print(&g1);
        let g2 = common::compile(&printed, &cfg)
            .unwrap_or_else(|d| panic!("{name} printed:\n{printed}\n{d:#?}"));
        assert_eq!(printed, draftc_ir::print::print(&g2), "{name}");
        assert!(g1 == g2, "{name}: graphs differ after print → parse");
    }
}

#[test]
fn llama_has_the_smollm2_tensor_names_and_count() {
    let g = common::compile(common::MODELS[0].1, &common::smollm2()).unwrap();
    let params = g.params();
    // embed (tied with the LM head) + final norm + 30 layers × 9 tensors.
    assert_eq!(params.len(), 2 + 30 * 9);
    let total = param_stats(&g).total;
    // SmolLM2-135M: 134,515,008 parameters with tied embeddings.
    assert_eq!(total, 134_515_008);
    assert!(params
        .iter()
        .any(|p| p.name == "model.layers.29.self_attn.k_proj.weight"));
    assert_eq!(g.emits.len(), 31);
}

#[test]
fn an_untied_target_binds_its_own_lm_head_and_exports_it() {
    let mut cfg = common::smollm2();
    cfg.flags.insert("tied_embeddings".into(), false);
    let g = common::compile(common::MODELS[0].1, &cfg).unwrap();
    let params = g.params();
    assert_eq!(params.len(), 3 + 30 * 9);
    let head = params.iter().find(|p| p.name == "lm_head.weight");
    assert_eq!(
        head.map(|p| p.shape.clone()),
        Some(vec![
            draftc_ir::dim::Dim::constant(49152),
            draftc_ir::dim::Dim::constant(576)
        ])
    );
    // The untied head adds v × d parameters to the tied count.
    assert_eq!(param_stats(&g).total, 134_515_008 + 49_152 * 576);
    assert_eq!(g.meta.exports["lm_head"], "lm_head");
    assert_eq!(g.meta.exports["embed"], "model.embed_tokens");
    // Tied: no `lm_head` tensor, and the export is the embedding.
    let tied = common::compile(common::MODELS[0].1, &common::smollm2()).unwrap();
    assert!(tied.params().iter().all(|p| p.name != "lm_head.weight"));
    assert_eq!(tied.meta.exports["lm_head"], "model.embed_tokens");
    // Printed, the untied graph names its head and parses back the same.
    let printed = draftc_ir::print::print(&g);
    assert!(printed.contains("@lm_head"), "{printed}");
    assert!(common::compile(&printed, &cfg).unwrap() == g);
}

#[test]
fn specformer_parameter_count_matches_hand_computation() {
    let g = common::compile(common::MODELS[1].1, &common::smollm2()).unwrap();
    let s = param_stats(&g);
    let (d, hd, h, hkv, f, l) = (576i64, 64i64, 9i64, 3i64, 1536i64, 4i64);
    // Position-dependent (paper 000 §3.3.1): W_P is [l·d, d] and b_P is [l·d].
    let m_p = d * d + d;
    let attn = d * h * hd + 2 * d * hkv * hd + h * hd * d;
    let m_s = 4 * d            // grouped RMS norm, one scale vector per tap
        + 4 * d * d            // downsampler W_D, no bias
        + d + attn             // context attention norm + q/k/v/o
        + d                    // positional FFN input norm
        + d + attn             // draft attention norm + q/k/v/o
        + d + 3 * d * f        // SwiGLU norm + gate/up/down
        + d; // final norm
    assert_eq!(s.per_position, m_p);
    assert_eq!(s.shared, m_s);
    assert_eq!(s.total, m_s + l * m_p);
}

#[test]
fn draft_length_override_changes_only_position_dependent_params() {
    let cfg = common::smollm2();
    let mut sets = std::collections::BTreeMap::new();
    sets.insert("l".to_string(), 8);
    let g4 = common::compile(common::MODELS[1].1, &cfg).unwrap();
    let g8 = draftc_ir::compile(common::MODELS[1].1, &cfg, &sets, &common::Models).unwrap();
    let (s4, s8) = (param_stats(&g4), param_stats(&g8));
    assert_eq!(s8.total - s4.total, 4 * s4.per_position);
}

#[test]
fn magicdec_is_llama_with_sliding_window_over_target_caches() {
    let cfg = common::smollm2();
    let g = common::compile(common::MODELS[5].1, &cfg).unwrap();
    let attns: Vec<_> = g
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            draftc_ir::op::Op::Attention(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(attns.len(), 30);
    for a in attns {
        assert_eq!(
            a.mask,
            draftc_ir::op::Mask::SlidingWindow {
                window: 64,
                sink: 1
            }
        );
        assert!(matches!(a.cache, draftc_ir::op::Cache::Target(_)));
    }
    assert!(param_stats(&g).from_target);
}

#[test]
fn qwen2_is_llama_with_q_k_v_biases() {
    let cfg = common::smollm2();
    let (llama, qwen2) = (common::MODELS[0], common::MODELS[8]);
    assert_eq!((llama.0, qwen2.0), ("llama", "qwen2"));
    let l = common::compile(llama.1, &cfg).unwrap().params();
    let q = common::compile(qwen2.1, &cfg).unwrap().params();
    let extra: Vec<&str> = q
        .iter()
        .filter(|p| l.iter().all(|x| x.name != p.name))
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(extra.len(), 3 * 30, "{extra:?}");
    assert!(extra.iter().all(|n| n.ends_with("q_proj.bias")
        || n.ends_with("k_proj.bias")
        || n.ends_with("v_proj.bias")));
    let printed = draftc_ir::print::print(&common::compile(qwen2.1, &cfg).unwrap());
    assert!(printed.contains(", bias)"), "{printed}");
}

#[test]
fn a_self_speculative_base_target_is_the_targets_own_family() {
    let magicdec = common::MODELS
        .iter()
        .find(|(n, _)| *n == "magicdec")
        .unwrap()
        .1;
    let mut cfg = common::smollm2();
    let llama = common::compile(magicdec, &cfg).unwrap();
    assert_eq!(llama.meta.base.as_deref(), Some("llama"));
    cfg.family = "qwen2".into();
    let qwen2 = common::compile(magicdec, &cfg).unwrap();
    assert_eq!(qwen2.meta.base.as_deref(), Some("qwen2"));
    let biases = |g: &draftc_ir::Graph| {
        g.params()
            .iter()
            .filter(|p| p.name.ends_with("_proj.bias"))
            .count()
    };
    assert_eq!((biases(&llama), biases(&qwen2)), (0, 3 * 30));
}

#[test]
fn qwen3_is_llama_with_head_norms_and_its_own_head_size() {
    let mut cfg = common::smollm2();
    // Heads of 80 over d = 576: the query width (9 · 80) is not d.
    cfg.ints.insert("hd".into(), 80);
    let llama = common::MODELS[0];
    let qwen3 = common::MODELS.iter().find(|(n, _)| *n == "qwen3").unwrap();
    let l = common::compile(llama.1, &cfg).unwrap().params();
    let g = common::compile(qwen3.1, &cfg).unwrap();
    let q = g.params();
    let extra: Vec<&draftc_ir::graph::Param> = q
        .iter()
        .filter(|p| l.iter().all(|x| x.name != p.name))
        .collect();
    assert_eq!(extra.len(), 2 * 30);
    for p in &extra {
        assert!(p.name.ends_with("q_norm.weight") || p.name.ends_with("k_norm.weight"));
        assert_eq!(p.shape.len(), 1);
        assert_eq!(p.shape[0].as_const(), Some(80), "{}", p.name);
    }
    let q_proj = q
        .iter()
        .find(|p| p.name.ends_with("0.self_attn.q_proj.weight"))
        .unwrap();
    let dims: Vec<Option<i64>> = q_proj.shape.iter().map(|d| d.as_const()).collect();
    assert_eq!(dims, [Some(9 * 80), Some(576)]);
    let printed = draftc_ir::print::print(&g);
    assert!(
        printed.contains("head_dim=80") && printed.contains(", qk_norm)"),
        "{printed}"
    );
}

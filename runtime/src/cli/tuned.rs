//! Decoding settings tuned for a drafter's shipped weights: the `decode`
//! section of its weights manifest (`models/weights/<name>.json`, beside
//! `<name>.safetensors`), one entry per device class, each chosen on the
//! trainer's held-out ShareGPT prompts (never on MT-Bench):
//!
//! ```json
//! "decode": {
//!   "lavapipe": { "tree": "chain", "budget": 3, "confidence": "0.05,0.3",
//!                 "lookup": 3, "chosen_on": "...", "measured": "..." }
//! }
//! ```
//!
//! `tree`, `confidence` and `lookup` are optional (the file's tree; no
//! cut; no prompt lookup in front of the model). The best
//! draft shape depends on the weights (how far their confidence can be
//! trusted) and on what a verified row costs on the device (about 5 % of a
//! decoding step on lavapipe, close to nothing on a GPU), so the settings
//! live with the weights and are keyed by device class. `draftc generate`
//! uses them when none of `--tree`, `--budget` and `--confidence` is given;
//! `draftc bench spec --tuned` measures every drafter at its own.

use std::path::{Path, PathBuf};

use draftc_codegen::device::DeviceClass;
use serde_json::Value;

use super::drafter::DrafterChoice;
use crate::speculation::{Confidence, TreeShape};

/// One device class's tuned settings for a drafter.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    /// `None`: the description file's `tree`.
    pub tree: Option<TreeShape>,
    pub budget: usize,
    pub confidence: Option<Confidence>,
    /// Prompt lookup first: the shortest n-gram match (`--lookup`).
    pub lookup: Option<usize>,
    /// The manifest they came from, and its device-class key.
    pub manifest: PathBuf,
    pub class: &'static str,
}

impl Tuned {
    /// Sets `choice`'s tree, budget and cut to these settings.
    pub fn apply(self, choice: &mut DrafterChoice) {
        choice.budget = self.budget;
        choice.tree = self.tree;
        choice.confidence = self.confidence;
        choice.lookup = self.lookup;
    }

    /// The command-line flags that ask for the same settings.
    pub fn flags(&self) -> String {
        let mut f = Vec::new();
        if let Some(t) = &self.tree {
            f.push(format!("--tree {t}"));
        }
        f.push(format!("--budget {}", self.budget));
        if let Some(c) = self.confidence {
            f.push(format!("--confidence {c}"));
        }
        if let Some(n) = self.lookup {
            f.push(format!("--lookup {n}"));
        }
        f.join(" ")
    }
}

/// The manifest key of a device class.
pub fn class_key(class: DeviceClass) -> &'static str {
    match class {
        DeviceClass::Emulator => "lavapipe",
        DeviceClass::Gpu => "gpu",
    }
}

/// Where the weights manifest of the description `drafter` ships
/// (`weights/<stem>.json` next to the `.draft` file).
pub fn manifest_path(drafter: &Path) -> PathBuf {
    super::drafter::shipped_weights(drafter).with_extension("json")
}

/// The tuned settings of `choice` for `class` when it is a description
/// file with shipped weights; `None` for other drafters and weights.
pub fn tuned_for(choice: &DrafterChoice, class: DeviceClass) -> Result<Option<Tuned>, String> {
    let path = Path::new(&choice.name);
    if choice.weights != super::drafter::SHIPPED
        || !choice.name.ends_with(".draft")
        || !super::drafter::shipped_weights(path).is_file()
    {
        return Ok(None);
    }
    tuned_settings(path, class)
}

/// The settings `drafter`'s manifest tunes for `class`: `Ok(None)` when it
/// ships no manifest or the manifest tunes nothing for the class; an error
/// naming the file and the key when the manifest cannot be read or a
/// setting is malformed.
pub fn tuned_settings(drafter: &Path, class: DeviceClass) -> Result<Option<Tuned>, String> {
    let manifest = manifest_path(drafter);
    let text = match std::fs::read_to_string(&manifest) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", manifest.display())),
    };
    parse(&text, &manifest, class_key(class))
}

/// [`tuned_settings`] of a manifest's text.
fn parse(text: &str, manifest: &Path, class: &'static str) -> Result<Option<Tuned>, String> {
    let at =
        |key: &str, what: String| format!("{}: `decode.{class}{key}`: {what}", manifest.display());
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| format!("{}: not a JSON manifest: {e}", manifest.display()))?;
    let Some(entry) = doc.get("decode").and_then(|d| d.get(class)) else {
        return Ok(None);
    };
    if !entry.is_object() {
        return Err(at("", "expected an object".into()));
    }
    let text_of = |key: &str| -> Result<Option<&str>, String> {
        match entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(at(
                &format!(".{key}"),
                format!("expected a string, found {v}"),
            )),
        }
    };
    let budget = match entry.get("budget") {
        Some(v) => match v.as_u64() {
            Some(b) if b >= 1 => b as usize,
            _ => {
                return Err(at(
                    ".budget",
                    format!("expected a draft budget >= 1, found {v}"),
                ))
            }
        },
        None => return Err(at(".budget", "missing (the draft tokens per round)".into())),
    };
    let tree = match text_of("tree")? {
        Some(t) => Some(
            t.parse::<TreeShape>()
                .map_err(|e| at(".tree", e.to_string()))?,
        ),
        None => None,
    };
    let confidence = match text_of("confidence")? {
        Some(c) => Some(
            c.parse::<Confidence>()
                .map_err(|e| at(".confidence", e.to_string()))?,
        ),
        None => None,
    };
    let max = crate::engine::LOOKUP_MAX_NGRAM;
    let lookup = match entry.get("lookup") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().map(|n| n as usize) {
            Some(n) if crate::engine::LOOKUP_MIN_NGRAMS.contains(&n) => Some(n),
            _ => {
                return Err(at(
                    ".lookup",
                    format!("expected the shortest n-gram match, 1 to {max}, found {v}"),
                ))
            }
        },
    };
    Ok(Some(Tuned {
        tree,
        budget,
        confidence,
        lookup,
        manifest: manifest.to_path_buf(),
        class,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Option<Tuned>, String> {
        parse(text, Path::new("m.json"), "lavapipe")
    }

    #[test]
    fn reads_a_class_entry() {
        let t = parsed(
            r#"{"drafter": "beagle", "decode": {"lavapipe": {"tree": "chain", "budget": 3,
                "confidence": "0.05,0.3", "chosen_on": "held-out"}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.tree, Some(TreeShape::Chain));
        assert_eq!(t.budget, 3);
        assert_eq!(t.confidence, Some("0.05,0.3".parse().unwrap()));
        assert_eq!(t.flags(), "--tree chain --budget 3 --confidence 0.05,0.3");
        assert_eq!(t.lookup, None);
        let l = parsed(r#"{"decode": {"lavapipe": {"budget": 3, "lookup": 2}}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(l.lookup, Some(2));
        assert_eq!(l.flags(), "--budget 3 --lookup 2");
        let plain = parsed(r#"{"decode": {"lavapipe": {"budget": 2}}}"#)
            .unwrap()
            .unwrap();
        assert_eq!((&plain.tree, plain.confidence), (&None, None));
        assert_eq!(plain.flags(), "--budget 2");
    }

    #[test]
    fn untuned_classes_and_manifests_give_none() {
        assert_eq!(parsed(r#"{"drafter": "beagle"}"#).unwrap(), None);
        assert_eq!(
            parsed(r#"{"decode": {"gpu": {"budget": 8}}}"#).unwrap(),
            None
        );
        let missing = Path::new("/nonexistent/models/x.draft");
        assert_eq!(
            tuned_settings(missing, DeviceClass::Emulator).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_settings_name_the_file_and_key() {
        for (text, key) in [
            (
                r#"{"decode": {"lavapipe": {"budget": 0}}}"#,
                "decode.lavapipe.budget",
            ),
            (
                r#"{"decode": {"lavapipe": {"budget": "3"}}}"#,
                "decode.lavapipe.budget",
            ),
            (r#"{"decode": {"lavapipe": {}}}"#, "decode.lavapipe.budget"),
            (
                r#"{"decode": {"lavapipe": {"budget": 3, "tree": "bush"}}}"#,
                "decode.lavapipe.tree",
            ),
            (
                r#"{"decode": {"lavapipe": {"budget": 3, "confidence": "2"}}}"#,
                "decode.lavapipe.confidence",
            ),
            (
                r#"{"decode": {"lavapipe": {"budget": 3, "confidence": 0.3}}}"#,
                "decode.lavapipe.confidence",
            ),
            (r#"{"decode": {"lavapipe": 3}}"#, "decode.lavapipe"),
            (
                r#"{"decode": {"lavapipe": {"budget": 3, "lookup": 4}}}"#,
                "decode.lavapipe.lookup",
            ),
            (
                r#"{"decode": {"lavapipe": {"budget": 3, "lookup": "2"}}}"#,
                "decode.lavapipe.lookup",
            ),
        ] {
            let e = parsed(text).unwrap_err();
            assert!(e.starts_with("m.json: ") && e.contains(key), "{text}: {e}");
        }
        let e = parsed("{\"decode\": ").unwrap_err();
        assert!(e.contains("m.json") && e.contains("JSON"), "{e}");
    }

    /// Every shipped manifest's settings parse (`draftc generate` reads
    /// them by default).
    #[test]
    fn shipped_manifests_parse() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
        for d in ["beagle", "specformer", "medusa", "spire"] {
            let draft = models.join(format!("{d}.draft"));
            for class in [DeviceClass::Emulator, DeviceClass::Gpu] {
                tuned_settings(&draft, class).unwrap_or_else(|e| panic!("{d}: {e}"));
            }
        }
    }
}

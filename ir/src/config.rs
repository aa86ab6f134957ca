//! Target presets: the symbol values (`d`, `n`, `h`, …) a model family is
//! instantiated with, read from a `preset NAME` description file.

use std::collections::BTreeMap;

/// Values a target preset supplies to every file checked against it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetConfig {
    /// Preset name, e.g. `smollm2-135m`.
    pub name: String,
    /// The model file the preset instantiates, e.g. `llama`.
    pub family: String,
    /// Integer symbols: `n`, `d`, `h`, `hkv`, `f`, `v`, …
    pub ints: BTreeMap<String, i64>,
    /// Float values: `theta` (RoPE base), `eps` (RMS norm epsilon), …
    pub floats: BTreeMap<String, f64>,
    /// Flags such as `tied_embeddings`.
    pub flags: BTreeMap<String, bool>,
}

impl TargetConfig {
    pub fn int(&self, name: &str) -> Option<i64> {
        self.ints.get(name).copied()
    }

    /// Names it defines, for "the preset defines: …" notes.
    pub fn defined_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .ints
            .keys()
            .chain(self.floats.keys())
            .chain(self.flags.keys())
            .cloned()
            .collect();
        v.sort();
        v
    }
}

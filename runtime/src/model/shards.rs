//! A checkpoint's weights as Hugging Face saves them: one
//! `model.safetensors`, or shards listed by `model.safetensors.index.json`
//! (its `weight_map`: tensor name → shard file), read the way transformers
//! does (the single file first). Every shard is opened and cross-checked
//! against the index when the checkpoint opens, so a missing shard, a tensor
//! the index places in the wrong shard, or a shard name that leaves the
//! directory is an error naming it before anything runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::{ModelError, Result};
use super::safetensors_io::{check_shapes, SafetensorsFile};

pub const SINGLE: &str = "model.safetensors";
pub const INDEX: &str = "model.safetensors.index.json";

/// The weights of one checkpoint directory.
pub struct ModelWeights {
    dir: PathBuf,
    shards: Vec<SafetensorsFile>,
    /// Tensor name → index into `shards`.
    owner: BTreeMap<String, usize>,
}

impl ModelWeights {
    /// Opens `dir/model.safetensors`, or else the shards its index names.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let single = dir.join(SINGLE);
        let index = dir.join(INDEX);
        if single.is_file() || !index.is_file() {
            let file = SafetensorsFile::open(&single)?;
            let owner = file.names()?.into_iter().map(|n| (n, 0)).collect();
            return Ok(ModelWeights {
                dir: dir.to_path_buf(),
                shards: vec![file],
                owner,
            });
        }
        let bad = |detail: String| ModelError::Safetensors {
            path: index.clone(),
            detail,
        };
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no `weight_map` object".into()))?;
        let mut files: Vec<String> = Vec::new();
        let mut owner = BTreeMap::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("`{tensor}` maps to {file}, not a file name")))?;
            if file.is_empty() || file.contains(['/', '\\']) || file == ".." || file == "." {
                return Err(bad(format!(
                    "`{tensor}` maps to `{file}`, which is not a file in the checkpoint's directory"
                )));
            }
            let i = match files.iter().position(|f| f == file) {
                Some(i) => i,
                None => {
                    files.push(file.to_string());
                    files.len() - 1
                }
            };
            owner.insert(tensor.clone(), i);
        }
        let shards = files
            .iter()
            .map(|f| SafetensorsFile::open(&dir.join(f)))
            .collect::<Result<Vec<_>>>()?;
        for (tensor, &i) in &owner {
            if shards[i].shape(tensor).is_err() {
                return Err(bad(format!(
                    "the index places `{tensor}` in `{}`, which does not hold it",
                    files[i]
                )));
            }
        }
        Ok(ModelWeights {
            dir: dir.to_path_buf(),
            shards,
            owner,
        })
    }

    fn shard(&self, name: &str) -> Result<&SafetensorsFile> {
        self.owner
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: name.to_string(),
                source_name: match &self.shards[..] {
                    [one] => one.path().display().to_string(),
                    _ => self.dir.join(INDEX).display().to_string(),
                },
            })
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Vec<String> {
        self.owner.keys().cloned().collect()
    }

    /// Shape of a tensor; [`ModelError::MissingTensor`] if absent.
    pub fn shape(&self, name: &str) -> Result<Vec<u64>> {
        self.shard(name)?.shape(name)
    }

    /// A tensor as f32, its shape checked (see [`SafetensorsFile::tensor_f32`]).
    pub fn tensor_f32(&self, name: &str, expected_shape: &[u64]) -> Result<Vec<f32>> {
        self.shard(name)?.tensor_f32(name, expected_shape)
    }

    /// Checks that every `(name, shape)` is present with that shape.
    pub fn check_tensors(&self, expected: &[(String, Vec<u64>)]) -> Result<()> {
        check_shapes(expected, |n| self.shape(n))
    }
}

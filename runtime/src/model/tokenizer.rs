//! The runtime's tokenizer: a `tokenizer.json` loaded with the `tokenizers`
//! crate, encode/decode with range-checked ids, and the chat template from
//! `tokenizer_config.json` (rendered by [`super::chat`], a Jinja engine set
//! up as transformers sets up its own).

use std::path::Path;

use super::error::{ModelError, Result};

fn err(detail: impl Into<String>) -> ModelError {
    ModelError::Tokenizer {
        detail: detail.into(),
    }
}

pub use super::chat::{ChatMessage, ChatTemplate};

/// `chat_template` of a `tokenizer_config.json`: a string, or (newer
/// checkpoints) a list of `{name, template}` of which `default` is the chat
/// template; `None` when absent.
fn chat_template_of(config: &serde_json::Value) -> Result<Option<String>> {
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(t)) => Ok(Some(t.clone())),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template").and_then(|t| t.as_str()))
            .map(|t| Some(t.to_string()))
            .ok_or_else(|| err("chat_template is a list without a `default` template")),
        Some(_) => Err(err(
            "chat_template is neither a string nor a list of templates",
        )),
    }
}

/// A special token's text in a `tokenizer_config.json`: a string, or an
/// added-token object with `content`.
fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    let v = config.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(|c| c.as_str()))
        .map(str::to_string)
}

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
    /// `inner.get_vocab_size(true)`, computed once: the crate builds the
    /// whole vocabulary map per call (~5 ms for SmolLM2's 49,152 tokens),
    /// and every decode checks its ids against it.
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and, when present, the chat template of
    /// `dir/tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let mut tok = Self::from_file(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        if config_path.is_file() {
            let text = std::fs::read_to_string(&config_path)
                .map_err(|e| ModelError::io(&config_path, e))?;
            let config: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| err(format!("{}: {e}", config_path.display())))?;
            if let Some(t) = chat_template_of(&config)? {
                let token = |k: &str| special_token(&config, k);
                tok.chat = Some(
                    ChatTemplate::from_jinja(&t)
                        .map_err(|e| match e {
                            // Named with its file, without a second "tokenizer:".
                            ModelError::Tokenizer { detail } => {
                                err(format!("{}: {detail}", config_path.display()))
                            }
                            e => e,
                        })?
                        .with_tokens(token("bos_token"), token("eos_token")),
                );
            }
        }
        Ok(tok)
    }

    /// Loads a `tokenizer.json` (no chat template).
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| err(format!("{}: {e}", path.display())))?;
        let vocab_size = inner.get_vocab_size(true);
        Ok(Tokenizer {
            inner,
            chat: None,
            vocab_size,
        })
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Token ids of a raw-text prompt as transformers' `tokenizer(text)`
    /// gives them: special tokens written in the text (e.g. `<|im_start|>`)
    /// map to their ids, and what the tokenizer's post-processor adds is
    /// added (Gemma's `<bos>`; nothing for SmolLM2).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// `text`'s ids, with the tokens the tokenizer adds around a text
    /// (`specials`: Gemma's `<bos>`) or without (a chat prompt, whose
    /// template writes them itself, as transformers' `apply_chat_template`).
    fn encode_with(&self, text: &str, specials: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, specials)
            .map_err(|e| err(format!("encoding failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included. Fails on an id outside the
    /// vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        self.inner
            .decode(ids, false)
            .map_err(|e| err(format!("decoding failed: {e}")))
    }

    /// The vocabulary string of one id.
    pub fn token(&self, id: u32) -> Result<String> {
        self.inner
            .id_to_token(id)
            .ok_or(ModelError::TokenOutOfRange {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }

    /// The chat prompt text, ending with the generation prompt.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String> {
        let chat = self.chat.as_ref().ok_or_else(|| {
            err("no chat template (tokenizer_config.json missing or without chat_template)")
        })?;
        chat.render(messages, true)
    }

    /// Token ids of [`Tokenizer::chat_prompt`].
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_with(&self.chat_prompt(messages)?, false)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab_size = self.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab_size) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }
}

/// Streams the text of a growing token sequence, as `draftc generate`
/// prints it: each [`TextStream::push`] returns the text the new tokens
/// complete. Only a short window of recent tokens is decoded per call
/// (incremental detokenization, as HF's `TextStreamer` and vLLM do), so a
/// token costs the same at position 10 and at position 1,000. A piece that
/// ends inside a multi-byte character (U+FFFD at the end) waits for the
/// next token.
#[derive(Debug, Default, Clone)]
pub struct TextStream {
    tokens: Vec<u32>,
    /// Start of the window decoded for context (its text is already out).
    prefix: usize,
    /// Tokens up to here have been printed.
    read: usize,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Appends `tok`; returns the newly completed text (possibly empty).
    /// An id outside the vocabulary is an error and is not kept.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        tok.check_ids(&[id])?;
        self.tokens.push(id);
        let before = tok.decode(&self.tokens[self.prefix..self.read])?;
        let now = tok.decode(&self.tokens[self.prefix..])?;
        if now.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let piece = match now.strip_prefix(before.as_str()) {
            Some(new) => new.to_string(),
            // A decoder that rewrites the window's start (none of the
            // ChatML byte-level tokenizers does): decode everything.
            None => {
                let all = tok.decode(&self.tokens[..self.read])?;
                let full = tok.decode(&self.tokens)?;
                full.strip_prefix(all.as_str()).unwrap_or(&full).to_string()
            }
        };
        self.prefix = self.read;
        self.read = self.tokens.len();
        Ok(piece)
    }
}

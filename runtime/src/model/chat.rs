//! Chat templates: the Jinja text a checkpoint ships in
//! `tokenizer_config.json`, rendered by a real Jinja engine (minijinja, with
//! minijinja-contrib's Python-compatible string and dict methods) set up the
//! way transformers' `apply_chat_template` sets up jinja2: `trim_blocks` and
//! `lstrip_blocks`, loop controls, `raise_exception(msg)`, `tojson`, the
//! tokenizer's special tokens (`bos_token`, `eos_token`) as variables, and
//! `messages`, `add_generation_prompt` and `tools` (none) in the context.
//! A template that does not parse is refused when the checkpoint loads; one
//! that refuses a conversation (`raise_exception`) is an error naming its
//! message. `runtime/tests/model_tokenizer.rs` checks the output against
//! transformers' own rendering of several templates.

use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use serde::Serialize;

use super::error::{ModelError, Result};

fn err(detail: impl Into<String>) -> ModelError {
    ModelError::Tokenizer {
        detail: detail.into(),
    }
}

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

const NAME: &str = "chat_template";

/// A checkpoint's chat template, parsed.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Parses a Jinja chat template; a syntax error is an error naming its
    /// line. The special tokens are empty until [`Self::with_tokens`].
    pub fn from_jinja(template: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // jinja2's default: a missing field is undefined (falsy), and
        // printing it prints nothing.
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(NAME, template.to_string())
            .map_err(|e| err(format!("chat template does not parse: {}", describe(&e))))?;
        Ok(ChatTemplate {
            env,
            bos_token: String::new(),
            eos_token: String::new(),
        })
    }

    /// The template with the tokenizer's `bos_token` and `eos_token` text.
    pub fn with_tokens(mut self, bos: Option<String>, eos: Option<String>) -> Self {
        self.bos_token = bos.unwrap_or_default();
        self.eos_token = eos.unwrap_or_default();
        self
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends
    /// with the template's generation prompt (for a ChatML template,
    /// `<|im_start|>assistant\n`).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| err(format!("chat template: {}", describe(&e))))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                tools => (),
            })
            .map_err(|e| {
                err(format!(
                    "the chat template refused the conversation: {}",
                    describe(&e)
                ))
            })
    }
}

/// An error's message (for `raise_exception`, the template's own words)
/// with the template line it came from.
fn describe(e: &Error) -> String {
    let what = e.detail().map_or_else(|| e.to_string(), str::to_string);
    match e.line() {
        Some(line) => format!("{what} (template line {line})"),
        None => what,
    }
}

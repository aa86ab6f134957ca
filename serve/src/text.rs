//! A completion's text as it streams: tokens become whole UTF-8 pieces
//! (`TextStream`), end-of-sequence ids are not text, and stop strings end
//! the text before them. A piece that might be the start of a stop string
//! is held back until the next token says otherwise, so a stop string never
//! reaches the client in part.

use draftc_runtime::model::tokenizer::{TextStream, Tokenizer};

/// Why a completion ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The text of one completion, fed token by token.
pub struct TextOut {
    stream: TextStream,
    text: String,
    sent: usize,
    stops: Vec<String>,
    stop_ids: Vec<u32>,
    /// Tokens consumed (the one that ended the completion included).
    pub tokens: usize,
    pub finish: Option<FinishReason>,
}

impl TextOut {
    pub fn new(stops: Vec<String>, stop_ids: Vec<u32>) -> TextOut {
        TextOut {
            stream: TextStream::new(),
            text: String::new(),
            sent: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            stop_ids,
            tokens: 0,
            finish: None,
        }
    }

    /// Feeds one token; returns the text that may be sent now. After the
    /// completion ended (a stop id or string), tokens are ignored.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if self.finish.is_some() {
            return String::new();
        }
        self.tokens += 1;
        if self.stop_ids.contains(&id) {
            self.finish = Some(FinishReason::Stop);
            return self.rest();
        }
        // An id the tokenizer cannot decode adds no text.
        let piece = self.stream.push(tok, id).unwrap_or_default();
        self.text.push_str(&piece);
        if let Some(at) = self.first_stop() {
            self.text.truncate(at);
            self.finish = Some(FinishReason::Stop);
            return self.rest();
        }
        let hold = self.held_back();
        let end = self.text.len() - hold;
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }

    /// Ends the completion for `reason` unless it already ended; returns
    /// the text still held back.
    pub fn end(&mut self, reason: FinishReason) -> String {
        if self.finish.is_none() {
            self.finish = Some(reason);
        }
        self.rest()
    }

    /// The whole text so far (stop string excluded).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn rest(&mut self) -> String {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }

    /// The byte offset of the earliest stop string in the text.
    fn first_stop(&self) -> Option<usize> {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min()
    }

    /// Bytes at the end of the unsent text that begin some stop string.
    fn held_back(&self) -> usize {
        let unsent = &self.text[self.sent..];
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in unsent.char_indices() {
                let tail = &unsent[i..];
                if tail.len() > hold && s.starts_with(tail) {
                    hold = tail.len();
                }
            }
        }
        hold
    }
}

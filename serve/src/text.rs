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
        self.push_text(&piece)
    }

    /// Appends decoded text; returns what may be sent now.
    fn push_text(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> (Vec<String>, String, Option<FinishReason>) {
        let mut t = TextOut::new(stops.iter().map(|s| s.to_string()).collect(), vec![]);
        let mut sent = Vec::new();
        for p in pieces {
            if t.finish.is_some() {
                break;
            }
            t.tokens += 1;
            sent.push(t.push_text(p));
        }
        let rest = t.end(FinishReason::Length);
        sent.push(rest);
        (sent, t.text().to_string(), t.finish)
    }

    #[test]
    fn text_without_stops_goes_out_as_it_comes() {
        let (sent, text, f) = feed(&[], &["Hel", "lo", " wörld"]);
        assert_eq!(sent, ["Hel", "lo", " wörld", ""]);
        assert_eq!(text, "Hello wörld");
        assert_eq!(f, Some(FinishReason::Length));
    }

    #[test]
    fn a_stop_string_across_pieces_is_never_sent_in_part() {
        let (sent, text, f) = feed(&["END"], &["ab E", "N", "Dcd"]);
        assert_eq!(sent.concat(), "ab ");
        assert!(sent.iter().all(|s| !s.contains('E')));
        assert_eq!(text, "ab ");
        assert_eq!(f, Some(FinishReason::Stop));
    }

    #[test]
    fn held_text_that_was_not_a_stop_is_sent_later() {
        let (sent, text, f) = feed(&["END"], &["ab E", "X", " EN"]);
        assert_eq!(sent, ["ab ", "EX", " ", "EN"]);
        assert_eq!(text, "ab EX EN");
        assert_eq!(f, Some(FinishReason::Length));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_stops_cut_on_boundaries() {
        let (sent, text, _) = feed(&["zz", "é!"], &["caf", "é! then zz"]);
        assert_eq!(text, "caf");
        assert_eq!(sent.concat(), "caf");
        let (_, text, _) = feed(&["zz", "é!"], &["a zz é!"]);
        assert_eq!(text, "a ");
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let (_, text, f) = feed(&[""], &["abc"]);
        assert_eq!((text.as_str(), f), ("abc", Some(FinishReason::Length)));
    }
}

//! Prompt-lookup n-gram drafting (`--drafter prompt-lookup`; "PLD", Saxena
//! 2023, a baseline of paper 003 Table 1): no draft model at all. The last
//! `n` tokens of the history are looked up in the history itself, and the
//! tokens that followed their most recent earlier occurrence are proposed.
//! `n` goes from `max_ngram` down to `min_ngram`; the first `n` with a match
//! wins. Copy-heavy outputs (code edits, summaries quoting the prompt) get
//! long proposals; text that never repeats gets none.
//!
//! The tree variant collects several distinct continuations (from different
//! earlier occurrences, newest first, then from shorter n-grams) and merges
//! them on shared prefixes into one [`DraftTree`] under the node budget.
//!
//! Lookups scan the history (`O(len · n)` per call); histories here are a
//! few thousand tokens, far below the cost of one target forward.
//! Proposed nodes carry log-prob 0: the drafter is deterministic, so
//! acceptance treats them as one-hot drafts (`q = None` in `draftc_ops::tree`).

use super::tree::{Candidate, DraftTree};
use super::SpecError;

/// Prompt-lookup drafter settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram tried first.
    pub max_ngram: usize,
    /// Shortest n-gram tried.
    pub min_ngram: usize,
    /// Most tokens proposed per round (the draft budget `k`).
    pub max_tokens: usize,
}

impl Default for PromptLookup {
    /// n from 3 down to 1, up to 10 tokens (the usual PLD settings).
    fn default() -> Self {
        PromptLookup {
            max_ngram: 3,
            min_ngram: 1,
            max_tokens: 10,
        }
    }
}

impl PromptLookup {
    /// Checked constructor: `1 <= min_ngram <= max_ngram`.
    pub fn new(
        min_ngram: usize,
        max_ngram: usize,
        max_tokens: usize,
    ) -> Result<PromptLookup, SpecError> {
        if min_ngram == 0 || min_ngram > max_ngram {
            return Err(SpecError::InvalidConfig {
                what: "prompt lookup n-gram range",
                reason: format!(
                    "need 1 <= min_ngram <= max_ngram, found min {min_ngram}, max {max_ngram}"
                ),
            });
        }
        Ok(PromptLookup {
            max_ngram,
            min_ngram,
            max_tokens,
        })
    }

    /// Start indices of earlier occurrences of the last `n` tokens, newest
    /// first. An occurrence must end before the last token, so at least one
    /// token follows it.
    fn matches(history: &[u32], n: usize) -> impl Iterator<Item = usize> + '_ {
        let len = history.len();
        let pattern = &history[len.saturating_sub(n)..];
        let last_start = if len > n { len - n - 1 } else { 0 };
        let valid = len > n && n > 0;
        (0..=last_start)
            .rev()
            .filter(move |&i| valid && &history[i..i + n] == pattern)
    }

    /// Up to `max_tokens` tokens that followed the most recent earlier
    /// occurrence of the longest matching suffix n-gram; empty if none.
    pub fn propose(&self, history: &[u32]) -> Vec<u32> {
        if self.max_tokens == 0 {
            return Vec::new();
        }
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if let Some(i) = Self::matches(history, n).next() {
                let start = i + n;
                let end = (start + self.max_tokens).min(history.len());
                return history[start..end].to_vec();
            }
        }
        Vec::new()
    }

    /// Up to `max_branches` distinct continuations (newest match of the
    /// longest n-gram first) merged into a tree of at most
    /// `min(budget, max_tokens · max_branches)` nodes. Each continuation is
    /// up to `max_tokens` long. With one branch this is [`Self::propose`]
    /// as a chain.
    pub fn propose_tree(&self, history: &[u32], max_branches: usize, budget: usize) -> DraftTree {
        let mut seqs: Vec<Vec<Candidate>> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        'outer: for n in (self.min_ngram..=self.max_ngram).rev() {
            for i in Self::matches(history, n) {
                if seqs.len() >= max_branches {
                    break 'outer;
                }
                let start = i + n;
                let end = (start + self.max_tokens).min(history.len());
                let cont = &history[start..end];
                if cont.is_empty() || !seen.insert(cont.to_vec()) {
                    continue;
                }
                // A continuation that is a prefix of one already taken adds nothing.
                if seqs
                    .iter()
                    .any(|s| s.len() >= cont.len() && s.iter().zip(cont).all(|(a, b)| a.0 == *b))
                {
                    continue;
                }
                seqs.push(cont.iter().map(|&t| (t, 0.0)).collect());
            }
        }
        DraftTree::from_sequences(&seqs, budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn copy_heavy_history_gives_long_proposals() {
        // "def f ( x ) : return x" written once, then being copied.
        let code = [10, 11, 12, 13, 14, 15, 16, 13, 17];
        let mut h: Vec<u32> = vec![1, 2];
        h.extend(code);
        h.extend([3, 4]);
        h.extend(&code[..3]); // the copy has started: 10 11 12
        let pl = PromptLookup::default();
        assert_eq!(pl.propose(&h), vec![13, 14, 15, 16, 13, 17, 3, 4, 10, 11]);
        let short = PromptLookup::new(1, 3, 4).unwrap();
        assert_eq!(short.propose(&h), vec![13, 14, 15, 16]);
    }

    #[test]
    fn no_match_gives_empty_proposal() {
        let pl = PromptLookup::default();
        assert!(pl.propose(&[1, 2, 3, 4, 5]).is_empty());
        assert!(pl.propose(&[]).is_empty());
        assert!(pl.propose(&[7]).is_empty());
        assert!(pl.propose_tree(&[1, 2, 3], 4, 10).is_empty());
    }

    #[test]
    fn longest_ngram_wins_over_newer_shorter_match() {
        // Suffix (5, 6): the bigram occurred at 0 (followed by 7); the
        // unigram 6 occurred more recently at 4 (followed by 9).
        let h = [5, 6, 7, 8, 6, 9, 5, 6];
        let pl = PromptLookup::new(1, 2, 2).unwrap();
        assert_eq!(pl.propose(&h), vec![7, 8]);
        let uni = PromptLookup::new(1, 1, 2).unwrap();
        assert_eq!(uni.propose(&h), vec![9, 5]);
    }

    #[test]
    fn most_recent_occurrence_is_used() {
        let h = [1, 2, 3, 1, 2, 4, 1, 2];
        let pl = PromptLookup::new(2, 2, 1).unwrap();
        assert_eq!(pl.propose(&h), vec![4]);
    }

    #[test]
    fn tree_variant_collects_distinct_continuations() {
        let h = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 8, 1, 2];
        let pl = PromptLookup::new(1, 2, 2).unwrap();
        let t = pl.propose_tree(&h, 4, 100);
        // Continuations of (1, 2), newest first: [3, 8], [4, 9], [3, 9].
        let roots: Vec<u32> = t.children(None).iter().map(|&c| t.node(c).token).collect();
        assert_eq!(roots, vec![3, 4]);
        let three = t.children(None)[0];
        let after3: Vec<u32> = t
            .children(Some(three))
            .iter()
            .map(|&c| t.node(c).token)
            .collect();
        assert_eq!(after3, vec![8, 9]);
        assert_eq!(t.len(), 5);
        // One branch = the chain of `propose`.
        let one = pl.propose_tree(&h, 1, 100);
        assert!(one.is_chain());
        assert_eq!(one.tokens(), pl.propose(&h));
        assert_eq!(pl.propose_tree(&h, 4, 3).len(), 3);
    }

    #[test]
    fn bad_ranges_are_errors() {
        assert!(PromptLookup::new(0, 3, 5).is_err());
        let e = PromptLookup::new(4, 3, 5).unwrap_err().to_string();
        assert!(e.contains("min 4, max 3"), "{e}");
    }

    proptest! {
        #[test]
        fn proposals_really_followed_the_suffix(
            h in prop::collection::vec(0u32..4, 0..80),
            max_ngram in 1usize..5,
            k in 0usize..8,
        ) {
            let pl = PromptLookup::new(1, max_ngram, k).unwrap();
            let p = pl.propose(&h);
            prop_assert!(p.len() <= k);
            if !p.is_empty() {
                // Some n-gram suffix occurs earlier, followed by exactly `p`
                // (or by the rest of the history when shorter).
                let ok = (1..=max_ngram).any(|n| {
                    n < h.len() && (0..h.len() - n).any(|i| {
                        h[i..i + n] == h[h.len() - n..]
                            && h[i + n..].starts_with(&p)
                            && (p.len() == k || i + n + p.len() == h.len())
                    })
                });
                prop_assert!(ok);
            } else if k > 0 && h.len() >= 2 {
                // Empty only when even the last token never occurred before.
                let last = h[h.len() - 1];
                prop_assert!(!h[..h.len() - 1].contains(&last));
            }
        }

        #[test]
        fn appending_the_proposal_of_a_periodic_text_continues_it(
            period in prop::collection::hash_set(0u32..1000, 1..6),
            reps in 2usize..5,
        ) {
            // A periodic history (distinct tokens within the period) is
            // continued periodically (maximal copying).
            let period: Vec<u32> = period.into_iter().collect();
            let h: Vec<u32> = period.iter().cycle().take(period.len() * reps).copied().collect();
            let pl = PromptLookup::new(1, 3, 4).unwrap();
            let p = pl.propose(&h);
            prop_assert!(!p.is_empty());
            for (j, &t) in p.iter().enumerate() {
                prop_assert_eq!(t, period[(h.len() + j) % period.len()]);
            }
        }
    }
}

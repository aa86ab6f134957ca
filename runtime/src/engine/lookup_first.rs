//! [`LookupFirst`]: prompt lookup in front of a model drafter
//! (`--lookup N`). Every round, a sequence whose last `n ≥ N` tokens
//! occurred earlier in its own history (chat template, prompt and output)
//! is drafted by prompt lookup: the chain of tokens that followed their
//! most recent occurrence, up to the round's budget (`speculation::prompt_lookup`,
//! n tried from [`MAX_NGRAM`] down to `N`). The model drafter drafts the
//! other sequences, and is not run at all in a round where every sequence
//! has a match.
//!
//! A lookup costs no pass, and a long n-gram match is usually a copy in
//! progress (a name, a quoted phrase, a list restated from the prompt), which
//! the target accepts more often than a learned drafter's guess: on 16
//! held-out ShareGPT prompts, lookup drafted 15 % of Beagle's rounds at
//! `N` = 2 and τ rose from 1.65 to 1.84 (docs/speculative.md, "Prompt
//! lookup first").
//!
//! The model drafter still observes every committed row, whichever drafter
//! proposed it, so its memory of target states stays complete. Output stays
//! lossless whatever is drafted: the engine verifies every tree.

use cubecl::prelude::*;

use std::ops::RangeInclusive;

use super::drafters::{DraftCall, Drafter, Observed, PromptLookupDrafter, SeqView};
use super::target::EngineError;
use crate::exec::Profile;
use crate::speculation::{Confidence, DraftTree, PromptLookup};

/// Longest n-gram a lookup tries first.
pub const MAX_NGRAM: usize = 3;

/// The values `--lookup N` (the shortest n-gram match) may take.
pub const MIN_NGRAMS: RangeInclusive<usize> = 1..=MAX_NGRAM;

/// Rounds by who drafted them (per sequence).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupRounds {
    /// Sequence-rounds drafted.
    pub rounds: usize,
    /// Of those, drafted by prompt lookup.
    pub by_lookup: usize,
}

/// Prompt lookup first, a model drafter where the history has no match.
pub struct LookupFirst<R: Runtime> {
    model: Box<dyn Drafter<R>>,
    /// A chain of n-grams `min_ngram..=MAX_NGRAM`; its `max_tokens` is set
    /// to each round's budget.
    lookup: PromptLookupDrafter,
    counts: LookupRounds,
}

impl<R: Runtime> LookupFirst<R> {
    /// `min_ngram`: the shortest match that wins a round for lookup
    /// ([`MIN_NGRAMS`]).
    pub fn new(model: Box<dyn Drafter<R>>, min_ngram: usize) -> Result<Self, EngineError> {
        // PromptLookup's own range check (1 <= min_ngram <= MAX_NGRAM) is
        // exactly MIN_NGRAMS.
        let lookup = PromptLookup::new(min_ngram, MAX_NGRAM, 1)
            .map_err(|e| EngineError::Invalid(format!("--lookup {min_ngram}: {e}")))?;
        Ok(LookupFirst {
            model,
            lookup: PromptLookupDrafter {
                lookup,
                branches: 1,
            },
            counts: LookupRounds::default(),
        })
    }

    /// Rounds drafted so far, and how many by lookup.
    pub fn counts(&self) -> LookupRounds {
        self.counts
    }
}

impl<R: Runtime> Drafter<R> for LookupFirst<R> {
    fn name(&self) -> String {
        format!(
            "{}+lookup{}",
            self.model.name(),
            self.lookup.lookup.min_ngram
        )
    }

    fn length(&self) -> usize {
        self.model.length()
    }

    fn observe(&mut self, pass: Observed<'_, R>) -> Result<(), EngineError> {
        self.model.observe(pass)
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (target, seqs, budget) = (call.target, call.seqs, call.budget);
        let mut trees = Vec::with_capacity(seqs.len());
        let mut rest = Vec::new();
        self.lookup.lookup.max_tokens = budget;
        for (i, s) in seqs.iter().enumerate() {
            let t = self
                .lookup
                .propose(s.tokens, budget)
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            if t.is_empty() {
                rest.push(i);
            }
            trees.push(t);
        }
        self.counts.rounds += seqs.len();
        self.counts.by_lookup += seqs.len() - rest.len();
        if rest.is_empty() {
            return Ok(trees);
        }
        let views: Vec<SeqView<'_>> = rest.iter().map(|&i| seqs[i].clone()).collect();
        let drafted = self.model.draft(DraftCall {
            target,
            seqs: &views,
            budget,
        })?;
        if drafted.len() != views.len() {
            return Err(EngineError::Invalid(format!(
                "{} drafted {} trees for {} sequences",
                self.model.name(),
                drafted.len(),
                views.len()
            )));
        }
        for (i, t) in rest.into_iter().zip(drafted) {
            trees[i] = t;
        }
        Ok(trees)
    }

    fn verifying(&mut self, seqs: &[SeqView<'_>], trees: &[DraftTree]) -> Result<(), EngineError> {
        self.model.verifying(seqs, trees)
    }

    fn verified(&mut self, seconds: f64, draft_tokens: usize, rounds: &[(usize, usize)]) {
        self.model.verified(seconds, draft_tokens, rounds)
    }

    fn finished(&mut self) -> Result<(), EngineError> {
        self.model.finished()
    }

    fn reset(&mut self, slot: usize) {
        self.model.reset(slot)
    }

    fn profile(&self) -> Option<&Profile> {
        self.model.profile()
    }

    fn set_confidence(&mut self, confidence: Confidence) -> Result<(), EngineError> {
        self.model.set_confidence(confidence)
    }

    fn lookup_rounds(&self) -> Option<LookupRounds> {
        Some(self.counts)
    }
}

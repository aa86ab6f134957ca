//! Concurrent drafting (paper 003): a drafter on its own thread and client
//! drafts round r+1 while the target verifies round r. On the tiny random
//! target, for a draft LM with the target's own weights (every draft right:
//! the pipeline's re-rooting path), a draft LM with other weights (most
//! drafts discarded), prompt lookup, chain and multi-sequence trees, fixed
//! and hardware-aware budgets, and batch sizes 1, 3 and 16, the output
//! equals autoregressive greedy decoding token for token.

mod tiny;

use draftc_codegen::PlanDType;
use draftc_runtime::engine::{
    BudgetPolicy, ConcurrentDrafter, DraftRequest, DraftWorker, LmDrafter, SyncTokenDrafter,
    TokenDrafter,
};
use draftc_runtime::speculation::{DraftTree, TreeShape};
use tiny::*;

/// A worker running a tiny draft LM with weights from `seed`.
fn lm_worker(slots: usize, seed: u64, shape: TreeShape) -> DraftWorker {
    DraftWorker::spawn(move || {
        let (lm, _) = target_seeded(slots, PlanDType::F32, seed);
        Ok(Box::new(LmDrafter::new(lm, shape, "tiny-lm")) as Box<dyn TokenDrafter>)
    })
    .unwrap()
}

#[test]
fn a_draft_lm_equal_to_the_target_has_every_draft_reused() {
    let (mut t, _) = target(3);
    for b in [1, 3] {
        let mut d = ConcurrentDrafter::new(lm_worker(3, 7, TreeShape::Chain), BudgetPolicy::Fixed);
        let got = clean_lossless_run(&mut t, &mut d, b, 4);
        // The drafts of round r+1 were made before round r was verified;
        // with the target's own weights they are right, so they are
        // re-rooted onto the committed tokens instead of being discarded.
        assert!(
            d.reused > 3 * d.discarded,
            "reused {} discarded {}",
            d.reused,
            d.discarded
        );
        assert!(got.stats.tau() > 3.0, "tau {}", got.stats.tau());
    }
}

#[test]
fn a_different_draft_lm_is_lossless_for_chains_and_multi_sequence_trees() {
    let (mut t, _) = target(16);
    for shape in [TreeShape::Chain, TreeShape::MultiSequence { seqs: 3 }] {
        for (b, budget, policy) in [
            (1, 3, BudgetPolicy::Fixed),
            (3, 6, BudgetPolicy::HardwareAware),
            (16, 4, BudgetPolicy::HardwareAware),
        ] {
            let mut d = ConcurrentDrafter::new(lm_worker(16, 8, shape.clone()), policy);
            clean_lossless_run(&mut t, &mut d, b, budget);
            assert!(d.discarded > 0, "{shape}: random drafts are mostly wrong");
            assert!(d.budgets.iter().all(|&k| (1..=budget).contains(&k)));
        }
    }
}

#[test]
fn concurrent_prompt_lookup_is_lossless() {
    let (mut t, _) = target(3);
    for b in [1, 3] {
        let worker =
            DraftWorker::spawn(|| Ok(Box::new(prompt_lookup(8, 2)) as Box<dyn TokenDrafter>))
                .unwrap();
        let mut d = ConcurrentDrafter::new(worker, BudgetPolicy::HardwareAware);
        clean_lossless_run(&mut t, &mut d, b, 8);
    }
}

#[test]
fn the_same_drafters_run_sequentially() {
    let (mut t, _) = target(3);
    let (lm, _) = target_seeded(3, PlanDType::F32, 7);
    let mut d = SyncTokenDrafter(Box::new(LmDrafter::new(lm, TreeShape::Chain, "tiny-lm")));
    let got = clean_lossless_run(&mut t, &mut d, 3, 4);
    assert!(got.stats.tau() > 3.0, "tau {}", got.stats.tau());
}

/// Fails every other request and proposes out-of-vocabulary ids otherwise.
struct Broken(usize);

impl TokenDrafter for Broken {
    fn name(&self) -> String {
        "broken".into()
    }

    fn draft(&mut self, requests: &[DraftRequest]) -> Result<Vec<DraftTree>, String> {
        self.0 += 1;
        if self.0.is_multiple_of(2) {
            return Err("drafter fault".into());
        }
        Ok(requests
            .iter()
            .map(|_| DraftTree::chain(&[5000, 3], &[0.0, 0.0]).unwrap())
            .collect())
    }
}

#[test]
fn a_failing_drafter_thread_changes_nothing() {
    let (mut t, _) = target(3);
    let want = reference(&mut t, 3);
    let worker = DraftWorker::spawn(|| Ok(Box::new(Broken(0)) as Box<dyn TokenDrafter>)).unwrap();
    let mut d = ConcurrentDrafter::new(worker, BudgetPolicy::Fixed);
    let got = spec_run(&mut t, &mut d, 3, 4).unwrap();
    assert_eq!(got.tokens, want);
    assert!(got.stats.draft_errors > 0);
    let err = DraftWorker::spawn(|| Err("no device for the drafter".into()))
        .err()
        .unwrap();
    assert!(err.contains("no device"), "{err}");
}

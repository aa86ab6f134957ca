//! EAGLE-family drafting (`engine::EagleDrafter`) is what its description
//! computes, not only lossless: a round's draft does not depend on what the
//! drafter cached in earlier rounds (committed rows come from target states
//! and the tokens alone), and a draft tree's branch sees only its own
//! ancestors (its first-child path is the chain the drafter would draft).
//! Tiny random target with four layers (EAGLE-3 taps HS[2], HS[n/2] and
//! HS[n − 3]), random drafter weights.

mod tiny;

use tiny::*;

use draftc_codegen::PlanDType;
use draftc_runtime::engine::{Request, SeqView, TargetModel};
use draftc_runtime::exec::HostWeights;
use draftc_runtime::speculation::DraftTree;

/// Records sequence 0's tokens and draft every round.
#[derive(Default)]
struct Rounds(Vec<(Vec<u32>, DraftTree)>);

impl Watch for Rounds {
    fn drafted(&mut self, _name: &str, seqs: &[SeqView<'_>], trees: &[DraftTree]) {
        for (s, tree) in seqs.iter().zip(trees) {
            if s.slot == 0 {
                self.0.push((s.tokens.to_vec(), tree.clone()));
            }
        }
    }
}

fn recording(t: &TargetModel<Wgpu>, tw: &HostWeights, name: &str, shape: &str) -> Watched<Rounds> {
    Watched {
        inner: drafter(t, tw, name, Some(shape), PlanDType::F32),
        watch: Rounds::default(),
    }
}

/// The tokens along the first child of every node from the root, with
/// the drafter's log-probabilities of them.
fn first_path(tree: &DraftTree) -> Vec<(u32, f32)> {
    let mut out = Vec::new();
    let mut at = None;
    while let Some(&c) = tree.children(at).first() {
        out.push((tree.node(c).token, tree.node(c).logprob));
        at = Some(c);
    }
    out
}

/// A fresh chain drafter's first draft after a prefill of `tokens` but the
/// last (which the target then picks, greedy, as the root).
fn fresh_chain(
    t: &mut TargetModel<Wgpu>,
    tw: &HostWeights,
    name: &str,
    tokens: &[u32],
    budget: usize,
) -> Vec<(u32, f32)> {
    let mut d = recording(t, tw, name, "chain");
    let prompt = tokens[..tokens.len() - 1].to_vec();
    greedy_speculative(t, &mut d, &[Request { prompt }], 2, budget).unwrap();
    let (seen, tree) = d.watch.0.first().expect("one round drafted").clone();
    assert_eq!(seen, tokens, "the fresh run reached the same tokens");
    first_path(&tree)
}

#[test]
fn a_draft_depends_only_on_the_tokens_and_a_branch_only_on_its_ancestors() {
    let (mut t, tw) = target_layers(3, 4);
    for name in ["eagle", "eagle3"] {
        // Trees wide enough that a first-path node is drafted with a
        // cousin's row already in the cache's tail.
        for (shape, budget) in [
            ("chain", 3),
            ("static(2, 2, 2)", 8),
            ("dynamic(depth=3, topk=2, nodes=8)", 8),
        ] {
            let mut d = recording(&t, &tw, name, shape);
            spec_run(&mut t, &mut d, 3, budget).unwrap();
            assert!(
                d.watch.0.len() > 3,
                "{name} {shape}: {} rounds",
                d.watch.0.len()
            );
            // Every round after the first (whose cache was empty anyway).
            for (tokens, tree) in d.watch.0.iter().skip(1) {
                let path = first_path(tree);
                let chain = fresh_chain(&mut t, &tw, name, tokens, path.len().max(1));
                assert_eq!(path.len(), chain.len(), "{name} {shape} after {tokens:?}");
                // Equal tokens, and probabilities equal up to f32 rounding:
                // a cousin's row or a stale cached row moves them.
                for (a, b) in path.iter().zip(&chain) {
                    assert!(
                        a.0 == b.0 && (a.1 - b.1).abs() < 1e-4,
                        "{name} {shape}: the draft after {tokens:?}: {path:?} against {chain:?}"
                    );
                }
            }
        }
    }
}

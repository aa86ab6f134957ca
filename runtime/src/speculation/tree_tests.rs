//! Tests of `speculation::tree`: conventions against `draftc_ops` (mask positions,
//! greedy acceptance), builders, budgets and `TreeShape` text.

use super::*;
use crate::speculation::Confidence;
use draftc_ops::attention::{validate_parents, SeqBatch};
use draftc_ops::tree::{accept_ref, AcceptMode};
use proptest::prelude::*;

/// A deterministic toy drafter: `width` candidates whose tokens and
/// log-probs depend only on the path (FNV hash + LCG), vocabulary `vocab`.
fn toy_drafter(seed: u64, vocab: u32, width: usize) -> impl FnMut(&[u32]) -> Vec<Candidate> {
    move |path: &[u32]| {
        let mut next = path_rng(seed, path);
        (0..width)
            .map(|_| {
                let tok = next() % vocab;
                let lp = -((next() % 1000) as f32) / 250.0;
                (tok, lp)
            })
            .collect()
    }
}

/// Numbers that depend only on `seed` and `path` (FNV hash + LCG).
fn path_rng(seed: u64, path: &[u32]) -> impl FnMut() -> u32 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &t in path {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
    }
    move || {
        h = h
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (h >> 33) as u32
    }
}

/// Random valid tree: `n` nodes, parent of node `i` in `None | 0..i`.
fn arb_tree(max_nodes: usize, vocab: u32) -> impl Strategy<Value = DraftTree> {
    prop::collection::vec((any::<u32>(), 0..vocab, -5.0f32..0.0), 0..max_nodes).prop_map(|raw| {
        let mut t = DraftTree::new();
        for (i, (p, tok, lp)) in raw.into_iter().enumerate() {
            let parent = (p as usize) % (i + 1);
            let parent = parent.checked_sub(1); // 0 → root
            t.push(parent, tok, lp).unwrap();
        }
        t
    })
}

fn assert_ancestor_closed(t: &DraftTree) {
    for (i, n) in t.nodes().iter().enumerate() {
        if let Some(p) = n.parent {
            assert!(p < i, "node {i} has parent {p} after it");
            assert_eq!(n.depth, t.node(p).depth + 1);
        } else {
            assert_eq!(n.depth, 0);
        }
    }
}

#[test]
fn push_checks_parents_and_accumulates() {
    let mut t = DraftTree::new();
    let a = t.push(None, 7, -0.5).unwrap();
    let b = t.push(Some(a), 8, -0.25).unwrap();
    assert_eq!(t.node(b).depth, 1);
    assert_eq!(t.node(b).cum_logprob, -0.75);
    assert_eq!(
        t.push(Some(5), 9, 0.0),
        Err(SpecError::InvalidParent { node: 2, parent: 5 })
    );
    // Positive and NaN log-probs are not probabilities: clamped.
    let c = t.push(Some(b), 1, 3.0).unwrap();
    assert_eq!(t.node(c).logprob, 0.0);
    let d = t.push(Some(b), 2, f32::NAN).unwrap();
    assert_eq!(t.node(d).cum_logprob, f32::NEG_INFINITY);
}

#[test]
fn paths_children_leaves() {
    // root ─ 0 ─ 2 ─ 3
    //      └ 1   └ 4
    let mut t = DraftTree::new();
    t.push(None, 10, 0.0).unwrap();
    t.push(None, 11, 0.0).unwrap();
    t.push(Some(0), 12, 0.0).unwrap();
    t.push(Some(2), 13, 0.0).unwrap();
    t.push(Some(2), 14, 0.0).unwrap();
    assert_eq!(t.path_to(4), vec![0, 2, 4]);
    assert_eq!(t.path_tokens(3), vec![10, 12, 13]);
    assert_eq!(t.children(None), vec![0, 1]);
    assert_eq!(t.children(Some(2)), vec![3, 4]);
    assert_eq!(t.leaves(), vec![1, 3, 4]);
    assert_eq!(t.levels(), 3);
    assert!(!t.is_chain());
    assert_eq!(t.parents_u32(), vec![TREE_ROOT, TREE_ROOT, 0, 2, 2]);
    assert_eq!(t.positions(100), vec![100, 100, 101, 102, 102]);
    assert_eq!(t.verify_parents(), vec![TREE_ROOT, 0, 0, 1, 3, 3]);
    assert_eq!(t.verify_tokens(99), vec![99, 10, 11, 12, 13, 14]);
}

#[test]
fn greedy_acceptance_example_matches_ops_example() {
    // The example of ops/src/tree/reference.rs, minus its root node:
    // verify tokens [9, 1, 2, 1, 3], parents [ROOT, 0, 0, 2, 2]; argmax at
    // the root 2, after node "2" 1, after node "1"(index 3) 3.
    let mut t = DraftTree::new();
    t.push(None, 1, 0.0).unwrap();
    t.push(None, 2, 0.0).unwrap();
    t.push(Some(1), 1, 0.0).unwrap();
    t.push(Some(1), 3, 0.0).unwrap();
    let acc = t.longest_accepted_path(2, &[0, 1, 3, 0]).unwrap();
    assert_eq!(
        acc,
        Accepted {
            nodes: vec![1, 2],
            bonus: 3
        }
    );
    assert_eq!(acc.emitted(&t), vec![2, 1, 3]);
    assert!(matches!(
        t.longest_accepted_path(2, &[0]),
        Err(SpecError::LengthMismatch { .. })
    ));
    // Nothing matches: only the bonus.
    let none = t.longest_accepted_path(5, &[0, 0, 0, 0]).unwrap();
    assert_eq!(none.nodes, Vec::<usize>::new());
    assert_eq!(none.emitted(&t), vec![5]);
}

#[test]
fn chain_builder() {
    let t = DraftTree::chain(&[4, 5, 6], &[-0.1, -0.2, -0.3]).unwrap();
    assert!(t.is_chain());
    assert_eq!(t.parents_u32(), vec![TREE_ROOT, 0, 1]);
    assert!((t.node(2).cum_logprob + 0.6).abs() < 1e-6);
    assert!(matches!(
        DraftTree::chain(&[1, 2], &[0.0]),
        Err(SpecError::LengthMismatch {
            expected: 2,
            found: 1,
            ..
        })
    ));
    let acc = t.longest_accepted_path(4, &[5, 9, 7]).unwrap();
    assert_eq!(acc.nodes, vec![0, 1]);
    assert_eq!(acc.bonus, 9);
}

#[test]
fn static_321_from_per_depth_candidates() {
    let cands = vec![
        vec![(1, -0.1), (2, -0.5), (3, -1.0), (4, -3.0)],
        vec![(10, -0.2), (11, -0.9)],
        vec![(20, -0.3), (21, -2.0)],
    ];
    let shape: TreeShape = "3,2,1".parse().unwrap();
    let TreeShape::Static(b) = &shape else {
        unreachable!()
    };
    let full = DraftTree::static_from_candidates(b, &cands, usize::MAX, None);
    assert_eq!(full.len(), 3 + 6 + 6);
    assert_eq!(shape.max_nodes(), Some(15));
    assert_eq!(full.children(None).len(), 3);
    for c in full.children(None) {
        let kids: Vec<u32> = full
            .children(Some(c))
            .iter()
            .map(|&k| full.node(k).token)
            .collect();
        assert_eq!(kids, vec![10, 11]);
    }
    // Budget 4: the best nodes are 1 (-0.1), 1·10 (-0.3), 2 (-0.5), 1·10·20 (-0.6).
    let small = DraftTree::static_from_candidates(b, &cands, 4, None);
    assert_eq!(small.tokens(), vec![1, 2, 10, 20]);
    assert_eq!(small.parents_u32(), vec![TREE_ROOT, TREE_ROOT, 0, 2]);
    // Cut at path probability e^-0.55 (keep) and e^-0.25 (expand): 3 and 4
    // are left out, 2 (-0.5) is kept but not expanded, 1·10 (-0.3) is kept
    // but not expanded, so 1·10·20 (-0.6) is never drafted.
    let cut = Confidence {
        keep: (-0.55f32).exp(),
        expand: (-0.25f32).exp(),
    };
    let cut_tree = DraftTree::static_from_candidates(b, &cands, usize::MAX, Some(cut));
    assert_eq!(cut_tree.tokens(), vec![1, 2, 10]);
    assert_eq!(cut_tree.parents_u32(), vec![TREE_ROOT, TREE_ROOT, 0]);
    // One child per level over the positions' top candidates (the chain a
    // cut parallel drafter drafts): stops below keep.
    let top: Vec<Vec<Candidate>> = cands.iter().map(|c| vec![c[0]]).collect();
    let chain = DraftTree::static_from_candidates(&[1, 1, 1], &top, 8, Some(cut));
    assert_eq!(chain.tokens(), vec![1, 10]);
}

#[test]
fn from_sequences_merges_shared_prefixes() {
    let s = |v: &[u32]| v.iter().map(|&t| (t, -1.0)).collect::<Vec<_>>();
    let t = DraftTree::from_sequences(&[s(&[1, 2, 3]), s(&[1, 2, 4]), s(&[5])], 100);
    assert_eq!(t.tokens(), vec![1, 2, 3, 4, 5]);
    assert_eq!(t.parents_u32(), vec![TREE_ROOT, 0, 1, 1, TREE_ROOT]);
    let capped = DraftTree::from_sequences(&[s(&[1, 2, 3]), s(&[1, 2, 4]), s(&[5])], 3);
    assert_eq!(capped.tokens(), vec![1, 2, 3]);
}

#[test]
fn dynamic_tree_follows_the_probable_branch() {
    // Token 1 is near-certain after anything; token 2 is the runner-up.
    let mut drafter = |_: &[u32]| vec![(1, -0.01), (2, -2.0), (3, -4.0)];
    let t = DraftTree::dynamic(4, 2, 6, 100, &mut drafter);
    assert_eq!(t.len(), 6);
    assert_ancestor_closed(&t);
    // The chain 1,1,1,1 (cum -0.04) is kept in full …
    let deepest = (0..t.len()).max_by_key(|&i| t.node(i).depth).unwrap();
    assert_eq!(t.path_tokens(deepest), vec![1, 1, 1, 1]);
    // … plus the best runner-ups (2 after the shortest paths).
    let mut rest: Vec<Vec<u32>> = (0..t.len())
        .filter(|&i| t.node(i).token == 2)
        .map(|i| t.path_tokens(i))
        .collect();
    rest.sort();
    assert_eq!(rest, vec![vec![1, 2], vec![2]]);
    // Budget caps below `nodes`.
    assert_eq!(DraftTree::dynamic(4, 2, 6, 3, &mut drafter).len(), 3);
    assert!(DraftTree::dynamic(0, 2, 6, 3, &mut drafter).is_empty());
}

#[test]
fn prune_with_ties_keeps_parents_first() {
    // Deterministic drafts (prompt lookup) have log-prob 0 everywhere: ties
    // go to the shallower node, so a pruned chain is its prefix.
    let t = DraftTree::chain(&[1, 2, 3, 4], &[0.0; 4]).unwrap();
    assert_eq!(t.prune_to_best(2).tokens(), vec![1, 2]);
    let mut wide = DraftTree::new();
    let a = wide.push(None, 1, 0.0).unwrap();
    wide.push(Some(a), 2, 0.0).unwrap();
    wide.push(None, 3, 0.0).unwrap();
    assert_eq!(wide.prune_to_best(2).tokens(), vec![1, 3]);
}

#[test]
fn dynamic_tree_expands_topk_of_each_layer() {
    // Without the final cut the tree holds topk + (depth - 1)·topk² nodes
    // from 1 + (depth - 1)·topk drafter calls.
    let mut calls = 0;
    let mut inner = toy_drafter(7, 1000, 5);
    let mut counting = |p: &[u32]| {
        calls += 1;
        inner(p)
    };
    let t = DraftTree::dynamic(4, 3, usize::MAX, usize::MAX, &mut counting);
    assert_eq!(calls, 1 + 3 * 3);
    assert_eq!(t.len(), 3 + 3 * 9);
}

#[test]
fn multi_sequence_adds_sequences_only_when_uncertain() {
    let ln = |p: f32| p.ln();
    // Uncertain first position: p(1,1)=0.5, p(1,2)=0.5 → θ = 0.25; the
    // runner-up (0.3) starts a second sequence, 0.15 does not.
    let mut uncertain = move |path: &[u32]| {
        if path.is_empty() {
            vec![(1, ln(0.5)), (2, ln(0.3)), (3, ln(0.15))]
        } else {
            vec![(10 + path.len() as u32, ln(0.5)), (99, ln(0.1))]
        }
    };
    let t = DraftTree::multi_sequence(4, 7, &mut uncertain);
    assert_eq!(t.len(), 7);
    let roots: Vec<u32> = t.children(None).iter().map(|&c| t.node(c).token).collect();
    assert_eq!(roots, vec![1, 2]);
    // 7 = 4 (top sequence, gets the remainder) + 3.
    let lens: Vec<usize> = t.leaves().iter().map(|&l| t.node(l).depth + 1).collect();
    assert_eq!(lens, vec![4, 3]);
    assert_eq!(t.path_tokens(t.leaves()[0]), vec![1, 11, 12, 13]);

    // Confident drafter: θ = 0.9·0.9 = 0.81 > every runner-up → one chain.
    let mut confident = move |path: &[u32]| vec![(path.len() as u32, ln(0.9)), (50, ln(0.05))];
    let c = DraftTree::multi_sequence(4, 5, &mut confident);
    assert!(c.is_chain());
    assert_eq!(c.tokens(), vec![0, 1, 2, 3, 4]);
    // max_seqs = 1 never branches; budget 1 drafts one token.
    assert!(DraftTree::multi_sequence(1, 7, &mut uncertain).is_chain());
    assert_eq!(
        DraftTree::multi_sequence(4, 1, &mut uncertain).tokens(),
        vec![1]
    );
    assert!(DraftTree::multi_sequence(4, 0, &mut uncertain).is_empty());
}

#[test]
fn build_dispatches_on_shape() {
    let mut d = toy_drafter(3, 50, 4);
    assert!(DraftTree::build(&TreeShape::Chain, 5, &mut d).is_chain());
    assert_eq!(DraftTree::build(&TreeShape::Chain, 5, &mut d).len(), 5);
    let s = DraftTree::build(&TreeShape::Static(vec![2, 2]), 100, &mut d);
    assert_eq!(s.len(), 6);
    assert_eq!(s.levels(), 2);
}

#[test]
fn tree_shape_text() {
    let ok = [
        ("chain", TreeShape::Chain),
        ("3,2,1", TreeShape::Static(vec![3, 2, 1])),
        (" static(4, 2) ", TreeShape::Static(vec![4, 2])),
        (
            "dynamic(topk=8, depth=5, nodes=60)",
            TreeShape::Dynamic {
                depth: 5,
                topk: 8,
                nodes: 60,
            },
        ),
        ("multi(seqs=3)", TreeShape::MultiSequence { seqs: 3 }),
    ];
    for (text, want) in ok {
        let got: TreeShape = text.parse().unwrap();
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string().parse::<TreeShape>().unwrap(), want);
    }
    let bad = [
        ("", "empty"),
        ("3,0,1", "the branching at depth 1 is `0`"),
        ("3,x", "the branching at depth 1 is `x`"),
        ("dynamic(depth=5, topk=8)", "missing `nodes=…`"),
        (
            "dynamic(depth=5, topk=8, nodes=6, depth=2)",
            "`depth` given twice",
        ),
        ("dynamic(width=5)", "unknown key `width`"),
        ("static(3, 2", "missing closing"),
        ("tree", "unknown shape `tree`"),
        ("chain(2)", "takes no arguments"),
    ];
    for (text, needle) in bad {
        let e = text.parse::<TreeShape>().unwrap_err().to_string();
        assert!(e.contains(needle), "`{text}` → {e}");
        assert!(e.contains("expected `chain`"), "{e}");
    }
}

#[test]
fn tree_shape_from_ir_spec() {
    let spec = draftc_ir::graph::TreeSpec::Dynamic {
        depth: 5,
        topk: 8,
        nodes: 60,
    };
    let shape = TreeShape::try_from(&spec).unwrap();
    assert_eq!(shape.to_string(), spec.to_string());
    assert!(TreeShape::try_from(&draftc_ir::graph::TreeSpec::Static(vec![2, -1])).is_err());
    assert_eq!(
        TreeShape::try_from(&draftc_ir::graph::TreeSpec::Chain).unwrap(),
        TreeShape::Chain
    );
}

proptest! {
    #[test]
    fn positions_match_ops_seq_batch(t in arb_tree(40, 16), committed in 0usize..500) {
        if !t.is_empty() {
            let sb = SeqBatch::tree(committed, &t.parents_u32()).unwrap();
            prop_assert_eq!(&sb.q_pos, &t.positions(committed));
            // The verify form: root at `committed - 1`'s successor slot.
            let vb = SeqBatch::tree(committed, &t.verify_parents()).unwrap();
            prop_assert_eq!(&vb.q_pos[1..], &t.positions(committed + 1)[..]);
        }
        prop_assert!(validate_parents("test", &t.verify_parents()).is_ok());
    }

    #[test]
    fn greedy_acceptance_equals_ops_reference(
        t in arb_tree(48, 4),
        argmax in prop::collection::vec(0u32..4, 49),
    ) {
        let vocab = 4;
        let n = t.len() + 1;
        let mut logits = vec![0.0f32; n * vocab];
        for row in 0..n {
            logits[row * vocab + argmax[row] as usize] = 1.0;
        }
        let out = accept_ref(&t.verify_tokens(0), &t.verify_parents(), &logits, None, vocab, AcceptMode::Greedy);
        let ours = t.longest_accepted_path(argmax[0], &argmax[1..n]).unwrap();
        let theirs: Vec<usize> = out.acceptance.accepted.iter().map(|&c| c as usize - 1).collect();
        prop_assert_eq!(ours.nodes, theirs);
        prop_assert_eq!(ours.bonus, out.acceptance.bonus);
    }

    #[test]
    fn prune_keeps_the_best_ancestor_closed(t in arb_tree(60, 8), n in 0usize..70) {
        let p = t.prune_to_best(n);
        prop_assert_eq!(p.len(), n.min(t.len()));
        assert_ancestor_closed(&p);
        // Kept nodes are a sub-multiset of paths of the original, and no
        // dropped node beats the worst kept one (log-probs are <= 0, so
        // cum_logprob never increases along a path).
        let kept_paths: std::collections::HashSet<Vec<u32>> =
            (0..p.len()).map(|i| p.path_tokens(i)).collect();
        let worst = p.nodes().iter().map(|x| x.cum_logprob).fold(f32::INFINITY, f32::min);
        let mut dropped_better = 0;
        for i in 0..t.len() {
            if !kept_paths.contains(&t.path_tokens(i)) && t.node(i).cum_logprob > worst {
                dropped_better += 1;
            }
        }
        // Duplicate paths (same tokens under one parent) can hide a kept node.
        let distinct: std::collections::HashSet<Vec<u32>> =
            (0..t.len()).map(|i| t.path_tokens(i)).collect();
        if distinct.len() == t.len() {
            prop_assert_eq!(dropped_better, 0);
        }
    }

    #[test]
    fn every_builder_respects_the_budget(
        seed in any::<u64>(),
        budget in 0usize..40,
        width in 1usize..6,
        shape in prop_oneof![
            Just(TreeShape::Chain),
            prop::collection::vec(1usize..4, 1..5).prop_map(TreeShape::Static),
            (1usize..6, 1usize..5, 1usize..50)
                .prop_map(|(depth, topk, nodes)| TreeShape::Dynamic { depth, topk, nodes }),
            (1usize..5).prop_map(|seqs| TreeShape::MultiSequence { seqs }),
        ],
    ) {
        let mut d = toy_drafter(seed, 64, width);
        let t = DraftTree::build(&shape, budget, &mut d);
        prop_assert!(t.len() <= budget);
        if let Some(m) = shape.max_nodes() {
            prop_assert!(t.len() <= m);
        }
        assert_ancestor_closed(&t);
        // Siblings never repeat a token (that would waste a verify slot).
        for parent in std::iter::once(None).chain((0..t.len()).map(Some)) {
            let toks: Vec<u32> = t.children(parent).iter().map(|&c| t.node(c).token).collect();
            let set: std::collections::HashSet<_> = toks.iter().collect();
            prop_assert_eq!(set.len(), toks.len());
        }
        if let TreeShape::Dynamic { depth, .. } = shape {
            prop_assert!(t.levels() <= depth);
        }
        if shape == TreeShape::Chain {
            prop_assert_eq!(t.len(), budget);
            prop_assert!(t.is_chain());
        }
    }

    #[test]
    fn dynamic_tree_expands_only_the_best_of_each_layer(
        seed in any::<u64>(),
        depth in 2usize..6,
        topk in 1usize..5,
    ) {
        let mut d = toy_drafter(seed, 1 << 20, 6);
        let t = DraftTree::dynamic(depth, topk, usize::MAX, usize::MAX, &mut d);
        // Every parent ranks within the top-k of its layer by cumulative
        // log-prob (ties: the earlier node).
        for (i, n) in t.nodes().iter().enumerate() {
            let Some(p) = n.parent else { continue };
            let pc = t.node(p).cum_logprob;
            let better = t
                .nodes()
                .iter()
                .enumerate()
                .filter(|(j, m)| {
                    m.depth == t.node(p).depth
                        && (m.cum_logprob > pc || (m.cum_logprob == pc && *j < p))
                })
                .count();
            prop_assert!(better < topk, "node {} expanded from a parent ranked {}", i, better);
        }
    }

    #[test]
    fn dynamic_cut_keeps_the_tree_of_full_expansion(
        seed in any::<u64>(),
        depth in 1usize..6,
        topk in 1usize..6,
        nodes in 1usize..30,
        budget in 1usize..12,
        coarse in any::<bool>(),
    ) {
        // `coarse` rounds log-probs to whole nats: many ties in the ranking.
        let mut inner = toy_drafter(seed, 48, 7);
        let mut d = |p: &[u32]| -> Vec<Candidate> {
            let c = inner(p);
            if coarse { c.into_iter().map(|(t, lp)| (t, lp.round())).collect() } else { c }
        };
        let mut full_calls = 0;
        let full = DraftTree::dynamic(depth, topk, usize::MAX, usize::MAX, &mut |p: &[u32]| {
            full_calls += 1;
            d(p)
        })
        .prune_to_best(nodes.min(budget));
        let mut cut_calls = 0;
        let cut = DraftTree::dynamic(depth, topk, nodes, budget, &mut |p: &[u32]| {
            cut_calls += 1;
            d(p)
        });
        prop_assert_eq!(cut.tokens(), full.tokens());
        prop_assert_eq!(cut.parents_u32(), full.parents_u32());
        let lps = |t: &DraftTree| t.nodes().iter().map(|n| n.logprob).collect::<Vec<_>>();
        prop_assert_eq!(lps(&cut), lps(&full));
        prop_assert!(cut_calls <= full_calls);
        // A budget of one is a greedy chain of one: one drafter call.
        if budget == 1 {
            prop_assert_eq!(cut_calls, 1);
        }
    }

    #[test]
    fn confidence_cut_keeps_and_expands_only_confident_nodes(
        seed in any::<u64>(),
        budget in 0usize..12,
        keep in 0.0f32..0.6,
        expand in 0.0f32..0.9,
        shape in prop_oneof![
            Just(TreeShape::Chain),
            prop::collection::vec(1usize..4, 1..4).prop_map(TreeShape::Static),
            (1usize..5, 1usize..4, 1usize..20)
                .prop_map(|(depth, topk, nodes)| TreeShape::Dynamic { depth, topk, nodes }),
        ],
    ) {
        // Few, peaked candidates: path probabilities straddle the cuts.
        let mut d = toy_drafter(seed, 16, 3);
        let cut = Confidence { keep, expand };
        let t = TreeBuilder::new(&shape, budget).with_confidence(Some(cut)).run(&mut d);
        prop_assert!(t.len() <= budget);
        assert_ancestor_closed(&t);
        for (i, n) in t.nodes().iter().enumerate() {
            prop_assert!(n.cum_logprob >= keep.ln(), "node {} below keep", i);
            if !t.children(Some(i)).is_empty() {
                prop_assert!(t.score(i) >= expand.ln(), "node {} expanded below expand", i);
            }
        }
        let plain = DraftTree::build(&shape, budget, &mut d);
        // No cut is the plain builder.
        let zero = TreeBuilder::new(&shape, budget)
            .with_confidence(Some(Confidence { keep: 0.0, expand: 0.0 }))
            .run(&mut d);
        prop_assert_eq!(zero.tokens(), plain.tokens());
        prop_assert_eq!(zero.parents_u32(), plain.parents_u32());
        if shape == TreeShape::Chain {
            // The plain chain up to its first node below keep (left out) or
            // below expand (kept, and the last).
            let mut want = Vec::new();
            for (i, n) in plain.nodes().iter().enumerate() {
                if n.cum_logprob < keep.ln() {
                    break;
                }
                want.push(n.token);
                if plain.score(i) < expand.ln() {
                    break;
                }
            }
            prop_assert_eq!(t.tokens(), want);
        } else {
            // Every node is one the uncapped expansion drafts too.
            let paths: std::collections::HashSet<Vec<u32>> = {
                let full = match &shape {
                    TreeShape::Dynamic { depth, topk, .. } => {
                        DraftTree::dynamic(*depth, *topk, usize::MAX, usize::MAX, &mut d)
                    }
                    s => DraftTree::build(s, usize::MAX, &mut d),
                };
                (0..full.len()).map(|i| full.path_tokens(i)).collect()
            };
            for i in 0..t.len() {
                prop_assert!(paths.contains(&t.path_tokens(i)));
            }
        }
    }

    #[test]
    fn tree_shape_display_round_trips(shape in prop_oneof![
        Just(TreeShape::Chain),
        prop::collection::vec(1usize..100, 1..6).prop_map(TreeShape::Static),
        (1usize..9, 1usize..20, 1usize..200)
            .prop_map(|(depth, topk, nodes)| TreeShape::Dynamic { depth, topk, nodes }),
        (1usize..9).prop_map(|seqs| TreeShape::MultiSequence { seqs }),
    ]) {
        prop_assert_eq!(shape.to_string().parse::<TreeShape>().unwrap(), shape);
    }
}

#[test]
fn confidence_parses_and_rejects_non_probabilities() {
    let c: Confidence = "0.1,0.5".parse().unwrap();
    assert_eq!((c.keep, c.expand), (0.1, 0.5));
    let c: Confidence = " 0.3 ".parse().unwrap();
    assert_eq!((c.keep, c.expand), (0.3, 0.3));
    assert_eq!(c.to_string().parse::<Confidence>().unwrap(), c);
    for bad in ["1.5", "-0.1", "a", "0.1,", ",0.2", "0.1,0.2,0.3", "NaN", ""] {
        let err = bad.parse::<Confidence>().unwrap_err().to_string();
        assert!(
            err.contains("--confidence") && err.contains("KEEP[,EXPAND]"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn prune_to_depth_keeps_the_first_levels() {
    let mut t = DraftTree::new();
    let a = t.push(None, 1, -0.1).unwrap();
    let b = t.push(Some(a), 2, -0.2).unwrap();
    t.push(Some(b), 3, -0.3).unwrap();
    t.push(None, 4, -0.5).unwrap();
    let p = t.prune_to_depth(2);
    assert_eq!(p.len(), 3);
    assert_eq!(p.levels(), 2);
    assert!(t.prune_to_depth(0).is_empty());
    assert_eq!(t.prune_to_depth(9), t);
}

/// Candidates for a node reached by `path`: `w` distinct tokens with
/// probabilities (sorted, best first; ties now and then), what the
/// drafter's top-k gives the device.
fn device_candidates(seed: u64, path: &[u32], w: usize) -> Vec<(u32, f32)> {
    let mut next = path_rng(seed, path);
    let base = next() % 1000;
    let mut probs: Vec<f32> = (0..w).map(|_| (1 + next() % 64) as f32 / 64.0).collect();
    probs.sort_by(|a, b| b.total_cmp(a));
    (0..w as u32)
        .map(|c| (base + 7 * c, probs[c as usize]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// A dynamic tree rebuilt from frontier picks made as the device makes
    /// them (`draftc_ops::tree_frontier`'s reference) is the tree the host
    /// builder, exact cut and all, builds from the same candidates.
    #[test]
    fn dynamic_from_picks_is_the_builders_tree(depth in 1usize..5, topk in 1usize..5,
                                               nodes in 1usize..16, budget in 1usize..16,
                                               seed in any::<u64>()) {
        use draftc_ops::tree_frontier::reference::expand;
        let shape = TreeShape::Dynamic { depth, topk, nodes };
        let builder = TreeBuilder::new(&shape, budget);
        let w = builder.wants();
        let host = builder.run(&mut |path| {
            device_candidates(seed, path, w).into_iter().map(|(t, p)| (t, p.ln())).collect()
        });
        // The device: every level's rows (paths, scores), its candidates,
        // and the picks that make the next level.
        let mut rows: Vec<(Vec<u32>, f32)> = vec![(Vec::new(), 0.0)];
        let (mut layers, mut picks) = (Vec::new(), Vec::new());
        for level in 0..depth {
            let cands: Vec<Vec<(u32, f32)>> =
                rows.iter().map(|(path, _)| device_candidates(seed, path, w)).collect();
            layers.push(
                cands.iter().map(|c| c.iter().map(|&(t, p)| (t, p.ln())).collect()).collect(),
            );
            if level + 1 == depth {
                break;
            }
            let probs: Vec<f32> = cands.iter().flatten().map(|c| c.1).collect();
            let ids: Vec<u32> = cands.iter().flatten().map(|c| c.0).collect();
            let cum: Vec<f32> = rows.iter().map(|r| r.1).collect();
            let f = topk.min(rows.len() * w);
            let picked = expand(&probs, &ids, &cum, &vec![0; rows.len()], w, f, 1, 0);
            picks.push(picked.iter().map(|p| p.0).collect::<Vec<u32>>());
            rows = picked
                .iter()
                .map(|&(e, tok, score, _)| {
                    let mut path = rows[e as usize / w].0.clone();
                    path.push(tok);
                    (path, score)
                })
                .collect();
        }
        let device = TreeBuilder::dynamic_from_picks(&shape, budget, &layers, &picks).unwrap();
        prop_assert_eq!(device, host);
    }
}

#[test]
fn path_confidences_follow_the_most_likely_path_and_sum_its_siblings() {
    let ln = |p: f32| p.ln();
    // Root children 0.6 and 0.3; the 0.6 node's children 0.5 and 0.2; the
    // 0.3 node's child 0.9 is off the most likely path.
    let mut t = DraftTree::new();
    let a = t.push(None, 1, ln(0.6)).unwrap();
    let b = t.push(None, 2, ln(0.3)).unwrap();
    t.push(Some(a), 3, ln(0.5)).unwrap();
    t.push(Some(a), 4, ln(0.2)).unwrap();
    t.push(Some(b), 5, ln(0.9)).unwrap();
    let c = t.path_confidences();
    assert_eq!(c.len(), 2);
    assert!(
        (c[0] - 0.9).abs() < 1e-6 && (c[1] - 0.7).abs() < 1e-6,
        "{c:?}"
    );
    let chain = DraftTree::chain(&[7, 8], &[ln(0.4), 0.0]).unwrap();
    let c = chain.path_confidences();
    assert!((c[0] - 0.4).abs() < 1e-6 && c[1] == 1.0, "{c:?}");
    assert!(DraftTree::new().path_confidences().is_empty());
}

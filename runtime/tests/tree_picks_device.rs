//! A dynamic draft tree with its frontiers picked on the device
//! (`DRAFTC_TREE_PICKS=device`; the host picks them by default, issue 31):
//! on the GPU kernel layouts, Beagle's dynamic tree reads twice a round
//! (the whole tree, then the acceptance) and its output is the target's own
//! greedy output, at batch 1 and 3. Its own test binary: the variable is
//! set before anything in the process reads it.

mod tiny;

use draftc_runtime::device::TreePicks;
use draftc_runtime::engine::{generate_speculative, Sampling};
use tiny::*;

#[test]
fn device_picked_trees_read_twice_a_round_and_are_lossless() {
    std::env::set_var(TreePicks::ENV, "device");
    assert_eq!(TreePicks::chosen(), TreePicks::Device);
    for b in [1, 3] {
        let (mut t, mut d) =
            gpu_layout_drafter(b, "beagle", Some("dynamic(depth=3, topk=2, nodes=6)"));
        let want = reference(&mut t, b);
        let run = generate_speculative(
            &mut t,
            d.as_mut(),
            &prompts(b),
            MAX,
            &Sampling::GREEDY,
            6,
            None,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(
            run.tokens, want,
            "batch {b}: not the target's greedy output"
        );
        let s = &run.stats;
        assert!(s.rounds > 0);
        let reads = s.round_counts.reads as f64 / s.rounds as f64;
        assert!(reads <= 2.0, "batch {b}: {reads} reads a round");
    }
}

//! The continuous-batching engine (`engine::Engine`, issue 53) on the tiny
//! random target: sequences that join at different rounds, share the batch
//! with others and leave early give exactly the tokens each gives alone —
//! greedy against autoregressive decoding, with no drafter, prompt lookup
//! and Beagle; sampled with a seed, whatever runs beside it and whether or
//! not anything is drafted. Cancellation frees the slot at once, and a long
//! prompt is prefilled in chunks while the others keep decoding.

mod tiny;

use tiny::*;

use draftc_codegen::PlanDType;
use draftc_runtime::engine::TargetModel;
use draftc_runtime::engine::{
    generate, DraftPolicy, Drafter, Emitted, Engine, EngineConfig, Finish, PromptLookupDrafter,
    Sampling, SeqParams,
};
use draftc_runtime::exec::HostWeights;
use draftc_runtime::speculation::PromptLookup;

fn greedy(max_tokens: usize) -> SeqParams {
    SeqParams {
        max_tokens,
        sampling: Sampling::GREEDY,
        stop_ids: Vec::new(),
    }
}

fn beagle(t: &TargetModel<Wgpu>, tw: &HostWeights) -> Box<dyn Drafter<Wgpu>> {
    model(t, tw, "beagle")
}

/// `models/{name}.draft` over `t` with deterministic random weights.
fn model(t: &TargetModel<Wgpu>, tw: &HostWeights, name: &str) -> Box<dyn Drafter<Wgpu>> {
    drafter(t, tw, name, None, PlanDType::F32)
}

fn lookup() -> Box<dyn Drafter<Wgpu>> {
    Box::new(PromptLookupDrafter {
        lookup: PromptLookup::default(),
        branches: 1,
    })
}

/// The drafter `which` names over `t` (`none`, `prompt-lookup`, or Beagle).
fn drafter_named(
    which: &str,
    t: &TargetModel<Wgpu>,
    tw: &HostWeights,
) -> Option<Box<dyn Drafter<Wgpu>>> {
    match which {
        "none" => None,
        "prompt-lookup" => Some(lookup()),
        _ => Some(beagle(t, tw)),
    }
}

/// Each request's greedy tokens alone on `plain` (batch 1, autoregressive,
/// its `max_tokens`).
fn solo(plain: &mut TargetModel<Wgpu>, reqs: &[Arrival]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|(_, p, s)| {
            let r = [draftc_runtime::engine::Request { prompt: p.clone() }];
            generate(
                plain,
                &r,
                s.max_tokens,
                &Sampling::GREEDY,
                None,
                &mut |_, _| {},
            )
            .unwrap()
            .tokens
            .remove(0)
        })
        .collect()
}

/// [`solo`] on the tiny target.
fn solo_tiny(reqs: &[Arrival]) -> Vec<Vec<u32>> {
    solo(&mut target(1).0, reqs)
}

/// A request: the round it arrives at, its prompt, its params.
type Arrival = (usize, Vec<u32>, SeqParams);

/// Runs `engine` until every request in `arrivals` (round it arrives at,
/// prompt, params) is done; returns each request's tokens and finish.
fn run(engine: &mut Engine<Wgpu>, arrivals: &[Arrival]) -> Vec<(Vec<u32>, Option<Finish>)> {
    let mut out: Vec<(Vec<u32>, Option<Finish>)> = vec![(Vec::new(), None); arrivals.len()];
    let mut waiting: Vec<usize> = (0..arrivals.len()).collect();
    let mut round = 0;
    while out.iter().any(|o| o.1.is_none()) {
        waiting.retain(|&i| {
            let (at, p, params) = &arrivals[i];
            if *at <= round && engine.free_slots() > 0 {
                engine.add(i as u64, p.clone(), params.clone()).unwrap();
                false
            } else {
                true
            }
        });
        for Emitted { id, tokens, finish } in engine.step().unwrap() {
            let o = &mut out[id as usize];
            o.0.extend(tokens);
            o.1 = o.1.or(finish);
        }
        round += 1;
        assert!(round < 10_000, "the engine does not finish");
    }
    assert_eq!(engine.running(), 0);
    out
}

/// Each request gave its solo tokens (`want`), the drafter never failed,
/// and, when `must_draft`, it drafted something.
fn assert_lossless(
    name: &str,
    engine: &Engine<Wgpu>,
    got: &[(Vec<u32>, Option<Finish>)],
    want: &[Vec<u32>],
    must_draft: bool,
) {
    for (i, (toks, _)) in got.iter().enumerate() {
        assert_eq!(toks, &want[i], "{name}: request {i}");
    }
    let stats = engine.stats();
    assert_eq!(
        stats.draft_errors, 0,
        "{name}: {:?}",
        stats.last_draft_error
    );
    if must_draft {
        assert!(stats.drafted > 0, "{name} drafted nothing");
    }
}

fn arrivals(n: usize, params: &dyn Fn(usize) -> SeqParams) -> Vec<Arrival> {
    prompts(n)
        .into_iter()
        .enumerate()
        .map(|(i, r)| ((i * 3) % 7, r.prompt, params(i)))
        .collect()
}

#[test]
fn greedy_sequences_joining_and_leaving_equal_their_solo_output() {
    // Different budgets so sequences leave at different rounds.
    let max = |i: usize| 6 + (i * 5) % 15;
    let reqs = arrivals(8, &|i| greedy(max(i)));
    let want = solo_tiny(&reqs);
    for which in ["none", "prompt-lookup", "beagle"] {
        for policy in [DraftPolicy::Fixed(3), DraftPolicy::auto(3).unwrap()] {
            // Four slots for eight requests: later ones wait for a free slot.
            let (t, tw) = target(4);
            let d = drafter_named(which, &t, &tw);
            let cfg = EngineConfig {
                prefill_chunk: 5,
                ..EngineConfig::default()
            };
            let mut e = Engine::new(t, d, policy, cfg);
            let got = run(&mut e, &reqs);
            for (i, (_, finish)) in got.iter().enumerate() {
                assert_eq!(*finish, Some(Finish::Length), "{which}: request {i}");
            }
            assert_lossless(which, &e, &got, &want, which == "beagle");
            assert_eq!(e.free_slots(), 4);
        }
    }
}

#[test]
fn every_drafter_kind_is_lossless_under_continuous_batching() {
    let max = |i: usize| 5 + (i * 7) % 11;
    let reqs = arrivals(6, &|i| greedy(max(i)));
    let want = solo_tiny(&reqs);
    // Parallel heads, self-speculation (it writes tentative rows into the
    // target's caches), Medusa.
    for name in ["specformer", "magicdec", "medusa"] {
        let (t, tw) = target(3);
        let d = model(&t, &tw, name);
        let mut e = Engine::new(
            t,
            Some(d),
            DraftPolicy::Fixed(3),
            EngineConfig {
                prefill_chunk: 6,
                ..EngineConfig::default()
            },
        );
        let got = run(&mut e, &reqs);
        assert_lossless(name, &e, &got, &want, true);
    }
}

#[test]
fn eagle_is_lossless_under_continuous_batching() {
    // EAGLE keeps a KV cache of its own per slot: slots are reused here.
    let (t, tw) = target_layers(2, 4);
    let reqs = arrivals(5, &|i| greedy(4 + i % 3 * 4));
    let want = solo(&mut target_layers(1, 4).0, &reqs);
    let d = model(&t, &tw, "eagle");
    let mut e = Engine::new(t, Some(d), DraftPolicy::Fixed(3), EngineConfig::default());
    let got = run(&mut e, &reqs);
    assert_lossless("eagle", &e, &got, &want, false);
}

#[test]
fn a_stop_id_ends_a_sequence_and_is_kept() {
    let p = prompts(1).remove(0).prompt;
    let full = solo_tiny(&[(0, p.clone(), greedy(12))]).remove(0);
    let stop = full[4];
    let first = full.iter().position(|&t| t == stop).unwrap();
    let (t, _) = target(2);
    let mut e = Engine::new(
        t,
        Some(lookup()),
        DraftPolicy::Fixed(4),
        EngineConfig::default(),
    );
    let params = SeqParams {
        stop_ids: vec![stop],
        ..greedy(12)
    };
    let got = run(&mut e, &[(0, p, params)]);
    assert_eq!(got[0].0, full[..=first].to_vec());
    assert_eq!(got[0].1, Some(Finish::Stop));
}

#[test]
fn a_seeded_sampled_sequence_gives_the_same_tokens_whatever_runs_beside_it() {
    let sampled = |seed: u64| SeqParams {
        max_tokens: 16,
        sampling: Sampling {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            seed,
        },
        stop_ids: Vec::new(),
    };
    let p = prompts(3).remove(2).prompt;
    // Alone, without a drafter.
    let (t, _) = target(1);
    let mut e = Engine::new(t, None, DraftPolicy::Fixed(0), EngineConfig::default());
    let alone = run(&mut e, &[(0, p.clone(), sampled(42))]).remove(0).0;
    // Beside greedy and other sampled sequences, with drafters.
    let (t, tw) = target(4);
    let d = beagle(&t, &tw);
    let mut e = Engine::new(t, Some(d), DraftPolicy::Fixed(4), EngineConfig::default());
    let mut reqs = arrivals(5, &|i| {
        if i % 2 == 0 {
            greedy(10)
        } else {
            sampled(i as u64)
        }
    });
    reqs.insert(2, (1, p.clone(), sampled(42)));
    let busy = run(&mut e, &reqs);
    assert_eq!(busy[2].0, alone, "the batch changed a seeded sample");
    let (t, _) = target(2);
    let mut e = Engine::new(
        t,
        Some(lookup()),
        DraftPolicy::Fixed(6),
        EngineConfig::default(),
    );
    let looked = run(
        &mut e,
        &[(0, p.clone(), sampled(42)), (0, p.clone(), sampled(7))],
    );
    assert_eq!(looked[0].0, alone, "prompt lookup changed a seeded sample");
    assert_ne!(looked[1].0, alone, "another seed gave the same sample");
    // Top-k and top-p are the same rule with a cut distribution.
    let cut = |seed| SeqParams {
        sampling: Sampling {
            top_k: 5,
            top_p: 0.9,
            ..sampled(seed).sampling
        },
        ..sampled(seed)
    };
    let (t, _) = target(1);
    let mut e = Engine::new(t, None, DraftPolicy::Fixed(0), EngineConfig::default());
    let plain = run(&mut e, &[(0, p.clone(), cut(3))]).remove(0).0;
    let (t, tw) = target(3);
    let d = beagle(&t, &tw);
    let mut e = Engine::new(t, Some(d), DraftPolicy::Fixed(3), EngineConfig::default());
    let reqs = [
        (0, p.clone(), greedy(8)),
        (0, p.clone(), cut(3)),
        (2, p, cut(9)),
    ];
    assert_eq!(run(&mut e, &reqs)[1].0, plain);
}

#[test]
fn cancelling_frees_the_slot_at_once() {
    let (t, _) = target(2);
    let mut e = Engine::new(
        t,
        Some(lookup()),
        DraftPolicy::Fixed(2),
        EngineConfig::default(),
    );
    let ps = prompts(3);
    e.add(1, ps[0].prompt.clone(), greedy(50)).unwrap();
    e.add(2, ps[1].prompt.clone(), greedy(50)).unwrap();
    assert!(
        e.add(3, ps[2].prompt.clone(), greedy(5)).is_err(),
        "no slot is free"
    );
    e.step().unwrap();
    e.step().unwrap();
    assert!(e.kv_rows() > 0);
    assert!(e.cancel(1));
    assert!(!e.cancel(1), "cancelled twice");
    assert_eq!((e.running(), e.free_slots()), (1, 1));
    e.add(3, ps[2].prompt.clone(), greedy(5)).unwrap();
    assert_eq!(e.cancel_all().len(), 2);
    assert_eq!((e.running(), e.free_slots(), e.kv_rows()), (0, 2, 0));
    assert!(e.step().unwrap().is_empty());
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_while_others_decode() {
    let (t, _) = target(2);
    let mut e = Engine::new(
        t,
        None,
        DraftPolicy::Fixed(0),
        EngineConfig {
            prefill_chunk: 4,
            ..EngineConfig::default()
        },
    );
    let short = prompts(1).remove(0).prompt;
    let long: Vec<u32> = (0..30).map(|i| (i * 7 + 3) % 90).collect();
    e.add(1, short.clone(), greedy(12)).unwrap();
    e.step().unwrap(); // the short prompt's prefill and first token
    e.add(2, long.clone(), greedy(4)).unwrap();
    let mut got = (Vec::new(), Vec::new());
    // The long prompt needs ceil(30 / 4) = 8 rounds; each of them still
    // gives the decoding sequence its token.
    for round in 0..8 {
        let em = e.step().unwrap();
        let one = em
            .iter()
            .find(|x| x.id == 1)
            .expect("the short sequence decoded");
        assert_eq!(one.tokens.len(), 1, "round {round}");
        got.0.extend(one.tokens.clone());
        let two: Vec<u32> = em
            .iter()
            .filter(|x| x.id == 2)
            .flat_map(|x| x.tokens.clone())
            .collect();
        assert_eq!(
            two.is_empty(),
            round < 7,
            "round {round}: the long prompt's first token"
        );
        got.1.extend(two);
    }
    while e.running() > 0 {
        for x in e.step().unwrap() {
            if x.id == 2 {
                got.1.extend(x.tokens);
            }
        }
    }
    let want = solo_tiny(&[(0, long, greedy(4))]).remove(0);
    assert_eq!(got.1, want);
}

#[test]
fn requests_that_do_not_fit_are_refused_with_a_reason() {
    let (t, _) = target_sized(1, PlanDType::F32, 7, 16);
    let e = Engine::new(t, None, DraftPolicy::Fixed(0), EngineConfig::default());
    let err = |p: &[u32], s: SeqParams| e.check(p, &s).unwrap_err().to_string();
    assert!(err(&[1; 10], greedy(8)).contains("exceed the context"));
    assert!(err(&[], greedy(1)).contains("no tokens"));
    assert!(err(&[100_000], greedy(1)).contains("outside the vocabulary"));
    assert!(err(&[1], greedy(0)).contains("at least 1"));
    let hot = SeqParams {
        sampling: Sampling {
            temperature: -1.0,
            ..Sampling::GREEDY
        },
        ..greedy(1)
    };
    assert!(err(&[1], hot).contains("temperature"));
    e.check(&[1; 10], &greedy(5)).unwrap();
}

#[test]
fn prompts_that_share_a_prefix_reuse_its_rows_and_decode_the_same() {
    // A shared 14-token "system turn", then different questions.
    let system: Vec<u32> = (0..14).map(|i| (i * 11 + 5) % 90).collect();
    let reqs: Vec<Arrival> = prompts(6)
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let p: Vec<u32> = system.iter().chain(&r.prompt).copied().collect();
            (i * 2, p, greedy(6 + i % 4))
        })
        .collect();
    let want = solo_tiny(&reqs);
    for which in ["none", "prompt-lookup", "beagle"] {
        // Three slots and the prefix cache's.
        let (t, tw) = target(4);
        let d = drafter_named(which, &t, &tw);
        let cfg = EngineConfig {
            prefill_chunk: 8,
            prefix_cache: true,
        };
        let mut e = Engine::new(t, d, DraftPolicy::Fixed(2), cfg);
        assert_eq!(e.free_slots(), 3);
        let got = run(&mut e, &reqs);
        for (i, (toks, _)) in got.iter().enumerate() {
            assert_eq!(toks, &want[i], "{which}: request {i}");
        }
        let reused = e.stats().prefix_rows;
        if which == "beagle" {
            assert_eq!(
                reused, 0,
                "a drafter that observes rows must see the whole prompt"
            );
        } else {
            // Every request after the first shares at least the system turn.
            assert!(reused >= 5 * system.len(), "{which}: {reused} rows reused");
        }
    }
}

/// A planner seeded with costs at which a draft never pays for one
/// sequence and pays well for two (the opposite of a real device, to tell
/// the engine's rule from the planner's own judgement).
fn contrary_planner() -> DraftPolicy {
    use draftc_runtime::speculation::planner::Costs;
    let mut p = draftc_runtime::speculation::Planner::new(
        draftc_runtime::speculation::PlannerConfig::auto(3),
    )
    .unwrap();
    let verify = (1..=16).map(|r| (r, 1e-3)).collect();
    let mut draft = Vec::new();
    for k in 1..=3 {
        draft.push((1, k, 10.0));
        draft.push((2, k, 1e-6));
    }
    p.seed_costs(&Costs {
        verify,
        draft,
        step: Vec::new(),
    });
    DraftPolicy::Planned(Box::new(p))
}

#[test]
fn a_drafter_off_at_one_batch_size_stays_off_at_larger_ones() {
    let ps = prompts(2);
    let (t, tw) = target(2);
    let d = beagle(&t, &tw);
    let mut e = Engine::new(t, Some(d), contrary_planner(), EngineConfig::default());
    e.add(1, ps[0].prompt.clone(), greedy(12)).unwrap();
    e.add(2, ps[1].prompt.clone(), greedy(12)).unwrap();
    // The first join was judged at batch 1: off. The second, at batch 2,
    // stays off although the planner alone would draft there.
    while e.running() > 0 {
        e.step().unwrap();
    }
    assert_eq!(
        e.stats().drafted,
        0,
        "drafted at batch 2 after going off at batch 1"
    );
}

#[test]
fn with_drafts_every_seed_samples_the_tokens_it_samples_without() {
    // The sample's distribution is the sampling kernel's (ops' tests); with
    // drafts the engine must give, seed by seed, exactly the no-draft
    // tokens, so drafting cannot move the distribution.
    let sampled = |seed: u64| SeqParams {
        max_tokens: 10,
        sampling: Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        },
        stop_ids: Vec::new(),
    };
    let ps = prompts(4);
    let reqs: Vec<Arrival> = (0..24u64)
        .map(|seed| (0, ps[seed as usize % 4].prompt.clone(), sampled(seed)))
        .collect();
    let (t, _) = target(8);
    let mut plain = Engine::new(t, None, DraftPolicy::Fixed(0), EngineConfig::default());
    let want = run(&mut plain, &reqs);
    let (t, tw) = target(8);
    let d = beagle(&t, &tw);
    let mut drafted = Engine::new(t, Some(d), DraftPolicy::Fixed(3), EngineConfig::default());
    let got = run(&mut drafted, &reqs);
    assert!(drafted.stats().accepted > 0, "no draft token was accepted");
    for (seed, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.0, g.0, "seed {seed}");
    }
    // Different seeds do sample differently.
    let distinct: std::collections::BTreeSet<&Vec<u32>> = want.iter().map(|w| &w.0).collect();
    assert!(
        distinct.len() > 12,
        "{} distinct samples of 24",
        distinct.len()
    );
}

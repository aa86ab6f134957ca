//! Property tests: no input bytes make the front end panic, and well-formed
//! graphs round-trip through print → parse unchanged.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;

/// Compile and render: neither may panic, whatever the input.
fn no_panic(src: &str) {
    let cfg = common::smollm2();
    if let Err(diags) = draftc_ir::compile(src, &cfg, &BTreeMap::new(), &common::Models) {
        assert!(!diags.is_empty());
        let _ = draftc_ir::render_all(&diags, "fuzz.draft", src, false);
    }
    let _ = draftc_ir::parse_preset(src);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        match draftc_ir::decode(&bytes) {
            Ok(src) => no_panic(src),
            Err(d) => { let _ = draftc_ir::render_all(&[d], "f", &String::from_utf8_lossy(&bytes), false); }
        }
    }

    #[test]
    fn random_token_soup_never_panics(words in proptest::collection::vec(
        prop::sample::select(vec!["drafter", "model", "x", "=", "+=", "(", ")", "[", "]", "{", "}", ",", ":",
            "\n", "repeat", "i", "in", "0..n", "linear", "attention", "target", ".", "hidden", "@w.{i}", "d", "t",
            "l", "4", "-1", "1e-5", "mask=", "causal", "split", "emit", "memory", "append", "output", "input",
            "kind", "parallel", "u32", "reshape", "*", "/", "%", "99999999999999999999", "#c"]), 0..60)) {
        no_panic(&words.join(" "));
    }

    #[test]
    fn mutated_model_files_never_panic(which in 0..common::MODELS.len(), edits in proptest::collection::vec((any::<u16>(), 0..4u8, any::<char>()), 1..6)) {
        let mut src: Vec<char> = common::MODELS[which].1.chars().collect();
        for (pos, kind, ch) in edits {
            if src.is_empty() { break; }
            let p = pos as usize % src.len();
            match kind {
                0 => { src.remove(p); }
                1 => src.insert(p, ch),
                2 => src[p] = ch,
                _ => { let end = (p + 12).min(src.len()); src.drain(p..end); }
            }
        }
        no_panic(&src.into_iter().collect::<String>());
    }

    #[test]
    fn random_graphs_round_trip(program in well_formed_program()) {
        let cfg = common::tiny();
        let g1 = common::compile(&program, &cfg).unwrap_or_else(|d| panic!("generated program must be valid:\n{program}\n{d:#?}"));
        let printed = draftc_ir::print::print(&g1);
        let g2 = common::compile(&printed, &cfg).unwrap_or_else(|d| panic!("printed graph must parse:\n{printed}\n{d:#?}"));
        prop_assert_eq!(&printed, &draftc_ir::print::print(&g2));
        prop_assert!(g1 == g2, "graphs differ after print → parse:\n{}", printed);
    }
}

/// Random well-typed drafter programs over the tiny preset (d = 64).
fn well_formed_program() -> impl Strategy<Value = String> {
    (1..4i64, proptest::collection::vec((0..12u8, any::<u32>()), 1..25)).prop_map(|(l, steps)| {
        // Values in scope: (name, feature dims after `t`).
        let mut vals: Vec<(String, Vec<i64>)> = vec![("x0".into(), vec![64])];
        let mut src = format!("drafter gen\nkind parallel\nl {l}\n\ninput x0 = target.hidden[n] : [t, d]\n");
        let mut k = 0;
        for (op, r) in steps {
            k += 1;
            let pick = |vals: &Vec<(String, Vec<i64>)>, want_rank: Option<usize>| -> Option<(String, Vec<i64>)> {
                let c: Vec<_> = vals.iter().filter(|v| want_rank.is_none_or(|w| v.1.len() == w)).collect();
                (!c.is_empty()).then(|| c[r as usize % c.len()].clone())
            };
            let name = format!("v{k}");
            let (line, dims): (String, Vec<i64>) = match op {
                0 => {
                    let (a, d) = pick(&vals, None).unwrap();
                    let out = [64, 32, 3][(r / 7) as usize % 3];
                    let bias = if r % 2 == 0 { ", bias" } else { "" };
                    let mut nd = d.clone();
                    *nd.last_mut().unwrap() = out;
                    (format!("{name} = linear({a}, {out}{bias}) @lin{k}"), nd)
                }
                1 => { let (a, d) = pick(&vals, None).unwrap(); (format!("{name} = rms_norm({a}, eps=1e-6) @norm{k}"), d) }
                2 => { let (a, d) = pick(&vals, None).unwrap(); (format!("{name} = silu({a})"), d) }
                3 => {
                    let (a, d) = pick(&vals, None).unwrap();
                    let same: Vec<_> = vals.iter().filter(|v| v.1 == d).collect();
                    let b = &same[(r / 3) as usize % same.len()].0;
                    (format!("{name} = {a} {} {b}", if r % 2 == 0 { "+" } else { "*" }), d)
                }
                4 => match pick(&vals, Some(1)).filter(|v| v.1[0] == 64) {
                    Some((a, d)) => {
                        let mask = ["causal", "sliding_window(8, 1)", "full"][r as usize % 3];
                        let rope = if r % 2 == 0 { ", rope=theta" } else { "" };
                        (format!("{name} = attention({a}, heads=4, kv_heads=2, mask={mask}, cache=c{k}{rope}) @attn{k}"), d)
                    }
                    None => continue,
                },
                5 => { let (a, d) = pick(&vals, None).unwrap(); (format!("{name} = swiglu({a}, 16) @mlp{k}"), d) }
                6 => match pick(&vals, Some(1)).filter(|v| v.1[0] == 64) {
                    Some((a, _)) => (format!("{name} = reshape({a}, [t, 2, 32])"), vec![2, 32]),
                    None => continue,
                },
                7 => match pick(&vals, Some(2)) {
                    Some((a, d)) => (format!("{name} = group_rms_norm({a}) @g{k}"), d),
                    None => continue,
                },
                8 => {
                    let (a, d) = pick(&vals, None).unwrap();
                    let mut nd = d.clone();
                    *nd.last_mut().unwrap() *= 2;
                    (format!("{name} = concat({a}, {a})"), nd)
                }
                9 => match pick(&vals, None).filter(|v| v.1.last().unwrap() % 2 == 0) {
                    Some((a, d)) => {
                        let mut nd = d.clone();
                        *nd.last_mut().unwrap() /= 2;
                        (format!("{name} = split({a}, 2, index={})", r % 2), nd)
                    }
                    None => continue,
                },
                10 => match pick(&vals, Some(1)).filter(|v| v.1[0] == 64) {
                    Some((a, _)) => (format!("{name} = layer_sum(stack({a}, {a}, {a})) @ls{k}"), vec![64]),
                    None => continue,
                },
                _ => match pick(&vals, Some(1)).filter(|v| v.1[0] == 64) {
                    Some((a, _)) => (
                        format!("{name} = reshape(linear({a}, l*d, bias) @pf{k}, [t, l, d])"),
                        vec![-1, 64],
                    ),
                    None => continue,
                },
            };
            src.push_str(&line);
            src.push('\n');
            vals.push((name, dims));
        }
        let last = &vals.last().unwrap().0;
        src.push_str(&format!("output out = silu({last})\n"));
        // dims -1 marks the symbolic `l` axis: keep such values out of later rank-based picks.
        src
    })
}

//! Every kind of user mistake gives a diagnostic with the right message and
//! location. One helper, `check(source, expected)`: `expected` lists
//! `line:col message-fragment` for each diagnostic, in order.

mod common;

use common::errors;

/// A drafter header for the snippets below (3 lines; snippets start on line 4).
const HEAD: &str = "drafter t\nkind parallel\nl 2\n";

#[track_caller]
fn check(body: &str, expected: &[&str]) {
    check_under(HEAD, body, expected)
}

/// [`check`] under another three-line header.
#[track_caller]
fn check_under(head: &str, body: &str, expected: &[&str]) {
    let src = format!("{head}{body}");
    let got = errors(&src);
    assert_eq!(
        got.len(),
        expected.len(),
        "diagnostics for:\n{src}\ngot: {got:#?}"
    );
    for (g, e) in got.iter().zip(expected) {
        let (loc, frag) = e.split_once(' ').unwrap();
        assert!(
            g.starts_with(&format!("{loc} ")) && g.contains(frag),
            "expected `{e}`, got `{g}`\nsource:\n{src}"
        );
    }
}

#[test]
fn unknown_op() {
    check(
        "input x = target.hidden[n] : [t, d]\ny = linaer(x, d) @w\noutput o = x\n",
        &["5:5 unknown op `linaer`"],
    );
}

#[test]
fn unknown_op_suggests_the_closest() {
    let src = format!("{HEAD}input x = target.hidden[n] : [t, d]\noutput y = rms_nrom(x) @w\n");
    let diags = common::compile(&src, &common::tiny()).unwrap_err();
    assert!(
        diags[0]
            .notes
            .iter()
            .any(|n| n.contains("did you mean `rms_norm`")),
        "{diags:?}"
    );
}

#[test]
fn shape_mismatch_in_annotation() {
    check(
        "input x = target.hidden[0, n] : [t, 2, d]\noutput y = linear(reshape(x, [t, 2*d]), d) @w : [t, 2*d]\n",
        &["5:47 shape mismatch: expected [t, 128], found [t, 64]"],
    );
}

#[test]
fn shape_mismatch_in_add() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = x + linear(x, 3) @w\n",
        &["5:12 shape mismatch: cannot broadcast [t, 64] with [t, 3]"],
    );
}

#[test]
fn undefined_name() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = linear(q, d) @w\n",
        &["5:19 undefined name `q`"],
    );
}

#[test]
fn used_before_definition() {
    check(
        "input x = target.hidden[n] : [t, d]\ny = z + x\nz = silu(x)\noutput o = y\n",
        &["5:5 `z` is used before it is defined"],
    );
}

#[test]
fn redefinition() {
    check(
        "input x = target.hidden[n] : [t, d]\ny = silu(x)\ny = silu(x)\noutput o = y\n",
        &["6:1 `y` is already defined"],
    );
}

#[test]
fn cycle() {
    check(
        "input x = target.hidden[n] : [t, d]\np = q + x\nq = p + x\noutput o = q\n",
        &["5:5 cyclic definition: p → q → p"],
    );
}

#[test]
fn bad_repeat_range() {
    check(
        "input x = target.hidden[n] : [t, d]\nrepeat i in 5..2 {\n  x += silu(x)\n}\noutput o = x\n",
        &["5:13 bad repeat range 5..2"],
    );
}

#[test]
fn repeat_bound_must_be_known() {
    check(
        "input x = target.hidden[n] : [t, d]\nrepeat i in 0..t {\n  x += silu(x)\n}\noutput o = x\n",
        &["5:16 expected a loop bound known before running, found `t`"],
    );
}

#[test]
fn wrong_arity_missing() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = linear(x) @w\n",
        &["5:12 wrong number of arguments: `linear` needs `out`"],
    );
}

#[test]
fn wrong_arity_extra() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = silu(x, x)\n",
        &["5:20 wrong number of arguments: `silu` takes 1 positional argument, found 2"],
    );
}

#[test]
fn unknown_argument() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = rms_norm(x, epsilon=1) @w\n",
        &["5:24 unknown argument `epsilon`"],
    );
}

#[test]
fn bad_attribute_value_mask() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = attention(x, heads=h, mask=diagonal) @a\n",
        &["5:39 bad value for `mask`"],
    );
}

#[test]
fn bad_attribute_value_heads() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = attention(x, heads=h, kv_heads=3) @a\n",
        &["5:43 bad value for `kv_heads`: 4 heads are not a multiple of 3 KV heads"],
    );
}

#[test]
fn heads_must_divide_width() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = attention(x, heads=7) @a\n",
        &["5:31 bad value for `heads`: the model width 64 is not divisible by 7 heads"],
    );
}

#[test]
fn unterminated_block() {
    check(
        "input x = target.hidden[n] : [t, d]\nrepeat i in 0..2 {\n  x += silu(x)\n",
        &["5:18 unterminated `repeat` block"],
    );
}

#[test]
fn unmatched_brace() {
    check(
        "input x = target.hidden[n] : [t, d]\n}\noutput o = x\n",
        &["5:1 unmatched `}`"],
    );
}

#[test]
fn dtype_mismatch() {
    check(
        "input ids : [t] u32\noutput y = linear(ids, d) @w\n",
        &["5:19 dtype mismatch: expected a float tensor, found u32"],
    );
}

#[test]
fn tap_out_of_range() {
    check(
        "input x = target.hidden[0, n+1] : [t, 2, d]\noutput o = silu(x)\n",
        &["4:28 tap index 5 is out of range"],
    );
}

#[test]
fn missing_weight_name() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = linear(x, d)\n",
        &["5:12 `linear` has weights but no weight name"],
    );
}

#[test]
fn weight_name_on_op_without_weights() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = silu(x) @w\n",
        &["5:20 `silu` has no weights"],
    );
}

#[test]
fn weight_bound_twice_with_different_shapes() {
    check(
        "input x = target.hidden[n] : [t, d]\na = linear(x, d) @w\noutput y = linear(a, 3) @w\n",
        &["6:25 weight `w.weight` is bound twice with different shapes"],
    );
}

#[test]
fn reshape_element_count() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput y = reshape(x, [t, 3, d])\n",
        &["5:23 shape mismatch: cannot reshape [t, 64] (64*t elements) to [t, 3, 64] (192*t elements)"],
    );
}

#[test]
fn syntax_error_expected_expression() {
    check(
        "input x = target.hidden[n] : [t, d]\ny = (x + \noutput o = x\n",
        &["5:10 expected an expression, found end of line"],
    );
}

#[test]
fn unexpected_character() {
    check(
        "input x = target.hidden[n] : [t, d]\ny = x $ x\noutput o = x\n",
        &[
            "5:7 unexpected character '$'",
            "5:9 expected end of line, found `x`",
        ],
    );
}

#[test]
fn target_reference_in_model_file() {
    let src = "model m\ninput ids : [t] u32\noutput y = target.embed(ids)\n";
    let got = errors(src);
    assert_eq!(
        got,
        vec!["3:12 `target` references are only valid in drafter files"]
    );
}

#[test]
fn drafter_without_kind() {
    let got = errors("drafter d\ninput x = target.hidden[n] : [t, d]\noutput o = silu(x)\n");
    assert_eq!(got, vec!["1:1 drafter has no `kind`"]);
}

#[test]
fn no_output() {
    check(
        "input x = target.hidden[n] : [t, d]\ny = silu(x)\n",
        &["1:1 `t` has no output"],
    );
}

#[test]
fn empty_file() {
    assert_eq!(errors(""), vec!["1:1 empty description file"]);
    assert_eq!(
        errors("\n# only a comment\n\n"),
        vec!["1:1 empty description file"]
    );
}

#[test]
fn non_utf8_bytes() {
    let bytes = b"drafter d\nkind par\xffallel\n";
    let d = draftc_ir::decode(bytes).unwrap_err();
    let text = String::from_utf8_lossy(bytes);
    assert!(
        d.message.contains("not valid UTF-8: byte 0xff"),
        "{}",
        d.message
    );
    assert_eq!(common::loc(&text, &d), "2:9");
}

#[test]
fn several_errors_are_all_reported() {
    check(
        "input x = target.hidden[n] : [t, d]\na = linaer(x, d) @w\nb = silu(q)\nc = x $ x\noutput o = x\n",
        &["5:5 unknown op", "6:10 undefined name `q`", "7:7 unexpected character", "7:9 expected end of line"],
    );
}

#[test]
fn rendered_diagnostic_has_location_source_line_and_caret() {
    let src = format!("{HEAD}input x = target.hidden[n] : [t, d]\noutput y = linear(q, d) @w\n");
    let diags = common::compile(&src, &common::tiny()).unwrap_err();
    let text = draftc_ir::render_all(&diags, "bad.draft", &src, false);
    assert!(text.contains("error: undefined name `q`"), "{text}");
    assert!(text.contains("bad.draft:5:19"), "{text}");
    assert!(text.contains("output y = linear(q, d) @w"), "{text}");
    assert!(text.contains("^ not defined"), "{text}");
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let deep = format!(
        "output y = {}x{}\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let got = errors(&format!(
        "{HEAD}input x = target.hidden[n] : [t, d]\n{deep}"
    ));
    assert!(
        got.iter()
            .any(|e| e.contains("expression nested too deeply")),
        "{got:?}"
    );
}

#[test]
fn memory_seed_through_the_final_norm() {
    let head = "drafter t\nkind autoregressive\nl 2\n";
    let body = "input ids : [t] u32\ne = target.embed(ids)\ny = attention(e, heads=h, kv_heads=hkv, memory=m, mask=cross_diagonal) @a\n\
                append m = y\noutput o = target.lm_head(y)\n";
    let ok = format!("{head}memory m = target.norm(target.hidden[n])\n{body}");
    let g = common::compile(&ok, &common::tiny()).unwrap();
    assert!(g.memories[0].normed, "{:?}", g.memories);
    let raw = format!("{head}memory m = target.hidden[n]\n{body}");
    assert!(!common::compile(&raw, &common::tiny()).unwrap().memories[0].normed);
    // Only the target's hidden states, optionally through its final norm.
    let bad = format!("{head}memory m = target.norm(target.embed(ids))\n{body}");
    let got = errors(&bad);
    assert!(
        got[0].starts_with("4:24 ")
            && got[0]
                .contains("expected `target.hidden[INDEX]` or `target.norm(target.hidden[INDEX])`"),
        "{got:?}"
    );
}

/// EAGLE's forms: a fused seed, `prev`, and `out=`.
const AR: &str = "drafter t\nkind autoregressive\nl 2\n";

#[track_caller]
fn check_ar(body: &str, expected: &[&str]) {
    check_under(AR, body, expected)
}

#[test]
fn fused_memory_seeds_need_their_form() {
    let tail = "input ids : [t] u32\ng = prev(f)\nappend f = g\noutput o = g\n";
    // No weight name.
    check_ar(
        &format!("memory f = linear(concat(target.hidden[1], target.hidden[2]), d)\n{tail}"),
        &["4:12 a fused memory seed"],
    );
    // One tap is not a fusion; a tap out of range.
    check_ar(
        &format!("memory f = linear(concat(target.hidden[1]), d) @fc\n{tail}"),
        &["4:19 a fused memory seed"],
    );
    check_ar(
        &format!("memory f = linear(concat(target.hidden[1], target.hidden[99]), d) @fc\n{tail}"),
        &["4:58 tap index 99 is out of range"],
    );
    // Not a tap.
    check_ar(
        &format!("memory f = linear(concat(target.hidden[1], ids), d) @fc\n{tail}"),
        &["4:44 a fused memory seed"],
    );
}

#[test]
fn prev_reads_a_declared_memory_and_out_only_widens_self_attention() {
    check_ar(
        "input ids : [t] u32\ng = prev(nothing)\noutput o = g\n",
        &["5:10 undefined memory `nothing`"],
    );
    check_ar(
        "memory m = target.hidden[n]\ninput ids : [t] u32\ne = target.embed(ids)\n\
         y = attention(e, heads=h, memory=m, out=d) @a\nappend m = y\noutput o = y\n",
        &["7:41 `out` applies to self-attention along the sequence"],
    );
    // Fine: prev as an input statement and an expression, out on self-attention.
    check_ar(
        "memory m = linear(concat(target.hidden[1], target.hidden[2]), d) @fc\n\
         input ids : [t] u32\ninput g = prev(m) : [t, d]\nq = prev(m)\n\
         u = concat(g, q)\ny = attention(u, heads=h, head_dim=d/h, cache=kv, out=d) @a\n\
         append m = y\noutput o = y\n",
        &[],
    );
}

#[test]
fn training_schedule_settings_are_checked() {
    let tail = "input ids : [t] u32\noutput o = target.embed(ids)\n";
    check_ar(
        &format!("train_steps 0\ntrain_decay 1.5\ntrain_loss mse\ntrain_regression -1\n{tail}"),
        &[
            "4:13 bad value for `train_steps`",
            "5:13 bad value for `train_decay`",
            "6:12 bad value for `train_loss`",
            "7:18 bad value for `train_regression`",
        ],
    );
    check_ar(
        &format!("train_steps 7\ntrain_decay 0.8\ntrain_loss distill\ntrain_regression 0\n{tail}"),
        &[],
    );
    let model = "model m\ntrain_steps 2\ninput ids : [t] u32\noutput o = ids\n";
    let got = errors(model);
    assert!(
        got.iter().any(|e| e.contains("is a drafter setting")),
        "{got:?}"
    );
}

/// A model header for the flag-choice snippets (3 lines).
const MODEL: &str = "model m\nembed e\nfinal_norm e\n";

#[test]
fn a_choice_on_a_flag_the_preset_lacks_is_named_with_the_flags_it_has() {
    check_under(
        MODEL,
        "input ids : [t] u32\noutput o = embedding(ids, v, d) @(e if tied_embedings else w)\n",
        &["5:40 `tied_embedings` is not a flag of the target preset `tiny`"],
    );
    let src = format!("{MODEL}lm_head e if tide else w\ninput ids : [t] u32\noutput o = embedding(ids, v, d) @e\n");
    let diags = common::compile(&src, &common::tiny()).unwrap_err();
    assert_eq!(common::loc(&src, &diags[0]), "4:14", "{diags:?}");
    assert!(
        diags[0]
            .notes
            .iter()
            .any(|n| n.contains("the preset's flags: ") && n.contains("tied_embeddings")),
        "{diags:?}"
    );
}

#[test]
fn a_malformed_weight_choice_is_an_error_not_a_name() {
    check_under(
        MODEL,
        "input ids : [t] u32\noutput o = embedding(ids, v, d) @(e if tied_embeddings)\n",
        &["5:33 a weight-name choice is `@(a if flag else b)`"],
    );
    check_under(
        MODEL,
        "input ids : [t] u32\noutput o = embedding(ids, v, d) @(e if tied_embeddings else w\n",
        &["5:33 unclosed `(` in weight name"],
    );
    check_under(
        MODEL,
        "lm_head e if tied_embeddings w\ninput ids : [t] u32\noutput o = embedding(ids, v, d) @e\n",
        &["4:30 expected `else`"],
    );
    check(
        "input x = target.hidden[n] : [t, d]\noutput o = x if tied_embeddings else x\n",
        &["5:14 expected"],
    );
}

#[test]
fn a_flag_choice_picks_each_side() {
    let body = "lm_head e if tied_embeddings else w\ninput ids : [t] u32\noutput o = embedding(ids, v, d) @(e if tied_embeddings else w)\n";
    let src = format!("{MODEL}{body}");
    let mut cfg = common::tiny();
    for (tied, name) in [(true, "e"), (false, "w")] {
        cfg.flags.insert("tied_embeddings".into(), tied);
        let g = common::compile(&src, &cfg).unwrap();
        assert_eq!(g.meta.exports["lm_head"], name);
        assert_eq!(g.params()[0].name, format!("{name}.weight"));
    }
}

#[test]
fn a_per_layer_flag_picks_each_layers_mask_and_rope_base() {
    // Gemma 3's layers: sliding-window attention with a local RoPE base
    // where the preset's `sliding[i]` says so, global attention otherwise.
    let body = "input ids : [t] u32\nx = embedding(ids, v, d) @e\nrepeat i in 0..n {\n  x += attention(x, heads=h, mask=sliding_window(4, 0) if sliding[i] else causal, rope=500.0 if sliding[i] else theta, cache=kv) @l.{i}\n}\noutput o = x\n";
    let src = format!("{MODEL}{body}");
    let mut cfg = common::tiny();
    let n = cfg.int("n").unwrap();
    for i in 0..n {
        cfg.flags.insert(format!("sliding[{i}]"), i % 2 == 0);
    }
    let g = common::compile(&src, &cfg).unwrap();
    let printed = draftc_ir::print::print(&g);
    let layers: Vec<&str> = printed
        .lines()
        .filter(|l| l.contains("attention("))
        .collect();
    assert_eq!(layers.len() as i64, n, "{printed}");
    for (i, l) in layers.iter().enumerate() {
        if i % 2 == 0 {
            assert!(
                l.contains("mask=sliding_window(4, 0)") && l.contains("rope=500.0"),
                "{l}"
            );
        } else {
            assert!(
                l.contains("mask=causal") && !l.contains("rope=500.0"),
                "{l}"
            );
        }
    }
    // A layer the preset says nothing of is an error naming the entry.
    cfg.flags.remove(&format!("sliding[{}]", n - 1));
    let diags = common::compile(&src, &cfg).unwrap_err();
    assert!(
        diags[0]
            .message
            .contains(&format!("`sliding[{}]` is not a flag", n - 1)),
        "{diags:?}"
    );
}

#[test]
fn qk_norm_takes_a_weight_kind_and_only_self_attention() {
    check(
        "input x = target.hidden[n] : [t, d]\noutput o = attention(x, heads=h, mask=causal, qk_norm=squared) @a\n",
        &["5:55 bad value for `qk_norm`"],
    );
    check(
        "input x = target.hidden[n] : [t, d]\ninput m = target.hidden[0] : [t, d]\noutput o = attention(x, kv=m, heads=h, mask=full, qk_norm) @a\n",
        &["6:12 `qk_norm` applies to self-attention along the sequence"],
    );
}

#[test]
fn a_preset_list_of_flags_sets_one_flag_per_layer() {
    let cfg =
        draftc_ir::parse_preset("preset p\nfamily gemma3\nn 3\nsliding [true, false, true]\n")
            .unwrap();
    let got: Vec<Option<bool>> = (0..4)
        .map(|i| cfg.flags.get(&format!("sliding[{i}]")).copied())
        .collect();
    assert_eq!(got, [Some(true), Some(false), Some(true), None]);
    let diags =
        draftc_ir::parse_preset("preset p\nfamily gemma3\nsliding [true, 2]\n").unwrap_err();
    assert!(
        diags[0].message.contains("bad value for `sliding`"),
        "{diags:?}"
    );
}

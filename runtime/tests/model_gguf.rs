//! GGUF parser and dequantisation on files built in-process: every metadata
//! value type, versions 2 and 3, custom alignment, and exact decoded values
//! for each supported tensor type.

mod model_support;

use draftc_runtime::model::dequant::{dequantize, GgmlType};
use draftc_runtime::model::gguf::Gguf;
use draftc_runtime::model::gguf_value::{GgufValue, GgufValueType, MetadataExt};
use model_support::*;

#[test]
fn metadata_of_every_type_round_trips() {
    let nested = GgufValue::Array(
        GgufValueType::Array,
        vec![
            GgufValue::Array(
                GgufValueType::U16,
                vec![GgufValue::U16(1), GgufValue::U16(2)],
            ),
            GgufValue::Array(GgufValueType::String, vec![]),
        ],
    );
    let values = vec![
        ("u8", GgufValue::U8(200)),
        ("i8", GgufValue::I8(-5)),
        ("u16", GgufValue::U16(60000)),
        ("i16", GgufValue::I16(-30000)),
        ("u32", GgufValue::U32(4_000_000_000)),
        ("i32", GgufValue::I32(-7)),
        ("f32", GgufValue::F32(1.5)),
        ("bool", GgufValue::Bool(true)),
        ("string", s("héllo ✓")),
        ("u64", GgufValue::U64(u64::MAX)),
        ("i64", GgufValue::I64(i64::MIN)),
        ("f64", GgufValue::F64(-2.25)),
        ("nested", nested),
    ];
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version = version;
        for (k, v) in &values {
            w.kv(k, v.clone());
        }
        let g = Gguf::parse(w.build()).expect("parses");
        assert_eq!(g.version, version);
        assert_eq!(g.metadata.len(), values.len());
        for ((k, v), (gk, gv)) in values.iter().zip(&g.metadata) {
            assert_eq!(k, gk);
            assert_eq!(v, gv);
        }
        assert_eq!(g.require_u64("u32").unwrap(), 4_000_000_000);
        assert_eq!(g.require_str("string").unwrap(), "héllo ✓");
        assert!(g.require_u64("i8").is_err(), "negative value is not a u64");
        let e = g.require_str("u8").unwrap_err().to_string();
        assert!(
            e.contains("`u8`") && e.contains("string") && e.contains("U8"),
            "{e}"
        );
        let e = g.require_u64("absent").unwrap_err().to_string();
        assert!(e.contains("missing metadata key `absent`"), "{e}");
    }
}

#[test]
fn tensor_infos_offsets_and_custom_alignment() {
    for alignment in [32u64, 64, 128] {
        let mut w = GgufWriter::new();
        w.alignment = alignment;
        w.kv("general.alignment", GgufValue::U32(alignment as u32));
        w.tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]));
        w.tensor(
            "b",
            &[2, 2],
            GgmlType::F16,
            f16_bytes(&[0.5, -0.5, 2.0, 65504.0]),
        );
        let (bytes, _, data_at) = w.build_with_offsets();
        let g = Gguf::parse(bytes).expect("parses");
        assert_eq!(g.alignment, alignment);
        assert_eq!(g.data_offset, data_at as u64);
        assert_eq!(g.data_offset % alignment, 0);
        let b = g.tensor("b").unwrap();
        assert_eq!(
            b.offset, alignment,
            "second tensor starts at the next aligned offset"
        );
        assert_eq!(b.shape(), vec![2, 2]);
        assert_eq!(
            g.tensor_f32(g.tensor("a").unwrap()).unwrap(),
            vec![1.0, 2.0, 3.0]
        );
        assert_eq!(g.tensor_f32(b).unwrap(), vec![0.5, -0.5, 2.0, 65504.0]);
    }
}

#[test]
fn dequantises_q8_0_exactly() {
    let mut q = [0i8; 32];
    for (j, x) in q.iter_mut().enumerate() {
        *x = (j as i32 * 8 - 127) as i8;
    }
    let bytes = q8_0_bytes(&[(0.25, q), (-2.0, [1; 32])]);
    let out = dequantize(GgmlType::Q8_0, &bytes, 64, "t").unwrap();
    for j in 0..32 {
        assert_eq!(out[j], (j as f32 * 8.0 - 127.0) * 0.25);
        assert_eq!(out[32 + j], -2.0);
    }
}

#[test]
fn dequantises_q4_0_and_q4_1_nibble_order() {
    let mut q = [0u8; 32];
    for (j, x) in q.iter_mut().enumerate() {
        *x = (j % 16) as u8 ^ ((j / 16) as u8 * 5);
    }
    let out = dequantize(GgmlType::Q4_0, &q4_bytes(&[(0.5, None, q)]), 32, "t").unwrap();
    for j in 0..32 {
        assert_eq!(out[j], (f32::from(q[j]) - 8.0) * 0.5, "Q4_0 weight {j}");
    }
    let out = dequantize(GgmlType::Q4_1, &q4_bytes(&[(0.25, Some(-1.0), q)]), 32, "t").unwrap();
    for j in 0..32 {
        assert_eq!(out[j], f32::from(q[j]) * 0.25 - 1.0, "Q4_1 weight {j}");
    }
}

#[test]
fn dequantises_f16_bf16_f32() {
    let f32s = [0.0f32, -1.0, 3.5, 1e-3];
    assert_eq!(
        dequantize(GgmlType::F32, &f32_bytes(&f32s), 4, "t").unwrap(),
        f32s
    );
    let out = dequantize(GgmlType::F16, &f16_bytes(&f32s), 4, "t").unwrap();
    for (a, b) in out.iter().zip(f32s) {
        assert!((a - b).abs() <= b.abs() * 1e-3, "{a} vs {b}");
    }
    let bf: Vec<u8> = [1.0f32, -2.5]
        .iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect();
    assert_eq!(
        dequantize(GgmlType::BF16, &bf, 2, "t").unwrap(),
        vec![1.0, -2.5]
    );
}

#[test]
fn wrong_data_length_is_an_error() {
    let e = dequantize(GgmlType::Q8_0, &[0u8; 33], 32, "blk.0.x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.0.x") && e.contains("33 bytes") && e.contains("expected 34"),
        "{e}"
    );
    let e = dequantize(GgmlType::Q4_1, &[0u8; 20], 31, "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a multiple of the Q4_1 block size 32"),
        "{e}"
    );
}

#[test]
fn tiny_llama_parses_and_every_tensor_dequantises() {
    let g = Gguf::parse(tiny_llama().build()).expect("parses");
    assert_eq!(g.tensors.len(), 2 + 9 * LAYERS as usize);
    let q = g.tensor("blk.1.attn_q.weight").unwrap();
    assert_eq!(q.ty, GgmlType::Q4_1);
    assert_eq!(q.dims, vec![D, D]);
    for t in &g.tensors {
        let v = g.tensor_f32(t).unwrap();
        assert_eq!(v.len() as u64, t.n_elements(), "{}", t.name);
        assert!(v.iter().all(|x| x.is_finite()), "{}", t.name);
    }
}

/// Blocks of random bytes (sane f16 scales, then extreme ones: ±65504,
/// subnormals, ±0, with random, all-ones and all-zero quants) and what the
/// `gguf` Python package's dequantiser gives for them
/// (`runtime/tests/fixtures/quants/`, written by
/// `tools/fixtures/quant_blocks.py`), decoded here bit for bit.
#[test]
fn every_block_type_matches_the_gguf_package_dequantiser() {
    let dir = draftc_ir::testing::repo().join("runtime/tests/fixtures/quants");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    let types = index["types"].as_object().unwrap();
    // Every block type draftc decodes has fixtures, and the fixtures hold
    // no type it does not decode.
    let decoded: Vec<GgmlType> = (0..40)
        .filter_map(GgmlType::from_tag)
        .filter(|t| t.is_supported() && t.block_size() > 1)
        .collect();
    let mut names: Vec<&str> = decoded.iter().map(|t| t.name()).collect();
    let mut fixtures: Vec<&str> = types.keys().map(|k| k.as_str()).collect();
    names.sort_unstable();
    fixtures.sort_unstable();
    assert_eq!(names, fixtures, "block types decoded vs fixtures");
    assert_eq!(names.len(), 10);
    for ty in decoded {
        let name = ty.name();
        let info = &types[name];
        assert_eq!(
            info["block_bytes"].as_u64(),
            Some(ty.block_bytes()),
            "{name}"
        );
        assert_eq!(
            info["block_elems"].as_u64(),
            Some(ty.block_size()),
            "{name}"
        );
        let bytes = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        let want: Vec<f32> = std::fs::read(dir.join(format!("{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let got = dequantize(ty, &bytes, want.len() as u64, name).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits(),
                "{name}: weight {i} (block {}, index {}): draftc {g}, gguf {w}",
                i as u64 / ty.block_size(),
                i as u64 % ty.block_size()
            );
        }
        // The values are not all alike (the layout is exercised).
        assert!(want.iter().any(|&w| w != want[0]), "{name}");
    }
}

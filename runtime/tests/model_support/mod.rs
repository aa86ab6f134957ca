//! Test support for the model tests: a tiny GGUF writer, quantisers that
//! produce blocks with known values, and a tiny random Llama GGUF (byte-level
//! BPE vocabulary included) so the default suite never downloads anything.
#![allow(dead_code)]

use draftc_runtime::model::dequant::GgmlType;
use draftc_runtime::model::gguf_value::{GgufValue, GgufValueType};
use half::f16;

/// A tensor to write: name, ggml dims (fastest first), type, raw bytes.
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// Builds GGUF bytes. Fields are public so tests can break them on purpose.
pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<RawTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub fn kv(&mut self, key: &str, value: GgufValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push(RawTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Serialises; also returns the byte offset where the tensor infos start
    /// and the absolute offset of the data section.
    pub fn build_with_offsets(&self) -> (Vec<u8>, usize, usize) {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut b, k);
            b.extend_from_slice(&v.value_type().tag().to_le_bytes());
            write_value(&mut b, v);
        }
        let infos_at = b.len();
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            write_str(&mut b, &t.name);
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.ty.0.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        pad(&mut b, self.alignment);
        let data_at = b.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            b.resize(data_at + off as usize, 0);
            b.extend_from_slice(&t.data);
        }
        (b, infos_at, data_at)
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_offsets().0
    }
}

fn pad(b: &mut Vec<u8>, alignment: u64) {
    while !(b.len() as u64).is_multiple_of(alignment) {
        b.push(0);
    }
}

fn write_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn write_value(b: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => b.push(*x),
        GgufValue::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => b.push(u8::from(*x)),
        GgufValue::String(s) => write_str(b, s),
        GgufValue::Array(ty, items) => {
            b.extend_from_slice(&ty.tag().to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(b, item);
            }
        }
        GgufValue::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}

pub fn s(x: &str) -> GgufValue {
    GgufValue::String(x.into())
}

pub fn str_array(items: &[String]) -> GgufValue {
    GgufValue::Array(GgufValueType::String, items.iter().map(|x| s(x)).collect())
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect()
}

/// Q8_0 blocks: scale `d`, quants `q` (32 per block).
pub fn q8_0_bytes(blocks: &[(f32, [i8; 32])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (d, q) in blocks {
        b.extend_from_slice(&f16::from_f32(*d).to_le_bytes());
        b.extend(q.iter().map(|&x| x as u8));
    }
    b
}

/// Q4_0 / Q4_1 blocks from 32 nibbles each (weight j in the low nibble of
/// byte j, weight j+16 in the high nibble); `m` is written only for Q4_1.
pub fn q4_bytes(blocks: &[(f32, Option<f32>, [u8; 32])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (d, m, q) in blocks {
        b.extend_from_slice(&f16::from_f32(*d).to_le_bytes());
        if let Some(m) = m {
            b.extend_from_slice(&f16::from_f32(*m).to_le_bytes());
        }
        for j in 0..16 {
            b.push((q[j] & 0x0f) | (q[j + 16] << 4));
        }
    }
    b
}

/// Quantises arbitrary values to Q8_0 (ggml's reference rounding) and
/// returns the bytes and the values they decode to.
pub fn quantize_q8_0(values: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut blocks = Vec::new();
    let mut decoded = Vec::new();
    for chunk in values.chunks(32) {
        let amax = chunk.iter().fold(0f32, |a, &x| a.max(x.abs()));
        let d = f16::from_f32(amax / 127.0).to_f32();
        let mut q = [0i8; 32];
        for (j, &x) in chunk.iter().enumerate() {
            q[j] = if d == 0.0 {
                0
            } else {
                (x / d).round().clamp(-127.0, 127.0) as i8
            };
            decoded.push(f32::from(q[j]) * d);
        }
        blocks.push((d, q));
    }
    (q8_0_bytes(&blocks), decoded)
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn pseudo_random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// GPT-2's byte → printable-unicode map (what byte-level BPE vocabularies
/// store), so the tiny vocabulary covers every byte.
pub fn byte_level_alphabet() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(_, c)| char::from_u32(c).map(String::from).unwrap_or_default())
        .collect()
}

pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const MERGES: [&str; 5] = ["Ġ t", "h e", "Ġt he", "1 2", "i n"];

/// Tiny Llama dimensions: d 32, 2 heads of 16, 1 KV head, FFN 64, 2 layers.
pub const D: u64 = 32;
pub const HEADS: u64 = 2;
pub const KV_HEADS: u64 = 1;
pub const FFN: u64 = 64;
pub const LAYERS: u64 = 2;

/// The chat template of SmolLM2-135M-Instruct's GGUF, verbatim.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Vocabulary of the tiny model: specials, the 256 byte tokens, merges.
pub fn tiny_vocab() -> Vec<String> {
    let mut v: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    v.extend(byte_level_alphabet());
    for m in MERGES {
        v.push(m.replace(' ', ""));
    }
    v
}

/// A complete tiny Llama GGUF writer: metadata like llama.cpp writes it,
/// embeddings in Q8_0, attention in Q4_1, FFN in Q4_0 / F16, norms in F32.
pub fn tiny_llama() -> GgufWriter {
    let vocab = tiny_vocab();
    let n_vocab = vocab.len() as u64;
    let mut w = GgufWriter::new();
    let mut types = vec![GgufValue::I32(3); SPECIALS.len()];
    types.resize(vocab.len(), GgufValue::I32(1));
    w.kv("general.architecture", s("llama"))
        .kv("llama.block_count", GgufValue::U32(LAYERS as u32))
        .kv("llama.context_length", GgufValue::U32(128))
        .kv("llama.embedding_length", GgufValue::U32(D as u32))
        .kv("llama.feed_forward_length", GgufValue::U32(FFN as u32))
        .kv("llama.attention.head_count", GgufValue::U32(HEADS as u32))
        .kv(
            "llama.attention.head_count_kv",
            GgufValue::U32(KV_HEADS as u32),
        )
        .kv("llama.rope.freq_base", GgufValue::F32(100000.0))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-5),
        )
        .kv("llama.vocab_size", GgufValue::U32(n_vocab as u32))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("smollm"))
        .kv("tokenizer.ggml.tokens", str_array(&vocab))
        .kv(
            "tokenizer.ggml.token_type",
            GgufValue::Array(GgufValueType::I32, types),
        )
        .kv(
            "tokenizer.ggml.merges",
            str_array(&MERGES.iter().map(|m| m.to_string()).collect::<Vec<_>>()),
        )
        .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", GgufValue::U32(0))
        .kv("tokenizer.ggml.padding_token_id", GgufValue::U32(2))
        .kv("tokenizer.chat_template", s(CHAT_TEMPLATE));
    let (emb, _) = quantize_q8_0(&pseudo_random((n_vocab * D) as usize, 1, 0.5));
    w.tensor("token_embd.weight", &[D, n_vocab], GgmlType::Q8_0, emb);
    for i in 0..LAYERS {
        let seed = 100 + i * 10;
        let kv = KV_HEADS * D / HEADS;
        let q4_1 = |rows: u64, seed: u64| q4_random(rows * D / 32, seed, true);
        w.tensor(
            &format!("blk.{i}.attn_norm.weight"),
            &[D],
            GgmlType::F32,
            f32_bytes(&pseudo_random(D as usize, seed, 1.0)),
        );
        w.tensor(
            &format!("blk.{i}.attn_q.weight"),
            &[D, D],
            GgmlType::Q4_1,
            q4_1(D, seed + 1),
        );
        w.tensor(
            &format!("blk.{i}.attn_k.weight"),
            &[D, kv],
            GgmlType::Q4_1,
            q4_1(kv, seed + 2),
        );
        w.tensor(
            &format!("blk.{i}.attn_v.weight"),
            &[D, kv],
            GgmlType::Q4_1,
            q4_1(kv, seed + 3),
        );
        w.tensor(
            &format!("blk.{i}.attn_output.weight"),
            &[D, D],
            GgmlType::Q4_1,
            q4_1(D, seed + 4),
        );
        w.tensor(
            &format!("blk.{i}.ffn_norm.weight"),
            &[D],
            GgmlType::F32,
            f32_bytes(&pseudo_random(D as usize, seed + 5, 1.0)),
        );
        w.tensor(
            &format!("blk.{i}.ffn_gate.weight"),
            &[D, FFN],
            GgmlType::Q4_0,
            q4_random(FFN * D / 32, seed + 6, false),
        );
        w.tensor(
            &format!("blk.{i}.ffn_up.weight"),
            &[D, FFN],
            GgmlType::F16,
            f16_bytes(&pseudo_random((FFN * D) as usize, seed + 7, 0.1)),
        );
        w.tensor(
            &format!("blk.{i}.ffn_down.weight"),
            &[FFN, D],
            GgmlType::Q4_0,
            q4_random(FFN * D / 32, seed + 8, false),
        );
    }
    w.tensor(
        "output_norm.weight",
        &[D],
        GgmlType::F32,
        f32_bytes(&pseudo_random(D as usize, 9, 1.0)),
    );
    w
}

/// Random Q4 blocks (Q4_1 when `with_min`).
pub fn q4_random(n_blocks: u64, seed: u64, with_min: bool) -> Vec<u8> {
    let r = pseudo_random(n_blocks as usize * 34, seed, 1.0);
    let blocks: Vec<(f32, Option<f32>, [u8; 32])> = r
        .chunks(34)
        .map(|c| {
            let mut q = [0u8; 32];
            for (j, x) in c[2..].iter().enumerate() {
                q[j] = ((x + 1.0) * 7.99) as u8 & 0x0f;
            }
            (c[0].abs() * 0.05 + 0.001, with_min.then_some(c[1] * 0.1), q)
        })
        .collect();
    q4_bytes(&blocks)
}

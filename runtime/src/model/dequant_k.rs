//! Dequantisation of the ggml block types most GGUF files use besides Q8_0
//! and Q4_0: Q5_0 and Q5_1 (32 weights a block) and the "K" types Q2_K,
//! Q3_K, Q4_K, Q5_K and Q6_K (super-blocks of 256 weights with 4-, 6- or
//! 8-bit sub-block scales), as ggml-quants.c's `dequantize_row_*` lays them
//! out. Each function takes one block's bytes (its size checked by the
//! caller) and appends its weights to `out`, in the same float operation
//! order as ggml (and as the `gguf` Python package, which the tests compare
//! against bit for bit).

use half::f16;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 32 unsigned 5-bit quants of a Q5_0 / Q5_1 block from its 32 high
/// bits `qh` (bit `j` for weight `j`) and 16 bytes of low nibbles `qs`
/// (weight `j` in byte `j`'s low nibble, `j + 16` in its high one).
fn q5_quants<'a>(qh: &[u8], qs: &'a [u8]) -> impl Iterator<Item = u8> + 'a {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let high = move |bit: usize| ((qh >> bit) & 1) as u8;
    let low = qs
        .iter()
        .enumerate()
        .map(move |(j, &q)| (q & 0x0f) | high(j) << 4);
    let high_nibbles = qs
        .iter()
        .enumerate()
        .map(move |(j, &q)| (q >> 4) | high(j + 16) << 4);
    low.chain(high_nibbles)
}

/// Q5_0, 22 bytes: f16 scale `d`, then [`q5_quants`]; weight = `(q − 16)·d`.
pub(super) fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    out.extend(q5_quants(&b[2..6], &b[6..22]).map(|q| f32::from(q as i8 - 16) * d));
}

/// Q5_1, 24 bytes: f16 scale `d` and minimum `m`, then [`q5_quants`];
/// weight = `q·d + m`.
pub(super) fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    out.extend(q5_quants(&b[4..8], &b[8..24]).map(|q| f32::from(q) * d + m));
}

/// Where sub-block `s` (16 weights) of a Q2_K / Q3_K super-block finds its
/// 2-bit quants: bit pair `shift / 2` of 16 bytes of the 64 starting at
/// `at`. Each half of 128 weights is four runs of 32 (bit pairs 0–3 of its
/// 32 bytes), each run two sub-blocks.
fn k2_run(s: usize) -> (usize, u32) {
    (32 * (s / 8) + 16 * (s % 2), 2 * ((s / 2) % 4) as u32)
}

/// Q2_K, 84 bytes: 16 bytes of sub-block scales (scale in the low nibble,
/// minimum in the high one), 64 bytes of 2-bit quants ([`k2_run`]), then
/// f16 `d` and `dmin`; weight = `d·sc · q − dmin·m`.
pub(super) fn q2_k(b: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (s, &sc) in scales.iter().enumerate() {
        let (dl, ml) = (d * f32::from(sc & 0x0f), dmin * f32::from(sc >> 4));
        let (at, shift) = k2_run(s);
        out.extend(
            qs[at..at + 16]
                .iter()
                .map(|&q| dl * f32::from((q >> shift) & 3) - ml),
        );
    }
}

/// Q3_K, 110 bytes: 32 bytes `hmask` (bit `i / 32` of byte `i % 32` set
/// when weight `i`'s quant is not offset by −4), 64 bytes of 2-bit quants
/// ([`k2_run`]), 12 bytes of 6-bit signed sub-block scales (low nibbles in
/// bytes 0–7, scales 8–15 in their high nibbles; high bit pairs in bytes
/// 8–11, scale `s`'s in byte `8 + s % 4` at bit `2·(s / 4)`), then f16 `d`;
/// weight = `d·(sc − 32) · (q − 4·!h)`.
pub(super) fn q3_k(b: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for s in 0..16 {
        let low = if s < 8 {
            scales[s] & 0x0f
        } else {
            scales[s - 8] >> 4
        };
        let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        let dl = d * f32::from((low | high << 4) as i8 - 32);
        let (at, shift) = k2_run(s);
        // Weight 16·s + j is byte `at + j` of the quants and its hmask bit
        // is bit s / 2 of byte (at + j) % 32.
        out.extend((at..at + 16).map(|l| {
            let q = ((qs[l] >> shift) & 3) as i8;
            let offset = if (hmask[l % 32] >> (s / 2)) & 1 == 0 {
                4
            } else {
                0
            };
            dl * f32::from(q - offset)
        }));
    }
}

/// Sub-block `j`'s 6-bit scale and minimum from the 12 packed bytes of a
/// Q4_K / Q5_K super-block (`get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// Q4_K and Q5_K (`high` = the 32 bytes of fifth bits, Q5_K only): f16 `d`
/// and `dmin`, 12 bytes of packed scales, then for each 64 weights 32
/// bytes whose low nibbles are the first 32 and high nibbles the next 32;
/// weight = `d·sc · q − dmin·m`.
fn k4(b: &[u8], high: Option<&[u8]>, qs: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for (g, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1, d2, m2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        // Q5_K's fifth bit of weight l of this group: bit 2g (low
        // nibbles) or 2g + 1 (high nibbles) of high[l].
        let bit = |l: usize, k: usize| high.map_or(0, |h| ((h[l] >> (2 * g + k)) & 1) << 4);
        out.extend((0..32).map(|l| d1 * f32::from((q[l] & 0x0f) | bit(l, 0)) - m1));
        out.extend((0..32).map(|l| d2 * f32::from((q[l] >> 4) | bit(l, 1)) - m2));
    }
}

/// Q4_K, 144 bytes (see [`k4`]).
pub(super) fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    k4(b, None, &b[16..144], out);
}

/// Q5_K, 176 bytes: Q4_K's layout with 32 bytes of fifth bits before the
/// nibbles.
pub(super) fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    k4(b, Some(&b[16..48]), &b[48..176], out);
}

/// Q6_K, 210 bytes: 128 bytes of low nibbles `ql`, 64 bytes of high bit
/// pairs `qh`, 16 signed 8-bit sub-block scales, then f16 `d`; each half of
/// 128 weights is four runs of 32 (`ql` low/high nibbles of two 32-byte
/// runs, `qh` bit pairs 0–3), weight = `d · sc · (q − 32)`.
pub(super) fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 208);
    let start = out.len();
    out.resize(start + 256, 0.0);
    let y = &mut out[start..];
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0x0f) | (qh[l] & 3) << 4,
                (ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4,
                (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,
            ];
            for (k, &q) in q.iter().enumerate() {
                let s = f32::from(sc[is + 2 * k] as i8);
                y[l + 32 * k] = d * s * f32::from(q as i8 - 32);
            }
        }
    }
}

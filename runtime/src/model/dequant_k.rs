//! Dequantisation of the ggml block types most GGUF files use besides Q8_0
//! and Q4_0: Q5_0 (32 weights a block) and the "K" types Q4_K, Q5_K and
//! Q6_K (super-blocks of 256 weights with 6- or 8-bit sub-block scales),
//! as ggml-quants.c's `dequantize_row_*` lays them out. Each function takes
//! one block's bytes (its size checked by the caller) and appends its
//! weights to `out`, in the same float operation order as ggml (and as the
//! `gguf` Python package, which the tests compare against value by value).

use half::f16;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q5_0, 22 bytes: f16 scale `d`, 32 high bits `qh`, 16 bytes of low
/// nibbles (weight `j` in byte `j`'s low nibble, `j + 16` in its high one).
pub(super) fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    let high = |bit: usize| ((qh >> bit) & 1) as u8;
    out.extend((0..16).map(|j| f32::from(((qs[j] & 0x0f) | high(j) << 4) as i8 - 16) * d));
    out.extend((0..16).map(|j| f32::from(((qs[j] >> 4) | high(j + 12 + 4) << 4) as i8 - 16) * d));
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

//! The q/k/v projection with RoPE and the KV append as its epilogue
//! (`linear_rope_qkv`): against the plain-Rust reference over random shapes
//! (ragged pair counts, rows past a block, with and without the norm, f32
//! and f16, both layouts), bit for bit against the two-launch form it
//! replaces (the plain linear, then `rope_qkv_append`), and its argument
//! errors.

use draftc_ops::kv::RowIndex;
use draftc_ops::linear::{linear_lanes, Epilogue, Prologue};
use draftc_ops::linear_plane::{linear_planes, PlaneShape};
use draftc_ops::linear_rope::{linear_rope_qkv, reference, RopeQkvLayout, RopeQkvOut};
use draftc_ops::rope::{rope_freqs, rope_qkv_append};
use draftc_ops::testing::{
    assert_close, awkward_size, config, distinct_slots, float_dtype, random_f32, random_u32,
    round_to, test_client, TestRuntime,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

type R = TestRuntime;

fn plane() -> u32 {
    test_client().properties().hardware.plane_size_max
}

/// One random problem on the host and the device.
struct Case {
    m: usize,
    k: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    rows: usize,
    dtype: DType,
    x: Vec<f32>,
    w: Vec<f32>,
    gamma: Vec<f32>,
    pos: Vec<u32>,
    slots: Vec<u32>,
    k0: Vec<f32>,
    v0: Vec<f32>,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(
        m: usize,
        k: usize,
        kv_heads: usize,
        group: usize,
        half: usize,
        extra: usize,
        dtype: DType,
        seed: u64,
    ) -> Case {
        let (heads, hd) = (kv_heads * group, 2 * half);
        let n = (heads + 2 * kv_heads) * hd;
        let rows = m + extra;
        let kw = kv_heads * hd;
        Case {
            m,
            k,
            heads,
            kv_heads,
            hd,
            rows,
            dtype,
            x: random_f32(seed, m * k, -2.0, 2.0, dtype),
            w: random_f32(seed ^ 1, n * k, -0.5, 0.5, dtype),
            gamma: random_f32(seed ^ 2, k, 0.5, 1.5, dtype),
            pos: random_u32(seed ^ 3, m, 8192),
            slots: distinct_slots(seed, rows, m),
            k0: random_f32(seed ^ 5, rows * kw, -1.0, 1.0, dtype),
            v0: random_f32(seed ^ 7, rows * kw, -1.0, 1.0, dtype),
        }
    }

    fn n(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.hd
    }

    /// The case on the device: x, the stacked weight, the norm's scale, q,
    /// the caches, the positions, the frequencies and the slots.
    fn upload(&self) -> OnDevice {
        let c = test_client();
        let up = |d: &[f32], s: &[usize]| DeviceTensor::upload_f32(&c, d, s, self.dtype).unwrap();
        let kw = self.kv_heads * self.hd;
        OnDevice {
            x: up(&self.x, &[self.m, self.k]),
            w: up(&self.w, &[self.n(), self.k]),
            gamma: up(&self.gamma, &[self.k]),
            q: DeviceTensor::zeros(&c, &[self.m, self.heads, self.hd], self.dtype),
            k_cache: up(&self.k0, &[self.rows, kw]),
            v_cache: up(&self.v0, &[self.rows, kw]),
            pos: DeviceTensor::upload_u32(&c, &self.pos, &[self.m]).unwrap(),
            freqs: rope_freqs(&c, self.hd, 1e5).unwrap(),
            slots: RowIndex::upload(&c, &self.slots).unwrap(),
        }
    }

    /// The fused launch's q, K cache and V cache.
    fn fused(&self, norm: bool, layout: RopeQkvLayout) -> Outputs {
        let d = self.upload();
        let out = RopeQkvOut {
            positions: &d.pos,
            freqs: &d.freqs,
            slots: &d.slots,
            q: &d.q,
            k_cache: &d.k_cache,
            v_cache: &d.v_cache,
        };
        let gamma = norm.then_some((&d.gamma, 1e-5));
        linear_rope_qkv(&test_client(), &d.x, &d.w, gamma, out, layout).unwrap();
        d.outputs()
    }

    /// The two launches it replaces: the plain linear (same layout) into a
    /// `[m, n]` buffer, then `rope_qkv_append`.
    fn two_launches(&self, norm: bool, layout: RopeQkvLayout) -> Outputs {
        let c = test_client();
        let d = self.upload();
        let qkv = DeviceTensor::<R>::zeros(&c, &[self.m, self.n()], self.dtype);
        let pro = match norm {
            true => Prologue::RmsNorm {
                weight: &d.gamma,
                eps: 1e-5,
            },
            false => Prologue::None,
        };
        match layout {
            RopeQkvLayout::Lanes { cols } => {
                linear_lanes(&c, &d.x, &d.w, pro, Epilogue::None, &qkv, cols).unwrap()
            }
            RopeQkvLayout::Planes(s) => {
                let shape = PlaneShape { cols: 1, ..s };
                linear_planes(&c, &d.x, &d.w, pro, Epilogue::None, &qkv, shape).unwrap()
            }
        }
        rope_qkv_append(
            &c, &qkv, &d.pos, &d.freqs, &d.slots, &d.q, &d.k_cache, &d.v_cache,
        )
        .unwrap();
        d.outputs()
    }

    fn reference(&self, norm: bool) -> Outputs {
        let (mut kc, mut vc) = (self.k0.clone(), self.v0.clone());
        let dtype = self.dtype;
        let q = reference::linear_rope_qkv(
            &self.x,
            &self.w,
            self.k,
            norm.then_some((self.gamma.as_slice(), 1e-5)),
            |v| round_to(dtype, &[v])[0],
            &self.pos,
            &self.slots,
            self.heads,
            self.kv_heads,
            self.hd,
            1e5,
            &mut kc,
            &mut vc,
        );
        (q, kc, vc)
    }
}

/// q, K cache and V cache, downloaded.
type Outputs = (Vec<f32>, Vec<f32>, Vec<f32>);

/// A [`Case`] on the device.
struct OnDevice {
    x: DeviceTensor<R>,
    w: DeviceTensor<R>,
    gamma: DeviceTensor<R>,
    q: DeviceTensor<R>,
    k_cache: DeviceTensor<R>,
    v_cache: DeviceTensor<R>,
    pos: DeviceTensor<R>,
    freqs: DeviceTensor<R>,
    slots: RowIndex<R>,
}

impl OnDevice {
    fn outputs(&self) -> Outputs {
        let c = test_client();
        (
            self.q.download_f32(&c).unwrap(),
            self.k_cache.download_f32(&c).unwrap(),
            self.v_cache.download_f32(&c).unwrap(),
        )
    }
}

/// The layouts tried: two unit widths, and planes with and without a
/// split reduction, one or two pairs a plane (every variant is a kernel
/// lavapipe compiles, so the set stays small).
fn layout_strategy() -> impl Strategy<Value = RopeQkvLayout> {
    prop_oneof![
        prop_oneof![Just(8usize), Just(16)].prop_map(|cols| RopeQkvLayout::Lanes { cols }),
        (prop_oneof![Just(1u32), Just(2)], 1u32..3).prop_map(|(ksplit, cols)| {
            RopeQkvLayout::Planes(PlaneShape {
                plane: plane(),
                planes: 4,
                ksplit,
                cols,
            })
        }),
    ]
}

proptest! {
    #![proptest_config(config(8))]

    /// The fused launch equals the reference (a norm, the projection
    /// rounded to the storage dtype, RoPE, the appends), every other cache
    /// row kept.
    #[test]
    fn matches_reference(m in awkward_size(12), k in prop_oneof![Just(64usize), Just(36), Just(7)],
                         kv_heads in 1usize..3, group in 1usize..4,
                         half in prop_oneof![Just(1usize), Just(32), 1usize..20], extra in 0usize..9,
                         norm in any::<bool>(), layout in layout_strategy(),
                         dtype in float_dtype(), seed in any::<u64>()) {
        let case = Case::new(m, k, kv_heads, group, half, extra, dtype, seed);
        let (q, kc, vc) = case.fused(norm, layout);
        let (wq, wk, wv) = case.reference(norm);
        assert_close("q", &q, &wq, dtype)?;
        assert_close("k_cache", &kc, &wk, dtype)?;
        assert_close("v_cache", &vc, &wv, dtype)?;
    }

    /// On the same layout, the one launch is bit for bit the plain linear
    /// followed by `rope_qkv_append` (what a plan without the fusion runs).
    #[test]
    fn equals_the_two_launches_bit_for_bit(m in awkward_size(12), k in prop_oneof![Just(576usize), Just(36)],
                                           half in prop_oneof![Just(32usize), 1usize..9], norm in any::<bool>(),
                                           layout in layout_strategy(), dtype in float_dtype(), seed in any::<u64>()) {
        let case = Case::new(m, k, 1, 3, half, 3, dtype, seed);
        prop_assert_eq!(case.fused(norm, layout), case.two_launches(norm, layout));
    }
}

#[test]
fn bad_arguments_are_errors() {
    let c = test_client();
    let f = DType::F32;
    let x = DeviceTensor::<R>::zeros(&c, &[2, 8], f);
    // 2 query heads, 1 kv head of 4: the stacked weight is 16 rows.
    let w = DeviceTensor::<R>::zeros(&c, &[16, 8], f);
    let q = DeviceTensor::<R>::zeros(&c, &[2, 2, 4], f);
    let cache = DeviceTensor::<R>::zeros(&c, &[4, 4], f);
    let pos = DeviceTensor::upload_u32(&c, &[0, 1], &[2]).unwrap();
    let freqs = rope_freqs(&c, 4, 1e4).unwrap();
    let slots = RowIndex::upload(&c, &[0, 3]).unwrap();
    let out = RopeQkvOut {
        positions: &pos,
        freqs: &freqs,
        slots: &slots,
        q: &q,
        k_cache: &cache,
        v_cache: &cache,
    };
    let lanes = RopeQkvLayout::Lanes { cols: 8 };
    linear_rope_qkv(&c, &x, &w, None, out, lanes).unwrap();
    let wide = DeviceTensor::<R>::zeros(&c, &[20, 8], f);
    assert!(matches!(
        linear_rope_qkv(&c, &x, &wide, None, out, lanes),
        Err(OpsError::ShapeMismatch { arg: "weight", .. })
    ));
    assert!(matches!(
        linear_rope_qkv(&c, &x, &w, None, out, RopeQkvLayout::Lanes { cols: 12 }),
        Ok(())
    ));
    assert!(linear_rope_qkv(&c, &x, &w, None, out, RopeQkvLayout::Lanes { cols: 7 }).is_err());
    let twice = RowIndex::upload(&c, &[1, 1]).unwrap();
    assert!(matches!(
        linear_rope_qkv(
            &c,
            &x,
            &w,
            None,
            RopeQkvOut {
                slots: &twice,
                ..out
            },
            lanes
        ),
        Err(OpsError::InvalidArgument { .. })
    ));
    let far = RowIndex::upload(&c, &[0, 4]).unwrap();
    assert!(matches!(
        linear_rope_qkv(&c, &x, &w, None, RopeQkvOut { slots: &far, ..out }, lanes),
        Err(OpsError::IndexOutOfRange { .. })
    ));
    let gamma = DeviceTensor::<R>::zeros(&c, &[7], f);
    assert!(matches!(
        linear_rope_qkv(&c, &x, &w, Some((&gamma, 1e-5)), out, lanes),
        Err(OpsError::ShapeMismatch { arg: "gamma", .. })
    ));
    let half_q = DeviceTensor::<R>::zeros(&c, &[2, 2, 4], DType::F16);
    assert!(linear_rope_qkv(&c, &x, &w, None, RopeQkvOut { q: &half_q, ..out }, lanes).is_err());
}

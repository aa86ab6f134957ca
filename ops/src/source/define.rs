//! The kernel definitions behind [`super::source`]: each [`KernelSpec`]
//! expanded into a `KernelDefinition` with a `KernelBuilder` (no client, no
//! device; cubecl guide §3.2).

use super::*;

/// A kernel definition for `spec`, built the way the `#[cube(launch)]`
/// macro's `define()` builds it, minus the client.
pub(super) fn definition(spec: &KernelSpec, props: TargetProperties) -> Result<KernelDefinition> {
    crate::dispatch_float!(spec.dtype(), OP, F => { define::<F>(spec, props) })
}

fn array_in<C: CubePrimitive>(b: &mut KernelBuilder) -> NativeExpand<Array<C>> {
    <Array<C> as LaunchArg>::expand(&ArrayCompilationArg { inplace: None }, b)
}

fn array_out<C: CubePrimitive>(b: &mut KernelBuilder) -> NativeExpand<Array<C>> {
    <Array<C> as LaunchArg>::expand_output(&ArrayCompilationArg { inplace: None }, b)
}

fn scalar<T: LaunchArg<CompilationArg = ()>>(b: &mut KernelBuilder) -> <T as CubeType>::ExpandType {
    T::expand(&(), b)
}

/// Registers the runtime arguments both linear layouts share (buffers `x`,
/// `w`, `w_up`, `gamma`, `extra`, `out`, then the size scalars and `eps`)
/// and expands kernel `$k` with them and its comptime arguments.
macro_rules! expand_linear {
    ($k:path, $b:ident, $n:ident, $($comptime:expr),+) => {{
        use $k as k;
        $b.scope.register_size::<k::N>($n);
        AddressType::U32.register(&mut $b.scope);
        let x = array_in::<Vector<F, k::N>>(&mut $b);
        let w = array_in::<Vector<F, k::N>>(&mut $b);
        let w_up = array_in::<Vector<F, k::N>>(&mut $b);
        let gamma = array_in::<Vector<F, k::N>>(&mut $b);
        let extra = array_in::<F>(&mut $b);
        let out = array_out::<F>(&mut $b);
        let m = scalar::<usize>(&mut $b);
        let in_v = scalar::<usize>(&mut $b);
        let n_cols = scalar::<usize>(&mut $b);
        let col_offset = scalar::<usize>(&mut $b);
        let out_stride = scalar::<usize>(&mut $b);
        let groups = scalar::<usize>(&mut $b);
        let dv = scalar::<usize>(&mut $b);
        let d = scalar::<usize>(&mut $b);
        let eps = scalar::<f32>(&mut $b);
        k::expand::<F, k::N>(
            &mut $b.scope,
            $n,
            x,
            w,
            w_up,
            gamma,
            extra,
            out,
            m,
            in_v,
            n_cols,
            col_offset,
            out_stride,
            groups,
            dv,
            d,
            eps,
            $($comptime),+
        );
    }};
}

/// Registers the runtime arguments both layouts of the q/k/v projection
/// with RoPE share (`x`, `w`, `gamma`, `pos`, `inv_freq`, `slots`, `q`,
/// `k_cache`, `v_cache`, then the size scalars and `eps`) and expands
/// kernel `$k` with them and its comptime arguments.
macro_rules! expand_linear_rope {
    ($k:path, $b:ident, $n:ident, $($comptime:expr),+) => {{
        use $k as k;
        $b.scope.register_size::<k::N>($n);
        AddressType::U32.register(&mut $b.scope);
        let x = array_in::<Vector<F, k::N>>(&mut $b);
        let w = array_in::<Vector<F, k::N>>(&mut $b);
        let gamma = array_in::<Vector<F, k::N>>(&mut $b);
        let pos = array_in::<u32>(&mut $b);
        let inv_freq = array_in::<f32>(&mut $b);
        let slots = array_in::<u32>(&mut $b);
        let q = array_out::<F>(&mut $b);
        let k_cache = array_out::<F>(&mut $b);
        let v_cache = array_out::<F>(&mut $b);
        let m = scalar::<usize>(&mut $b);
        let in_v = scalar::<usize>(&mut $b);
        let pairs = scalar::<usize>(&mut $b);
        let half = scalar::<usize>(&mut $b);
        let heads = scalar::<usize>(&mut $b);
        let kv_heads = scalar::<usize>(&mut $b);
        let d = scalar::<usize>(&mut $b);
        let eps = scalar::<f32>(&mut $b);
        k::expand::<F, k::N>(
            &mut $b.scope,
            $n,
            x,
            w,
            gamma,
            pos,
            inv_freq,
            slots,
            q,
            k_cache,
            v_cache,
            m,
            in_v,
            pairs,
            half,
            heads,
            kv_heads,
            d,
            eps,
            $($comptime),+
        );
    }};
}

/// Expands the kernel of `spec` with storage type `F`. Runtime arguments are
/// registered in declaration order (inputs and outputs as buffers, scalars in
/// the info block); comptime ones are passed by value.
fn define<F: Float + CubeElement>(spec: &KernelSpec, props: TargetProperties) -> KernelDefinition {
    let mut b = KernelBuilder::default();
    b.runtime_properties(props);
    let n = spec.vector();
    match *spec {
        KernelSpec::Linear {
            rows_per_block,
            cols,
            norm,
            epilogue: LinearEpilogue::RopeQkv,
            ..
        } => expand_linear_rope!(
            crate::linear_rope::linear_rope_qkv_kernel,
            b,
            n,
            rows_per_block,
            cols / 2,
            norm
        ),
        KernelSpec::LinearPlanes {
            rows_per_block,
            cols,
            planes,
            ksplit,
            norm,
            epilogue: LinearEpilogue::RopeQkv,
            ..
        } => expand_linear_rope!(
            crate::linear_rope::linear_plane_rope_qkv_kernel,
            b,
            n,
            rows_per_block,
            cols,
            planes,
            ksplit,
            norm
        ),
        KernelSpec::Linear {
            rows_per_block,
            cols,
            norm,
            epilogue,
            ..
        } => expand_linear!(
            linear::linear_kernel,
            b,
            n,
            rows_per_block,
            cols,
            norm,
            epilogue.code()
        ),
        KernelSpec::LinearPlanes {
            rows_per_block,
            cols,
            planes,
            ksplit,
            norm,
            epilogue,
            ..
        } => expand_linear!(
            crate::linear_plane::linear_plane_kernel,
            b,
            n,
            rows_per_block,
            cols,
            planes,
            ksplit,
            norm,
            epilogue.code()
        ),
        KernelSpec::RmsNorm { .. } => {
            use rms_norm::rms_norm_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<Vector<F, k::N>>(&mut b);
            let w = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let segments = scalar::<usize>(&mut b);
            let groups = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            let d = scalar::<usize>(&mut b);
            let eps = scalar::<f32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                x,
                w,
                out,
                segments,
                groups,
                dv,
                d,
                eps,
                rms_norm::BLOCK,
            );
        }
        KernelSpec::Rope { .. } => {
            use rope::rope_kernel as k;
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<F>(&mut b);
            let pos = array_in::<u32>(&mut b);
            let inv_freq = array_in::<f32>(&mut b);
            let out = array_out::<F>(&mut b);
            let pairs = scalar::<usize>(&mut b);
            let heads = scalar::<usize>(&mut b);
            let half = scalar::<usize>(&mut b);
            k::expand::<F>(&mut b.scope, x, pos, inv_freq, out, pairs, heads, half);
        }
        KernelSpec::HeadNorm { rope, .. } => {
            use head_norm::head_norm_rope_kernel as k;
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<F>(&mut b);
            let w = array_in::<F>(&mut b);
            let pos = array_in::<u32>(&mut b);
            let inv_freq = array_in::<f32>(&mut b);
            let out = array_out::<F>(&mut b);
            let rows = scalar::<usize>(&mut b);
            let heads = scalar::<usize>(&mut b);
            let hd = scalar::<usize>(&mut b);
            let eps = scalar::<f32>(&mut b);
            let offset = scalar::<f32>(&mut b);
            k::expand::<F>(
                &mut b.scope,
                x,
                w,
                pos,
                inv_freq,
                out,
                rows,
                heads,
                hd,
                eps,
                offset,
                rope,
            );
        }
        KernelSpec::RopeQkvAppend { .. } => {
            use rope::rope_qkv_append_kernel as k;
            AddressType::U32.register(&mut b.scope);
            let qkv = array_in::<F>(&mut b);
            let pos = array_in::<u32>(&mut b);
            let inv_freq = array_in::<f32>(&mut b);
            let slots = array_in::<u32>(&mut b);
            let q = array_out::<F>(&mut b);
            let k_cache = array_out::<F>(&mut b);
            let v_cache = array_out::<F>(&mut b);
            let pairs = scalar::<usize>(&mut b);
            let heads = scalar::<usize>(&mut b);
            let kv_heads = scalar::<usize>(&mut b);
            let half = scalar::<usize>(&mut b);
            k::expand::<F>(
                &mut b.scope,
                qkv,
                pos,
                inv_freq,
                slots,
                q,
                k_cache,
                v_cache,
                pairs,
                heads,
                kv_heads,
                half,
            );
        }
        KernelSpec::RopeAppend { .. } => {
            use rope::rope_append_kernel as k;
            AddressType::U32.register(&mut b.scope);
            let kx = array_in::<F>(&mut b);
            let vx = array_in::<F>(&mut b);
            let pos = array_in::<u32>(&mut b);
            let inv_freq = array_in::<f32>(&mut b);
            let slots = array_in::<u32>(&mut b);
            let k_cache = array_out::<F>(&mut b);
            let v_cache = array_out::<F>(&mut b);
            let pairs = scalar::<usize>(&mut b);
            let heads = scalar::<usize>(&mut b);
            let half = scalar::<usize>(&mut b);
            k::expand::<F>(
                &mut b.scope,
                kx,
                vx,
                pos,
                inv_freq,
                slots,
                k_cache,
                v_cache,
                pairs,
                heads,
                half,
            );
        }
        KernelSpec::CopyRows { .. } => {
            use copy_rows as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let src = array_in::<Vector<F, k::N>>(&mut b);
            let src_idx = array_in::<u32>(&mut b);
            let dst = array_out::<Vector<F, k::N>>(&mut b);
            let dst_idx = array_in::<u32>(&mut b);
            let rows = scalar::<u32>(&mut b);
            let layers = scalar::<u32>(&mut b);
            let src_rows = scalar::<u32>(&mut b);
            let dst_rows = scalar::<u32>(&mut b);
            let width_v = scalar::<u32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                src,
                src_idx,
                dst,
                dst_idx,
                rows,
                layers,
                src_rows,
                dst_rows,
                width_v,
            );
        }
        KernelSpec::AttentionPlanes {
            pv, planes, mask, ..
        } => {
            use crate::attention::decode_attention as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let q = array_in::<Vector<F, k::N>>(&mut b);
            let kk = array_in::<Vector<F, k::N>>(&mut b);
            let v = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let part_ml = array_out::<f32>(&mut b);
            let part_acc = array_out::<Vector<f32, k::N>>(&mut b);
            let meta = array_in::<u32>(&mut b);
            let k_pos = array_in::<u32>(&mut b);
            let anc = array_in::<u32>(&mut b);
            let row_offset = scalar::<u32>(&mut b);
            let rows = scalar::<u32>(&mut b);
            let heads = scalar::<u32>(&mut b);
            let group = scalar::<u32>(&mut b);
            let kv_heads = scalar::<u32>(&mut b);
            let hdv = scalar::<u32>(&mut b);
            let scale = scalar::<f32>(&mut b);
            let p0 = scalar::<u32>(&mut b);
            let p1 = scalar::<u32>(&mut b);
            let words = scalar::<u32>(&mut b);
            let splits = scalar::<u32>(&mut b);
            let chunk = scalar::<u32>(&mut b);
            let (code, _, _) = mask.representative().kernel_args();
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                q,
                kk,
                v,
                out,
                part_ml,
                part_acc,
                meta,
                k_pos,
                anc,
                row_offset,
                rows,
                heads,
                group,
                kv_heads,
                hdv,
                scale,
                p0,
                p1,
                words,
                splits,
                chunk,
                pv,
                planes,
                crate::attention::decode::MAX_HEAD_DIM / n,
                code,
                mask.is_tree(),
            );
        }
        KernelSpec::AttentionCombine { .. } => {
            use crate::attention::attention_combine as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let part_ml = array_in::<f32>(&mut b);
            let part_acc = array_in::<Vector<f32, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let row_offset = scalar::<u32>(&mut b);
            let rows = scalar::<u32>(&mut b);
            let heads = scalar::<u32>(&mut b);
            let hdv = scalar::<u32>(&mut b);
            let splits = scalar::<u32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                part_ml,
                part_acc,
                out,
                row_offset,
                rows,
                heads,
                hdv,
                splits,
            );
        }
        KernelSpec::Attention {
            mask, head_dim_cap, ..
        } => {
            use fused_attention as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let q = array_in::<Vector<F, k::N>>(&mut b);
            let kk = array_in::<Vector<F, k::N>>(&mut b);
            let v = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let meta = array_in::<u32>(&mut b);
            let k_pos = array_in::<u32>(&mut b);
            let anc = array_in::<u32>(&mut b);
            let row_offset = scalar::<u32>(&mut b);
            let rows = scalar::<u32>(&mut b);
            let heads = scalar::<u32>(&mut b);
            let group = scalar::<u32>(&mut b);
            let kv_heads = scalar::<u32>(&mut b);
            let hdv = scalar::<u32>(&mut b);
            let scale = scalar::<f32>(&mut b);
            let p0 = scalar::<u32>(&mut b);
            let p1 = scalar::<u32>(&mut b);
            let words = scalar::<u32>(&mut b);
            let (code, _, _) = mask.representative().kernel_args();
            let tree = mask.is_tree();
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                q,
                kk,
                v,
                out,
                meta,
                k_pos,
                anc,
                row_offset,
                rows,
                heads,
                group,
                kv_heads,
                hdv,
                scale,
                p0,
                p1,
                words,
                code,
                tree,
                head_dim_cap / n,
            );
        }
        KernelSpec::Embedding { .. } => {
            use embedding::embedding_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let table = array_in::<Vector<F, k::N>>(&mut b);
            let ids = array_in::<u32>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let tokens = scalar::<usize>(&mut b);
            let vocab = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, table, ids, out, tokens, vocab, dv);
        }
        KernelSpec::EmbeddingScaled { .. } => {
            use embedding::embedding_scaled_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let table = array_in::<Vector<F, k::N>>(&mut b);
            let ids = array_in::<u32>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let tokens = scalar::<usize>(&mut b);
            let vocab = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            let scale = scalar::<f32>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, table, ids, out, tokens, vocab, dv, scale);
        }
        KernelSpec::EmbeddingRows { scaled, .. } => {
            use embedding::embedding_rows_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let table = array_in::<Vector<F, k::N>>(&mut b);
            let ids = array_in::<u32>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let tokens = scalar::<usize>(&mut b);
            let vocab = scalar::<usize>(&mut b);
            let row0 = scalar::<usize>(&mut b);
            let rows = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            let scale = scalar::<f32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                table,
                ids,
                out,
                tokens,
                vocab,
                row0,
                rows,
                dv,
                scale,
                scaled,
            );
        }
        KernelSpec::Elementwise { op, .. } => {
            use elementwise::elementwise_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let a = array_in::<Vector<F, k::N>>(&mut b);
            let bb = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let len_v = scalar::<usize>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, a, bb, out, len_v, op.code());
        }
        KernelSpec::LayerSum { .. } => {
            use layer_sum::layer_sum_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<Vector<F, k::N>>(&mut b);
            let w = array_in::<F>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let layers = scalar::<usize>(&mut b);
            let len_v = scalar::<usize>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, x, w, out, layers, len_v);
        }
    }
    b.build(
        KernelSettings::default()
            .cube_dim(CubeDim::new_1d(spec.cube_units()))
            .kernel_name(spec.entry_point()),
    )
}

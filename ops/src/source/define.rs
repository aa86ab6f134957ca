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

/// Expands kernel `$k` the way its `#[cube(launch)]` macro's `define()`
/// would: its runtime arguments registered in declaration order, each
/// `input` (a read array of the type given), `output` (a written array) or
/// `scalar` (in the info block), then the kernel expanded with them and its
/// comptime arguments. With `vector n`, the kernel is generic over a vector
/// size as well, named `N` in the argument types and registered as `n`.
macro_rules! expand {
    (@input $b:ident, $t:ty) => {
        array_in::<$t>(&mut $b)
    };
    (@output $b:ident, $t:ty) => {
        array_out::<$t>(&mut $b)
    };
    (@scalar $b:ident, $t:ty) => {
        scalar::<$t>(&mut $b)
    };
    ($b:ident, $k:path, vector $n:ident;
     $($kind:ident $name:ident: $t:ty),+;
     $($comptime:expr),* $(,)?) => {{
        use $k as kernel;
        type N = kernel::N;
        $b.scope.register_size::<N>($n);
        AddressType::U32.register(&mut $b.scope);
        $(let $name = expand!(@$kind $b, $t);)+
        kernel::expand::<F, N>(&mut $b.scope, $n, $($name,)+ $($comptime),*);
    }};
    ($b:ident, $k:path;
     $($kind:ident $name:ident: $t:ty),+;
     $($comptime:expr),* $(,)?) => {{
        use $k as kernel;
        AddressType::U32.register(&mut $b.scope);
        $(let $name = expand!(@$kind $b, $t);)+
        kernel::expand::<F>(&mut $b.scope, $($name,)+ $($comptime),*);
    }};
}

/// [`expand!`] for either linear layout's kernel `$k`: the runtime
/// arguments both share, then `$k`'s comptime arguments.
macro_rules! expand_linear {
    ($k:path, $b:ident, $n:ident, $($comptime:expr),+) => {
        expand!($b, $k, vector $n;
            input x: Vector<F, N>,
            input w: Vector<F, N>,
            input w_up: Vector<F, N>,
            input gamma: Vector<F, N>,
            input extra: F,
            output out: F,
            scalar m: usize,
            scalar in_v: usize,
            scalar n_cols: usize,
            scalar col_offset: usize,
            scalar out_stride: usize,
            scalar groups: usize,
            scalar dv: usize,
            scalar d: usize,
            scalar eps: f32;
            $($comptime),+)
    };
}

/// [`expand!`] for either layout's kernel `$k` of the q/k/v projection
/// with RoPE: the runtime arguments both share, then `$k`'s comptime
/// arguments.
macro_rules! expand_linear_rope {
    ($k:path, $b:ident, $n:ident, $($comptime:expr),+) => {
        expand!($b, $k, vector $n;
            input x: Vector<F, N>,
            input w: Vector<F, N>,
            input gamma: Vector<F, N>,
            input pos: u32,
            input inv_freq: f32,
            input slots: u32,
            output q: F,
            output k_cache: F,
            output v_cache: F,
            scalar m: usize,
            scalar in_v: usize,
            scalar pairs: usize,
            scalar half: usize,
            scalar heads: usize,
            scalar kv_heads: usize,
            scalar d: usize,
            scalar eps: f32;
            $($comptime),+)
    };
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
            rows_per_block: mb,
            cols,
            norm,
            epilogue,
            ..
        } => match epilogue {
            LinearEpilogue::RopeQkv => {
                use crate::linear_rope::linear_rope_qkv_kernel as k;
                expand_linear_rope!(k, b, n, mb, cols / 2, norm)
            }
            _ => expand_linear!(linear::linear_kernel, b, n, mb, cols, norm, epilogue.code()),
        },
        KernelSpec::LinearPlanes {
            rows_per_block: mb,
            cols,
            planes,
            ksplit,
            norm,
            epilogue,
            ..
        } => match epilogue {
            LinearEpilogue::RopeQkv => {
                use crate::linear_rope::linear_plane_rope_qkv_kernel as k;
                expand_linear_rope!(k, b, n, mb, cols, planes, ksplit, norm)
            }
            _ => {
                use crate::linear_plane::linear_plane_kernel as k;
                expand_linear!(k, b, n, mb, cols, planes, ksplit, norm, epilogue.code())
            }
        },
        KernelSpec::RmsNorm { .. } => expand!(b, rms_norm::rms_norm_kernel, vector n;
            input x: Vector<F, N>,
            input w: Vector<F, N>,
            output out: Vector<F, N>,
            scalar segments: usize,
            scalar groups: usize,
            scalar dv: usize,
            scalar d: usize,
            scalar eps: f32;
            rms_norm::BLOCK),
        KernelSpec::Rope { .. } => expand!(b, rope::rope_kernel;
            input x: F,
            input pos: u32,
            input inv_freq: f32,
            output out: F,
            scalar pairs: usize,
            scalar heads: usize,
            scalar half: usize;),
        KernelSpec::HeadNorm { rope, .. } => expand!(b, head_norm::head_norm_rope_kernel;
            input x: F,
            input w: F,
            input pos: u32,
            input inv_freq: f32,
            output out: F,
            scalar rows: usize,
            scalar heads: usize,
            scalar hd: usize,
            scalar eps: f32,
            scalar offset: f32;
            rope),
        KernelSpec::RopeQkvAppend { .. } => expand!(b, rope::rope_qkv_append_kernel;
            input qkv: F,
            input pos: u32,
            input inv_freq: f32,
            input slots: u32,
            output q: F,
            output k_cache: F,
            output v_cache: F,
            scalar pairs: usize,
            scalar heads: usize,
            scalar kv_heads: usize,
            scalar half: usize;),
        KernelSpec::RopeAppend { .. } => expand!(b, rope::rope_append_kernel;
            input k: F,
            input v: F,
            input pos: u32,
            input inv_freq: f32,
            input slots: u32,
            output k_cache: F,
            output v_cache: F,
            scalar pairs: usize,
            scalar heads: usize,
            scalar half: usize;),
        KernelSpec::CopyRows { .. } => expand!(b, copy_rows, vector n;
            input src: Vector<F, N>,
            input src_idx: u32,
            output dst: Vector<F, N>,
            input dst_idx: u32,
            scalar rows: u32,
            scalar layers: u32,
            scalar src_rows: u32,
            scalar dst_rows: u32,
            scalar width_v: u32;),
        KernelSpec::AttentionPlanes {
            pv, planes, mask, ..
        } => expand!(b, crate::attention::decode_attention, vector n;
            input q: Vector<F, N>,
            input k: Vector<F, N>,
            input v: Vector<F, N>,
            output out: Vector<F, N>,
            output part_ml: f32,
            output part_acc: Vector<f32, N>,
            input meta: u32,
            input k_pos: u32,
            input anc: u32,
            scalar row_offset: u32,
            scalar rows: u32,
            scalar heads: u32,
            scalar group: u32,
            scalar kv_heads: u32,
            scalar hdv: u32,
            scalar scale: f32,
            scalar p0: u32,
            scalar p1: u32,
            scalar words: u32,
            scalar splits: u32,
            scalar chunk: u32;
            pv,
            planes,
            crate::attention::decode::MAX_HEAD_DIM / n,
            mask.code(),
            mask.is_tree()),
        KernelSpec::AttentionCombine { .. } => {
            expand!(b, crate::attention::attention_combine, vector n;
            input part_ml: f32,
            input part_acc: Vector<f32, N>,
            output out: Vector<F, N>,
            scalar row_offset: u32,
            scalar rows: u32,
            scalar heads: u32,
            scalar hdv: u32,
            scalar splits: u32;)
        }
        KernelSpec::Attention {
            mask,
            head_dim_cap,
            heads_per_unit,
            ..
        } => expand!(b, fused_attention, vector n;
            input q: Vector<F, N>,
            input k: Vector<F, N>,
            input v: Vector<F, N>,
            output out: Vector<F, N>,
            input meta: u32,
            input k_pos: u32,
            input anc: u32,
            scalar row_offset: u32,
            scalar rows: u32,
            scalar heads: u32,
            scalar group: u32,
            scalar kv_heads: u32,
            scalar hdv: u32,
            scalar scale: f32,
            scalar p0: u32,
            scalar p1: u32,
            scalar words: u32;
            mask.code(),
            mask.is_tree(),
            head_dim_cap / n,
            heads_per_unit),
        KernelSpec::Embedding { .. } => expand!(b, embedding::embedding_kernel, vector n;
            input table: Vector<F, N>,
            input ids: u32,
            output out: Vector<F, N>,
            scalar tokens: usize,
            scalar vocab: usize,
            scalar dv: usize;),
        KernelSpec::EmbeddingScaled { .. } => {
            expand!(b, embedding::embedding_scaled_kernel, vector n;
            input table: Vector<F, N>,
            input ids: u32,
            output out: Vector<F, N>,
            scalar tokens: usize,
            scalar vocab: usize,
            scalar dv: usize,
            scalar scale: f32;)
        }
        KernelSpec::EmbeddingRows { scaled, .. } => {
            expand!(b, embedding::embedding_rows_kernel, vector n;
            input table: Vector<F, N>,
            input ids: u32,
            output out: Vector<F, N>,
            scalar tokens: usize,
            scalar vocab: usize,
            scalar row0: usize,
            scalar rows: usize,
            scalar dv: usize,
            scalar scale: f32;
            scaled)
        }
        KernelSpec::Elementwise { op, .. } => expand!(b, elementwise::elementwise_kernel, vector n;
            input a: Vector<F, N>,
            input bb: Vector<F, N>,
            output out: Vector<F, N>,
            scalar len_v: usize;
            op.code()),
        KernelSpec::LayerSum { .. } => expand!(b, layer_sum::layer_sum_kernel, vector n;
            input x: Vector<F, N>,
            input w: F,
            output out: Vector<F, N>,
            scalar layers: usize,
            scalar len_v: usize;),
    }
    b.build(
        KernelSettings::default()
            .cube_dim(CubeDim::new_1d(spec.cube_units()))
            .kernel_name(spec.entry_point()),
    )
}

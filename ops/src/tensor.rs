//! Device tensors: a cubecl [`Handle`] plus a row-major contiguous shape and a
//! [`DType`].
//!
//! Tensors are plain descriptors: cloning one clones the ref-counted handle,
//! not the data, and launch functions write their outputs through `&DeviceTensor`
//! (device memory is shared, like any GPU buffer). Uploads are padded to a
//! multiple of 16 bytes so that f16 tensors of odd length are valid wgpu
//! buffers and vector loads never touch unallocated memory; `numel` is the
//! logical length and the only one kernels see.

use std::marker::PhantomData;

use cubecl::prelude::*;
use cubecl::server::Handle;
use half::f16;

use crate::error::{OpsError, Result};

/// Element type of a [`DeviceTensor`]. Floats are what kernels compute on;
/// `U32` carries token ids and parent indices. bf16 is not supported yet (and
/// not at all by wgpu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }

    /// Whether the device behind `client` can run kernels on this type.
    pub fn is_supported<R: Runtime>(self, client: &ComputeClient<R>) -> bool {
        let ty = match self {
            DType::F32 => f32::as_type_native_unchecked(),
            DType::F16 => f16::as_type_native_unchecked(),
            DType::U32 => u32::as_type_native_unchecked(),
        };
        client.properties().supports_type(ty)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::U32 => "u32",
        })
    }
}

/// A row-major contiguous tensor in device memory.
pub struct DeviceTensor<R: Runtime> {
    /// The allocation; at least `numel * dtype.size()` bytes.
    pub handle: Handle,
    shape: Vec<usize>,
    dtype: DType,
    _runtime: PhantomData<R>,
}

impl<R: Runtime> Clone for DeviceTensor<R> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone(),
            shape: self.shape.clone(),
            dtype: self.dtype,
            _runtime: PhantomData,
        }
    }
}

impl<R: Runtime> std::fmt::Debug for DeviceTensor<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceTensor<{}>{:?}", self.dtype, self.shape)
    }
}

/// Reads `tensors` back in one request (one wait, counted as one read),
/// each buffer checked to hold its tensor's bytes.
fn read<R: Runtime>(
    client: &ComputeClient<R>,
    tensors: &[&DeviceTensor<R>],
    op: &'static str,
) -> Result<Vec<Vec<u8>>> {
    let handles = tensors.iter().map(|t| t.handle.clone()).collect();
    let bytes = crate::counters::read(|| cubecl::future::block_on(client.read_async(handles)))
        .map_err(|e| OpsError::device(op, e))?;
    if bytes.len() != tensors.len() {
        return Err(OpsError::Device {
            op,
            message: format!("read {} buffers, asked for {}", bytes.len(), tensors.len()),
        });
    }
    tensors
        .iter()
        .zip(bytes)
        .map(|(t, b)| {
            let need = t.numel() * t.dtype.size();
            if b.len() < need {
                return Err(OpsError::Device {
                    op,
                    message: format!("read {} bytes, expected {need}", b.len()),
                });
            }
            Ok(b.to_vec())
        })
        .collect()
}

/// `bytes` on the device: written in place into a kept buffer (`kept.rs`;
/// the patched cubecl's `ComputeClient::write`, third_party/README.md),
/// queued after the work before it, or a new buffer when too large to keep.
fn upload_bytes<R: Runtime>(client: &ComputeClient<R>, bytes: Vec<u8>) -> Handle {
    match crate::kept::take_ref(client, bytes.len()) {
        Some((h, r)) => {
            crate::counters::write();
            crate::replay::note_write(r, &bytes, client.recorded_len().unwrap_or(0));
            client.write(h.clone(), cubecl::bytes::Bytes::from_bytes_vec(bytes));
            h
        }
        None => {
            crate::counters::upload();
            client.create_from_slice(&bytes)
        }
    }
}

/// What [`DeviceTensor::download_f32_u32_all`] reads: each float tensor's
/// data as f32, each u32 tensor's data.
pub type FloatsAndIds = (Vec<Vec<f32>>, Vec<Vec<u32>>);

/// The byte alignment of each array in a packed upload
/// ([`DeviceTensor::upload_u32_packed`]): wgpu's storage-binding offset
/// alignment on every adapter it supports (256), a multiple of CUDA's.
pub const PACK_ALIGN: usize = 256;

/// The bytes [`DeviceTensor::upload_u32`] writes for `data` (padded as
/// [`padded_bytes`]); a replayed pass writes an input's new ids this way.
pub fn u32_bytes(data: &[u32]) -> Vec<u8> {
    let mut bytes = bytemuck::cast_slice::<u32, u8>(data).to_vec();
    bytes.resize(padded_bytes(data.len(), DType::U32), 0);
    bytes
}

/// The words of [`DeviceTensor::upload_u32_packed`]'s one upload and each
/// part's byte offset in it: every part padded to a whole section aligned
/// to [`PACK_ALIGN`] bytes (never empty). A replayed pass writes these
/// bytes into its recorded upload (`crate::replay`).
pub fn pack_u32(parts: &[(&[u32], &[usize])]) -> Result<(Vec<u32>, Vec<usize>)> {
    let mut offsets = Vec::with_capacity(parts.len());
    let mut words: Vec<u32> = Vec::new();
    for (data, shape) in parts {
        check_len("upload_u32_packed", data.len(), shape)?;
        offsets.push(words.len() * 4);
        words.extend_from_slice(data);
        let section = padded_bytes(data.len(), DType::U32).div_ceil(PACK_ALIGN) * PACK_ALIGN;
        words.resize(offsets[offsets.len() - 1] / 4 + section / 4, 0);
    }
    Ok((words, offsets))
}

/// Allocation size for `numel` elements: padded to 16 bytes, never zero
/// (what [`DeviceTensor::empty`] asks for).
pub fn padded_bytes(numel: usize, dtype: DType) -> usize {
    (numel * dtype.size()).div_ceil(16).max(1) * 16
}

impl<R: Runtime> DeviceTensor<R> {
    /// Wraps an existing handle. Fails if the allocation is smaller than the shape needs.
    pub fn from_handle(handle: Handle, shape: &[usize], dtype: DType) -> Result<Self> {
        let need = (shape.iter().product::<usize>() * dtype.size()) as u64;
        if handle.size_in_used() < need {
            return Err(OpsError::InvalidArgument {
                op: "from_handle",
                reason: format!(
                    "handle holds {} bytes, shape {shape:?} of {dtype} needs {need}",
                    handle.size_in_used()
                ),
            });
        }
        Ok(Self {
            handle,
            shape: shape.to_vec(),
            dtype,
            _runtime: PhantomData,
        })
    }

    /// Uploads f32 data as `dtype` (F32, or F16 by round-to-nearest).
    pub fn upload_f32(
        client: &ComputeClient<R>,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        check_len("upload_f32", data.len(), shape)?;
        let mut bytes = match dtype {
            DType::F32 => bytemuck::cast_slice::<f32, u8>(data).to_vec(),
            DType::F16 => {
                let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
                bytemuck::cast_slice::<f16, u8>(&h).to_vec()
            }
            DType::U32 => {
                return Err(OpsError::InvalidArgument {
                    op: "upload_f32",
                    reason: "cannot upload f32 data as u32; use upload_u32".into(),
                })
            }
        };
        bytes.resize(padded_bytes(data.len(), dtype), 0);
        crate::counters::upload();
        Self::from_handle(client.create_from_slice(&bytes), shape, dtype)
    }

    /// Uploads u32 data (token ids, parent indices).
    pub fn upload_u32(client: &ComputeClient<R>, data: &[u32], shape: &[usize]) -> Result<Self> {
        check_len("upload_u32", data.len(), shape)?;
        Self::from_handle(upload_bytes(client, u32_bytes(data)), shape, DType::U32)
    }

    /// Uploads several u32 arrays (`(data, shape)` each) as ONE upload
    /// (into a kept buffer, `kept.rs`), returning a tensor per array: views of the one
    /// buffer at offsets aligned to [`PACK_ALIGN`] bytes (what storage
    /// bindings need on every backend). A pass's small per-step arrays
    /// (attention metadata, positions, cache slots) cost one host→device
    /// transfer instead of one each.
    pub fn upload_u32_packed(
        client: &ComputeClient<R>,
        parts: &[(&[u32], &[usize])],
    ) -> Result<Vec<Self>> {
        let (words, offsets) = pack_u32(parts)?;
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let total = (words.len() * 4) as u64;
        let handle = upload_bytes(client, bytemuck::cast_slice::<u32, u8>(&words).to_vec());
        parts
            .iter()
            .zip(&offsets)
            .enumerate()
            .map(|(i, ((data, shape), &at))| {
                let end = offsets.get(i + 1).copied().unwrap_or(words.len() * 4) as u64;
                let used = (padded_bytes(data.len(), DType::U32) as u64).min(end - at as u64);
                let h = handle
                    .clone()
                    .offset_start(at as u64)
                    .offset_end(total - at as u64 - used);
                Self::from_handle(h, shape, DType::U32)
            })
            .collect()
    }

    /// A zero-filled tensor in a kept buffer (`kept.rs`; a new one past
    /// its size limit), written in place: for a pass's small constants.
    /// Long-lived tensors (caches) take [`DeviceTensor::zeros`].
    pub fn zeroed(client: &ComputeClient<R>, shape: &[usize], dtype: DType) -> Self {
        let bytes = padded_bytes(shape.iter().product::<usize>(), dtype);
        Self {
            handle: upload_bytes(client, vec![0u8; bytes]),
            shape: shape.to_vec(),
            dtype,
            _runtime: PhantomData,
        }
    }

    /// A zero-filled tensor.
    pub fn zeros(client: &ComputeClient<R>, shape: &[usize], dtype: DType) -> Self {
        let numel = shape.iter().product::<usize>();
        crate::counters::upload();
        let handle = client.create_from_slice(&vec![0u8; padded_bytes(numel, dtype)]);
        Self {
            handle,
            shape: shape.to_vec(),
            dtype,
            _runtime: PhantomData,
        }
    }

    /// An uninitialised tensor, for outputs that a launch overwrites entirely.
    pub fn empty(client: &ComputeClient<R>, shape: &[usize], dtype: DType) -> Self {
        let bytes = padded_bytes(shape.iter().product::<usize>(), dtype);
        let handle = crate::kept::take(client, bytes).unwrap_or_else(|| {
            crate::counters::allocation();
            client.empty(bytes)
        });
        Self {
            handle,
            shape: shape.to_vec(),
            dtype,
            _runtime: PhantomData,
        }
    }

    /// Reads the tensor back as f32 (f16 is widened exactly). Blocks until
    /// the work queued before it has run.
    pub fn download_f32(&self, client: &ComputeClient<R>) -> Result<Vec<f32>> {
        const OP: &str = "download_f32";
        self.expect_float_data(OP)?;
        let bytes = read(client, &[self], OP)?;
        Ok(self.f32_of(&bytes[0]))
    }

    /// Reads a u32 tensor back.
    pub fn download_u32(&self, client: &ComputeClient<R>) -> Result<Vec<u32>> {
        const OP: &str = "download_u32";
        self.expect_u32_data(OP)?;
        let bytes = read(client, &[self], OP)?;
        Ok(self.u32_of(&bytes[0]))
    }

    /// Reads several u32 tensors back in one request: one wait for the
    /// device instead of one each.
    pub fn download_u32_all(
        client: &ComputeClient<R>,
        tensors: &[&DeviceTensor<R>],
    ) -> Result<Vec<Vec<u32>>> {
        const OP: &str = "download_u32_all";
        for t in tensors {
            t.expect_u32_data(OP)?;
        }
        if tensors.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = read(client, tensors, OP)?;
        Ok(tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| t.u32_of(b))
            .collect())
    }

    /// Reads `values` (a float tensor, widened to f32) and `ids` (u32) back
    /// in one request: one wait for the device instead of two.
    pub fn download_f32_and_u32(
        client: &ComputeClient<R>,
        values: &DeviceTensor<R>,
        ids: &DeviceTensor<R>,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        let (mut f, mut u) = Self::download_f32_u32_all(client, &[values], &[ids])?;
        Ok((f.remove(0), u.remove(0)))
    }

    /// Reads float tensors (widened to f32) and u32 tensors back in one
    /// request: one wait for the device for all of them.
    pub fn download_f32_u32_all(
        client: &ComputeClient<R>,
        floats: &[&DeviceTensor<R>],
        ids: &[&DeviceTensor<R>],
    ) -> Result<FloatsAndIds> {
        const OP: &str = "download_f32_u32_all";
        for t in floats {
            t.expect_float_data(OP)?;
        }
        for t in ids {
            t.expect_u32_data(OP)?;
        }
        let all: Vec<&DeviceTensor<R>> = floats.iter().chain(ids).copied().collect();
        if all.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let bytes = read(client, &all, OP)?;
        let (fb, ub) = bytes.split_at(floats.len());
        Ok((
            floats.iter().zip(fb).map(|(t, b)| t.f32_of(b)).collect(),
            ids.iter().zip(ub).map(|(t, b)| t.u32_of(b)).collect(),
        ))
    }

    fn expect_float_data(&self, op: &'static str) -> Result<()> {
        match self.dtype {
            DType::U32 => Err(self.dtype_err(op, DType::F32)),
            _ => Ok(()),
        }
    }

    fn expect_u32_data(&self, op: &'static str) -> Result<()> {
        match self.dtype {
            DType::U32 => Ok(()),
            _ => Err(self.dtype_err(op, DType::U32)),
        }
    }

    /// This float tensor's elements as f32, from bytes `read` checked.
    fn f32_of(&self, bytes: &[u8]) -> Vec<f32> {
        let n = self.numel();
        match self.dtype {
            DType::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(&bytes[..n * 2])
                .into_iter()
                .map(f16::to_f32)
                .collect(),
            _ => bytemuck::pod_collect_to_vec::<u8, f32>(&bytes[..n * 4]),
        }
    }

    /// This u32 tensor's elements, from bytes `read` checked.
    fn u32_of(&self, bytes: &[u8]) -> Vec<u32> {
        bytemuck::pod_collect_to_vec::<u8, u32>(&bytes[..self.numel() * 4])
    }

    fn dtype_err(&self, op: &'static str, expected: DType) -> OpsError {
        OpsError::DTypeMismatch {
            op,
            arg: "self",
            expected,
            found: self.dtype,
        }
    }

    /// Same data, new shape with the same number of elements (no copy).
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(OpsError::ShapeMismatch {
                op: "reshape",
                arg: "shape",
                expected: format!("{} elements", self.numel()),
                found: shape.to_vec(),
            });
        }
        let mut t = self.clone();
        t.shape = shape.to_vec();
        Ok(t)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-major strides, in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1usize; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.shape[i + 1];
        }
        strides
    }

    /// The tensor as a flat `Array` argument of `numel` scalars.
    ///
    /// Safe because the allocation always holds `numel` elements. For an
    /// `Array<Vector<F, N>>` parameter the length is still given in scalars.
    pub fn array_arg(&self) -> ArrayArg<R> {
        // SAFETY: every constructor checks the handle holds `numel` elements.
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.numel()) }
    }

    /// The tensor as a `Tensor` argument with its shape and row-major strides.
    pub fn tensor_arg(&self) -> TensorArg<R> {
        // SAFETY: shape and strides describe exactly `numel` elements of the allocation.
        unsafe {
            TensorArg::from_raw_parts(
                self.handle.clone(),
                self.strides().into(),
                self.shape.clone().into(),
            )
        }
    }
}

fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<()> {
    if shape.iter().product::<usize>() != len {
        return Err(OpsError::ShapeMismatch {
            op,
            arg: "shape",
            expected: format!("{len} elements (the data's length)"),
            found: shape.to_vec(),
        });
    }
    Ok(())
}

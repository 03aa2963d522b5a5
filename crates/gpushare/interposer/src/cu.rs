//! The few CUDA driver API types and codes the interposer needs (from `cuda.h`).

use std::ffi::c_void;

pub type CUresult = i32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type Handle = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `cuGetProcAddress` flags: per-thread default stream (the `_ptsz` variants).
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `CUdriverProcAddressQueryResult`.
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;

/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: u32,
}

#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

/// The head of `CUmemAllocationProp` (the fields read here).
#[repr(C)]
pub struct MemAllocationPropHead {
    pub alloc_type: u32,
    pub requested_handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
}

/// Bytes per channel element of a `CUarray_format`; formats this build does not
/// know count as 16 bytes (the largest), so an unknown format is over-counted,
/// never under-counted.
pub fn format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 16,
    }
}

/// Bytes of an array of `levels` mip levels (1: a plain array).
pub fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    channels: u32,
    format: u32,
    levels: u32,
) -> u64 {
    let (mut w, mut h, mut d) = (width as u64, height as u64, depth as u64);
    let elem = (channels.max(1) as u64).saturating_mul(format_bytes(format));
    let mut total: u64 = 0;
    for _ in 0..levels.max(1) {
        let level = w
            .max(1)
            .saturating_mul(h.max(1))
            .saturating_mul(d.max(1))
            .saturating_mul(elem);
        total = total.saturating_add(level);
        w /= 2;
        h /= 2;
        d /= 2;
    }
    total
}

/// Runs a wrapper body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of
/// unwinding into C.
macro_rules! guarded {
    ($body:block) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> $crate::cu::CUresult {
            $body
        })) {
            Ok(r) => r,
            Err(_) => $crate::cu::CUDA_ERROR_UNKNOWN,
        }
    };
}
pub(crate) use guarded;

/// The task state, or the error every wrapped call returns when it is missing.
macro_rules! state_or_return {
    () => {
        match $crate::state::state() {
            Ok(s) => s,
            Err(rc) => return rc,
        }
    };
}
pub(crate) use state_or_return;

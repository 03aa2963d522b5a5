//! Device memory: every allocation is reserved against the task's cap in the
//! region before the driver sees it, and given back when it is freed (or when
//! the driver refuses it). Sizes are the sizes asked for; the driver's own
//! rounding and context memory are not counted (see docs/gpushare.md).

use std::sync::atomic::Ordering;

use crate::cu::*;
use crate::driver::real;
use crate::log::{self, Once};
use crate::state::{AllocKind, State};

/// Reserves `bytes` on `dev`, runs the driver call (which returns its result and
/// the new handle), records the handle; gives the bytes back if the call fails.
fn alloc(
    st: &State,
    dev: usize,
    bytes: u64,
    kind: AllocKind,
    call: impl FnOnce() -> (CUresult, u64),
) -> CUresult {
    let (pid, slot) = match st.proc_slot() {
        Ok(x) => x,
        Err(rc) => return rc,
    };
    if let Err(rc) = st.reserve(pid, slot, dev, bytes) {
        return rc;
    }
    let (rc, h) = call();
    if rc == CUDA_SUCCESS {
        st.allocs.insert(kind, h, dev, bytes);
    } else {
        st.region.release(slot, pid, dev, bytes);
    }
    rc
}

/// Runs the driver's free; on success gives back what the handle held (handles
/// this process did not allocate through the interposer change nothing).
fn free(st: &State, kind: AllocKind, h: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let rc = call();
    if rc == CUDA_SUCCESS {
        if let Some((dev, bytes)) = st.allocs.remove(kind, h) {
            if let Ok((pid, slot)) = st.proc_slot() {
                st.region.release(slot, pid, dev, bytes);
            }
        }
    }
    rc
}

fn device(st: &State) -> Result<usize, CUresult> {
    st.current_device()
}

macro_rules! dev_or_return {
    ($st:expr) => {
        match device($st) {
            Ok(d) => d,
            Err(rc) => return rc,
        }
    };
}

type AllocFn = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
type AllocStreamFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, Handle) -> CUresult;
type AllocPoolFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, Handle, Handle) -> CUresult;
type FreeStreamFn = unsafe extern "C" fn(CUdeviceptr, Handle) -> CUresult;

fn plain_alloc(dptr: *mut CUdeviceptr, bytes: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let st = state_or_return!();
    if dptr.is_null() || bytes == 0 {
        return call(); // the driver reports the bad argument
    }
    let dev = dev_or_return!(st);
    alloc(st, dev, bytes as u64, AllocKind::Ptr, || {
        let rc = call();
        // SAFETY: dptr is non-null and the driver wrote it on success.
        (
            rc,
            if rc == CUDA_SUCCESS {
                unsafe { *dptr }
            } else {
                0
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    guarded!({
        let f = real!(cuMemAlloc_v2 as AllocFn);
        // SAFETY: forwarding the caller's arguments.
        plain_alloc(dptr, bytes, || unsafe { f(dptr, bytes) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: u32,
) -> CUresult {
    guarded!({
        let f = real!(
            cuMemAllocManaged as unsafe extern "C" fn(*mut CUdeviceptr, usize, u32) -> CUresult
        );
        // SAFETY: forwarding the caller's arguments.
        plain_alloc(dptr, bytes, || unsafe { f(dptr, bytes, flags) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    guarded!({
        let f = real!(cuMemAllocAsync as AllocStreamFn);
        // SAFETY: forwarding the caller's arguments.
        plain_alloc(dptr, bytes, || unsafe { f(dptr, bytes, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    guarded!({
        let f = real!(cuMemAllocAsync_ptsz as AllocStreamFn);
        // SAFETY: forwarding the caller's arguments.
        plain_alloc(dptr, bytes, || unsafe { f(dptr, bytes, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    guarded!({
        let f = real!(cuMemAllocFromPoolAsync as AllocPoolFn);
        // SAFETY: forwarding the caller's arguments.
        plain_alloc(dptr, bytes, || unsafe { f(dptr, bytes, pool, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    guarded!({
        let f = real!(cuMemAllocFromPoolAsync_ptsz as AllocPoolFn);
        // SAFETY: forwarding the caller's arguments.
        plain_alloc(dptr, bytes, || unsafe { f(dptr, bytes, pool, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CUresult {
    guarded!({
        let f = real!(
            cuMemAllocPitch_v2
                as unsafe extern "C" fn(
                    *mut CUdeviceptr,
                    *mut usize,
                    usize,
                    usize,
                    u32,
                ) -> CUresult
        );
        let st = state_or_return!();
        // SAFETY (all calls below): forwarding the caller's arguments.
        if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
            return unsafe { f(dptr, pitch, width, height, elem) };
        }
        let dev = dev_or_return!(st);
        let (pid, slot) = match st.proc_slot() {
            Ok(x) => x,
            Err(rc) => return rc,
        };
        // The pitch is known only afterwards: reserve the usual 512-byte-aligned
        // estimate, then settle the difference.
        let estimate = (width as u64).div_ceil(512) * 512 * height as u64;
        if let Err(rc) = st.reserve(pid, slot, dev, estimate) {
            return rc;
        }
        let rc = unsafe { f(dptr, pitch, width, height, elem) };
        if rc != CUDA_SUCCESS {
            st.region.release(slot, pid, dev, estimate);
            return rc;
        }
        let (ptr, actual) = unsafe { (*dptr, *pitch as u64 * height as u64) };
        if actual > estimate {
            if st.region.try_reserve(slot, pid, dev, actual - estimate)
                != tessera_gpushare::region::Reserve::Done
            {
                let fr = real!(cuMemFree_v2 as unsafe extern "C" fn(CUdeviceptr) -> CUresult);
                unsafe { fr(ptr) };
                st.region.release(slot, pid, dev, estimate);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        } else {
            st.region.release(slot, pid, dev, estimate - actual);
        }
        st.allocs.insert(AllocKind::Ptr, ptr, dev, actual);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guarded!({
        let f = real!(cuMemFree_v2 as unsafe extern "C" fn(CUdeviceptr) -> CUresult);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's argument.
        free(st, AllocKind::Ptr, dptr, || unsafe { f(dptr) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    guarded!({
        let f = real!(cuMemFreeAsync as FreeStreamFn);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's arguments.
        free(st, AllocKind::Ptr, dptr, || unsafe { f(dptr, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    guarded!({
        let f = real!(cuMemFreeAsync_ptsz as FreeStreamFn);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's arguments.
        free(st, AllocKind::Ptr, dptr, || unsafe { f(dptr, stream) })
    })
}

fn handle_alloc(
    out: *mut Handle,
    bytes: u64,
    kind: AllocKind,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let st = state_or_return!();
    if out.is_null() {
        return call();
    }
    let dev = dev_or_return!(st);
    alloc(st, dev, bytes, kind, || {
        let rc = call();
        // SAFETY: out is non-null and the driver wrote it on success.
        (
            rc,
            if rc == CUDA_SUCCESS {
                unsafe { *out as u64 }
            } else {
                0
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    arr: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    guarded!({
        let f = real!(
            cuArrayCreate_v2
                as unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CUresult
        );
        if desc.is_null() {
            // SAFETY: forwarding; the driver reports the null descriptor.
            return unsafe { f(arr, desc) };
        }
        // SAFETY: desc is non-null and points to the caller's descriptor.
        let d = unsafe { &*desc };
        let bytes = array_bytes(d.width, d.height, 1, d.num_channels, d.format, 1);
        // SAFETY: forwarding the caller's arguments.
        handle_alloc(arr, bytes, AllocKind::Array, || unsafe { f(arr, desc) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CUresult {
    guarded!({
        let f = real!(
            cuArray3DCreate_v2
                as unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor) -> CUresult
        );
        if desc.is_null() {
            // SAFETY: forwarding; the driver reports the null descriptor.
            return unsafe { f(arr, desc) };
        }
        // SAFETY: desc is non-null and points to the caller's descriptor.
        let d = unsafe { &*desc };
        let bytes = array_bytes(d.width, d.height, d.depth, d.num_channels, d.format, 1);
        // SAFETY: forwarding the caller's arguments.
        handle_alloc(arr, bytes, AllocKind::Array, || unsafe { f(arr, desc) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: u32,
) -> CUresult {
    guarded!({
        let f = real!(
            cuMipmappedArrayCreate
                as unsafe extern "C" fn(*mut Handle, *const Array3dDescriptor, u32) -> CUresult
        );
        if desc.is_null() {
            // SAFETY: forwarding; the driver reports the null descriptor.
            return unsafe { f(arr, desc, levels) };
        }
        // SAFETY: desc is non-null and points to the caller's descriptor.
        let d = unsafe { &*desc };
        let bytes = array_bytes(d.width, d.height, d.depth, d.num_channels, d.format, levels);
        // SAFETY: forwarding the caller's arguments.
        handle_alloc(arr, bytes, AllocKind::Mipmap, || unsafe {
            f(arr, desc, levels)
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: Handle) -> CUresult {
    guarded!({
        let f = real!(cuArrayDestroy as unsafe extern "C" fn(Handle) -> CUresult);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's argument.
        free(st, AllocKind::Array, arr as u64, || unsafe { f(arr) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: Handle) -> CUresult {
    guarded!({
        let f = real!(cuMipmappedArrayDestroy as unsafe extern "C" fn(Handle) -> CUresult);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's argument.
        free(st, AllocKind::Mipmap, arr as u64, || unsafe { f(arr) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationPropHead,
    flags: u64,
) -> CUresult {
    guarded!({
        let f = real!(
            cuMemCreate
                as unsafe extern "C" fn(
                    *mut u64,
                    usize,
                    *const MemAllocationPropHead,
                    u64,
                ) -> CUresult
        );
        let st = state_or_return!();
        // SAFETY (calls below): forwarding the caller's arguments.
        if handle.is_null() || prop.is_null() || size == 0 {
            return unsafe { f(handle, size, prop, flags) };
        }
        // SAFETY: prop is non-null and points to the caller's CUmemAllocationProp.
        let p = unsafe { &*prop };
        if p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            // Host (NUMA) memory is not the device's.
            return unsafe { f(handle, size, prop, flags) };
        }
        let dev = match st.device_index(p.location_id) {
            Ok(d) => d,
            Err(rc) => return rc,
        };
        alloc(st, dev, size as u64, AllocKind::Vmm, || {
            let rc = unsafe { f(handle, size, prop, flags) };
            (
                rc,
                if rc == CUDA_SUCCESS {
                    unsafe { *handle }
                } else {
                    0
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guarded!({
        let f = real!(cuMemRelease as unsafe extern "C" fn(u64) -> CUresult);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's argument.
        free(st, AllocKind::Vmm, handle, || unsafe { f(handle) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free_bytes: *mut usize, total: *mut usize) -> CUresult {
    guarded!({
        let f = real!(cuMemGetInfo_v2 as unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { f(free_bytes, total) };
        if rc != CUDA_SUCCESS {
            return rc;
        }
        let dev = dev_or_return!(st);
        let Some(d) = st.region.device(dev) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        let limit = d.memory_limit.load(Ordering::Relaxed);
        let used = d.memory_used.load(Ordering::Relaxed);
        // SAFETY: the driver accepted these pointers; null ones are skipped.
        unsafe {
            if !total.is_null() {
                *total = (*total).min(limit as usize);
            }
            if !free_bytes.is_null() {
                *free_bytes = (*free_bytes).min(limit.saturating_sub(used) as usize);
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guarded!({
        let f =
            real!(cuDeviceTotalMem_v2 as unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult);
        let st = state_or_return!();
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { f(bytes, dev) };
        if rc == CUDA_SUCCESS && !bytes.is_null() {
            if let Some(d) = st.region.device(dev.max(0) as usize) {
                let limit = d.memory_limit.load(Ordering::Relaxed) as usize;
                // SAFETY: the driver wrote it.
                unsafe { *bytes = (*bytes).min(limit) };
            }
        }
        rc
    })
}

/// Graph memory nodes allocate when the graph runs, inside the driver: not
/// counted against the cap. Let through, said and counted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *mut std::ffi::c_void,
) -> CUresult {
    guarded!({
        let f = real!(
            cuGraphAddMemAllocNode
                as unsafe extern "C" fn(
                    *mut Handle,
                    Handle,
                    *const Handle,
                    usize,
                    *mut std::ffi::c_void,
                ) -> CUresult
        );
        let st = state_or_return!();
        if let Some(d) = st.region.device(0) {
            d.unenforced_events.fetch_add(1, Ordering::Relaxed);
        }
        log::once(
            Once::GraphMemNode,
            "cuGraphAddMemAllocNode: memory that graph memory nodes allocate is not counted against the task's cap",
        );
        // SAFETY: forwarding the caller's arguments.
        unsafe { f(node, graph, deps, ndeps, params) }
    })
}

fn legacy(name: &str) -> CUresult {
    log::once(
        Once::Legacy,
        &format!(
            "{name} is a 32-bit entry point of CUDA before 3.2; GPU sharing does not enforce it, so it fails \
             (CUDA_ERROR_NOT_SUPPORTED). Rebuild against a CUDA 3.2+ cuda.h (the _v2 entry points)"
        ),
    );
    CUDA_ERROR_NOT_SUPPORTED
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(_dptr: *mut u32, _bytes: u32) -> CUresult {
    legacy("cuMemAlloc")
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    _d: *mut u32,
    _p: *mut u32,
    _w: u32,
    _h: u32,
    _e: u32,
) -> CUresult {
    legacy("cuMemAllocPitch")
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(_dptr: u32) -> CUresult {
    legacy("cuMemFree")
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(_free: *mut u32, _total: *mut u32) -> CUresult {
    legacy("cuMemGetInfo")
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(_a: *mut Handle, _d: *const std::ffi::c_void) -> CUresult {
    legacy("cuArrayCreate")
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(_a: *mut Handle, _d: *const std::ffi::c_void) -> CUresult {
    legacy("cuArray3DCreate")
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(_b: *mut u32, _dev: CUdevice) -> CUresult {
    legacy("cuDeviceTotalMem")
}

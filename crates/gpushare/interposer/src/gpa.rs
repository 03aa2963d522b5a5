//! `cuInit` and `cuGetProcAddress` / `cuGetProcAddress_v2`: how the CUDA runtime
//! (and any program using the driver's entry-point API) finds driver functions.
//! Every lookup of a function the interposer wraps returns the wrapper of the
//! variant the driver picked; allocation entry points it does not know are
//! refused.

use std::ffi::{CStr, c_char, c_void};

use crate::Sym;
use crate::cu::*;
use crate::driver::{driver, real};
use crate::log::{self, Once};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    guarded!({
        let f = real!(cuInit as unsafe extern "C" fn(u32) -> CUresult);
        // SAFETY: forwarding the caller's argument.
        let rc = unsafe { f(flags) };
        if rc != CUDA_SUCCESS {
            return rc;
        }
        match crate::state::state() {
            Ok(_) => CUDA_SUCCESS,
            Err(rc) => rc,
        }
    })
}

/// A driver function and its variants: `(variant, introduced in, per-thread
/// default stream)`. The driver picks the newest variant not newer than the
/// caller's CUDA version, and the `_ptsz` one under per-thread default streams.
type Family = &'static [(Sym, i32, bool)];

fn family(base: &[u8]) -> Option<Family> {
    use Sym::*;
    Some(match base {
        b"cuInit" => &[(cuInit, 2000, false)],
        b"cuGetProcAddress" => &[
            (cuGetProcAddress, 11030, false),
            (cuGetProcAddress_v2, 12000, false),
        ],
        b"cuMemAlloc" => &[(cuMemAlloc, 2000, false), (cuMemAlloc_v2, 3020, false)],
        b"cuMemAllocPitch" => &[
            (cuMemAllocPitch, 2000, false),
            (cuMemAllocPitch_v2, 3020, false),
        ],
        b"cuMemFree" => &[(cuMemFree, 2000, false), (cuMemFree_v2, 3020, false)],
        b"cuMemGetInfo" => &[(cuMemGetInfo, 2000, false), (cuMemGetInfo_v2, 3020, false)],
        b"cuArrayCreate" => &[
            (cuArrayCreate, 2000, false),
            (cuArrayCreate_v2, 3020, false),
        ],
        b"cuArray3DCreate" => &[
            (cuArray3DCreate, 2000, false),
            (cuArray3DCreate_v2, 3020, false),
        ],
        b"cuDeviceTotalMem" => &[
            (cuDeviceTotalMem, 2000, false),
            (cuDeviceTotalMem_v2, 3020, false),
        ],
        b"cuMemAllocManaged" => &[(cuMemAllocManaged, 6000, false)],
        b"cuMemAllocAsync" => &[
            (cuMemAllocAsync, 11020, false),
            (cuMemAllocAsync_ptsz, 11020, true),
        ],
        b"cuMemAllocFromPoolAsync" => &[
            (cuMemAllocFromPoolAsync, 11020, false),
            (cuMemAllocFromPoolAsync_ptsz, 11020, true),
        ],
        b"cuMemFreeAsync" => &[
            (cuMemFreeAsync, 11020, false),
            (cuMemFreeAsync_ptsz, 11020, true),
        ],
        b"cuArrayDestroy" => &[(cuArrayDestroy, 2000, false)],
        b"cuMipmappedArrayCreate" => &[(cuMipmappedArrayCreate, 5000, false)],
        b"cuMipmappedArrayDestroy" => &[(cuMipmappedArrayDestroy, 5000, false)],
        b"cuMemCreate" => &[(cuMemCreate, 10020, false)],
        b"cuMemRelease" => &[(cuMemRelease, 10020, false)],
        b"cuGraphAddMemAllocNode" => &[(cuGraphAddMemAllocNode, 11040, false)],
        b"cuLaunchKernel" => &[
            (cuLaunchKernel, 4000, false),
            (cuLaunchKernel_ptsz, 7000, true),
        ],
        b"cuLaunchKernelEx" => &[
            (cuLaunchKernelEx, 11060, false),
            (cuLaunchKernelEx_ptsz, 11060, true),
        ],
        b"cuLaunchCooperativeKernel" => &[
            (cuLaunchCooperativeKernel, 9000, false),
            (cuLaunchCooperativeKernel_ptsz, 9000, true),
        ],
        b"cuLaunchCooperativeKernelMultiDevice" => {
            &[(cuLaunchCooperativeKernelMultiDevice, 9000, false)]
        }
        b"cuGraphLaunch" => &[
            (cuGraphLaunch, 10000, false),
            (cuGraphLaunch_ptsz, 10000, true),
        ],
        b"cuLaunch" => &[(cuLaunch, 2000, false)],
        b"cuLaunchGrid" => &[(cuLaunchGrid, 2000, false)],
        b"cuLaunchGridAsync" => &[(cuLaunchGridAsync, 2000, false)],
        _ => return None,
    })
}

/// The variant a driver hands out for `(version, flags)`.
fn pick(fam: Family, version: i32, flags: u64) -> Option<Sym> {
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let ok = |&&(_, v, pt): &&(Sym, i32, bool)| v <= version && pt == per_thread;
    fam.iter()
        .filter(ok)
        .max_by_key(|(_, v, _)| *v)
        .or_else(|| {
            fam.iter()
                .filter(|(_, v, pt)| *v <= version && !pt)
                .max_by_key(|(_, v, _)| *v)
        })
        .map(|&(s, _, _)| s)
}

/// Replaces what the driver returned for `symbol` with this library's wrapper,
/// or refuses the lookup. Returns the result code to give the caller.
///
/// # Safety
/// `symbol` is a NUL-terminated string and `pfn` a valid pointer (the driver
/// accepted both).
unsafe fn filter(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    rc: CUresult,
) -> CUresult {
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let refuse = |why: String| {
        log::once(Once::UnknownAllocator, &why);
        // SAFETY: per the contract.
        unsafe { *pfn = std::ptr::null_mut() };
        CUDA_ERROR_NOT_SUPPORTED
    };
    if crate::unknown_allocator(name) {
        return refuse(format!(
            "cuGetProcAddress(\"{}\"): an allocation entry point this interposer does not know; refused \
             (CUDA_ERROR_NOT_SUPPORTED) rather than left unenforced",
            String::from_utf8_lossy(name)
        ));
    }
    // SAFETY: per the contract.
    let got = unsafe { *pfn };
    if rc != CUDA_SUCCESS || got.is_null() {
        return rc;
    }
    let variant = match family(name) {
        Some(fam) => {
            let by_addr = driver().ok().and_then(|d| {
                fam.iter()
                    .find(|(s, _, _)| d.addr(*s) == got)
                    .map(|&(s, _, _)| s)
            });
            match by_addr.or_else(|| pick(fam, version, flags)) {
                Some(s) => s,
                None => {
                    return refuse(format!(
                        "cuGetProcAddress(\"{}\", version {version}, flags {flags:#x}) returned an entry point \
                         this interposer cannot identify; refused",
                        String::from_utf8_lossy(name)
                    ));
                }
            }
        }
        // A versioned name asked for directly.
        None => match crate::sym_by_name(name) {
            Some((s, _)) => s,
            None => return rc,
        },
    };
    // SAFETY: per the contract.
    unsafe { *pfn = crate::wrapper(variant) };
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    guarded!({
        let f = real!(
            cuGetProcAddress
                as unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult
        );
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { f(symbol, pfn, version, flags) };
        if symbol.is_null() || pfn.is_null() {
            return rc;
        }
        // SAFETY: both non-null and accepted by the driver.
        unsafe { filter(symbol, pfn, version, flags, rc) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    guarded!({
        let f = real!(
            cuGetProcAddress_v2
                as unsafe extern "C" fn(
                    *const c_char,
                    *mut *mut c_void,
                    i32,
                    u64,
                    *mut i32,
                ) -> CUresult
        );
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { f(symbol, pfn, version, flags, status) };
        if symbol.is_null() || pfn.is_null() {
            return rc;
        }
        // SAFETY: both non-null and accepted by the driver.
        let out = unsafe { filter(symbol, pfn, version, flags, rc) };
        if out == CUDA_ERROR_NOT_SUPPORTED && !status.is_null() {
            // SAFETY: non-null status the caller passed.
            unsafe { *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND };
        }
        out
    })
}

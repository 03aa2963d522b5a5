//! `libtessera_cuda.so`: the CUDA driver API interposer of fractional GPU tasks.
//!
//! The node runtime lists this library in the sandbox's `/etc/ld.so.preload`, so
//! the dynamic loader maps it into every process of the task — children, shells,
//! re-execs and processes started without the task's environment — before any
//! other library. It defines the driver entry points that allocate, free and
//! report device memory and that launch work, so a program linked against
//! `libcuda.so.1` binds to them first; it defines `dlsym`, so a program (or the
//! CUDA runtime) that opens `libcuda.so.1` and looks entry points up in it gets
//! them too; and it wraps `cuGetProcAddress` / `cuGetProcAddress_v2`, the way the
//! CUDA runtime finds driver entry points today.
//!
//! Every wrapped call keeps the task inside its share, recorded in the task's
//! accounting region (`tessera_gpushare::region`), a file shared by all of the
//! task's processes: memory over the cap is refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` (or waits for memory to be freed, as configured);
//! `cuMemGetInfo` reports the cap; launches wait while the task's compute bucket,
//! which the node's monitor refills every tick, is in debt.
//!
//! It fails closed and says so on stderr (`tessera-cuda: …`): no configuration,
//! a driver version it does not know, a driver without an entry point it needs,
//! a legacy 32-bit entry point, or an allocation entry point it does not know
//! all make CUDA calls fail instead of running unenforced.
//!
//! A process that never calls the driver pays one two-byte check per `dlsym`
//! call and nothing else: configuration is read at the first driver call.
#![allow(unsafe_code)]
#![allow(non_snake_case, non_camel_case_types)]
// The interposer's exported C entry points take raw pointers from C callers;
// they are `unsafe extern "C"` and document their contract as the CUDA API does.
#![allow(clippy::missing_safety_doc)]

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "tessera-cuda's dlsym trampoline is written for x86-64 Linux only; porting it (aarch64) needs the \
     trampoline in dl.rs and a test run on that architecture"
);

mod cu;
mod dl;
mod driver;
mod gpa;
mod launch;
mod log;
mod mem;
mod state;

/// Every driver entry point the interposer knows, in one table: `Wrap` entries
/// are exported by this library (the name is the exported symbol); `Need`
/// entries are only looked up in the driver.
macro_rules! symbols {
    ($( $kind:ident $name:ident $( => $wrapper:path )? ),* $(,)?) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum Sym { $( $name, )* }

        pub(crate) const SYMS: &[(Sym, &str, Kind)] = &[ $( (Sym::$name, stringify!($name), Kind::$kind), )* ];

        /// This library's own entry point for a wrapped symbol.
        pub(crate) fn wrapper(s: Sym) -> *mut std::ffi::c_void {
            match s {
                $( Sym::$name => symbols!(@addr $( $wrapper )?), )*
            }
        }
    };
    (@addr $w:path) => { $w as *mut std::ffi::c_void };
    (@addr) => { std::ptr::null_mut() };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Exported and enforced here.
    Wrap,
    /// Exported and refused here (a 32-bit legacy entry point, a deprecated
    /// multi-device launch): failing is safer than running unenforced.
    Refuse,
    /// Looked up in the driver only.
    Need,
}

symbols! {
    Wrap cuInit => gpa::cuInit,
    Wrap cuGetProcAddress => gpa::cuGetProcAddress,
    Wrap cuGetProcAddress_v2 => gpa::cuGetProcAddress_v2,
    Wrap cuMemAlloc_v2 => mem::cuMemAlloc_v2,
    Wrap cuMemAllocPitch_v2 => mem::cuMemAllocPitch_v2,
    Wrap cuMemAllocManaged => mem::cuMemAllocManaged,
    Wrap cuMemAllocAsync => mem::cuMemAllocAsync,
    Wrap cuMemAllocAsync_ptsz => mem::cuMemAllocAsync_ptsz,
    Wrap cuMemAllocFromPoolAsync => mem::cuMemAllocFromPoolAsync,
    Wrap cuMemAllocFromPoolAsync_ptsz => mem::cuMemAllocFromPoolAsync_ptsz,
    Wrap cuMemFree_v2 => mem::cuMemFree_v2,
    Wrap cuMemFreeAsync => mem::cuMemFreeAsync,
    Wrap cuMemFreeAsync_ptsz => mem::cuMemFreeAsync_ptsz,
    Wrap cuArrayCreate_v2 => mem::cuArrayCreate_v2,
    Wrap cuArray3DCreate_v2 => mem::cuArray3DCreate_v2,
    Wrap cuArrayDestroy => mem::cuArrayDestroy,
    Wrap cuMipmappedArrayCreate => mem::cuMipmappedArrayCreate,
    Wrap cuMipmappedArrayDestroy => mem::cuMipmappedArrayDestroy,
    Wrap cuMemCreate => mem::cuMemCreate,
    Wrap cuMemRelease => mem::cuMemRelease,
    Wrap cuMemGetInfo_v2 => mem::cuMemGetInfo_v2,
    Wrap cuDeviceTotalMem_v2 => mem::cuDeviceTotalMem_v2,
    Wrap cuGraphAddMemAllocNode => mem::cuGraphAddMemAllocNode,
    Refuse cuMemAlloc => mem::cuMemAlloc,
    Refuse cuMemAllocPitch => mem::cuMemAllocPitch,
    Refuse cuMemFree => mem::cuMemFree,
    Refuse cuMemGetInfo => mem::cuMemGetInfo,
    Refuse cuArrayCreate => mem::cuArrayCreate,
    Refuse cuArray3DCreate => mem::cuArray3DCreate,
    Refuse cuDeviceTotalMem => mem::cuDeviceTotalMem,
    Wrap cuLaunchKernel => launch::cuLaunchKernel,
    Wrap cuLaunchKernel_ptsz => launch::cuLaunchKernel_ptsz,
    Wrap cuLaunchKernelEx => launch::cuLaunchKernelEx,
    Wrap cuLaunchKernelEx_ptsz => launch::cuLaunchKernelEx_ptsz,
    Wrap cuLaunchCooperativeKernel => launch::cuLaunchCooperativeKernel,
    Wrap cuLaunchCooperativeKernel_ptsz => launch::cuLaunchCooperativeKernel_ptsz,
    Wrap cuGraphLaunch => launch::cuGraphLaunch,
    Wrap cuGraphLaunch_ptsz => launch::cuGraphLaunch_ptsz,
    Wrap cuLaunch => launch::cuLaunch,
    Wrap cuLaunchGrid => launch::cuLaunchGrid,
    Wrap cuLaunchGridAsync => launch::cuLaunchGridAsync,
    Refuse cuLaunchCooperativeKernelMultiDevice => launch::cuLaunchCooperativeKernelMultiDevice,
    Need cuDriverGetVersion,
    Need cuCtxGetDevice,
    Need tesseraFakeClockNs,
    Need tesseraFakeSleepUntilNs,
}

pub(crate) fn sym_by_name(name: &[u8]) -> Option<(Sym, Kind)> {
    SYMS.iter()
        .find(|(_, n, k)| *k != Kind::Need && n.as_bytes() == name)
        .map(|&(s, _, k)| (s, k))
}

pub(crate) fn sym_name(s: Sym) -> &'static str {
    SYMS[s as usize].1
}

/// Whether `name` looks like a device-memory allocation entry point this build
/// does not know (a newer driver's `_v3`, a new allocator): such names are
/// refused rather than handed out unenforced. Host allocations are not device
/// memory and pass.
pub(crate) fn unknown_allocator(name: &[u8]) -> bool {
    if sym_by_name(name).is_some() {
        return false;
    }
    let s = match std::str::from_utf8(name) {
        Ok(s) => s,
        Err(_) => return false,
    };
    (s.starts_with("cuMemAlloc") && !s.starts_with("cuMemAllocHost"))
        || s.starts_with("cuMemCreate")
        || ((s.starts_with("cuArray") || s.starts_with("cuMipmappedArray")) && s.contains("Create"))
}

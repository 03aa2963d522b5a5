//! The real driver: `libcuda.so.1` as the process loaded it, and its entry points.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::{SYMS, Sym};

unsafe extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlerror() -> *mut c_char;
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const RTLD_NOW: c_int = 2;
const RTLD_NOLOAD: c_int = 4;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's `dlsym` (this library defines its own). Found with `dlvsym`, which
/// this library does not define, relative to this library (`RTLD_NEXT`).
pub fn real_dlsym() -> DlsymFn {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        // GLIBC_2.34 where libdl merged into libc; GLIBC_2.2.5 before, on x86-64.
        for v in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: both strings are NUL-terminated; dlvsym has no other contract.
            p = unsafe { dlvsym(RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            crate::log::say("cannot find glibc's dlsym; aborting rather than run unenforced");
            std::process::abort();
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's dlsym, whose type this is.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) }
}

/// The address `dlsym(RTLD_NEXT)` inside the trampoline jumps to.
pub extern "C" fn real_dlsym_addr() -> *mut c_void {
    real_dlsym() as *mut c_void
}

pub struct Driver {
    fns: Vec<AtomicPtr<c_void>>,
}

// SAFETY: the handle is an opaque token for dlsym; the table is atomics.
unsafe impl Send for Driver {}
// SAFETY: as above.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The driver as loaded in this process (loading it if the program has not).
pub fn driver() -> Result<&'static Driver, &'static str> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: NUL-terminated name; dlopen of an already loaded library
            // (matched by soname) returns its handle.
            let mut h = unsafe { dlopen(c"libcuda.so.1".as_ptr(), RTLD_NOW | RTLD_NOLOAD) };
            if h.is_null() {
                // SAFETY: as above.
                h = unsafe { dlopen(c"libcuda.so.1".as_ptr(), RTLD_NOW) };
            }
            if h.is_null() {
                // SAFETY: dlerror returns a NUL-terminated string or null.
                let e = unsafe {
                    let e = dlerror();
                    if e.is_null() {
                        String::new()
                    } else {
                        CStr::from_ptr(e).to_string_lossy().into_owned()
                    }
                };
                return Err(format!("cannot load the CUDA driver libcuda.so.1: {e}"));
            }
            let dl = real_dlsym();
            let fns = SYMS
                .iter()
                .map(|(_, name, _)| {
                    let c = std::ffi::CString::new(*name).unwrap_or_default();
                    // SAFETY: valid handle and NUL-terminated name.
                    AtomicPtr::new(unsafe { dl(h, c.as_ptr()) })
                })
                .collect();
            Ok(Driver { fns })
        })
        .as_ref()
        .map_err(String::as_str)
}

impl Driver {
    /// The driver's own address of `s` (null when it has none).
    pub fn addr(&self, s: Sym) -> *mut c_void {
        self.fns[s as usize].load(Ordering::Relaxed)
    }
}

/// Whether `p` lies inside the CUDA driver library (`libcuda.so*`).
pub fn in_driver(p: *const c_void) -> bool {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    if unsafe { dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    base.starts_with(b"libcuda.so")
}

/// Calls the real entry point `$sym` as `$ty`, or returns `CUDA_ERROR_NOT_FOUND`
/// (said once) when the driver has none.
macro_rules! real {
    ($sym:ident as $ty:ty) => {{
        match $crate::driver::driver().map(|d| d.addr($crate::Sym::$sym)) {
            Ok(p) if !p.is_null() => {
                // SAFETY: the driver's symbol of this name has this C signature
                // (cuda.h); only the pointer type changes.
                unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) }
            }
            _ => {
                $crate::log::once(
                    $crate::log::Once::MissingEntryPoint,
                    &format!(
                        "the CUDA driver has no {}; the call fails (CUDA_ERROR_NOT_FOUND)",
                        stringify!($sym)
                    ),
                );
                return $crate::cu::CUDA_ERROR_NOT_FOUND;
            }
        }
    }};
}
pub(crate) use real;

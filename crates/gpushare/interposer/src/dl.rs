//! `dlsym`: a program that opens `libcuda.so.1` and looks entry points up in its
//! handle would get the driver's own functions, past the interposer. This
//! library defines `dlsym`, hands out its wrappers for the driver functions it
//! wraps, and passes every other lookup to glibc's `dlsym` by a *tail jump*, so
//! glibc sees the original caller's return address: `dlsym(RTLD_NEXT, …)`, which
//! glibc resolves relative to its caller, keeps working for every program.

use std::ffi::{CStr, c_char, c_void};

use crate::Kind;
use crate::driver::{in_driver, real_dlsym};
use crate::log::{self, Once};

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// What the trampoline should do with a lookup: 0 = let glibc's `dlsym` answer
/// (tail jump), 1 = answer "not found", anything else = answer this address.
const DEFER: usize = 0;
const NOT_FOUND: usize = 1;

extern "C" fn dlsym_filter(handle: *mut c_void, name: *const c_char) -> usize {
    // Fast path for every lookup that is not a cu* name.
    // SAFETY: a non-null `name` is a NUL-terminated string (dlsym's contract),
    // so its first byte is readable, and its second when the first is not NUL.
    if name.is_null()
        || unsafe { *name } != b'c' as c_char
        || unsafe { *name.add(1) } != b'u' as c_char
    {
        return DEFER;
    }
    if handle == RTLD_NEXT {
        // Relative to the caller; glibc must answer it (another interposer below
        // this one looking for the next definition).
        return DEFER;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: as above.
        let n = unsafe { CStr::from_ptr(name) }.to_bytes();
        let known = crate::sym_by_name(n);
        let unknown_alloc = known.is_none() && crate::unknown_allocator(n);
        if known.is_none() && !unknown_alloc {
            return DEFER;
        }
        // SAFETY: glibc's dlsym with the caller's arguments; only RTLD_NEXT
        // depends on the caller, and it was deferred above.
        let real = unsafe { real_dlsym()(handle, name) };
        if real.is_null() || !in_driver(real) {
            return DEFER;
        }
        match known {
            Some((s, Kind::Wrap | Kind::Refuse)) => crate::wrapper(s) as usize,
            _ => {
                log::once(
                    Once::UnknownAllocator,
                    &format!(
                        "dlsym(\"{}\"): an allocation entry point this interposer does not know; refused \
                         rather than left unenforced",
                        String::from_utf8_lossy(n)
                    ),
                );
                NOT_FOUND
            }
        }
    })
    .unwrap_or(DEFER)
}

/// glibc's `dlsym`, for the trampoline's tail jump.
extern "C" fn real_dlsym_target() -> *mut c_void {
    crate::driver::real_dlsym_addr()
}

/// `void *dlsym(void *handle, const char *symbol)`.
///
/// # Safety
/// dlsym's contract: `symbol` is null or a NUL-terminated string.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rsp ≡ 8 (mod 16). Two pushes and 8 bytes keep calls 16-aligned.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {filter}",
        "cmp rax, 1",
        "je 3f",
        "test rax, rax",
        "jnz 2f",
        "call {target}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        // Tail jump: glibc's dlsym returns straight to our caller.
        "jmp rax",
        "2:",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "ret",
        "3:",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "xor eax, eax",
        "ret",
        filter = sym dlsym_filter,
        target = sym real_dlsym_target,
    )
}

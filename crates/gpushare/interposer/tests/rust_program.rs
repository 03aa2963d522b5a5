//! A Rust CUDA program under the interposer: it opens the driver with dlopen,
//! finds every entry point through cuGetProcAddress_v2 (as the CUDA runtime
//! does), fills the task's cap, forks children that allocate, and launches.
//! The test re-runs this binary as that program.
#![allow(unsafe_code)]

mod common;

use std::ffi::{CString, c_char, c_void};
use std::time::Duration;

use common::*;

const ENV: &str = "GPUSHARE_RUST_PROBE";

unsafe extern "C" {
    fn dlopen(file: *const c_char, mode: i32) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

type Gpa = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> i32;

struct Cuda {
    init: unsafe extern "C" fn(u32) -> i32,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> i32,
    free: unsafe extern "C" fn(u64) -> i32,
    info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32,
    module: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32,
    function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> i32,
    launch: unsafe extern "C" fn(
        *mut c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> i32,
    sync: unsafe extern "C" fn(*mut c_void) -> i32,
}

unsafe fn lookup<T>(gpa: Gpa, name: &str) -> T {
    let c = CString::new(name).unwrap();
    let mut p = std::ptr::null_mut();
    let mut status = -1;
    // SAFETY: the caller names a driver entry point whose C type is T.
    unsafe {
        let rc = gpa(c.as_ptr(), &mut p, 12040, 0, &mut status);
        assert!(
            rc == 0 && !p.is_null(),
            "cuGetProcAddress_v2({name}) = {rc}"
        );
        std::mem::transmute_copy(&p)
    }
}

fn program() -> String {
    // SAFETY: this is a CUDA program: dlopen/dlsym of the driver and calls
    // through the entry points it hands out, with valid out-pointers.
    unsafe {
        let h = dlopen(c"libcuda.so.1".as_ptr(), 2);
        assert!(!h.is_null());
        let gpa: Gpa = std::mem::transmute(dlsym(h, c"cuGetProcAddress_v2".as_ptr()));
        let cu = Cuda {
            init: lookup(gpa, "cuInit"),
            alloc: lookup(gpa, "cuMemAlloc"),
            free: lookup(gpa, "cuMemFree"),
            info: lookup(gpa, "cuMemGetInfo"),
            module: lookup(gpa, "cuModuleLoadData"),
            function: lookup(gpa, "cuModuleGetFunction"),
            launch: lookup(gpa, "cuLaunchKernel"),
            sync: lookup(gpa, "cuStreamSynchronize"),
        };
        assert_eq!((cu.init)(0), 0);
        let mut chunks = Vec::new();
        loop {
            let mut p = 0;
            if (cu.alloc)(&mut p, 8 << 20) != 0 {
                break;
            }
            chunks.push(p);
        }
        let (mut free, mut total) = (0, 0);
        (cu.info)(&mut free, &mut total);
        // A child while the task is full: refused.
        let child = |want_ok: bool| -> i32 {
            let pid = libc::fork();
            if pid == 0 {
                let mut p = 0;
                let rc = (cu.alloc)(&mut p, 8 << 20);
                libc::_exit(if (rc == 0) == want_ok { 0 } else { 1 });
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
            libc::WEXITSTATUS(st)
        };
        let child_full = child(false);
        (cu.free)(chunks.pop().unwrap());
        let child_after_free = child(true);
        // The child died holding 8 MiB: the parent gets it back.
        let mut p = 0;
        let parent_after_child = (cu.alloc)(&mut p, 8 << 20);
        let mut m = std::ptr::null_mut();
        let mut f = std::ptr::null_mut();
        (cu.module)(&mut m, std::ptr::null());
        (cu.function)(&mut f, m, c"spin_1000".as_ptr());
        let null = std::ptr::null_mut();
        let mut launch = 0;
        for _ in 0..3 {
            launch |= (cu.launch)(f, 1, 1, 1, 1, 1, 1, 0, null, null.cast(), null.cast());
            launch |= (cu.sync)(null);
        }
        format!(
            "RESULT chunks={} free={free} total={total} child_full={child_full} child_after_free={child_after_free} parent_after_child={parent_after_child} launch={launch}",
            chunks.len() + 1
        )
    }
}

/// The program itself: runs only when the test below starts this binary.
#[test]
fn rust_program_entry() {
    if std::env::var_os(ENV).is_some() {
        println!("{}", program());
    }
}

#[test]
fn a_rust_program_using_get_proc_address_is_capped() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("rust");
    let (rp, r) = region(&dir, "rust", 64 * MIB, 1000, Duration::ZERO);
    let o = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rust_program_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV, "1")
        .env("LD_PRELOAD", interposer())
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("TESSERA_GPUSHARE_REGION", &rp)
        .env("FAKECUDA_STATE", dir.join("dev.state"))
        .output()
        .unwrap();
    let out = stdout(&o);
    let result: Vec<&str> = out
        .iter()
        .filter_map(|l| l.find("RESULT").map(|i| &l[i..]))
        .collect();
    assert_eq!(
        result,
        [
            "RESULT chunks=8 free=0 total=67108864 child_full=0 child_after_free=0 parent_after_child=0 launch=0"
        ],
        "{out:?}\n{}",
        stderr(&o)
    );
    assert_eq!(
        r.usage().devices[0].memory_used_bytes,
        0,
        "the program exited"
    );
}

//! Shared helpers for the sandbox's integration tests.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use tessera_sandbox::{AllowAll, InitProgram, Runtime, RuntimeConfig, Sandbox, SandboxSpec};

/// `true` when running as root; otherwise says plainly why the test does nothing.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        true
    } else {
        eprintln!(
            "SKIPPED {test}: needs root (user namespaces mapped to a uid range, cgroups); CI runs as root"
        );
        false
    }
}

/// A runtime whose guard allows everything ([`AllowAll`], named as such): these tests
/// prove the kernel's walls (namespaces, seccomp, Landlock, cgroups) hold on their own,
/// so the guard must not stop their attempts first. [`guarded_runtime`] has the guard.
pub fn runtime() -> Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        Runtime::new(RuntimeConfig {
            init: Some(InitProgram {
                path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
                args: vec![],
            }),
            cgroups: true,
            guard: Arc::new(AllowAll),
            ..Default::default()
        })
        .expect("runtime")
    })
    .clone()
}

/// A runtime with the default guard (the shipped policy), as every caller gets it.
pub fn guarded_runtime() -> Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        Runtime::new(RuntimeConfig {
            init: Some(InitProgram {
                path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
                args: vec![],
            }),
            cgroups: true,
            ..Default::default()
        })
        .expect("runtime")
    })
    .clone()
}

pub fn spawn(spec: &SandboxSpec) -> Sandbox {
    runtime().spawn(spec).expect("spawn sandbox")
}

pub fn sandbox() -> Sandbox {
    spawn(&SandboxSpec::default())
}

// ------------------------------------------------------------------ micro-VM tier

/// The extracted kernel package (`dpkg-deb -x linux-image-*-cloud-amd64.deb DIR`) or the
/// `.deb` itself: `TESSERA_VM_KERNEL`, else where `.ci/vm-kernel.sh` puts it.
pub const VM_KERNEL_ENV: &str = "TESSERA_VM_KERNEL";
pub const VM_KERNEL_DEFAULT: &str = "/var/cache/tessera-ci/kernel/x";

/// The micro-VM tier (one per test binary, with the shipped guard), or `None` with a
/// line saying why the test does nothing: no root, no QEMU or no kernel. With `CI` set
/// a missing tool fails the test instead (`.ci/vm-kernel.sh` installs them).
pub fn vm_tier(test: &str) -> Option<Arc<tessera_sandbox::vm::MicroVmTier>> {
    static TIER: OnceLock<Result<Arc<tessera_sandbox::vm::MicroVmTier>, String>> = OnceLock::new();
    vm_tier_in(&TIER, test, None)
}

/// The micro-VM tier whose guard allows everything ([`AllowAll`]), as [`runtime`] is for
/// the namespace tier: for the escape cases that prove the walls hold on their own.
pub fn vm_tier_walls_only(test: &str) -> Option<Arc<tessera_sandbox::vm::MicroVmTier>> {
    static TIER: OnceLock<Result<Arc<tessera_sandbox::vm::MicroVmTier>, String>> = OnceLock::new();
    vm_tier_in(&TIER, test, Some(Arc::new(AllowAll)))
}

fn vm_tier_in(
    tier: &OnceLock<Result<Arc<tessera_sandbox::vm::MicroVmTier>, String>>,
    test: &str,
    guard: Option<Arc<dyn tessera_sandbox::CommandCheck>>,
) -> Option<Arc<tessera_sandbox::vm::MicroVmTier>> {
    use std::path::PathBuf;
    use tessera_sandbox::vm::{MicroVmConfig, MicroVmTier, image};
    let ci = std::env::var_os("CI").is_some();
    let skip = |why: String| {
        assert!(
            !ci,
            "{test}: {why}, and CI is set: run .ci/vm-kernel.sh first"
        );
        eprintln!("SKIPPED {test}: {why}");
        None
    };
    if !nix::unistd::geteuid().is_root() {
        return skip("needs root (QEMU's jail, cgroups, the guest's sandbox)".into());
    }
    let src = std::env::var_os(VM_KERNEL_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(VM_KERNEL_DEFAULT));
    if !src.exists() {
        return skip(format!(
            "no guest kernel at {} (set {VM_KERNEL_ENV} to an extracted linux-image-cloud-amd64)",
            src.display()
        ));
    }
    if tessera_sandbox::vm::find_qemu().is_none() {
        return skip(
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".into(),
        );
    }
    let made = tier.get_or_init(|| {
        let cache = std::env::temp_dir().join("tessera-vm-tests");
        let ktpl = image::cached_kernel_template(&src, &cache).map_err(|e| e.to_string())?;
        let mut cfg = MicroVmConfig::new(&ktpl, &cache);
        cfg.init = Some(InitProgram {
            path: env!("CARGO_BIN_EXE_tessera-sandbox-init").into(),
            args: vec![],
        });
        cfg.boot_timeout = std::time::Duration::from_secs(120);
        if let Some(g) = guard {
            cfg.guard = g;
        }
        MicroVmTier::new(cfg).map_err(|e| e.to_string())
    });
    match made {
        Ok(t) => Some(t.clone()),
        Err(e) => panic!("{test}: the micro-VM tier did not start: {e}"),
    }
}

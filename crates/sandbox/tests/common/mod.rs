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

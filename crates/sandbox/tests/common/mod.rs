//! Shared helpers for the sandbox's integration tests.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use tessera_sandbox::{InitProgram, Runtime, RuntimeConfig, Sandbox, SandboxSpec};

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

pub fn runtime() -> Arc<Runtime> {
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

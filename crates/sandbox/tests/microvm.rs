//! The micro-VM tier: a QEMU `microvm` guest with its own kernel, its agent running the
//! namespace sandbox inside, the host's guard on every command, file and `execve`.
//!
//! Boots are slow under TCG (seconds), so the cases that only read share one VM; the
//! ones that change what they look at boot their own.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tessera_sandbox::tier::Isolated;
use tessera_sandbox::vm::VmSandbox;
use tessera_sandbox::{ExecOutput, ExecRequest, SandboxSpec};

const T: Duration = Duration::from_secs(60);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sh(sb: &dyn Isolated, cmd: &str) -> ExecOutput {
    sb.exec(&ExecRequest::shell(cmd).timeout(T)).expect("exec")
}

/// One VM shared by the read-only cases.
fn shared(test: &str) -> Option<Arc<VmSandbox>> {
    static VM: OnceLock<Arc<VmSandbox>> = OnceLock::new();
    let tier = common::vm_tier(test)?;
    Some(
        VM.get_or_init(|| Arc::new(tier.spawn_vm(&SandboxSpec::default()).expect("boot")))
            .clone(),
    )
}

#[test]
fn exec_round_trip_and_files_in_and_out() {
    let Some(vm) = shared("exec_round_trip_and_files_in_and_out") else {
        return;
    };
    let out = sh(&*vm, "echo hi; echo err >&2; exit 3");
    assert_eq!(text(&out.stdout), "hi\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.status.code(), 3, "{out:?}");
    // stdin in, files in and out.
    let mut req = ExecRequest::shell("cat; id -u").timeout(T);
    req.stdin = Some(b"from stdin\n".to_vec());
    let out = vm.exec(&req).expect("exec");
    assert_eq!(text(&out.stdout), "from stdin\n1000\n");
    vm.write_file("/workspace/in.txt", b"payload")
        .expect("write");
    let out = sh(
        &*vm,
        "cat /workspace/in.txt; echo -n out > /workspace/out.txt",
    );
    assert_eq!(text(&out.stdout), "payload");
    assert_eq!(vm.read_file("/workspace/out.txt").expect("read"), b"out");
    let names: Vec<String> = vm
        .list("/workspace")
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"in.txt".to_string()), "{names:?}");
}

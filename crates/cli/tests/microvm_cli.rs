//! The micro-VM tier from the command line, as a new user meets it: build a kernel
//! template from Debian's kernel package, then run a command in a micro-VM with it.
//! Needs root, QEMU and the extracted kernel package at `TESSERA_VM_KERNEL`
//! (`.ci/vm-kernel.sh`); says why and skips without them (with `CI` set, fails).

mod common;

use std::process::Command;

use common::BIN;

fn kernel_source(test: &str) -> Option<std::path::PathBuf> {
    let ci = std::env::var_os("CI").is_some();
    let src = std::env::var_os("TESSERA_VM_KERNEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/tessera-ci/kernel/x".into());
    let qemu = [
        "/usr/bin/qemu-system-x86_64",
        "/usr/local/bin/qemu-system-x86_64",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    let why = if !common::is_root() {
        "not root"
    } else if !src.exists() {
        "no extracted kernel package (set TESSERA_VM_KERNEL)"
    } else if !qemu {
        "qemu-system-x86_64 is not installed"
    } else {
        return Some(src);
    };
    assert!(
        !ci,
        "{test}: {why}, and CI is set: run .ci/vm-kernel.sh first"
    );
    eprintln!("SKIPPED {test}: {why}");
    None
}

#[test]
fn a_kernel_template_from_the_package_runs_a_micro_vm() {
    let Some(src) = kernel_source("a_kernel_template_from_the_package_runs_a_micro_vm") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tpl = dir.path().join("kernel");
    let o = Command::new(BIN)
        .args(["template", "build", "--kernel"])
        .arg(&src)
        .arg(&tpl)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{o:?}");
    assert!(out.starts_with("kernel template ready: "), "{out}");
    assert!(out.contains("tessera up --vm-kernel"), "{out}");
    for f in ["vmlinuz", "modules.cpio.gz", "kernel.json"] {
        assert!(tpl.join(f).is_file(), "{f} in the template: {out}");
    }
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tpl.join("kernel.json")).unwrap()).unwrap();
    let guest = info["version"].as_str().unwrap().to_string();

    // The same folder again: refused, nothing overwritten.
    let o = Command::new(BIN)
        .args(["template", "build", "--kernel"])
        .arg(&src)
        .arg(&tpl)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already holds files"),
        "{o:?}"
    );

    // A command in a micro-VM: the guest's own kernel answers.
    let o = Command::new(BIN)
        .args([
            "sandbox",
            "run",
            "--runtime-class",
            "isolated",
            "--vm-kernel",
        ])
        .arg(&tpl)
        .args(["--", "uname", "-r"])
        .env_remove("TESSERA_VM_KERNEL_TEMPLATE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let said = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(said, guest, "{o:?}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(said, host.trim(), "the guest runs its own kernel");
}

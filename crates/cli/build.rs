//! Builds the small sandbox init (`tessera-sandbox-init`, a bin of `tessera-sandbox`)
//! and embeds it in `tessera`, so that the README's `cargo run --release -p tessera --
//! up` runs every sandbox with it: `cargo run` builds only the binary it runs, and
//! without the small init each sandbox would start this whole binary as its init
//! (slower, several times the idle memory). At run time the bytes go into a sealed
//! memfd (`InitProgram::from_bytes`); nothing is written to disk.
//!
//! When: release builds (`PROFILE=release`), or always / never with
//! `TESSERA_EMBED_INIT=always|never`. Dev and test builds skip it (`cargo test
//! --workspace` builds the init next to the tests anyway, where it is found first).
//! The init is built by a nested cargo into a target folder of its own (the outer
//! build holds its own), sharing the outer build's jobserver.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TESSERA_EMBED_INIT");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out.join("tessera-sandbox-init");
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let want = match std::env::var("TESSERA_EMBED_INIT").as_deref() {
        Ok("always") => true,
        Ok("never") => false,
        _ => profile == "release",
    };
    if !want {
        std::fs::write(&dest, b"").expect("write OUT_DIR/tessera-sandbox-init");
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let root = manifest.join("../..");
    for p in [
        "crates/sandbox/src",
        "crates/sandbox/Cargo.toml",
        "crates/guard/src",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    // <target>/<profile>/build/tessera-<hash>/out -> <target>/<profile>/embedded-init
    let target_dir = out
        .ancestors()
        .nth(3)
        .map(|p| p.join("embedded-init"))
        .unwrap_or_else(|| out.join("embedded-init"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .args(["-p", "tessera-sandbox", "--bin", "tessera-sandbox-init"])
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        // Small: no debug info in the embedded copy (the outer profile keeps its own).
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .env("CARGO_PROFILE_DEV_DEBUG", "0");
    let sub = if profile == "release" {
        cmd.arg("--release");
        "release"
    } else {
        "debug"
    };
    let host = std::env::var("HOST").unwrap_or_default();
    let target = std::env::var("TARGET").unwrap_or_default();
    let built = if !target.is_empty() && target != host {
        cmd.args(["--target", &target]);
        target_dir.join(&target).join(sub)
    } else {
        target_dir.join(sub)
    }
    .join("tessera-sandbox-init");
    let status = cmd.status().expect("run cargo for tessera-sandbox-init");
    if !status.success() {
        panic!(
            "building tessera-sandbox-init to embed failed ({status}); set TESSERA_EMBED_INIT=never to skip it"
        );
    }
    std::fs::copy(&built, &dest)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", built.display(), dest.display()));
}

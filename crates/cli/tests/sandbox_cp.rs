//! `tessera sandbox cp` with the real binary: a folder in and out as a tar archive
//! (`-r`), and a download whose archive holds a link the sandbox made to a host path,
//! which must fail without writing anything. Needs root (CI runs as root).

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

fn tessera(state: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("TESSERA_SANDBOX_STATE", state)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn cp_r_moves_folders_and_refuses_links_out_of_the_destination() {
    if !nix_is_root() {
        eprintln!(
            "SKIPPED cp_r_moves_folders_and_refuses_links_out_of_the_destination: needs root"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("pkg")).unwrap();
    std::fs::write(src.join("pkg/a.txt"), b"alpha").unwrap();
    std::os::unix::fs::symlink("pkg/a.txt", src.join("link")).unwrap();
    let name = format!("cpt-{}", std::process::id());
    let (rc, out, err) = tessera(&state, &["sandbox", "create", "--name", &name]);
    assert_eq!(rc, 0, "{out}{err}");
    let remote = format!("{name}:/workspace/p");
    let run = || {
        // A folder without -r is refused, with what to do.
        let (rc, _, err) = tessera(&state, &["sandbox", "cp", src.to_str().unwrap(), &remote]);
        assert_eq!(rc, 2, "{err}");
        assert!(err.contains("add -r"), "{err}");
        let (rc, _, err) = tessera(
            &state,
            &["sandbox", "cp", "-r", src.to_str().unwrap(), &remote],
        );
        assert_eq!(rc, 0, "{err}");
        let back = tmp.path().join("back");
        let (rc, _, err) = tessera(
            &state,
            &["sandbox", "cp", "-r", &remote, back.to_str().unwrap()],
        );
        assert_eq!(rc, 0, "{err}");
        assert_eq!(std::fs::read(back.join("link")).unwrap(), b"alpha");
        // A link to a host path, made inside: the download fails and writes nothing.
        let (rc, _, err) = tessera(
            &state,
            &[
                "sandbox",
                "exec",
                &name,
                "--shell",
                "--",
                "ln -s /etc/shadow /workspace/p/evil",
            ],
        );
        assert_eq!(rc, 0, "{err}");
        let bad = tmp.path().join("bad");
        let (rc, _, err) = tessera(
            &state,
            &["sandbox", "cp", "-r", &remote, bad.to_str().unwrap()],
        );
        assert_eq!(rc, 1, "{err}");
        assert!(err.contains("outside the destination"), "{err}");
        assert!(!bad.exists());
    };
    let r = std::panic::catch_unwind(run);
    let _ = tessera(&state, &["sandbox", "rm", &name]);
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

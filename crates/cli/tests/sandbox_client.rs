//! The Python sandbox client (`clients/python/tessera_client/sandbox.py`, E2B-shaped)
//! against a real `tessera up --sandboxes`: create, run (whole and streamed), a
//! failing command, files, the guard's refusal, pause to disk, connect (resume),
//! kill; `tessera sandbox remote …` against the same kind of server; a paused sandbox
//! outliving a killed server. Needs root (sandboxes) and `TESSERA_PYTHON` (a Python
//! with `httpx`; `.ci/run` makes one); skips with the reason without them unless `CI`
//! is set.

mod common;

use std::process::Command;

use common::{Up, up_with};

/// `tessera up --sandboxes` on a fresh data folder, with its admin key; `None` (and
/// why) where sandboxes cannot run (not root), which fails instead when `CI` is set.
fn sandbox_server() -> Option<(tempfile::TempDir, Up, String)> {
    if !common::is_root() {
        assert!(std::env::var_os("CI").is_none(), "needs root (sandboxes)");
        eprintln!("SKIP: sandboxes need root here");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up_with(&["--data", data.to_str().unwrap(), "--sandboxes"]);
    let key = up
        .key
        .clone()
        .expect("the first start prints the admin key");
    Some((dir, up, key))
}

/// `tessera sandbox remote ARGS` against `url` with `key` (no config file from `dir`'s
/// user): exit code, stdout, stderr.
fn remote(dir: &std::path::Path, url: &str, key: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(common::BIN)
        .args(["sandbox", "remote"])
        .args(args)
        .env("TESSERA_URL", url)
        .env("TESSERA_API_KEY", key)
        .env("TESSERA_CONFIG", dir.join("none.yaml"))
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_e2b_flow_through_the_python_client() {
    let ci = std::env::var_os("CI").is_some();
    let py = match std::env::var("TESSERA_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            assert!(
                !ci,
                "TESSERA_PYTHON must be set in CI (.ci/run makes the venv)"
            );
            eprintln!("SKIP: TESSERA_PYTHON is not set (a Python with httpx)");
            return;
        }
    };
    let Some((_dir, up, key)) = sandbox_server() else {
        return;
    };
    let clients = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python");
    let o = Command::new(py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/sandbox_client.py"
        ))
        // The client from this tree, not an installed copy.
        .env("PYTHONPATH", clients)
        .env("TESSERA_URL", &up.url)
        .env("TESSERA_API_KEY", &key)
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(
        o.status.success() && out.trim_end().ends_with("OK"),
        "{out}\n{err}"
    );
}

/// `tessera sandbox remote …` against the same kind of server: create, exec (its exit
/// code and output), cp (files and folders, both ways), ls, pause/resume, kill.
#[test]
fn the_cli_drives_server_sandboxes() {
    let Some((dir, up, key)) = sandbox_server() else {
        return;
    };
    let cli = |args: &[&str]| remote(dir.path(), &up.url, &key, args);
    let (code, id, err) = cli(&["create", "--timeout", "120"]);
    assert_eq!(code, 0, "{err}");
    let id = id.trim().to_string();
    assert!(id.starts_with("sbx_"), "{id}");
    let (code, out, err) = cli(&[
        "exec",
        &id,
        "--shell",
        "--",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!((code, out.as_str(), err.as_str()), (7, "out\n", "err\n"));
    let (code, out, _) = cli(&["exec", &id, "--", "uname", "-s"]);
    assert_eq!((code, out.as_str()), (0, "Linux\n"));
    // cp: a binary file in and out, a folder in and out (-r, as a tar archive).
    let here = dir.path();
    let bin: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(here.join("blob"), &bin).unwrap();
    let target = format!("{id}:/workspace/blob");
    let (code, _, err) = cli(&["cp", here.join("blob").to_str().unwrap(), &target]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli(&["exec", &id, "--shell", "--", "wc -c < /workspace/blob"]);
    assert_eq!((code, out.trim()), (0, "70000"));
    let (code, _, err) = cli(&["cp", &target, here.join("back").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(here.join("back")).unwrap(), bin);
    std::fs::create_dir_all(here.join("proj/src")).unwrap();
    std::fs::write(here.join("proj/src/main.py"), "print('hi')\n").unwrap();
    let (code, _, err) = cli(&[
        "cp",
        here.join("proj").to_str().unwrap(),
        &format!("{id}:/workspace/proj"),
    ]);
    assert!(code == 2 && err.contains("add -r"), "{code} {err}");
    let (code, _, err) = cli(&[
        "cp",
        "-r",
        here.join("proj").to_str().unwrap(),
        &format!("{id}:/workspace/proj"),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli(&["exec", &id, "--", "python3", "/workspace/proj/src/main.py"]);
    assert_eq!((code, out.as_str()), (0, "hi\n"));
    let (code, _, err) = cli(&[
        "cp",
        "-r",
        &format!("{id}:/workspace/proj"),
        here.join("proj2").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(here.join("proj2/src/main.py")).unwrap(),
        "print('hi')\n"
    );
    let (code, _, err) = cli(&["cp", "a", "b"]);
    assert!(code == 2 && err.contains("ID:/path"), "{code} {err}");
    let (code, _, err) = cli(&[
        "cp",
        &format!("{id}:/etc/shadow"),
        here.join("x").to_str().unwrap(),
    ]);
    assert!(code != 0 && err.contains("403"), "{code} {err}");
    let (code, _, err) = cli(&["exec", &id, "--", "cat", "/etc/shadow"]);
    assert!(code != 0 && err.contains("403"), "{code} {err}");
    let (code, out, _) = cli(&["ls"]);
    assert!(
        code == 0 && out.starts_with("ID") && out.contains(&id) && out.contains("running"),
        "{out}"
    );
    let (code, out, err) = cli(&["pause", &id]);
    assert!(code == 0 && out.contains("paused"), "{out} {err}");
    let (code, out, err) = cli(&["resume", &id, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "running", "{v}");
    let (code, out, err) = cli(&["kill", &id]);
    assert_eq!(
        (code, out.trim()),
        (0, format!("killed {id}").as_str()),
        "{err}"
    );
    let (code, _, err) = cli(&["get", &id]);
    assert!(code != 0 && err.contains("404"), "{err}");
}

/// E2B's "resume after the server was killed": a paused sandbox survives a SIGKILL of
/// the server and resumes with its files on the next start from the same data folder;
/// one that was running when the server died is gone, and a killed one stays gone.
#[test]
fn a_paused_sandbox_outlives_a_killed_server() {
    let Some((dir, up, key)) = sandbox_server() else {
        return;
    };
    let cli = |url: &str, args: &[&str]| remote(dir.path(), url, &key, args);
    let made = |url: &str| {
        let (code, id, err) = cli(url, &["create", "--timeout", "120"]);
        assert_eq!(code, 0, "{err}");
        id.trim().to_string()
    };
    let kept = made(&up.url);
    let running = made(&up.url);
    let (code, _, err) = cli(
        &up.url,
        &["exec", &kept, "--shell", "--", "echo kept > /workspace/f"],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&up.url, &["pause", &kept]);
    assert!(code == 0 && out.contains("paused"), "{out} {err}");
    // SIGKILL: no shutdown path runs.
    drop(up);
    let data = dir.path().join("data");
    let again = || common::up_with(&["--data", data.to_str().unwrap(), "--sandboxes"]);
    let up = again();
    let (code, out, err) = cli(&up.url, &["ls"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.contains(&kept) && l.contains("paused")),
        "{out}"
    );
    assert!(
        !out.contains(&running),
        "a running sandbox came back: {out}"
    );
    let (code, _, err) = cli(&up.url, &["get", &running]);
    assert!(code != 0 && err.contains("404"), "{err}");
    let (code, out, err) = cli(&up.url, &["resume", &kept, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "running", "{v}");
    let (code, out, err) = cli(&up.url, &["exec", &kept, "--", "cat", "/workspace/f"]);
    assert_eq!((code, out.as_str()), (0, "kept\n"), "{err}");
    // Paused again, then killed: the next start has nothing to list.
    let (code, _, err) = cli(&up.url, &["pause", &kept]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli(&up.url, &["kill", &kept]);
    assert_eq!(code, 0, "{err}");
    drop(up);
    let up = again();
    let (code, _, err) = cli(&up.url, &["get", &kept]);
    assert!(code != 0 && err.contains("404"), "{err}");
    let snaps = data.join("sandbox-snapshots");
    let left: Vec<_> = std::fs::read_dir(&snaps)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{}: {left:?}", snaps.display());
}

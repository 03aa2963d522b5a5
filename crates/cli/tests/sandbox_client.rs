//! The Python sandbox client (`clients/python/tessera_client/sandbox.py`, E2B-shaped)
//! against a real `tessera up --sandboxes`: create, run (whole and streamed), a
//! failing command, files, the guard's refusal, pause to disk, connect (resume),
//! kill. Needs root (sandboxes) and `TESSERA_PYTHON` (a Python with `httpx`; `.ci/run`
//! makes one); skips with the reason without them unless `CI` is set.

mod common;

use std::process::Command;

use common::up_with;

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
    if !common::is_root() {
        assert!(!ci, "needs root (sandboxes)");
        eprintln!("SKIP: sandboxes need root here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up_with(&["--data", data.to_str().unwrap(), "--sandboxes"]);
    let key = up
        .key
        .clone()
        .expect("the first start prints the admin key");
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

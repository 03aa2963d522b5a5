//! `kill -9` of `tessera up --tpm swtpm` while it decrypts a task's weights into
//! the task's sandbox: the sandbox (and its memory-backed folder) dies with the
//! server, and no decrypted byte is left on a disk: not in the data folder, not in
//! /tmp, not in /dev/shm. The weights go in through `tessera weights put`, as a user
//! stores them. Root and swtpm only; fails without them when `CI` is set.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::up_with;
use serde_json::{Value, json};

const MARKER: &str = "TESSERA-CRASH-MARKER-5e2a9f";

fn ready_or_skip(test: &str) -> bool {
    let root = common::is_root();
    let why = if !root {
        Some("job tasks run in sandboxes, which need root here")
    } else if !tessera_node::attest::tpm::Swtpm::available() {
        Some("swtpm or tpm2-tools is not installed")
    } else {
        None
    };
    match why {
        None => true,
        Some(w) => {
            assert!(std::env::var_os("CI").is_none(), "{test}: {w}");
            eprintln!("SKIPPED {test}: {w}");
            false
        }
    }
}

async fn call(url: &str, key: &str, m: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let c = reqwest::Client::new();
    let mut r = c.request(m, format!("{url}{path}")).bearer_auth(key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    r.send().await.unwrap().json().await.unwrap_or(Value::Null)
}

/// Processes whose mount namespace holds a sealed folder, with the size of the
/// weights file in it so far (read through /proc as root).
fn sealed() -> Vec<(i32, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(m) = std::fs::read_to_string(e.path().join("mountinfo")) else {
            continue;
        };
        if m.contains("tessera-sealed") {
            let size = std::fs::metadata(e.path().join("root/weights/llama/model.bin"))
                .map(|m| m.len())
                .unwrap_or(0);
            out.push((pid, size));
        }
    }
    out
}

/// The software TPM `tessera up --tpm swtpm` started outlives a SIGKILL of it (it
/// is not told of its parent's death; the next start stops it): stopped here so the
/// test leaves nothing.
fn kill_swtpm_of(data: &Path) {
    let d = data.to_string_lossy().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            let c = String::from_utf8_lossy(&c);
            c.starts_with("swtpm") && c.contains(&d)
        }) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// Files under `dir` (not under `skip`) that hold the marker.
fn with_marker(dir: &Path, skip: &Path, found: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.starts_with(skip) {
            continue;
        }
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            with_marker(&p, skip, found);
        } else if ft.is_file()
            && std::fs::read(&p)
                .is_ok_and(|b| b.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()))
        {
            found.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_weights_release_leaves_no_plaintext() {
    if !ready_or_skip("kill_9_during_a_weights_release_leaves_no_plaintext") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 256 MiB of lines that each carry the marker.
    let line = format!("{MARKER} {}\n", "x".repeat(100));
    let model = src.join("model.bin");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&model).unwrap());
        let block = line.repeat(8192);
        for _ in 0..((256 << 20) / block.len()) {
            f.write_all(block.as_bytes()).unwrap();
        }
    }
    let total = std::fs::metadata(&model).unwrap().len();
    let mut server = up_with(&["--data", data.to_str().unwrap(), "--tpm", "swtpm"]);
    let key = server.key.clone().expect("first start prints the key");
    let url = server.url.clone();
    let nodes = call(&url, &key, reqwest::Method::GET, "/v1/nodes", None).await;
    let node = nodes["items"][0]["name"].as_str().unwrap().to_string();
    let a = call(
        &url,
        &key,
        reqwest::Method::POST,
        &format!("/v1/nodes/{node}/attestation/trust"),
        None,
    )
    .await;
    assert_eq!(a["attested"], true, "{a}");
    call(
        &url,
        &key,
        reqwest::Method::POST,
        "/v1/queues",
        Some(json!({"name": "q"})),
    )
    .await;

    // As a user stores weights.
    let out = std::process::Command::new(common::BIN)
        .args(["weights", "put", "llama"])
        .arg(&model)
        .env("TESSERA_URL", &url)
        .env("TESSERA_API_KEY", &key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("llama") && stdout.contains("model.bin"),
        "{stdout}"
    );

    let job = json!({"name": "j", "queue": "q", "tasks": [{
        "name": "t", "command": ["sleep", "600"], "weights": ["llama"],
        "resources": {"cpu_milli": 100, "memory": 1u64 << 30},
    }]});
    let v = call(&url, &key, reqwest::Method::POST, "/v1/jobs", Some(job)).await;
    assert_eq!(v["spec"]["name"], "j", "{v}");

    // Wait for the release to begin (a sealed folder with part of the file), then
    // SIGKILL: no shutdown path runs.
    let mut mid = None;
    let mut last = Vec::new();
    for _ in 0..6000 {
        last = sealed();
        if let Some(&(_, size)) = last.iter().find(|(_, s)| *s > 0) {
            mid = Some(size);
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let size = mid.unwrap_or_else(|| panic!("the release never began: {last:?}"));
    eprintln!(
        "killed with {size} of {total} bytes delivered ({})",
        if size < total {
            "mid-release"
        } else {
            "just after the release"
        }
    );

    // The sandbox and its memory-backed folder go with the server.
    let mut left = sealed();
    for _ in 0..500 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = sealed();
    }
    assert!(
        left.is_empty(),
        "sealed folders outlived the server: {left:?}"
    );

    // And no plaintext anywhere on disk but the user's own file.
    let mut found = Vec::new();
    with_marker(&data, &src, &mut found);
    with_marker(Path::new("/dev/shm"), &src, &mut found);
    with_marker(&std::env::temp_dir(), &src, &mut found);
    assert!(found.is_empty(), "plaintext left behind: {found:?}");

    // The software TPM outlived the SIGKILL (holding its state's lock): a restart
    // stops it and starts afresh on the same state, still attested.
    drop(server);
    let again = up_with(&["--data", data.to_str().unwrap(), "--tpm", "swtpm"]);
    let a = call(
        &again.url,
        &key,
        reqwest::Method::GET,
        &format!("/v1/nodes/{node}/attestation"),
        None,
    )
    .await;
    assert_eq!(a["attested"], true, "after the restart: {a}");
    drop(again);
    kill_swtpm_of(&data);
}

//! `/v1/sandboxes` through HTTP: create, commands (JSON and server-sent events), files,
//! pause/resume, timeout, kill, tenant scoping, roles, the guard, and a server with
//! sandboxes off. Real sandboxes need root (CI runs as root) and the
//! `tessera-sandbox-init` program, which `cargo test --workspace` builds.

use std::time::Duration;

mod common;

use common::{Client, Method, Server, StatusCode, Value, code, json};
use tessera_sandbox::InitProgram;
use tessera_server::sandboxes::SandboxesConfig;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

/// The init program, or `None` (and why) when this test cannot make sandboxes here.
fn ready(test: &str) -> Option<InitProgram> {
    if !is_root() {
        eprintln!(
            "SKIPPED {test}: needs root (user-namespace id ranges, cgroups); CI runs as root"
        );
        return None;
    }
    match InitProgram::locate() {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("{test}: tessera-sandbox-init is not built next to the test binary")
        }
        None => {
            eprintln!(
                "SKIPPED {test}: tessera-sandbox-init not built (cargo build -p tessera-sandbox)"
            );
            None
        }
    }
}

async fn server(init: InitProgram) -> Server {
    Server::start_with(|c| {
        c.register_local_node = false;
        c.sandboxes = SandboxesConfig {
            enabled: true,
            init: Some(init),
            warm: 1,
            max_per_tenant: 3,
        };
    })
    .await
}

async fn create(c: &Client, body: Value) -> String {
    let (st, v) = c.post("/v1/sandboxes", body).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    v["sandbox_id"].as_str().unwrap().to_string()
}

async fn raw_get(c: &Client, path: &str) -> (StatusCode, Vec<u8>) {
    let r = c.request(Method::GET, path).send().await.unwrap();
    (r.status(), r.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_run_files_pause_timeout_kill() {
    let Some(init) = ready("create_run_files_pause_timeout_kill") else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let id = create(
        &t,
        json!({"timeout": 120, "metadata": {"owner": "test"}, "env_vars": {"GREETING": "hello"}, "memory_mb": 256}),
    )
    .await;
    assert!(id.starts_with("sbx_"));
    let (st, v) = t.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "running");
    assert_eq!(v["metadata"]["owner"], "test");
    assert_eq!(v["limits"]["memory_bytes"], 256 << 20);

    // Commands: shell line with env and stdin, argv form, exit codes.
    let (st, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "echo \"$GREETING $X\"; cat; exit 3", "envs": {"X": "world"}, "stdin": "in\n"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["stdout"], "hello world\nin\n");
    assert_eq!(v["exit_code"], 3);
    let (_, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"argv": ["python3", "-c", "print(6*7)"], "cwd": "/tmp"}),
        )
        .await;
    assert_eq!(v["stdout"], "42\n", "{v}");
    // A command timeout kills the tree and says so.
    let (_, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "sleep 30", "timeout": 0.5}),
        )
        .await;
    assert_eq!(v["timed_out"], true, "{v}");
    // Both or neither of cmd/argv: 400 naming the field.
    let (st, v) = t
        .post(&format!("/v1/sandboxes/{id}/commands"), json!({}))
        .await;
    assert_eq!((st, code(&v)), (StatusCode::BAD_REQUEST, "invalid_request"));
    assert_eq!(v["field"], "cmd");
    // The guard.
    let (st, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "rm -rf --no-preserve-root /"}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("guard"), "{v}");

    // Files.
    let r = t
        .request(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/workspace/d/a.txt"),
        )
        .body(b"alpha\x00beta".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (st, body) = raw_get(
        &t,
        &format!("/v1/sandboxes/{id}/files?path=/workspace/d/a.txt"),
    )
    .await;
    assert_eq!(
        (st, body.as_slice()),
        (StatusCode::OK, &b"alpha\x00beta"[..])
    );
    let (st, v) = t
        .get(&format!("/v1/sandboxes/{id}/files/list?path=/workspace/d"))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["items"][0]["name"], "a.txt");
    assert_eq!(v["items"][0]["type"], "file");
    assert_eq!(v["items"][0]["size"], 10);
    let (st, v) = t
        .get(&format!("/v1/sandboxes/{id}/files?path=/workspace/nope"))
        .await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "{v}");
    let (st, v) = t
        .get(&format!("/v1/sandboxes/{id}/files?path=relative"))
        .await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{v}"
    );
    let (st, _) = t
        .delete(&format!(
            "/v1/sandboxes/{id}/files?path=/workspace/d&recursive=true"
        ))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = t
        .get(&format!("/v1/sandboxes/{id}/files/list?path=/workspace/d"))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // The base is read-only.
    let r = t
        .request(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/usr/evil"),
        )
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // Pause (to disk): commands wait for resume (409 meanwhile); files survive it.
    let r = t
        .request(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/workspace/keep.txt"),
        )
        .body("kept across a pause")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (st, v) = t.post_empty(&format!("/v1/sandboxes/{id}/pause")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{v}"
    );
    let (st, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!((st, code(&v)), (StatusCode::CONFLICT, "conflict"), "{v}");
    let (st, v) = t.post_empty(&format!("/v1/sandboxes/{id}/resume")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    let (st, body) = raw_get(
        &t,
        &format!("/v1/sandboxes/{id}/files?path=/workspace/keep.txt"),
    )
    .await;
    assert_eq!(
        (st, String::from_utf8_lossy(&body).as_ref()),
        (StatusCode::OK, "kept across a pause")
    );

    // Timeout: a new end, then expiry kills it.
    let (st, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/timeout"),
            json!({"timeout": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let mut gone = false;
    for _ in 0..150 {
        if t.get(&format!("/v1/sandboxes/{id}")).await.0 == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the sandbox outlived its timeout");

    // Kill.
    let id2 = create(&t, json!({})).await;
    let (st, _) = t.delete(&format!("/v1/sandboxes/{id2}")).await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = t.get(&format!("/v1/sandboxes/{id2}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = t
        .post(
            &format!("/v1/sandboxes/{id2}/commands"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.running.shutdown().await;
}

/// A tar archive: `(kind, path, link target)` each with one byte of data, written from
/// raw headers so that hostile names can be made.
fn archive(entries: &[(tar::EntryType, &str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (kind, path, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(1);
        h.set_mode(if *kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
    }
    b.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_move_as_tar_archives() {
    let Some(init) = ready("files_move_as_tar_archives") else {
        return;
    };
    use tar::EntryType as E;
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let id = create(&t, json!({"timeout": 120})).await;
    let put = |body: Vec<u8>, ct: &'static str, path: &'static str| {
        t.request(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files/tar?path={path}"),
        )
        .header("content-type", ct)
        .body(body)
    };
    let good = archive(&[
        (E::Directory, "src/", ""),
        (E::Regular, "src/a.py", ""),
        (E::Symlink, "b.py", "src/a.py"),
    ]);
    let r = put(good.clone(), "application/x-tar", "/workspace/p")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["files"].as_u64(), v["links"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    let (st, body) = raw_get(
        &t,
        &format!("/v1/sandboxes/{id}/files?path=/workspace/p/b.py"),
    )
    .await;
    assert_eq!((st, body.as_slice()), (StatusCode::OK, &b"x"[..]));
    // Download: an archive the library's checker accepts, holding what was uploaded.
    let (st, body) = raw_get(
        &t,
        &format!("/v1/sandboxes/{id}/files/tar?path=/workspace/p"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let sum = tessera_sandbox::tarball::check(&body, &Default::default()).unwrap();
    assert_eq!((sum.files, sum.dirs, sum.links), (1, 1, 1), "{sum:?}");
    // Hostile archives: 400 naming the entry, nothing unpacked.
    for (a, want) in [
        (archive(&[(E::Regular, "../../etc/x", "")]), "`..`"),
        (archive(&[(E::Symlink, "l", "/")]), "outside"),
        (archive(&[(E::Block, "sda", "")]), "block device"),
    ] {
        let r = put(a, "application/x-tar", "/workspace/bad")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let v: Value = r.json().await.unwrap();
        assert!(v["detail"].as_str().unwrap().contains(want), "{want}: {v}");
    }
    let (st, _) = t
        .get(&format!(
            "/v1/sandboxes/{id}/files/list?path=/workspace/bad"
        ))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Not a tar content type: 415.
    let r = put(good, "application/json", "/workspace/p")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Larger than the body limit of JSON routes (1 MiB) is fine here.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("big.bin").unwrap();
    h.set_size(3 << 20);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, &vec![0u8; 3 << 20][..]).unwrap();
    let r = put(
        b.into_inner().unwrap(),
        "application/x-tar",
        "/workspace/big",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_are_tenant_scoped_and_role_checked() {
    let Some(init) = ready("sandboxes_are_tenant_scoped_and_role_checked") else {
        return;
    };
    let s = server(init).await;
    let a = s.tenant("a").await;
    let b = s.tenant("b").await;
    let id = create(&a, json!({})).await;
    for (m, path) in [
        (Method::GET, format!("/v1/sandboxes/{id}")),
        (Method::DELETE, format!("/v1/sandboxes/{id}")),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/files?path=/etc/hostname"),
        ),
        (Method::POST, format!("/v1/sandboxes/{id}/pause")),
    ] {
        let (st, v) = b.call(m.clone(), &path, None).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::NOT_FOUND, "not_found"),
            "{m} {path}"
        );
    }
    let (st, v) = b
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (_, v) = b.get("/v1/sandboxes").await;
    assert_eq!(v["items"].as_array().unwrap().len(), 0);
    let (_, v) = a.get("/v1/sandboxes").await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    // A viewer sees, but cannot run or create.
    let viewer = a.with_role("vic", "viewer").await;
    assert_eq!(
        viewer.get(&format!("/v1/sandboxes/{id}")).await.0,
        StatusCode::OK
    );
    let (st, _) = viewer
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(
        viewer.post("/v1/sandboxes", json!({})).await.0,
        StatusCode::FORBIDDEN
    );
    // Per-tenant cap (3 in this server).
    create(&a, json!({})).await;
    create(&a, json!({})).await;
    let (st, v) = a.post("/v1/sandboxes", json!({})).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
        "{v}"
    );
    // Bad bodies name the field.
    let (st, v) = b.post("/v1/sandboxes", json!({"timeout": 0})).await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("timeout"))
    );
    let (st, v) = b.post("/v1/sandboxes", json!({"templat": "x"})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = b.post("/v1/sandboxes", json!({"template": "../etc"})).await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("template"))
    );
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_stream_output_as_server_sent_events() {
    let Some(init) = ready("commands_stream_output_as_server_sent_events") else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let id = create(&t, json!({})).await;
    let mut r = t
        .request(Method::POST, &format!("/v1/sandboxes/{id}/commands"))
        .json(&json!({"cmd": "echo one; sleep 0.3; echo two >&2; echo three; exit 4", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut text = String::new();
    let mut chunks = 0;
    while let Some(c) = r.chunk().await.unwrap() {
        chunks += 1;
        text.push_str(&String::from_utf8_lossy(&c));
        if text.contains("event: end") && text.ends_with("\n\n") {
            break;
        }
    }
    assert!(chunks >= 2, "output arrived in one piece: {text}");
    let mut out = String::new();
    let mut err = String::new();
    let mut end = Value::Null;
    let mut ev = "";
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            ev = e;
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).unwrap();
            match ev {
                "stdout" => out.push_str(v["data"].as_str().unwrap()),
                "stderr" => err.push_str(v["data"].as_str().unwrap()),
                "end" => end = v,
                other => panic!("unexpected event {other}: {d}"),
            }
        }
    }
    assert_eq!(out, "one\nthree\n");
    assert_eq!(err, "two\n");
    assert_eq!(end["exit_code"], 4, "{text}");
    s.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_are_off_unless_enabled() {
    let s = Server::start_with(|c| c.register_local_node = false).await;
    let t = s.tenant("acme").await;
    let (st, v) = t.post("/v1/sandboxes", json!({})).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    assert!(v["detail"].as_str().unwrap().contains("--sandboxes"), "{v}");
    // The routes are in the OpenAPI document either way.
    let (_, doc) = t.get("/v1/openapi.json").await;
    assert!(doc["paths"]["/v1/sandboxes/{id}/commands"]["post"].is_object());
    assert!(doc["components"]["schemas"]["NewSandbox"].is_object());
    s.running.shutdown().await;
}

/// E2B's `autoPause`: at its timeout the sandbox is paused to disk, not killed: it
/// stays listed as `paused` with no end and no node, its snapshot in the server's
/// folder (root's alone), its processes gone; `resume` places it again with its
/// files and a fresh timeout; `kill` removes the snapshot too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_pause_at_the_timeout_then_resume() {
    use std::os::unix::fs::PermissionsExt;
    let Some(init) = ready("auto_pause_at_the_timeout_then_resume") else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let id = create(&t, json!({"timeout": 2, "auto_pause": true})).await;
    let (st, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "echo note > /workspace/n.txt; mkdir -p /home/user/d; echo deep > /home/user/d/f; sleep 300 & echo $!"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let v = t
        .wait_for(&format!("/v1/sandboxes/{id}"), |v| v["state"] == "paused")
        .await;
    assert_eq!(
        (&v["end_at"], &v["node"], &v["auto_pause"]),
        (&Value::Null, &Value::Null, &json!(true)),
        "{v}"
    );
    let snap = s.dir().join("sandbox-snapshots");
    let mode = std::fs::metadata(&snap).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert!(snap.join(&id).is_dir(), "the snapshot is on disk");
    // No process of the sandbox is left: nothing runs `sleep 300` on the host.
    let sleeping = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|c| c == b"sleep\x00300\x00");
    assert!(!sleeping, "a paused sandbox's processes are gone");
    // Paused: files and commands wait (409); still listed, as paused.
    let (st, _) = raw_get(
        &t,
        &format!("/v1/sandboxes/{id}/files?path=/workspace/n.txt"),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    let (_, l) = t.get("/v1/sandboxes").await;
    assert_eq!(l["items"][0]["state"], "paused", "{l}");

    let (st, v) = t.post_empty(&format!("/v1/sandboxes/{id}/resume")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    assert!(v["node"].is_string() && v["end_at"].is_number(), "{v}");
    for (path, want) in [("/workspace/n.txt", "note\n"), ("/home/user/d/f", "deep\n")] {
        let (st, body) = raw_get(&t, &format!("/v1/sandboxes/{id}/files?path={path}")).await;
        assert_eq!(
            (st, String::from_utf8_lossy(&body).as_ref()),
            (StatusCode::OK, want)
        );
    }
    // Its timeout counts again from the resume: it pauses once more.
    t.wait_for(&format!("/v1/sandboxes/{id}"), |v| v["state"] == "paused")
        .await;
    let (st, _) = t.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK);
    assert!(!snap.join(&id).exists(), "kill removes the snapshot");
}

/// The per-tenant cap holds under concurrent creates (issue 24: the count and the
/// insert were under separate locks, so creates racing past the check all got in).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_cap_holds_under_concurrent_creates() {
    let Some(init) = ready("the_tenant_cap_holds_under_concurrent_creates") else {
        return;
    };
    let s = server(init).await;
    let a = s.tenant("racer").await;
    let tries: Vec<_> = (0..8)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { a.post("/v1/sandboxes", json!({})).await })
        })
        .collect();
    let mut made = 0;
    for t in tries {
        let (st, v) = t.await.unwrap();
        match st {
            StatusCode::CREATED => made += 1,
            StatusCode::TOO_MANY_REQUESTS => assert_eq!(code(&v), "quota_exceeded", "{v}"),
            other => panic!("{other}: {v}"),
        }
    }
    assert_eq!(made, 3, "the cap is 3");
    let (_, v) = a.get("/v1/sandboxes").await;
    assert_eq!(v["items"].as_array().unwrap().len(), 3, "{v}");
}

/// `/v1/watch?kind=sandbox` follows every change of the caller's sandboxes (create,
/// timeout, pause, resume, kill) and none of another tenant's; a watcher resumes
/// after the last number it saw; a number the feed does not have is a 410; the
/// list's items carry the version the watch compares with; open watches do not hold
/// up the server's shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_follows_every_change_of_the_tenants_sandboxes() {
    let Some(init) = ready("the_watch_follows_every_change_of_the_tenants_sandboxes") else {
        return;
    };
    let s = server(init).await;
    let a = s.tenant("alpha").await;
    let b = s.tenant("beta").await;
    let mut wa = a.watch("sandbox", None).await;
    let mut wb = b.watch("sandbox", None).await;
    let other = create(&b, json!({})).await;
    let id = create(&a, json!({"timeout": 120})).await;
    let (st, _) = a
        .post(
            &format!("/v1/sandboxes/{id}/timeout"),
            json!({"timeout": 60}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = a.post_empty(&format!("/v1/sandboxes/{id}/pause")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = a.post_empty(&format!("/v1/sandboxes/{id}/resume")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, listed) = a.get("/v1/sandboxes").await;
    let (st, _) = a.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK);

    let ev = wa.next(5).await;
    let got: Vec<(&str, &str)> = ev
        .iter()
        .map(|(e, o)| (e.as_str(), o["state"].as_str().unwrap_or("?")))
        .collect();
    assert_eq!(
        got,
        [
            ("created", "running"),
            ("updated", "running"),
            ("updated", "paused"),
            ("updated", "running"),
            ("deleted", "running"),
        ]
    );
    assert!(
        ev.iter()
            .all(|(_, o)| o["name"] == id.as_str() && o["sandbox_id"] == id.as_str())
    );
    let versions: Vec<u64> = ev
        .iter()
        .map(|(_, o)| o["resource_version"].as_u64().unwrap())
        .collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    // The timeout's update shows the new end; the list read after the resume
    // carries the resume's version.
    assert!(
        ev[1].1["end_at"].as_f64() < ev[0].1["end_at"].as_f64(),
        "{ev:?}"
    );
    assert_eq!(
        listed["items"][0]["resource_version"], versions[3],
        "{listed}"
    );
    // Beta saw its own sandbox only.
    let evb = wb.next(1).await;
    assert_eq!(
        (evb[0].0.as_str(), &evb[0].1["name"]),
        ("created", &json!(other))
    );

    // Resuming after the create gives the rest, in order.
    let rest = a.watch("sandbox", Some(versions[0])).await.next(4).await;
    assert_eq!(
        rest.iter()
            .map(|(_, o)| o["resource_version"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        versions[1..]
    );
    // Numbers this feed never gave (an earlier run's, a later one's): 410, list again.
    for after in [1, versions[4] + 1000] {
        let (st, v) = a
            .get(&format!("/v1/watch?kind=sandbox&after={after}"))
            .await;
        assert_eq!((st, code(&v)), (StatusCode::GONE, "compacted"), "{v}");
    }
    // A viewer-less caller is refused as for the list; unknown kinds name the field.
    let (st, v) = a.get("/v1/watch?kind=sandboxes").await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("sandbox"), "{v}");
    tokio::time::timeout(Duration::from_secs(30), s.running.shutdown())
        .await
        .expect("open watches end at shutdown");
}

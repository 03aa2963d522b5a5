//! Runtime classes through the whole server: the local node advertises the classes
//! whose tier it runs (as `runtime-class.tessera.io/NAME` labels), a job task's class
//! becomes a node selector the live batch scheduler honours (an `isolated` task never
//! lands on a node without the micro-VM tier, and its pending reason names the class),
//! a tenant's minimum class upgrades what names none and refuses what is weaker, and,
//! where QEMU and a guest kernel are present, an `isolated` job task and an
//! `isolated` API sandbox really run in a micro-VM (another kernel than the host's).

mod common;

use common::{Client, Server, StatusCode, Value, code, json};

async fn queue(c: &Client) {
    let (st, v) = c.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

fn job(name: &str, class: Option<&str>, cmd: &str) -> Value {
    let mut t = json!({"name": "t", "resources": {"cpu_milli": 100, "memory": 67108864},
                       "command": ["sh", "-c", cmd]});
    if let Some(c) = class {
        t["runtime_class"] = json!(c);
    }
    json!({"name": name, "queue": "q", "tasks": [t]})
}

/// QEMU processes on this machine (only this test in this binary starts any).
fn qemu_processes() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("qemu-system"))
        })
        .count()
}

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_task_waits_for_a_node_that_runs_its_class() {
    let s = Server::start_with(|c| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.classes
            .min_class
            .insert("untrusted".into(), "isolated".into());
    })
    .await;
    // This server has no --vm-kernel: its node runs the namespace tier's classes only.
    let (_, v) = s.admin.get("/v1/nodes").await;
    let labels = &v["items"][0]["labels"];
    assert_eq!(labels["runtime-class.tessera.io/standard"], "true", "{v}");
    assert!(
        labels.get("runtime-class.tessera.io/isolated").is_none(),
        "{v}"
    );

    let a = s.tenant("alpha").await;
    queue(&a).await;
    let (st, v) = a
        .post("/v1/jobs", job("vm", Some("isolated"), "true"))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["spec"]["tasks"][0]["runtime_class"], "isolated", "{v}");
    let v = a
        .wait_for("/v1/jobs/vm", |v| v["status"]["pending_reason"].is_string())
        .await;
    let why = v["status"]["pending_reason"].as_str().unwrap();
    assert!(
        why.contains("run runtime class `isolated`"),
        "the reason names the class: {why}"
    );
    assert_eq!(v["status"]["phase"], "pending", "{v}");
    assert!(
        v["status"]["tasks"]
            .as_object()
            .is_none_or(|m| m.is_empty())
    );

    // A class the server does not know, and GPUs in a micro-VM, are refused by field.
    let (st, v) = a.post("/v1/jobs", job("bad", Some("gvisor"), "true")).await;
    assert_eq!((st, code(&v)), (StatusCode::BAD_REQUEST, "invalid_request"));
    assert_eq!(v["field"], "tasks[0].runtime_class", "{v}");
    let mut gpu = job("gpu", Some("isolated"), "true");
    gpu["tasks"][0]["gpu"] = json!(1);
    let (st, v) = a.post("/v1/jobs", gpu).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("cannot hold GPUs"),
        "{v}"
    );

    // A job that names no class gets `standard`, which adds no selector.
    let (st, v) = a.post("/v1/jobs", job("plain", None, "true")).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["spec"]["tasks"][0]["runtime_class"], "standard", "{v}");

    // Tenant `untrusted` runs at least `isolated`: no class means isolated, and
    // `standard` is refused.
    let u = s.tenant("untrusted").await;
    queue(&u).await;
    let (st, v) = u.post("/v1/jobs", job("d", None, "true")).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["spec"]["tasks"][0]["runtime_class"], "isolated", "{v}");
    let (st, v) = u
        .post("/v1/jobs", job("weak", Some("standard"), "true"))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("at least runtime class `isolated`"),
        "{v}"
    );
    // Agent sessions run only in the namespace tier so far: refused for this tenant
    // rather than run weaker than its policy.
    let (st, v) = u
        .post("/v1/runtimes", json!({"name": "r", "command": ["true"]}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("agent sessions"),
        "{v}"
    );
    let (st, v) = u.post("/v1/runtimes/r/invocations", json!({})).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
}

/// The micro-VM tier's kernel template, built once from the extracted kernel package
/// at `TESSERA_VM_KERNEL` (`.ci/vm-kernel.sh`); `None` with a line saying why (with
/// `CI` set, a missing piece fails instead).
fn kernel_template(test: &str) -> Option<std::path::PathBuf> {
    let ci = std::env::var_os("CI").is_some();
    let skip = |why: String| {
        assert!(
            !ci,
            "{test}: {why}, and CI is set: run .ci/vm-kernel.sh first"
        );
        eprintln!("SKIPPED {test}: {why}");
        None
    };
    if !common::can_run_tasks(test) {
        return None;
    }
    let src = std::env::var_os("TESSERA_VM_KERNEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/tessera-ci/kernel/x".into());
    if !src.exists() {
        return skip(format!(
            "no guest kernel at {} (set TESSERA_VM_KERNEL)",
            src.display()
        ));
    }
    if tessera_sandbox::vm::find_qemu().is_none() {
        return skip("qemu-system-x86_64 is not installed".into());
    }
    let cache = std::env::temp_dir().join("tessera-server-vm-tests");
    Some(tessera_sandbox::vm::image::cached_kernel_template(&src, &cache).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_work_runs_in_a_micro_vm() {
    let Some(ktpl) = kernel_template("isolated_work_runs_in_a_micro_vm") else {
        return;
    };
    // The scheduler, the micro-VM tier and API sandboxes (cold): this server, and the
    // one started again on its folder below.
    let vm_server = |c: &mut tessera_server::ServerConfig| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.node.vm_kernel = Some(ktpl.clone());
        c.sandboxes = tessera_server::sandboxes::SandboxesConfig {
            enabled: true,
            warm: 0,
            ..Default::default()
        };
    };
    let s = Server::start_with(vm_server).await;
    let (_, v) = s.admin.get("/v1/nodes").await;
    assert_eq!(
        v["items"][0]["labels"]["runtime-class.tessera.io/isolated"], "true",
        "{v}"
    );
    let host = host_kernel();

    let a = s.tenant("alpha").await;
    queue(&a).await;
    let (st, v) = a
        .post(
            "/v1/jobs",
            job(
                "vm",
                Some("isolated"),
                "echo kernel=$(uname -r); echo hi > /workspace/f; cat /workspace/f",
            ),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    // Under TCG a boot takes seconds.
    let v = a
        .wait_for_within("/v1/jobs/vm", std::time::Duration::from_secs(180), |v| {
            matches!(v["status"]["phase"].as_str(), Some("succeeded" | "failed"))
        })
        .await;
    let r = a
        .request(common::Method::GET, "/v1/jobs/vm/logs")
        .send()
        .await
        .unwrap();
    let log = r.text().await.unwrap();
    assert_eq!(v["status"]["phase"], "succeeded", "{v}\n{log}");
    let guest = log
        .lines()
        .find_map(|l| l.strip_prefix("kernel="))
        .unwrap_or_else(|| panic!("no kernel line in the log: {log}"));
    assert_ne!(guest, host, "the task ran on the host's kernel: {log}");
    assert!(log.contains("hi"), "{log}");

    // Cancelling a running micro-VM task leaves no QEMU behind.
    let (st, v) = a
        .post(
            "/v1/jobs",
            job("long", Some("isolated"), "echo up; sleep 600"),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    for _ in 0..1800 {
        let r = a
            .request(common::Method::GET, "/v1/jobs/long/logs")
            .send()
            .await
            .unwrap();
        if r.text().await.unwrap().contains("up") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(qemu_processes() > 0, "the task's VM is not running");
    let (st, v) = a.post_empty("/v1/jobs/long/cancel").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    a.wait_for_within("/v1/jobs/long", std::time::Duration::from_secs(60), |v| {
        v["status"]["phase"] == "cancelled" && v["status"]["tasks"]["t"]["state"] != "terminating"
    })
    .await;
    for _ in 0..100 {
        if qemu_processes() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        qemu_processes(),
        0,
        "a cancelled task's QEMU is still running"
    );

    // An API sandbox of class `isolated` is a micro-VM too; a `standard` one is not.
    let (st, v) = a
        .post(
            "/v1/sandboxes",
            json!({"runtime_class": "isolated", "timeout": 120}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(
        (v["tier"].as_str(), v["runtime_class"].as_str()),
        (Some("microvm"), Some("isolated")),
        "{v}"
    );
    let id = v["sandbox_id"].as_str().unwrap().to_string();
    let (st, out) = a
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "uname -r"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{out}");
    let guest = out["stdout"].as_str().unwrap().trim().to_string();
    assert_ne!(guest, host, "{out}");
    // Paused to disk and resumed: the VM's memory comes back, and with it a file in
    // the guest's tmpfs (there is no file layer in a micro-VM snapshot, only memory).
    let (st, out) = a
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "echo in-guest-memory > /tmp/m; grep ' /tmp ' /proc/mounts"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{out}");
    assert!(out["stdout"].as_str().unwrap().contains("tmpfs"), "{out}");
    let (st, v) = a.post_empty(&format!("/v1/sandboxes/{id}/pause")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{v}"
    );
    let (st, v) = a.post_empty(&format!("/v1/sandboxes/{id}/resume")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    let (st, out) = a
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "cat /tmp/m; uname -r"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{out}");
    assert_eq!(
        out["stdout"].as_str().unwrap(),
        format!("in-guest-memory\n{guest}\n"),
        "{out}"
    );
    let (st, _) = a.delete(&format!("/v1/sandboxes/{id}")).await;
    assert!(st.is_success());
    let (st, v) = a.post("/v1/sandboxes", json!({"timeout": 60})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["tier"], "namespace", "{v}");
    let id = v["sandbox_id"].as_str().unwrap().to_string();
    let (_, out) = a
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "uname -r"}),
        )
        .await;
    assert_eq!(out["stdout"].as_str().unwrap().trim(), host, "{out}");

    // A paused micro-VM outlives the server: a new server process on the same data
    // folder lists it paused and resumes it with its memory (the file in the guest's
    // tmpfs), from the snapshot the old one wrote.
    let (st, v) = a
        .post(
            "/v1/sandboxes",
            json!({"runtime_class": "isolated", "timeout": 120}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let id = v["sandbox_id"].as_str().unwrap().to_string();
    let (st, out) = a
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "echo across-restarts > /tmp/m"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{out}");
    let (st, v) = a.post_empty(&format!("/v1/sandboxes/{id}/pause")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("paused")),
        "{v}"
    );
    let tenant_key = a.key().to_string();
    let dir = s.stop().await;
    assert_eq!(qemu_processes(), 0, "a paused VM holds no QEMU");
    let store = tessera_server::SqliteStore::open(dir.path().join("data")).unwrap();
    let mut c = common::test_config(dir.path());
    vm_server(&mut c);
    let running = tessera_server::start(store.into(), c).await.unwrap();
    let a = common::Client::new(&format!("http://{}", running.addr), Some(&tenant_key));
    let (st, v) = a.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(
        (st, v["state"].as_str(), v["tier"].as_str()),
        (StatusCode::OK, Some("paused"), Some("microvm")),
        "{v}"
    );
    let (st, v) = a.post_empty(&format!("/v1/sandboxes/{id}/resume")).await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("running")),
        "{v}"
    );
    let (st, out) = a
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "cat /tmp/m"}),
        )
        .await;
    assert_eq!(
        (st, out["stdout"].as_str()),
        (StatusCode::OK, Some("across-restarts\n")),
        "{out}"
    );
    let (st, _) = a.delete(&format!("/v1/sandboxes/{id}")).await;
    assert!(st.is_success());
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_sandbox_without_the_tier_says_how_to_get_it() {
    if !common::can_run_tasks("an_isolated_sandbox_without_the_tier_says_how_to_get_it") {
        return;
    }
    let s = Server::start_with(|c| {
        c.sandboxes = tessera_server::sandboxes::SandboxesConfig {
            enabled: true,
            warm: 0,
            ..Default::default()
        };
    })
    .await;
    let a = s.tenant("alpha").await;
    let (st, v) = a
        .post("/v1/sandboxes", json!({"runtime_class": "isolated"}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("--vm-kernel"), "{v}");
    let (st, v) = a
        .post("/v1/sandboxes", json!({"runtime_class": "nope"}))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "runtime_class", "{v}");
}

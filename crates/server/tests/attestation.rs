//! Node attestation on `tessera up --tpm` (a software TPM): the node registers and
//! measures itself, but is not attested until an operator approves its values; a job
//! whose tenant's rule requires attestation waits until then, saying why; an operator
//! cannot declare a node attested by writing its label; a tampered PCR makes the next
//! quote fail, the node loses the label and the job's task is evicted from it; a
//! restart with a changed configuration is refused, naming the measurement.

mod common;
use std::sync::Arc;

use common::{Client, Server, StatusCode, Value, json};
use tessera_node::attest::{Measurement, Tpm, tpm::Swtpm};
use tessera_sandbox::trust::TrustPolicy;

fn sleeper(name: &str) -> Value {
    json!({"name": name, "queue": "q", "tasks": [{
        "name": "t0", "command": ["sleep", "60"],
        "resources": {"cpu_milli": 100, "memory": 64 << 20},
    }]})
}

async fn attestation(c: &Client, node: &str) -> Value {
    let (st, v) = c.get(&format!("/v1/nodes/{node}/attestation")).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_attested_nodes_run_what_requires_attestation() {
    if !Swtpm::available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but swtpm/tpm2-tools are missing: .ci/run installs them"
        );
        eprintln!("SKIPPED: swtpm or tpm2-tools is not installed");
        return;
    }
    let run_tasks = common::can_run_tasks("only_attested_nodes_run_what_requires_attestation");
    let sw = Swtpm::start().unwrap();
    let files = tempfile::tempdir().unwrap();
    std::fs::write(
        files.path().join("trust.yaml"),
        "rules:\n  - name: secure-attested\n    tenants: [secure]\n    require_attested: true\n",
    )
    .unwrap();
    let policy = Arc::new(TrustPolicy::load(&files.path().join("trust.yaml")).unwrap());
    let reg = files.path().join("templates");
    tessera_sandbox::TemplateRegistry::open(&reg).unwrap();
    let tcti = sw.tcti();
    let config = |c: &mut tessera_server::ServerConfig| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.agents.host.pool_min = 0;
        c.templates = Some(reg.clone());
        c.trust = Some(policy.clone());
        c.node.tpm = Some(tcti.clone());
    };
    let s = Server::start_with(config).await;
    let node = tessera_server::node::local_name();

    // Registered (credential activation passed) and measured, not yet approved.
    let a = attestation(&s.admin, &node).await;
    assert_eq!(a["registered"], true, "{a}");
    assert_eq!(a["attested"], false, "{a}");
    assert!(
        a["reason"].as_str().unwrap().contains("tessera node trust"),
        "{a}"
    );
    let names: Vec<&str> = a["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    for n in ["tessera-binary", "seccomp-policy", "node-config"] {
        assert!(names.contains(&n), "{n}: {a}");
    }

    let secure = s.tenant("secure").await;
    let (st, v) = secure.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = secure.post("/v1/jobs", sleeper("j")).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(
        v["spec"]["tasks"][0]["node_selector"]["attested.tessera.io"], "true",
        "{v}"
    );
    let v = secure
        .wait_for("/v1/jobs/j", |v| {
            v.to_string().contains("not attested (no label")
        })
        .await;
    assert_eq!(v["status"]["phase"], "pending", "{v}");

    // A tenant cannot approve; an operator writing the label by hand changes nothing.
    let (st, _) = secure
        .post_empty(&format!("/v1/nodes/{node}/attestation/trust"))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (_, mut n) = s.admin.get(&format!("/v1/nodes/{node}")).await;
    n["labels"]["attested.tessera.io"] = json!("true");
    let body = json!({
        "name": n["name"], "labels": n["labels"], "taints": n["taints"],
        "allocatable": n["allocatable"], "gpus": n["gpus"],
    });
    let (st, v) = s.admin.put(&format!("/v1/nodes/{node}"), body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, n) = s.admin.get(&format!("/v1/nodes/{node}")).await;
    assert!(n["labels"].get("attested.tessera.io").is_none(), "{n}");

    // Approved: attested, labelled, and the job runs.
    let (st, a) = s
        .admin
        .post_empty(&format!("/v1/nodes/{node}/attestation/trust"))
        .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["attested"], true, "{a}");
    assert!(
        a["reason"].as_str().unwrap().contains("quote verified"),
        "{a}"
    );
    let (_, n) = s.admin.get(&format!("/v1/nodes/{node}")).await;
    assert_eq!(n["labels"]["attested.tessera.io"], "true", "{n}");
    if run_tasks {
        secure
            .wait_for("/v1/jobs/j", |v| {
                v["status"]["tasks"]["t0"]["state"] == "running"
            })
            .await;
    }

    // From inside a sandbox, another tenant's task cannot reach the TPM to tamper with
    // it: its network namespace has only its own loopback.
    if run_tasks {
        let port = tcti.rsplit('=').next().unwrap();
        let other = s.tenant("other").await;
        let (st, v) = other.post("/v1/queues", json!({"name": "q"})).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        // (Python's socket, not the shell's /dev/tcp, which the guard refuses
        // before the wall is reached.)
        let probe = format!(
            "import socket\nprint('tried', flush=True)\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n    print('reached-the-tpm')\nexcept OSError as e:\n    print('refused', e)\n"
        );
        let job = json!({"name": "probe", "queue": "q", "tasks": [{
            "name": "t0", "command": ["python3", "-c", probe],
            "resources": {"cpu_milli": 100, "memory": 64 << 20},
        }]});
        let (st, v) = other.post("/v1/jobs", job).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        other
            .wait_for("/v1/jobs/probe", |v| v["status"]["phase"] == "succeeded")
            .await;
        let r = other
            .request(common::Method::GET, "/v1/jobs/probe/logs")
            .send()
            .await
            .unwrap();
        let log = r.text().await.unwrap();
        assert!(log.contains("tried") && log.contains("refused"), "{log}");
        assert!(!log.contains("reached-the-tpm"), "{log}");
    }

    // Someone extends the measurement PCR behind the node's back: the next quote does
    // not replay, the node loses its label, the task is evicted from it.
    let intruder = tempfile::tempdir().unwrap();
    Tpm::open(&sw.tcti(), intruder.path())
        .unwrap()
        .extend(&Measurement::of("rootkit", b"evil"))
        .unwrap();
    let (st, a) = s
        .admin
        .post_empty(&format!("/v1/nodes/{node}/attestation/check"))
        .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["attested"], false, "{a}");
    assert!(
        a["reason"].as_str().unwrap().contains("does not replay"),
        "{a}"
    );
    let (_, n) = s.admin.get(&format!("/v1/nodes/{node}")).await;
    assert!(n["labels"].get("attested.tessera.io").is_none(), "{n}");
    if run_tasks {
        let v = secure
            .wait_for("/v1/jobs/j", |v| {
                let t = &v["status"]["tasks"]["t0"];
                t["evictions"].as_u64().unwrap_or(0) >= 1
                    && v.to_string().contains("not attested (no label")
            })
            .await;
        assert!(v.to_string().contains("lost its attestation"), "{v}");
    }
    let key = s.admin.key().to_string();
    let dir = s.stop().await;

    // A restart with another configuration measures afresh: refused, by name.
    let store = tessera_server::SqliteStore::open(dir.path().join("data")).unwrap();
    let running = tessera_server::start(store.into(), {
        let mut c = common::test_config(dir.path());
        config(&mut c);
        c.classes
            .classes
            .insert("fast", tessera_sandbox::TierKind::Namespace)
            .unwrap();
        c
    })
    .await
    .unwrap();
    let admin = common::Client::new(&format!("http://{}", running.addr), Some(&key));
    let a = attestation(&admin, &node).await;
    assert_eq!(a["attested"], false, "{a}");
    let why = a["reason"].as_str().unwrap();
    assert!(
        why.contains("node-config") && why.contains("approved value"),
        "{a}"
    );
    running.shutdown().await;
}

//! The trust policy on `tessera up`: a tenant whose rule requires signed templates
//! cannot submit a job, create an agent runtime or make a sandbox from an unsigned
//! template (or from `host`); once signed by the key the rule names, it can; another
//! tenant, outside the rule, is not affected; a job's template name is pinned to its
//! digest when it is admitted.

mod common;
use std::sync::Arc;

use common::{Client, Server, StatusCode, Value, json};
use tessera_sandbox::TemplateRegistry;
use tessera_sandbox::trust::{KeyKind, SigningKey, TrustPolicy, generate_key};

fn tree(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::write(dir.join("bin/sh"), b"#!/bin/true\n").unwrap();
    std::fs::set_permissions(dir.join("bin/sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn task_job(name: &str, template: &str) -> Value {
    json!({"name": name, "queue": "q", "tasks": [{
        "name": "t0", "command": ["true"], "template": template,
        "resources": {"cpu_milli": 100, "memory": 1000},
    }]})
}

async fn queue(t: &Client) {
    let (st, v) = t.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

fn detail(v: &Value) -> &str {
    v["detail"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_admitted_by_the_trust_policy() {
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = generate_key(KeyKind::P256).unwrap();
    std::fs::write(keys.path().join("release.pub"), &public).unwrap();
    std::fs::write(
        keys.path().join("trust.yaml"),
        "signers:\n  release: {key: release.pub}\n\
         rules:\n  - name: acme-signed\n    tenants: [acme]\n    require_signed: true\n",
    )
    .unwrap();
    let policy = Arc::new(TrustPolicy::load(&keys.path().join("trust.yaml")).unwrap());
    let reg_dir = keys.path().join("templates");
    let reg = TemplateRegistry::open(&reg_dir).unwrap();
    let src = keys.path().join("src");
    tree(&src);
    let rec = reg.import_dir("tools", &src).unwrap();

    let s = Server::start_with(|c| {
        c.register_local_node = false;
        c.agents.host.pool_min = 0;
        c.templates = Some(reg_dir.clone());
        c.trust = Some(policy.clone());
    })
    .await;
    let acme = s.tenant("acme").await;
    let beta = s.tenant("beta").await;
    queue(&acme).await;
    queue(&beta).await;

    // Unsigned: refused at submit, naming the field, the template, its digest and the rule.
    let (st, v) = acme.post("/v1/jobs", task_job("j1", "tools")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "tasks[0].template", "{v}");
    for needle in ["\"tools\"", &rec.digest, "\"acme-signed\"", "not signed"] {
        assert!(detail(&v).contains(needle), "{needle}: {v}");
    }
    // The built-in host template cannot be signed.
    let (st, v) = acme.post("/v1/jobs", task_job("j2", "host")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(detail(&v).contains("cannot be signed"), "{v}");
    // Agent runtimes are admitted by the same policy.
    let runtime = json!({"name": "r", "command": ["true"], "template": "tools"});
    let (st, v) = acme.post("/v1/runtimes", runtime.clone()).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(detail(&v).contains("acme-signed"), "{v}");

    // Another tenant is outside the rule; its job's template is pinned to the digest.
    let (st, v) = beta.post("/v1/jobs", task_job("j1", "tools")).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (_, j) = beta.get("/v1/jobs/j1").await;
    let pinned = format!("tools@{}", rec.digest);
    assert_eq!(j["spec"]["tasks"][0]["template"], pinned.as_str(), "{j}");
    // The built-in template has no digest: it is stored as it was named.
    let (st, v) = beta.post("/v1/jobs", task_job("j2", "host")).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (_, j) = beta.get("/v1/jobs/j2").await;
    assert_eq!(j["spec"]["tasks"][0]["template"], "host", "{j}");

    // Signed by the key the rule names: admitted.
    let key = SigningKey::from_pem(&private).unwrap();
    reg.sign("tools", &key).unwrap();
    let (st, v) = acme.post("/v1/jobs", task_job("j1", "tools")).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = acme.post("/v1/runtimes", runtime).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");

    // Signed by another key: a changed tree under the same name is refused again.
    std::fs::write(src.join("bin/extra"), b"x").unwrap();
    let changed = reg.import_dir("tools", &src).unwrap();
    let (other, _) = generate_key(KeyKind::Ed25519).unwrap();
    reg.sign("tools", &SigningKey::from_pem(&other).unwrap())
        .unwrap();
    let (st, v) = acme.post("/v1/jobs", task_job("j3", "tools")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(detail(&v).contains(&changed.digest), "{v}");
    assert!(detail(&v).contains("no attached signature verifies"), "{v}");
    // The signed digest, pinned, is still admitted: it names the signed content.
    let (st, v) = acme.post("/v1/jobs", task_job("j4", &pinned)).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (_, j) = acme.get("/v1/jobs/j4").await;
    assert_eq!(j["spec"]["tasks"][0]["template"], pinned.as_str(), "{j}");
}

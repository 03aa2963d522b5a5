//! Model weights: the key service releases a data key only to an attested node
//! (a fresh TPM quote over the service's nonce and the node's ephemeral key), for a
//! task bound to that node, of a tenant that owns or was granted the weights, in a
//! class their policy allows, after a matching device view; each refusal names the
//! link that broke and is audited. Then end to end on `tessera up --tpm`: the task
//! reads its weights, read-only, from memory; another tenant's task on the same node
//! cannot find them; nothing decrypted is on the disk.

mod common;

use std::convert::Infallible;

use common::{Server, StatusCode, Value, json};
use tessera_node::attest::{Measurement, Reference, Tpm, tpm::Swtpm};
use tessera_node::weights::{Release, ReleaseRequest, WeightsMount, context, format, wrap};
use tessera_server::plane::Caller;
use tessera_server::weights::KeyService;
use tessera_store::{AnyStore, Key, Store};

fn swtpm_or_skip(test: &str) -> bool {
    if Swtpm::available() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: CI is set but swtpm/tpm2-tools are missing: .ci/run installs them"
    );
    eprintln!("SKIPPED {test}: swtpm or tpm2-tools is not installed");
    false
}

fn caller(tenant: &str, role: &str) -> Caller {
    Caller {
        tenant: tenant.into(),
        subject: format!("user:{tenant}"),
        key_id: "k".into(),
        role: serde_json::from_value(json!(role)).expect("a role"),
    }
}

async fn put(svc: &KeyService, c: &Caller, name: &str, classes: &[&str], data: &[u8]) -> Value {
    // Three frames, to stream across chunk edges.
    let third = data.len() / 3;
    let frames: Vec<Result<axum::body::Bytes, Infallible>> = vec![
        Ok(data[..third].to_vec().into()),
        Ok(data[third..2 * third].to_vec().into()),
        Ok(data[2 * third..].to_vec().into()),
    ];
    svc.put(
        c,
        name,
        Some("model.bin"),
        classes.iter().map(|s| s.to_string()).collect(),
        futures_util::stream::iter(frames),
    )
    .await
    .unwrap()
}

async fn set(store: &AnyStore, key: Key, body: Value) {
    match store.get(&key).await.unwrap() {
        Some(o) => store.update(key, Some(o.version), body).await.unwrap(),
        None => store.create(key, body).await.unwrap(),
    };
}

fn job(tenant: &str, weights: &[&str], class: &str, node: &str, gpus: &[u32]) -> (Key, Value) {
    let body = json!({
        "spec": {"name": "j", "queue": "q", "tasks": [{
            "name": "t0", "command": ["true"], "weights": weights, "runtime_class": class,
        }]},
        "status": {"phase": "running", "tasks": {"t0": {"node": node, "gpus": gpus}}},
        "created_at": 0,
    });
    (Key::new("job", tenant, "j"), body)
}

/// A node's request, made as the node runtime makes it: the service's nonce, a fresh
/// ephemeral key, the TPM's quote over both.
fn request(
    svc: &KeyService,
    tpm: &Tpm,
    tenant: &str,
    weights: &str,
    gpus: &[u32],
) -> (ReleaseRequest, wrap::Recipient, [u8; 32]) {
    let nonce = svc.nonce();
    let me = wrap::Recipient::generate();
    let b = wrap::binding(&nonce, me.public());
    let evidence = tpm.quote(&b).unwrap();
    let view = gpus
        .iter()
        .map(|i| tessera_node::fence::SeenDevice {
            index: *i,
            uuid: format!("GPU-{i}"),
            bus_id: String::new(),
            node: format!("/dev/nvidia{i}"),
            mig_uuid: None,
        })
        .collect();
    let req = ReleaseRequest {
        node: "n1".into(),
        task: tessera_node::TaskKey::new(tenant, "j", "t0", 0),
        weights: weights.into(),
        nonce: tessera_node::attest::hex(&nonce),
        recipient: tessera_node::attest::hex(me.public()),
        evidence,
        view,
    };
    (req, me, b)
}

fn opened(rel: &Release, me: &wrap::Recipient, b: &[u8; 32], weights: &str) -> Vec<u8> {
    let key = me.open(&rel.envelope, &context(b, weights)).unwrap();
    let mut out = Vec::new();
    format::open(&key, std::fs::File::open(&rel.blob).unwrap(), |p| {
        out.extend_from_slice(p);
        Ok(())
    })
    .unwrap();
    out
}

async fn refused(svc: &KeyService, req: &ReleaseRequest, why: &str) {
    match svc.release(req).await {
        Ok(_) => panic!("released, though {why}"),
        Err(e) => assert!(
            e.contains(why),
            "refused for another reason: {e} (wanted {why})"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_service_releases_only_when_every_link_holds() {
    if !swtpm_or_skip("the_key_service_releases_only_when_every_link_holds") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store: AnyStore = tessera_server::SqliteStore::open(dir.path().join("db"))
        .unwrap()
        .into();
    let svc = KeyService::open(store.clone(), dir.path()).unwrap();
    let acme = caller("acme", "admin");
    let data: Vec<u8> = (0..(3 << 20) + 77).map(|i| (i * 7 % 251) as u8).collect();
    let marker = b"TESSERA-PLAINTEXT-MARKER-0123456789";
    let mut data = data;
    data[1000..1000 + marker.len()].copy_from_slice(marker);
    let v = put(&svc, &acme, "llama", &[], &data).await;
    assert_eq!(v["bytes"], data.len() as u64, "{v}");
    assert!(
        v.get("wrapped_key").is_none(),
        "the wrapped key never leaves: {v}"
    );
    put(&svc, &acme, "classy", &["secure"], b"classified weights").await;

    // At rest: sealed, no plaintext; the KEK is the owner's alone (0600).
    let sealed: Vec<_> = std::fs::read_dir(dir.path().join("weights/acme"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("llama."))
        .collect();
    assert_eq!(sealed.len(), 1, "one sealed file: {sealed:?}");
    let blob = std::fs::read(sealed[0].path()).unwrap();
    assert!(!blob.windows(marker.len()).any(|w| w == marker));
    use std::os::unix::fs::PermissionsExt;
    let kek = std::fs::metadata(dir.path().join("keys/weights.kek")).unwrap();
    assert_eq!(kek.permissions().mode() & 0o777, 0o600);

    // An attested node n1 (a software TPM, its values approved).
    let sw = Swtpm::start().unwrap();
    let tdir = tempfile::tempdir().unwrap();
    let tpm = Tpm::open(&sw.tcti(), tdir.path()).unwrap();
    let id = tpm.identity().unwrap();
    tpm.measure(&[Measurement::of("tessera-binary", b"v1")])
        .unwrap();
    let e = tpm.quote(b"approval").unwrap();
    let reference = Reference::approving(&id.ak_public, &e);
    let att = |attested: bool| {
        json!({"node": "n1", "tcti": sw.tcti(), "software_tpm": true, "identity": id,
               "registered": true, "reference": reference, "attested": attested,
               "reason": "test", "checked_ms": 0})
    };
    set(&store, Key::new("attestation", "", "n1"), att(true)).await;
    let node = json!({"name": "n1", "allocatable": {"cpu_milli": 8000, "memory": 1u64 << 34},
        "gpus": [{"index": 0, "model": "H100", "memory": 1}, {"index": 1, "model": "H100", "memory": 1}]});
    set(&store, Key::new("node", "", "n1"), node.clone()).await;
    let (k, j) = job("acme", &["llama", "classy"], "standard", "n1", &[0]);
    set(&store, k, j).await;

    // Every link holds: released, and the envelope opens only with the node's key.
    let (req, me, b) = request(&svc, &tpm, "acme", "llama", &[0]);
    let rel = svc.release(&req).await.unwrap();
    assert_eq!(opened(&rel, &me, &b, "llama"), data);
    assert!(
        wrap::Recipient::generate()
            .open(&rel.envelope, &context(&b, "llama"))
            .is_err(),
        "another key opens the envelope"
    );

    // A replayed request (its nonce was used) is refused.
    refused(&svc, &req, "nonce").await;
    // A nonce this service never issued.
    let (mut req2, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    req2.nonce = tessera_node::attest::hex(&[7u8; 32]);
    refused(&svc, &req2, "nonce").await;
    // A quote that binds another key than the one the envelope would go to (a
    // man in the middle swapping the recipient).
    let (mut req3, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    req3.recipient = tessera_node::attest::hex(wrap::Recipient::generate().public());
    refused(&svc, &req3, "does not verify").await;
    // The weights' class policy: `classy` runs only in class `secure`.
    let (req4, _, _) = request(&svc, &tpm, "acme", "classy", &[0]);
    refused(&svc, &req4, "runtime class secure").await;
    // Weights the task never named.
    let (mut req5, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    req5.weights = "other".into();
    refused(&svc, &req5, "does not name").await;
    // A device view that is not the binding's.
    let (req6, _, _) = request(&svc, &tpm, "acme", "llama", &[1]);
    refused(&svc, &req6, "device view mismatch").await;
    let mut tainted = node.clone();
    tainted["taints"] =
        json!([{"key": "tessera.io/device-view-mismatch", "value": "", "effect": "NoSchedule"}]);
    set(&store, Key::new("node", "", "n1"), tainted).await;
    let (req7, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    refused(&svc, &req7, "device-view mismatch taint").await;
    set(&store, Key::new("node", "", "n1"), node.clone()).await;
    // Another node than the task's.
    let (mut req8, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    req8.node = "n2".into();
    refused(&svc, &req8, "not bound to node n2").await;

    // Another tenant's task: refused until granted, released after.
    let (k, j) = job("beta", &["acme/llama"], "standard", "n1", &[0]);
    set(&store, k, j).await;
    let (req9, _, _) = request(&svc, &tpm, "beta", "acme/llama", &[0]);
    refused(&svc, &req9, "tenant beta was not granted").await;
    let g = svc.grant(&acme, "llama", "beta", false).await;
    assert!(g.is_err(), "no tenant beta yet: {g:?}");
    set(
        &store,
        Key::new("tenant", "", "beta"),
        json!({"name": "beta"}),
    )
    .await;
    svc.grant(&acme, "llama", "beta", false).await.unwrap();
    let (req10, me10, b10) = request(&svc, &tpm, "beta", "acme/llama", &[0]);
    let rel = svc.release(&req10).await.unwrap();
    assert_eq!(opened(&rel, &me10, &b10, "acme/llama"), data);
    assert!(
        svc.grant(&caller("beta", "admin"), "llama", "acme", false)
            .await
            .is_err(),
        "beta cannot re-grant acme's weights"
    );

    // The node is no longer attested: refused.
    set(&store, Key::new("attestation", "", "n1"), att(false)).await;
    let (req11, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    refused(&svc, &req11, "not attested").await;
    // Attested on record, but what it runs changed since approval: its fresh quote
    // does not match the approved values.
    set(&store, Key::new("attestation", "", "n1"), att(true)).await;
    tpm.extend(&Measurement::of("rootkit", b"evil")).unwrap();
    let (req12, _, _) = request(&svc, &tpm, "acme", "llama", &[0]);
    refused(&svc, &req12, "does not verify").await;

    // Every release and refusal is in the owner's audit log; beta's own are in its.
    let audit = |t: &str| {
        let store = store.clone();
        let t = t.to_string();
        async move {
            store
                .list("audit", Some(&t))
                .await
                .unwrap()
                .objects
                .into_iter()
                .map(|o| o.body)
                .collect::<Vec<Value>>()
        }
    };
    let a = audit("acme").await;
    let count = |a: &[Value], action: &str| a.iter().filter(|e| e["action"] == action).count();
    assert_eq!(count(&a, "weights.release"), 2, "{a:?}");
    assert_eq!(count(&a, "weights.refuse"), 11, "{a:?}");
    assert!(a.iter().any(|e| {
        e["subject"] == "node:n1"
            && e["object"]
                .as_str()
                .unwrap()
                .contains("device view mismatch")
    }));
    let b = audit("beta").await;
    assert_eq!(count(&b, "weights.release"), 1, "{b:?}");
    assert_eq!(count(&b, "weights.refuse"), 1, "{b:?}");
    assert_eq!(WeightsMount::new("acme/llama").path, "/weights/llama");
}

fn probe_job(name: &str, weights: &[&str], cmd: &str) -> Value {
    json!({"name": name, "queue": "q", "tasks": [{
        "name": "t0", "command": ["sh", "-c", cmd], "weights": weights,
        "resources": {"cpu_milli": 100, "memory": 256 << 20},
    }]})
}

async fn log(c: &common::Client, job: &str) -> String {
    c.request(common::Method::GET, &format!("/v1/jobs/{job}/logs"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_reach_their_task_only_in_memory_and_read_only() {
    if !swtpm_or_skip("weights_reach_their_task_only_in_memory_and_read_only") {
        return;
    }
    let sw = Swtpm::start().unwrap();
    let tcti = sw.tcti();
    let s = Server::start_with(|c| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.agents.host.pool_min = 0;
        c.node.tpm = Some(tcti.clone());
        c.classes
            .classes
            .insert("secure", tessera_sandbox::TierKind::Namespace)
            .unwrap();
    })
    .await;
    let node = tessera_server::node::local_name();
    let acme = s.tenant("acme").await;
    let (st, v) = acme.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let marker = "TESSERA-WEIGHTS-MARKER-7d1c";
    let mut data = format!("{marker}\n").repeat(40_000).into_bytes();
    data.extend_from_slice(b"end\n");
    let sha = tessera_node::attest::Measurement::of("w", &data).digest;
    let r = acme
        .request(common::Method::PUT, "/v1/weights/llama?file=model.bin")
        .header("content-type", "application/octet-stream")
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["sha256"], sha, "{v}");
    let r = acme
        .request(common::Method::PUT, "/v1/weights/classy?class=secure")
        .body(b"secret".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let (_, l) = acme.get("/v1/weights").await;
    assert_eq!(l["items"].as_array().unwrap().len(), 2, "{l}");

    // Refused at submit, each naming the rule: a class the policy does not allow,
    // weights that do not exist, another tenant's weights not granted.
    let (st, v) = acme
        .post("/v1/jobs", probe_job("bad-class", &["classy"], "true"))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("runtime class secure"), "{v}");
    let (st, v) = acme
        .post("/v1/jobs", probe_job("none", &["nope"], "true"))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let beta = s.tenant("beta").await;
    let (st, v) = beta.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = beta
        .post("/v1/jobs", probe_job("steal", &["acme/llama"], "true"))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("not granted"), "{v}");

    // Not attested yet (no approved values): the task waits, saying why.
    let hex = sha.trim_start_matches("sha256:").to_string();
    let reader = format!(
        "[ \"$(sha256sum /weights/llama/model.bin | cut -d' ' -f1)\" = {hex} ] && echo sha-ok; \
        (echo x > /weights/llama/model.bin) 2>/dev/null || echo write-refused; \
        (touch /weights/llama/new) 2>/dev/null || echo create-refused; \
        grep ' /weights/llama ' /proc/self/mountinfo; echo reader-ready; sleep 30"
    );
    let (st, v) = acme
        .post("/v1/jobs", probe_job("reader", &["llama"], &reader))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(
        v["spec"]["tasks"][0]["node_selector"]["attested.tessera.io"], "true",
        "{v}"
    );
    acme.wait_for("/v1/jobs/reader", |v| {
        v.to_string().contains("not attested (no label")
    })
    .await;
    if !common::can_run_tasks("weights_reach_their_task_only_in_memory_and_read_only") {
        return;
    }
    let (st, a) = s
        .admin
        .post_empty(&format!("/v1/nodes/{node}/attestation/trust"))
        .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["attested"], true, "{a}");
    acme.wait_for_within("/v1/jobs/reader", std::time::Duration::from_secs(60), |v| {
        v["status"]["tasks"]["t0"]["state"] == "running"
    })
    .await;
    let mut l = String::new();
    for _ in 0..200 {
        l = log(&acme, "reader").await;
        if l.contains("reader-ready") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(l.contains("sha-ok"), "the task reads its weights: {l}");
    assert!(
        l.contains("write-refused") && l.contains("create-refused"),
        "{l}"
    );
    assert!(
        l.contains("ramfs") && l.contains(" ro,"),
        "memory-backed, read-only: {l}"
    );

    // Another tenant's task on the same node, meanwhile: no such folder, and no way
    // to another sandbox's root through /proc.
    let thief = "ls /weights 2>&1; cat /weights/llama/model.bin 2>&1 | head -c 100; \
        for p in /proc/[0-9]*; do cat $p/root/weights/llama/model.bin 2>/dev/null; done; \
        echo thief-done";
    let (st, v) = beta.post("/v1/jobs", probe_job("thief", &[], thief)).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    beta.wait_for_within("/v1/jobs/thief", std::time::Duration::from_secs(120), |v| {
        v["status"]["phase"] == "succeeded"
    })
    .await;
    let t = log(&beta, "thief").await;
    assert!(t.contains("thief-done"), "{t}");
    assert!(!t.contains(marker), "another tenant read the weights: {t}");

    // The host's disk: the sealed file and nothing else of it.
    let mut found = Vec::new();
    let mut stack = vec![s.dir()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .is_ok_and(|b| b.windows(marker.len()).any(|w| w == marker.as_bytes()))
            {
                found.push(p);
            }
        }
    }
    assert!(found.is_empty(), "plaintext on disk: {found:?}");
    let (_, audit) = acme.get("/v1/audit").await;
    assert!(
        audit.to_string().contains("weights.release"),
        "the release is audited: {audit}"
    );
}

//! API sandboxes placed by the agent scheduler on the local node, within the
//! capacity the node gives sandboxes: each placement is recorded on the sandbox
//! (`node`), a sandbox that no longer fits is refused with the reason (the node's
//! free capacity against the ask), and killing one gives its capacity back.

mod common;

use common::{Server, StatusCode, json};
use tessera_sandbox::InitProgram;
use tessera_server::sandboxes::SandboxesConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_are_placed_within_the_node_and_refused_when_it_is_full() {
    if !common::can_run_tasks("sandboxes_are_placed_within_the_node_and_refused_when_it_is_full") {
        return;
    }
    let init = InitProgram::locate().expect("init");
    let s = Server::start_with(|c| {
        c.sandboxes = SandboxesConfig {
            enabled: true,
            init: Some(init),
            warm: 0,
            max_per_tenant: 8,
        };
        // Room for two sandboxes of 64 MiB and 500m.
        c.node.sandbox_capacity = Some(tessera_server::placement::capacity(1000, 160 << 20));
    })
    .await;
    let a = s.tenant("alpha").await;
    let body = json!({"memory_mb": 64, "cpus": 0.5, "timeout": 60});
    let mut ids = Vec::new();
    let mut node = String::new();
    for _ in 0..2 {
        let (st, v) = a.post("/v1/sandboxes", body.clone()).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        node = v["node"]
            .as_str()
            .expect("the placement is recorded")
            .to_string();
        ids.push(v["sandbox_id"].as_str().unwrap().to_string());
    }
    let (st, v) = a.post("/v1/sandboxes", body.clone()).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    let text = v.to_string();
    assert!(
        text.contains("no node has room for this sandbox (500m CPU, 64 MiB)")
            && text.contains(&format!(
                "node {node} has 0m CPU and 32 MiB free of 1000m and 160 MiB"
            )),
        "{text}"
    );
    // Killing one gives its room back.
    let (st, v) = a.delete(&format!("/v1/sandboxes/{}", ids[0])).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = a.post("/v1/sandboxes", body).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["node"], node.as_str());
}

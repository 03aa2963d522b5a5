//! Simulated nodes (`tessera up --cluster`): registered with a label, and tasks
//! bound there run in simulated time — a task with a duration succeeds after
//! `duration / speedup`, one without holds its resources until cancelled.

mod common;

use common::{Server, StatusCode, code, job, json};
use tessera_model::{Node, Resources};
use tessera_server::Simulated;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_simulated_nodes_run_in_simulated_time() {
    let nodes = (0..3)
        .map(|i| Node::new(format!("sim-{i}"), Resources::new(64_000, 1 << 40)))
        .collect();
    let s = Server::start_with(|c| {
        c.register_local_node = false;
        c.simulated = Some(Simulated {
            nodes,
            // An hour of simulated time is 3.6 ms.
            speedup: 1_000_000.0,
        });
    })
    .await;
    let (_, v) = s.admin.get("/v1/nodes").await;
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{v}");
    assert!(
        items
            .iter()
            .all(|n| n["labels"]["tessera.io/simulated"] == "true")
    );

    let a = s.tenant("alpha").await;
    a.post("/v1/queues", json!({"name": "q"})).await;
    let mut timed = job("timed", 2);
    timed["tasks"][0]["duration"] = json!(3600);
    timed["tasks"][1]["duration"] = json!(1800.5);
    let (st, v) = a.post("/v1/jobs", timed).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let v = a
        .wait_for("/v1/jobs/timed", |v| v["status"]["phase"] == "succeeded")
        .await;
    assert_eq!(v["status"]["tasks"]["t0"]["node"], "sim-0");
    assert_eq!(v["status"]["tasks"]["t0"]["exit_code"], 0);
    assert!(
        v["status"]["tasks"]["t0"]["message"]
            .as_str()
            .unwrap()
            .contains("simulated: ran 3600 s"),
        "{v}"
    );

    // Without a duration, a task holds its node until the job is cancelled.
    let (st, _) = a.post("/v1/jobs", job("forever", 1)).await;
    assert_eq!(st, StatusCode::CREATED);
    let v = a
        .wait_for("/v1/jobs/forever", |v| v["status"]["phase"] == "running")
        .await;
    assert!(v["status"]["tasks"]["t0"].get("state").is_none(), "{v}");
    let (st, v) = a.post_empty("/v1/jobs/forever/cancel").await;
    assert_eq!(
        (st, v["status"]["phase"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );

    // A negative or infinite duration is refused with the field named.
    let mut bad = job("bad", 1);
    bad["tasks"][0]["duration"] = json!(-1);
    let (st, v) = a.post("/v1/jobs", bad).await;
    assert_eq!((st, code(&v)), (StatusCode::BAD_REQUEST, "invalid_request"));
    assert_eq!(v["field"], "tasks[0].duration");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_list_says_how_many_gpus_are_free_and_allocated() {
    let s = Server::start_with(|c| common::simulated_cluster(c, vec![common::h100_node("gpu-0")]))
        .await;
    let a = s.tenant("alpha").await;
    a.post("/v1/queues", json!({"name": "q"})).await;
    let mut j = job("two", 1);
    j["tasks"][0]["gpu"] = json!(2);
    let (st, v) = a.post("/v1/jobs", j).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    a.wait_for("/v1/jobs/two", |v| v["status"]["phase"] == "running")
        .await;
    let v = s
        .admin
        .wait_for("/v1/nodes/gpu-0", |v| v["gpu_use"]["free"] == 2)
        .await;
    assert_eq!(
        v["gpu_use"],
        json!({"total": 4, "free": 2, "allocated_milli": 2000}),
        "{v}"
    );
    let (_, l) = s.admin.get("/v1/nodes").await;
    assert_eq!(l["items"][0]["gpu_use"]["free"], 2, "{l}");
}

//! Change-log compaction seen from the API: a watch from a compacted revision is
//! 410 with code `compacted` (list again), and the scheduler loop and the
//! executor, which follow the change log themselves, keep working while the log
//! is compacted under them.

mod common;

use std::time::Duration;

use common::{Server, StatusCode, code, job, json};
use tessera_server::Compaction;
use tessera_store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_behind_compaction_get_410_and_the_loops_keep_up() {
    // Keep nothing: the log is compacted to the latest revision every 20 ms.
    let s = Server::start_with(|c| {
        c.compaction = Compaction {
            keep: 0,
            every: Duration::from_millis(20),
        }
    })
    .await;
    let a = s.tenant("alpha").await;
    let (st, _) = a.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED);
    let store = s.running.plane.store().clone();
    let mut compacted = 0;
    for _ in 0..500 {
        compacted = store.compacted().await.unwrap();
        if compacted > 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(compacted > 2, "the compaction loop ran");

    let (st, v) = a.get("/v1/watch?kind=job&after=1").await;
    assert_eq!((st, code(&v)), (StatusCode::GONE, "compacted"), "{v}");
    assert_eq!(v["field"], "after");
    assert!(v["detail"].as_str().unwrap().contains("list"), "{v}");
    // From a listing's revision the watch works.
    let (st, _) = a.get("/v1/jobs").await;
    assert_eq!(st, StatusCode::OK);
    let rev = store.revision().await.unwrap();
    let resp = a
        .request(
            reqwest::Method::GET,
            &format!("/v1/watch?kind=job&after={rev}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    drop(resp);

    // The scheduler binds and the executor runs, although every change they
    // follow is compacted away within milliseconds.
    if !common::can_run_tasks(
        "watches_behind_compaction_get_410_and_the_loops_keep_up (executor part)",
    ) {
        return;
    }
    for i in 0..3 {
        let mut j = job(&format!("j{i}"), 2);
        for t in j["tasks"].as_array_mut().unwrap() {
            t["command"] = json!(["true"]);
        }
        let (st, v) = a.post("/v1/jobs", j).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    for i in 0..3 {
        a.wait_for(&format!("/v1/jobs/j{i}"), |v| {
            v["status"]["phase"] == "succeeded"
        })
        .await;
    }
}

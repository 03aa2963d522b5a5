//! The operator's caps on a tenant's top-level queues over HTTP
//! (`GET/PUT /v1/tenants/{name}/queue-caps`): set by the system tenant's
//! operators; a tenant's admin can read them but neither change them nor
//! create or replace queues past them.

mod common;

use common::{Server, StatusCode, code, json};

/// The reply holds the caps the operator set (weight 4, 8 GPUs).
fn is_caps(v: &common::Value) -> bool {
    v["caps"]["weight"] == 4 && v["caps"]["capability"]["gpu_milli"] == 8000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_cap_a_tenants_queues_and_its_admin_cannot_exceed_or_change_them() {
    let s = Server::start_with(|c| c.scheduler = None).await;
    let team = s.tenant("team").await;
    let other = s.tenant("other").await;
    let caps = json!({"weight": 4, "capability": {"gpu_milli": 8000}});

    // The tenant's admin may not set its own caps, nor another tenant's.
    let (st, v) = team.put("/v1/tenants/team/queue-caps", caps.clone()).await;
    assert_eq!((st, code(&v)), (StatusCode::FORBIDDEN, "forbidden"), "{v}");
    let (st, v) = other.put("/v1/tenants/team/queue-caps", caps.clone()).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");

    // Before the operator sets any: none.
    let (st, v) = team.get("/v1/tenants/team/queue-caps").await;
    assert_eq!((st, v["caps"].is_null()), (StatusCode::OK, true), "{v}");

    // The system tenant's admin (an operator and more) sets them.
    let (st, v) = s
        .admin
        .put("/v1/tenants/team/queue-caps", caps.clone())
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(is_caps(&v), "{v}");
    assert!(v["resource_version"].is_u64(), "{v}");

    // A system operator (not only the admin) may, too; a bad field is named.
    let op = s.admin.with_role("ops", "operator").await;
    let (st, v) = op
        .put("/v1/tenants/team/queue-caps", json!({"weigth": 4}))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = op.put("/v1/tenants/team/queue-caps", caps.clone()).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // No such tenant: 404.
    let (st, v) = op.put("/v1/tenants/nobody/queue-caps", caps.clone()).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "{v}");

    // The tenant reads its own caps; another tenant may not read them.
    let (st, v) = team.get("/v1/tenants/team/queue-caps").await;
    assert_eq!((st, is_caps(&v)), (StatusCode::OK, true), "{v}");
    let (st, _) = other.get("/v1/tenants/team/queue-caps").await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    // The tenant's admin cannot exceed them: 6 + 4 GPUs of capability > 8,
    // weight 3 + 2 > 4, and a top-level queue with no capability is unbounded.
    let (st, v) = team
        .post(
            "/v1/queues",
            json!({"name": "a", "weight": 2, "capability": {"gpu_milli": 6000}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    for (q, what) in [
        (
            json!({"name": "b", "weight": 1, "capability": {"gpu_milli": 4000}}),
            "capability",
        ),
        (
            json!({"name": "b", "weight": 3, "capability": {"gpu_milli": 1000}}),
            "weight",
        ),
        (json!({"name": "b", "weight": 1}), "capability"),
    ] {
        let (st, v) = team.post("/v1/queues", q.clone()).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{q}: {v}");
        assert!(
            v["detail"].as_str().unwrap_or("").contains(what),
            "{q}: {v}"
        );
    }
    // Nor by replacing a queue it has.
    let (_, a) = team.get("/v1/queues/a").await;
    let (st, v) = team
        .put(
            "/v1/queues/a",
            json!({"name": "a", "weight": 2, "capability": {"gpu_milli": 9000},
                   "resource_version": a["resource_version"]}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    // Within the caps it may.
    let (st, v) = team
        .post(
            "/v1/queues",
            json!({"name": "b", "weight": 2, "capability": {"gpu_milli": 2000}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");

    // The caps still read what the operator set, and the route is documented.
    let (_, v) = team.get("/v1/tenants/team/queue-caps").await;
    assert!(is_caps(&v), "{v}");
    let (_, doc) = s.anonymous().get("/v1/openapi.json").await;
    assert!(
        doc["paths"]["/v1/tenants/{name}/queue-caps"]["put"].is_object(),
        "openapi lacks the route"
    );
    assert!(doc["components"]["schemas"]["QueueCaps"].is_object());
}

//! Users and service accounts as objects, tied to role bindings and API keys:
//! created explicitly or (users) by the first key or binding that names them;
//! reading one shows its role and keys without secrets; deleting one removes its
//! binding and revokes its keys; all scoped to the tenant.

mod common;

use common::{Server, StatusCode, code, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_service_accounts_carry_roles_and_keys() {
    let s = Server::start_with(|c| c.scheduler = None).await;
    let a = s.tenant("alpha").await;
    let b = s.tenant("beta").await;

    let (st, v) = a
        .post(
            "/v1/users",
            json!({"name": "alice@example.com", "display_name": "Alice", "role": "developer"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(
        (v["role"].as_str(), v["keys"].as_array().unwrap().len()),
        (Some("developer"), 0)
    );
    let alice = a.with_role("alice@example.com", "developer").await;
    let (_, v) = a.get("/v1/users/alice@example.com").await;
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{v}");
    assert!(
        keys[0].get("hash").is_none() && keys[0].get("salt").is_none(),
        "{v}"
    );
    assert!(!v.to_string().contains(&alice.key()[20..]));
    let (st, _) = a
        .post("/v1/users", json!({"name": "alice@example.com"}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT);

    // A key for a new subject makes it a user.
    let bob = a.with_role("bob", "viewer").await;
    let (_, v) = a.get("/v1/users").await;
    let names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["admin", "alice@example.com", "bob"], "{v}");
    assert_eq!(v["items"][2]["role"], "viewer");
    assert_eq!(v["items"][2]["created_by"], "implicit");

    // Service accounts must exist before a key names them.
    let (st, v) = a
        .post("/v1/apikeys", json!({"subject": "sa:ci", "role": "viewer"}))
        .await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("subject")),
        "{v}"
    );
    let (st, v) = a
        .post(
            "/v1/serviceaccounts",
            json!({"name": "ci", "description": "builds", "role": "developer"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["subject"], "sa:ci");
    let ci = s.client(&a.key_for("sa:ci", "developer").await);
    let (st, v) = ci.get("/v1/whoami").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (v["subject"].as_str(), v["role"].as_str()),
        (Some("sa:ci"), Some("developer"))
    );
    let (st, v) = a
        .post("/v1/serviceaccounts", json!({"name": "Not Valid"}))
        .await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("name"))
    );

    // Only admins manage them; viewers read.
    let (st, _) = bob.post("/v1/users", json!({"name": "mallory"})).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = alice.delete("/v1/serviceaccounts/ci").await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, v) = bob.get("/v1/serviceaccounts").await;
    assert_eq!(
        (st, v["items"][0]["name"].as_str()),
        (StatusCode::OK, Some("ci"))
    );

    // Another tenant sees none of it.
    let (_, v) = b.get("/v1/users").await;
    assert_eq!(
        v["items"].as_array().unwrap().len(),
        1,
        "only beta's admin: {v}"
    );
    for path in ["/v1/users/bob", "/v1/serviceaccounts/ci"] {
        let (st, v) = b.get(path).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::NOT_FOUND, "not_found"),
            "{path}"
        );
        let (st, _) = b.delete(path).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}");
    }

    // Deleting revokes every key and removes the binding, in one commit.
    let (st, v) = a.delete("/v1/serviceaccounts/ci").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["revoked_keys"].as_array().unwrap().len(), 1);
    let (st, _) = ci.get("/v1/whoami").await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = a.delete("/v1/users/alice@example.com").await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = alice.get("/v1/whoami").await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (_, v) = a.get("/v1/rolebindings").await;
    let subjects: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["admin", "bob"], "{v}");
    // An admin cannot delete itself.
    let (st, _) = a.delete("/v1/users/admin").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    // The audit log names the deletions.
    let (_, v) = a.get("/v1/audit").await;
    let text = v.to_string();
    assert!(
        text.contains("serviceaccount/ci") && text.contains("user/alice@example.com"),
        "{v}"
    );
}

//! Runtimes (immutable versions, endpoints, quotas, validation) and the
//! session store (memory, history, checkpoints, state index).

use serde_json::json;
use tessera_agent::runtimes::{self, Quotas, RuntimeSpec};
use tessera_agent::sessions::{self, Checkpoint, State};
use tessera_store::SqliteStore;

fn store() -> (tempfile::TempDir, SqliteStore) {
    let d = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(d.path()).unwrap();
    (d, s)
}

fn spec(cmd: &str) -> RuntimeSpec {
    serde_json::from_value(json!({"command": [cmd]})).unwrap()
}

#[tokio::test]
async fn versions_are_immutable_and_default_follows_latest() {
    let (_d, s) = store();
    let q = Quotas::default();
    runtimes::create(&s, "t", "bot", spec("v1"), q, 1)
        .await
        .unwrap();
    let e = runtimes::create(&s, "t", "bot", spec("v1"), q, 1)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    let v2 = runtimes::update(&s, "t", "bot", spec("v2"), q, 2)
        .await
        .unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(
        runtimes::get_version(&s, "t", "bot", 1)
            .await
            .unwrap()
            .spec
            .command,
        ["v1"]
    );
    runtimes::put_endpoint(&s, "t", "bot", "prod", 1)
        .await
        .unwrap();
    assert_eq!(
        runtimes::resolve(&s, "t", "bot", None)
            .await
            .unwrap()
            .version,
        2
    );
    assert_eq!(
        runtimes::resolve(&s, "t", "bot", Some("prod"))
            .await
            .unwrap()
            .version,
        1
    );
    runtimes::update(&s, "t", "bot", spec("v3"), q, 3)
        .await
        .unwrap();
    assert_eq!(
        runtimes::resolve(&s, "t", "bot", Some("DEFAULT"))
            .await
            .unwrap()
            .version,
        3
    );
    assert_eq!(
        runtimes::resolve(&s, "t", "bot", Some("prod"))
            .await
            .unwrap()
            .version,
        1
    );
    let e = runtimes::put_endpoint(&s, "t", "bot", "DEFAULT", 1)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("endpoint: DEFAULT always follows"),
        "{e}"
    );
    let e = runtimes::put_endpoint(&s, "t", "bot", "x", 9)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("version 9 of runtime \"bot\" not found"),
        "{e}"
    );
    assert_eq!(
        runtimes::list_endpoints(&s, "t", "bot")
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn quotas_give_clear_errors() {
    let (_d, s) = store();
    let q = Quotas {
        runtimes_per_tenant: 2,
        versions_per_runtime: 2,
    };
    runtimes::create(&s, "t", "a", spec("x"), q, 1)
        .await
        .unwrap();
    runtimes::create(&s, "t", "b", spec("x"), q, 1)
        .await
        .unwrap();
    let e = runtimes::create(&s, "t", "c", spec("x"), q, 1)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "quota exceeded: tenant \"t\" has 2 runtimes, its limit is 2: delete one or raise --agent-max-runtimes"
    );
    // Other tenants have their own quota.
    runtimes::create(&s, "u", "c", spec("x"), q, 1)
        .await
        .unwrap();
    runtimes::update(&s, "t", "a", spec("y"), q, 2)
        .await
        .unwrap();
    let e = runtimes::update(&s, "t", "a", spec("z"), q, 3)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("runtime \"a\" has 2 versions, its limit is 2"),
        "{e}"
    );
    runtimes::delete(&s, "t", "b").await.unwrap();
    runtimes::create(&s, "t", "c", spec("x"), q, 1)
        .await
        .unwrap();
}

#[test]
fn bad_specs_name_the_field() {
    let cases = [
        (json!({"command": []}), "command: must name a program"),
        (
            json!({"command": ["x"], "resources": {"cpu_millis": 1}}),
            "resources.cpu_millis: 1: use 10 to 64000",
        ),
        (
            json!({"command": ["x"], "env": {"TESSERA_URL": "x"}}),
            "env.TESSERA_URL: not a valid variable name",
        ),
        (
            json!({"command": ["x"], "template": "rel/dir"}),
            "template: template \"rel/dir\": a template is named",
        ),
        // A host path from a tenant is refused: templates are registered, never paths.
        (
            json!({"command": ["x"], "template": "/"}),
            "template: template \"/\": a template is named",
        ),
        (
            json!({"command": ["x"], "template": "/usr/.."}),
            "template: template \"/usr/..\": a template is named",
        ),
        (
            json!({"command": ["x"], "idle_timeout_s": 0}),
            "idle_timeout_s: 0: use 1 to 604800",
        ),
    ];
    for (v, want) in cases {
        let s: RuntimeSpec = serde_json::from_value(v.clone()).unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.starts_with(want), "{v}: {e}");
    }
}

#[tokio::test]
async fn memory_history_and_checkpoints_live_in_the_store() {
    let (_d, s) = store();
    sessions::memory_put(&s, "t", "s1", "plan", json!({"step": 1}))
        .await
        .unwrap();
    sessions::memory_put(&s, "t", "s1", "name", json!("ada"))
        .await
        .unwrap();
    sessions::memory_put(&s, "t", "s1", "plan", json!({"step": 2}))
        .await
        .unwrap();
    assert_eq!(
        sessions::memory_get(&s, "t", "s1", "plan").await.unwrap(),
        json!({"step": 2})
    );
    assert_eq!(
        sessions::memory_keys(&s, "t", "s1").await.unwrap(),
        ["name", "plan"]
    );
    sessions::memory_delete(&s, "t", "s1", "name")
        .await
        .unwrap();
    assert_eq!(
        sessions::memory_keys(&s, "t", "s1").await.unwrap(),
        ["plan"]
    );
    assert!(sessions::memory_get(&s, "t", "s2", "plan").await.is_err());
    for i in 0..3 {
        sessions::history_append(&s, "t", "s1", json!({"turn": i}), 1)
            .await
            .unwrap();
    }
    let h = sessions::history_read(&s, "t", "s1", 1, 10).await.unwrap();
    assert_eq!(
        h.iter()
            .map(|e| e.payload["turn"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    let cp = |id: &str, parent: Option<&str>| Checkpoint {
        ns: String::new(),
        id: id.into(),
        parent_id: parent.map(Into::into),
        checkpoint: json!({"v": id}),
        metadata: json!({}),
        created_at_ms: 0,
        seq: 0,
    };
    sessions::checkpoint_put(&s, "t", "s1", cp("c1", None), 1)
        .await
        .unwrap();
    sessions::checkpoint_put(&s, "t", "s1", cp("c2", Some("c1")), 2)
        .await
        .unwrap();
    // A retried put is a no-op; other content under the same id is refused.
    sessions::checkpoint_put(&s, "t", "s1", cp("c2", Some("c1")), 3)
        .await
        .unwrap();
    let mut other = cp("c2", Some("c1"));
    other.checkpoint = json!("different");
    assert!(
        sessions::checkpoint_put(&s, "t", "s1", other, 4)
            .await
            .is_err()
    );
    let l = sessions::checkpoint_list(&s, "t", "s1", "", None, 10)
        .await
        .unwrap();
    assert_eq!(
        l.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["c2", "c1"]
    );
    let older = sessions::checkpoint_list(&s, "t", "s1", "", Some(l[0].seq), 10)
        .await
        .unwrap();
    assert_eq!(
        older.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["c1"]
    );
    let w = json!({"task_id": "t1", "idx": 0, "channel": "messages", "value": "x"});
    sessions::checkpoint_put_writes(&s, "t", "s1", "", "c2", vec![w.clone()])
        .await
        .unwrap();
    sessions::checkpoint_put_writes(&s, "t", "s1", "", "c2", vec![w.clone()])
        .await
        .unwrap();
    assert_eq!(
        sessions::checkpoint_writes(&s, "t", "s1", "", "c2")
            .await
            .unwrap(),
        vec![w]
    );
}

#[tokio::test]
async fn session_listing_reads_the_state_index() {
    let (_d, s) = store();
    runtimes::create(&s, "t", "bot", spec("x"), Quotas::default(), 1)
        .await
        .unwrap();
    let rv = runtimes::resolve(&s, "t", "bot", None).await.unwrap();
    for i in 0..5 {
        sessions::get_or_create(&s, "t", format!("s{i}").as_str(), &rv, 1)
            .await
            .unwrap();
    }
    sessions::update(&s, "t", "s1", |x| {
        x.state = State::Active;
        Ok(true)
    })
    .await
    .unwrap();
    sessions::update(&s, "t", "s3", |x| {
        x.state = State::Killed;
        Ok(true)
    })
    .await
    .unwrap();
    let ids = |v: Vec<sessions::Session>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(sessions::list(&s, "t", &[State::Active], None)
            .await
            .unwrap()),
        ["s1"]
    );
    assert_eq!(
        ids(sessions::list(&s, "t", &[State::Idle], Some("bot"))
            .await
            .unwrap()),
        ["s0", "s2", "s4"]
    );
    assert_eq!(sessions::list(&s, "t", &[], None).await.unwrap().len(), 5);
    assert!(
        sessions::list(&s, "t", &[State::Idle], Some("other"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_session_keeps_who_started_it_and_a_later_call_does_not_change_it() {
    let (_d, s) = store();
    runtimes::create(&s, "t", "bot", spec("x"), Quotas::default(), 1)
        .await
        .unwrap();
    let rv = runtimes::resolve(&s, "t", "bot", None).await.unwrap();
    let by = |who| sessions::NewSession {
        id: "s1",
        started_by: Some(who),
    };
    let (x, created) = sessions::get_or_create(&s, "t", by("alice"), &rv, 1)
        .await
        .unwrap();
    assert!(created);
    assert_eq!(x.started_by.as_deref(), Some("alice"));
    let (x, created) = sessions::get_or_create(&s, "t", by("mallory"), &rv, 2)
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(x.started_by.as_deref(), Some("alice"));
    let (x, _) = sessions::get_or_create(&s, "t", "s2", &rv, 1)
        .await
        .unwrap();
    assert_eq!(x.started_by, None);
}

//! The tool gateway against a real embedded store and local HTTP tools: grants,
//! schemas, the ledger's replay, crash recovery (with crash points injected in
//! the real code path), approvals, and concurrency on one key.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};
use tessera_agent::tools::testing::{CountingConfig, CountingService};
use tessera_agent::tools::{
    CallError, CallRequest, Completion, Decision, Fault, Grant, Resolution, ResolvedAs, State,
    Status, ToolCaller, ToolGateway, ToolGatewayConfig, ToolSpec,
};
use tessera_store::{Key, SqliteStore, Store};

const T: &str = "acme";

struct Env {
    _dir: tempfile::TempDir,
    store: SqliteStore,
    plain: CountingService,
    keyed: CountingService,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    let plain = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    let keyed = CountingService::start(CountingConfig {
        honour_keys: true,
        ..Default::default()
    })
    .await
    .unwrap();
    store
        .create(
            Key::new("session", T, "s1"),
            json!({"id": "s1", "runtime": "shop", "state": "active"}),
        )
        .await
        .unwrap();
    Env {
        _dir: dir,
        store,
        plain,
        keyed,
    }
}

fn gateway(e: &Env) -> ToolGateway<SqliteStore> {
    ToolGateway::new(e.store.clone(), ToolGatewayConfig::default())
}

fn spec(v: Value) -> ToolSpec {
    serde_json::from_value(v).unwrap()
}

async fn setup(e: &Env, gw: &ToolGateway<SqliteStore>) {
    let schema = json!({"type": "object", "properties": {"amount": {"type": "integer", "minimum": 1}}, "required": ["amount"]});
    gw.register(
        T,
        spec(json!({"name": "charge", "target": {"type": "http", "url": e.plain.url()}, "input_schema": schema})),
    )
    .await
    .unwrap();
    gw.register(
        T,
        spec(
            json!({"name": "charge-keyed", "target": {"type": "http", "url": e.keyed.url()},
            "input_schema": schema, "idempotency_keys": true}),
        ),
    )
    .await
    .unwrap();
    gw.register(
        T,
        spec(
            json!({"name": "refund", "target": {"type": "http", "url": e.plain.url()},
            "input_schema": schema, "approval": {"ttl_seconds": 1}, "fee": 0.5}),
        ),
    )
    .await
    .unwrap();
    for t in ["charge", "charge-keyed", "refund"] {
        gw.set_grant(
            T,
            t,
            Grant {
                runtime: Some("shop".into()),
                role: None,
            },
            true,
        )
        .await
        .unwrap();
    }
}

fn agent() -> ToolCaller {
    ToolCaller {
        tenant: T.into(),
        subject: "session:s1".into(),
        role: "developer".into(),
    }
}

fn req(id: &str, amount: i64) -> CallRequest {
    CallRequest {
        session_id: "s1".into(),
        tool_call_id: id.into(),
        idempotency_key: None,
        arguments: json!({"amount": amount}),
    }
}

#[tokio::test]
async fn a_repeated_key_returns_the_recorded_result_without_executing() {
    let e = env().await;
    let gw = gateway(&e);
    setup(&e, &gw).await;
    let a = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    assert_eq!(a.status, Status::Completed, "{a:?}");
    assert!(!a.replayed);
    assert_eq!(a.result.as_ref().unwrap()["executions"], 1);
    let b = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    assert!(b.replayed);
    assert_eq!(b.result, a.result);
    gw.flush().await;
    // And from the store, by a fresh process.
    let gw2 = gateway(&e);
    let c = gw2.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    assert!(c.replayed);
    assert_eq!(c.result, a.result);
    assert_eq!(e.plain.executions("s1/c1"), 1);
    // The same key with other arguments is refused.
    let err = gw2
        .call(&agent(), "charge", req("c1", 6))
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::KeyReused { .. }), "{err}");
    let entry = gw2.entry(T, &a.ledger_id).await.unwrap().unwrap();
    assert_eq!(entry.state, State::Completed);
    assert_eq!(entry.attempts, 1);
}

#[tokio::test]
async fn grants_schemas_and_sessions_are_enforced() {
    let e = env().await;
    let gw = gateway(&e);
    setup(&e, &gw).await;
    gw.register(
        T,
        spec(json!({"name": "secret", "target": {"type": "http", "url": e.plain.url()}})),
    )
    .await
    .unwrap();
    let err = gw.call(&agent(), "secret", req("x", 1)).await.unwrap_err();
    assert!(matches!(err, CallError::NotGranted { .. }), "{err}");
    let err = gw.call(&agent(), "charge", req("x", 0)).await.unwrap_err();
    match err {
        CallError::InvalidArguments(v) => assert_eq!(v.path, "/amount"),
        other => panic!("{other}"),
    }
    let mut other = req("x", 1);
    other.session_id = "s2".into();
    let err = gw
        .call(&agent(), "charge", other.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::NotYourSession { .. }), "{err}");
    let human = ToolCaller {
        tenant: T.into(),
        subject: "alice".into(),
        role: "operator".into(),
    };
    let err = gw.call(&human, "charge", other).await.unwrap_err();
    assert!(matches!(err, CallError::SessionNotFound(_)), "{err}");
    // A role grant admits the human, not the session key (developer).
    gw.set_grant(
        T,
        "secret",
        Grant {
            runtime: None,
            role: Some("operator".into()),
        },
        true,
    )
    .await
    .unwrap();
    assert!(gw.call(&human, "secret", req("y", 1)).await.is_ok());
    assert!(gw.call(&agent(), "secret", req("y", 1)).await.is_err());
    assert_eq!(e.plain.requests(), 1);
    let listed: Vec<String> = gw
        .granted_tools(&agent(), "s1")
        .await
        .unwrap()
        .iter()
        .map(|t| t.spec.name.clone())
        .collect();
    assert_eq!(listed, ["charge", "charge-keyed", "refund"]);
}

#[tokio::test]
async fn a_crash_after_sending_marks_the_call_in_doubt_and_never_resends_it() {
    let e = env().await;
    let gw = gateway(&e);
    setup(&e, &gw).await;
    gw.inject(Fault::AfterSend);
    assert!(gw.call(&agent(), "charge", req("c1", 5)).await.is_err());
    assert_eq!(e.plain.executions("s1/c1"), 1);
    drop(gw);
    // The restarted process finds the entry orphaned.
    let gw = gateway(&e);
    assert_eq!(gw.sweep().await.unwrap(), 1);
    for _ in 0..3 {
        let o = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
        assert_eq!(o.status, Status::InDoubt, "{o:?}");
    }
    assert_eq!(e.plain.executions("s1/c1"), 1);
    // An operator checks the tool and records what happened.
    let id = gw
        .ledger(T, Some("s1"), Some(State::InDoubt))
        .await
        .unwrap()[0]
        .id
        .clone();
    gw.resolve(
        T,
        &id,
        Resolution {
            outcome: ResolvedAs::Completed,
            result: Some(json!({"checked": true})),
            error: None,
        },
        "alice",
    )
    .await
    .unwrap();
    let o = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    assert_eq!(o.status, Status::Completed);
    assert_eq!(o.result, Some(json!({"checked": true})));
    assert_eq!(e.plain.executions("s1/c1"), 1);
}

#[tokio::test]
async fn a_crash_before_sending_can_be_resent_after_a_check() {
    let e = env().await;
    let gw = gateway(&e);
    setup(&e, &gw).await;
    gw.inject(Fault::AfterIntent);
    assert!(gw.call(&agent(), "charge", req("c1", 5)).await.is_err());
    let gw = gateway(&e);
    let o = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    assert_eq!(o.status, Status::InDoubt);
    assert_eq!(e.plain.executions("s1/c1"), 0);
    gw.resolve(
        T,
        &o.ledger_id,
        Resolution {
            outcome: ResolvedAs::Resend,
            result: None,
            error: None,
        },
        "alice",
    )
    .await
    .unwrap();
    let o = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    assert_eq!(o.status, Status::Completed, "{o:?}");
    assert_eq!(e.plain.executions("s1/c1"), 1);
}

#[tokio::test]
async fn a_tool_that_honours_keys_is_resent_with_the_same_key_after_a_crash() {
    let e = env().await;
    let gw = gateway(&e);
    setup(&e, &gw).await;
    gw.inject(Fault::AfterSend);
    assert!(
        gw.call(&agent(), "charge-keyed", req("k1", 5))
            .await
            .is_err()
    );
    let gw = gateway(&e);
    gw.sweep().await.unwrap();
    let o = gw
        .call(&agent(), "charge-keyed", req("k1", 5))
        .await
        .unwrap();
    assert_eq!(o.status, Status::Completed, "{o:?}");
    assert_eq!(e.keyed.requests(), 2);
    assert_eq!(e.keyed.executions("s1/k1"), 1);
}

#[tokio::test]
async fn approvals_gate_the_call_and_time_out_to_a_denial() {
    let e = env().await;
    let gw = gateway(&e);
    setup(&e, &gw).await;
    let o = gw.call(&agent(), "refund", req("r1", 5)).await.unwrap();
    assert_eq!(o.status, Status::PendingApproval);
    let id = o.approval_id.clone().unwrap();
    assert_eq!(gw.approvals(T).await.unwrap().len(), 1);
    // Polling does not send it.
    let o = gw.call(&agent(), "refund", req("r1", 5)).await.unwrap();
    assert_eq!(o.status, Status::PendingApproval);
    assert_eq!(e.plain.requests(), 0);
    gw.decide_approval(T, &id, Decision::Approve, "alice")
        .await
        .unwrap();
    let o = gw.call(&agent(), "refund", req("r1", 5)).await.unwrap();
    assert_eq!(o.status, Status::Completed, "{o:?}");
    assert_eq!(e.plain.executions("s1/r1"), 1);
    gw.flush().await;
    // The fee is metered once.
    let usage = e.store.list("usage", Some(T)).await.unwrap().objects;
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].body["kind"], "tool_fee");
    // Denied.
    let o = gw.call(&agent(), "refund", req("r2", 5)).await.unwrap();
    gw.decide_approval(T, &o.ledger_id, Decision::Deny, "bob")
        .await
        .unwrap();
    let o = gw.call(&agent(), "refund", req("r2", 5)).await.unwrap();
    assert_eq!(o.status, Status::Denied);
    // Nobody decides: denied when the TTL passes.
    let o = gw.call(&agent(), "refund", req("r3", 5)).await.unwrap();
    assert_eq!(o.status, Status::PendingApproval);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(gw.sweep().await.unwrap(), 1);
    let o = gw.call(&agent(), "refund", req("r3", 5)).await.unwrap();
    assert_eq!(o.status, Status::Denied);
    assert!(
        gw.decide_approval(T, &o.ledger_id, Decision::Approve, "late")
            .await
            .is_err()
    );
    assert_eq!(e.plain.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_with_one_key_execute_once() {
    let e = env().await;
    setup(&e, &gateway(&e)).await;
    // Two replicas on one store (not exclusive: leases decide) and many callers.
    let replica = || {
        ToolGateway::new(
            e.store.clone(),
            ToolGatewayConfig {
                exclusive: false,
                ..Default::default()
            },
        )
    };
    let gws = [replica(), replica()];
    let mut tasks = Vec::new();
    for i in 0..40 {
        let gw = gws[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            gw.call(&agent(), "charge", req("same", 5)).await
        }));
    }
    for t in tasks {
        let o = t.await.unwrap().unwrap();
        assert_eq!(o.status, Status::Completed, "{o:?}");
    }
    assert_eq!(e.plain.executions("s1/same"), 1);
}

#[tokio::test]
async fn outcomes_written_before_the_reply_when_asked() {
    let e = env().await;
    let gw = ToolGateway::new(
        e.store.clone(),
        ToolGatewayConfig {
            completion: Completion::BeforeReply,
            ..Default::default()
        },
    );
    setup(&e, &gw).await;
    let o = gw.call(&agent(), "charge", req("c1", 5)).await.unwrap();
    let stored = e
        .store
        .get(&Key::new("ledger", T, &o.ledger_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.body["state"], "completed");
}

#[derive(Debug, Clone, Copy)]
enum Crash {
    None,
    AfterIntent,
    AfterSend,
    LoseOutcome,
}

fn crash() -> impl Strategy<Value = Crash> {
    prop_oneof![
        Just(Crash::None),
        Just(Crash::AfterIntent),
        Just(Crash::AfterSend),
        Just(Crash::LoseOutcome)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random crash points in the real code path, restarts, retries and an
    /// operator who reconciles in-doubt calls by asking the tool: no logical call
    /// of a tool that ignores idempotency keys executes twice, one that honours
    /// them executes once however often it is re-sent, and every call ends
    /// completed.
    #[test]
    fn no_logical_call_executes_twice(
        plan in proptest::collection::vec((crash(), any::<bool>(), 1usize..4, any::<bool>()), 1..6)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let e = env().await;
            let mut gw = gateway(&e);
            setup(&e, &gw).await;
            for (i, (crash, keyed, retries, sweep)) in plan.iter().enumerate() {
                let tool = if *keyed { "charge-keyed" } else { "charge" };
                let id = format!("c{i}");
                let key = format!("s1/{id}");
                match crash {
                    Crash::None => {}
                    Crash::AfterIntent => gw.inject(Fault::AfterIntent),
                    Crash::AfterSend => gw.inject(Fault::AfterSend),
                    Crash::LoseOutcome => gw.inject(Fault::LoseOutcome),
                }
                let first = gw.call(&agent(), tool, req(&id, 5)).await;
                if !matches!(crash, Crash::None) {
                    // The process dies; a new one starts (and sweeps, or not yet).
                    gw = gateway(&e);
                    if *sweep {
                        gw.sweep().await.unwrap();
                    }
                } else {
                    prop_assert_eq!(first.unwrap().status, Status::Completed);
                }
                let mut last = None;
                for _ in 0..*retries {
                    last = Some(gw.call(&agent(), tool, req(&id, 5)).await.unwrap());
                }
                let mut o = last.unwrap();
                if o.status == Status::InDoubt {
                    // Reconcile by asking the tool.
                    let ran = e.plain.executions(&key);
                    let r = if ran == 0 {
                        Resolution { outcome: ResolvedAs::Resend, result: None, error: None }
                    } else {
                        Resolution { outcome: ResolvedAs::Completed, result: Some(json!({"checked": ran})), error: None }
                    };
                    gw.resolve(T, &o.ledger_id, r, "operator").await.unwrap();
                    o = gw.call(&agent(), tool, req(&id, 5)).await.unwrap();
                }
                prop_assert_eq!(o.status, Status::Completed, "{:?} {:?}", crash, o);
                let svc = if *keyed { &e.keyed } else { &e.plain };
                prop_assert_eq!(svc.executions(&key), 1, "{:?} keyed={}", crash, keyed);
            }
            Ok(())
        })?;
    }
}

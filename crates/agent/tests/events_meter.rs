//! Events (ordered, dense offsets, consumer offsets) and the meter (idempotent
//! records, totals equal to the sum of the records, budgets).

use proptest::prelude::*;
use serde_json::json;
use tessera_agent::events;
use tessera_agent::meter::{self, UsageKind, UsageRecord};
use tessera_store::{Key, SqliteStore, Store};

fn store() -> (tempfile::TempDir, SqliteStore) {
    let d = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(d.path()).unwrap();
    (d, s)
}

fn rec(session: &str, kind: UsageKind, q: f64, src: &str) -> UsageRecord {
    UsageRecord {
        tenant: "t1".into(),
        session: session.into(),
        runtime: "rt".into(),
        kind,
        quantity: q,
        at_ms: 1,
        source_id: src.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishers_get_dense_ordered_offsets() {
    let (_d, s) = store();
    let mut tasks = Vec::new();
    for p in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..10 {
                got.push(
                    events::publish(&s, "t1", "orders", json!({"p": p, "i": i}), 5)
                        .await
                        .unwrap(),
                );
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let got = t.await.unwrap();
        // One publisher's events keep their order.
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        all.extend(got);
    }
    all.sort();
    assert_eq!(all, (1..=80).collect::<Vec<u64>>());
    let evs = events::read(&s, "t1", "orders", 0, 1000).await.unwrap();
    assert_eq!(evs.len(), 80);
    assert!(
        evs.iter()
            .enumerate()
            .all(|(i, e)| e.offset == i as u64 + 1)
    );
    let tail = events::read(&s, "t1", "orders", 75, 10).await.unwrap();
    assert_eq!(
        tail.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![76, 77, 78, 79, 80]
    );
    // Other tenants do not see the topic.
    assert!(
        events::read(&s, "t2", "orders", 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn consumer_offsets_only_move_forward_and_bad_names_are_rejected() {
    let (_d, s) = store();
    assert_eq!(events::committed(&s, "t1", "a", "c1").await.unwrap(), 0);
    assert_eq!(
        events::commit_offset(&s, "t1", "a", "c1", 5).await.unwrap(),
        5
    );
    assert_eq!(
        events::commit_offset(&s, "t1", "a", "c1", 3).await.unwrap(),
        5
    );
    assert_eq!(events::committed(&s, "t1", "a", "c1").await.unwrap(), 5);
    let e = events::publish(&s, "t1", "bad/topic", json!(1), 0)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("topic: \"bad/topic\" is not a valid name"),
        "{e}"
    );
}

#[tokio::test]
async fn read_wait_wakes_on_publish() {
    let (_d, s) = store();
    let s2 = s.clone();
    let h = tokio::spawn(async move {
        events::read_wait(&s2, "t1", "hitl", 0, 10, std::time::Duration::from_secs(30)).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    events::publish(&s, "t1", "hitl", json!({"msg": "approve?"}), 1)
        .await
        .unwrap();
    let evs = h.await.unwrap().unwrap();
    assert_eq!(evs[0].payload["msg"], "approve?");
}

#[tokio::test]
async fn usage_is_idempotent_and_budgets_stop_sessions() {
    let (_d, s) = store();
    s.create(
        Key::new("session", "t1", "s1"),
        json!({"id": "s1", "budget": {"max_cost": 0.5}}),
    )
    .await
    .unwrap();
    let r = meter::record(&s, rec("s1", UsageKind::ToolFee, 0.25, "call-1"))
        .await
        .unwrap();
    assert!(r.counted && r.over_budget.is_none());
    let again = meter::record(&s, rec("s1", UsageKind::ToolFee, 0.25, "call-1"))
        .await
        .unwrap();
    assert!(!again.counted);
    assert_eq!(
        meter::session_totals(&s, "t1", "s1").await.unwrap().records,
        1
    );
    meter::check_budget(&s, "t1", "s1").await.unwrap();
    let r = meter::record(&s, rec("s1", UsageKind::ToolFee, 0.5, "call-2"))
        .await
        .unwrap();
    let why = r.over_budget.expect("over budget");
    assert!(
        why.contains("session s1 spent 0.750000 of its budget 0.500000"),
        "{why}"
    );
    let e = meter::check_budget(&s, "t1", "s1").await.unwrap_err();
    assert!(
        e.to_string().starts_with("budget exceeded: session s1"),
        "{e}"
    );
    // Tenant budget.
    meter::set_tenant_budget(&s, "t1", Some(0.1)).await.unwrap();
    let e = meter::check_budget(&s, "t1", "other").await.unwrap_err();
    assert!(e.to_string().contains("tenant t1 spent"), "{e}");
    // Bad input names the field.
    let e = meter::record(&s, rec("s1", UsageKind::TokensIn, f64::NAN, "x"))
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with("quantity: NaN"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    /// Whatever the records (duplicates included), the session, runtime and
    /// tenant totals equal the sum over the distinct records.
    #[test]
    fn totals_equal_sum_of_distinct_records(
        recs in prop::collection::vec((0usize..3, 0usize..7, 0u32..1000, 0u32..20), 1..30)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (_d, s) = store();
            let mut distinct = std::collections::BTreeMap::new();
            for (sess, kind, q, src) in &recs {
                let kind = UsageKind::ALL[*kind];
                let r = rec(&format!("s{sess}"), kind, f64::from(*q), &format!("src-{src}"));
                let first = !distinct.contains_key(&format!("src-{src}"));
                let out = meter::record(&s, r.clone()).await.unwrap();
                prop_assert_eq!(out.counted, first);
                distinct.entry(format!("src-{src}")).or_insert(r);
            }
            let listed = meter::records(&s, "t1", None).await.unwrap();
            prop_assert_eq!(listed.len(), distinct.len());
            let sum_cost: f64 = listed.iter().map(|b| b["cost"].as_f64().unwrap()).sum();
            let tenant = meter::tenant_totals(&s, "t1").await.unwrap();
            let runtime = meter::runtime_totals(&s, "t1", "rt").await.unwrap();
            prop_assert!((tenant.cost - sum_cost).abs() < 1e-9);
            prop_assert!((runtime.cost - sum_cost).abs() < 1e-9);
            prop_assert_eq!(tenant.records as usize, distinct.len());
            let mut per_session = 0u64;
            for i in 0..3 {
                per_session += meter::session_totals(&s, "t1", &format!("s{i}")).await.unwrap().records;
            }
            prop_assert_eq!(per_session as usize, distinct.len());
            Ok(())
        })?;
    }
}

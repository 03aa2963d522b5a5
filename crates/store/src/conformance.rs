//! The conformance suite every backend must pass.
//!
//! Each case is a function taking a fresh, empty store. A backend's tests run all of
//! them with [`conformance_tests!`](crate::conformance_tests), given a factory
//! `async fn() -> Option<(S, Guard)>` (`None`: the backend is not available here,
//! e.g. no PostgreSQL URL; the guard keeps a temporary folder alive).

use std::time::Duration;

use serde_json::json;

use crate::{ChangeOp, Key, Op, Store, StoreError, WatchFilter};

fn k(kind: &str, tenant: &str, name: &str) -> Key {
    Key::new(kind, tenant, name)
}

/// A created object reads back with its body and a positive version.
pub async fn create_get<S: Store>(s: S) {
    let before = s.revision().await.unwrap();
    let body = json!({"a": 1, "nested": {"list": [1, 2, 3], "s": "héllo ✓"}, "big": 18446744073709551615u64});
    let o = s.create(k("job", "t1", "j1"), body.clone()).await.unwrap();
    assert!(o.version > before);
    assert_eq!(o.body, body);
    let got = s.get(&k("job", "t1", "j1")).await.unwrap().unwrap();
    assert_eq!(got, o);
    assert_eq!(s.revision().await.unwrap(), o.version);
    assert_eq!(s.get(&k("job", "t2", "j1")).await.unwrap(), None);
    assert_eq!(s.get(&k("queue", "t1", "j1")).await.unwrap(), None);
}

/// Creating an existing key fails and changes nothing.
pub async fn create_existing<S: Store>(s: S) {
    let o = s.create(k("job", "t1", "j1"), json!(1)).await.unwrap();
    let e = s.create(k("job", "t1", "j1"), json!(2)).await.unwrap_err();
    assert_eq!(e, StoreError::AlreadyExists(k("job", "t1", "j1")));
    assert_eq!(s.get(&o.key()).await.unwrap().unwrap(), o);
}

/// Update is compare-and-swap on the version; a stale version is a conflict.
pub async fn update_cas<S: Store>(s: S) {
    let o = s
        .create(k("job", "t1", "j1"), json!({"v": 1}))
        .await
        .unwrap();
    let o2 = s
        .update(o.key(), Some(o.version), json!({"v": 2}))
        .await
        .unwrap();
    assert!(o2.version > o.version);
    let e = s
        .update(o.key(), Some(o.version), json!({"v": 3}))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        StoreError::Conflict {
            key: o.key(),
            expected: o.version,
            actual: o2.version
        }
    );
    assert_eq!(
        s.get(&o.key()).await.unwrap().unwrap().body,
        json!({"v": 2})
    );
    // Unconditional update.
    let o3 = s.update(o.key(), None, json!({"v": 4})).await.unwrap();
    assert!(o3.version > o2.version);
    let e = s
        .update(k("job", "t1", "nope"), None, json!(0))
        .await
        .unwrap_err();
    assert_eq!(e, StoreError::NotFound(k("job", "t1", "nope")));
}

/// Delete is compare-and-swap too; a deleted object is gone.
pub async fn delete_cas<S: Store>(s: S) {
    let o = s
        .create(k("job", "t1", "j1"), json!({"v": 1}))
        .await
        .unwrap();
    let o2 = s.update(o.key(), None, json!({"v": 2})).await.unwrap();
    let e = s.delete(o.key(), Some(o.version)).await.unwrap_err();
    assert!(matches!(e, StoreError::Conflict { .. }), "{e:?}");
    let d = s.delete(o.key(), Some(o2.version)).await.unwrap();
    assert!(d.version > o2.version);
    assert_eq!(d.body, json!({"v": 2}));
    assert_eq!(s.get(&o.key()).await.unwrap(), None);
    let e = s.delete(o.key(), None).await.unwrap_err();
    assert_eq!(e, StoreError::NotFound(o.key()));
    // The name can be used again.
    s.create(o.key(), json!({"v": 3})).await.unwrap();
}

/// Lists are per kind, per tenant (or all tenants), sorted by (tenant, name).
pub async fn list_scoping<S: Store>(s: S) {
    for (t, n) in [
        ("t2", "b"),
        ("t1", "b"),
        ("t1", "a"),
        ("t2", "a"),
        ("t1", "c"),
    ] {
        s.create(k("job", t, n), json!({"t": t, "n": n}))
            .await
            .unwrap();
    }
    s.create(k("queue", "t1", "a"), json!({})).await.unwrap();
    let l = s.list("job", Some("t1")).await.unwrap();
    let names: Vec<_> = l
        .objects
        .iter()
        .map(|o| (o.tenant.as_str(), o.name.as_str()))
        .collect();
    assert_eq!(names, [("t1", "a"), ("t1", "b"), ("t1", "c")]);
    assert_eq!(l.revision, s.revision().await.unwrap());
    let all = s.list("job", None).await.unwrap();
    let names: Vec<_> = all
        .objects
        .iter()
        .map(|o| (o.tenant.as_str(), o.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("t1", "a"),
            ("t1", "b"),
            ("t1", "c"),
            ("t2", "a"),
            ("t2", "b")
        ]
    );
    assert!(s.list("job", Some("t3")).await.unwrap().objects.is_empty());
    assert_eq!(s.list("queue", None).await.unwrap().objects.len(), 1);
}

/// A commit applies all its operations or none.
pub async fn commit_atomic<S: Store>(s: S) {
    let a = s.create(k("job", "t1", "a"), json!(1)).await.unwrap();
    let rev = s.revision().await.unwrap();
    let e = s
        .commit(vec![
            Op::Update {
                key: a.key(),
                expected: Some(a.version),
                body: json!(2),
            },
            Op::Create {
                key: k("job", "t1", "b"),
                body: json!(1),
            },
            Op::Update {
                key: k("job", "t1", "missing"),
                expected: None,
                body: json!(1),
            },
        ])
        .await
        .unwrap_err();
    assert_eq!(e, StoreError::NotFound(k("job", "t1", "missing")));
    assert_eq!(s.get(&a.key()).await.unwrap().unwrap(), a);
    assert_eq!(s.get(&k("job", "t1", "b")).await.unwrap(), None);
    assert_eq!(
        s.revision().await.unwrap(),
        rev,
        "a failed commit takes no revision"
    );
    let out = s
        .commit(vec![
            Op::Update {
                key: a.key(),
                expected: Some(a.version),
                body: json!(2),
            },
            Op::Create {
                key: k("job", "t1", "b"),
                body: json!(1),
            },
        ])
        .await
        .unwrap();
    assert_eq!(out.len(), 2);
    assert!(out[0].version < out[1].version);
    assert_eq!(s.get(&a.key()).await.unwrap().unwrap().body, json!(2));
    // The same key twice in one commit is refused.
    let e = s
        .commit(vec![
            Op::Delete {
                key: a.key(),
                expected: None,
            },
            Op::Create {
                key: a.key(),
                body: json!(3),
            },
        ])
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e:?}");
    assert!(matches!(
        s.commit(vec![]).await.unwrap_err(),
        StoreError::Invalid(_)
    ));
}

/// The change log lists every write in revision order, deletions included.
pub async fn changes_log<S: Store>(s: S) {
    let start = s.revision().await.unwrap();
    let a = s.create(k("job", "t1", "a"), json!(1)).await.unwrap();
    let a2 = s.update(a.key(), None, json!(2)).await.unwrap();
    let d = s.delete(a.key(), None).await.unwrap();
    let ch = s.changes(start, 100).await.unwrap();
    let seen: Vec<_> = ch
        .iter()
        .map(|c| (c.op, c.version(), c.object.body.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (ChangeOp::Created, a.version, json!(1)),
            (ChangeOp::Updated, a2.version, json!(2)),
            (ChangeOp::Deleted, d.version, json!(2)),
        ]
    );
    assert_eq!(s.changes(a.version, 1).await.unwrap().len(), 1);
    assert_eq!(
        s.changes(a.version, 1).await.unwrap()[0].version(),
        a2.version
    );
    assert!(s.changes(d.version, 100).await.unwrap().is_empty());
}

/// A watcher sees changes made after it started, filtered by kind and tenant.
pub async fn watch_filtered<S: Store>(s: S) {
    let start = s.revision().await.unwrap();
    let mut w = s.watch(
        start,
        WatchFilter {
            kind: Some("job".into()),
            tenant: Some("t1".into()),
        },
    );
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            s.create(k("job", "t2", "x"), json!(0)).await.unwrap();
            s.create(k("queue", "t1", "x"), json!(0)).await.unwrap();
            s.create(k("job", "t1", "x"), json!(1)).await.unwrap();
        })
    };
    let got = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("watch woke up")
        .unwrap();
    writer.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].object.key(), k("job", "t1", "x"));
    assert_eq!(w.position(), got[0].version());
}

/// Concurrent read-modify-write loops with retry on conflict lose no increment.
pub async fn concurrent_cas<S: Store>(s: S) {
    let key = k("counter", "", "c");
    s.create(key.clone(), json!(0)).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..10 {
                loop {
                    let o = s.get(&key).await.unwrap().unwrap();
                    let n = o.body.as_u64().unwrap();
                    match s.update(key.clone(), Some(o.version), json!(n + 1)).await {
                        Ok(_) => break,
                        Err(StoreError::Conflict { .. }) => conflicts += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            conflicts
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.get(&key).await.unwrap().unwrap().body, json!(80));
}

/// Many concurrent commits on one key (they land in the same group commit on
/// backends that group): exactly one create and one delete win, and the change
/// log replays to the stored state.
pub async fn concurrent_same_key<S: Store>(s: S) {
    let start = s.revision().await.unwrap();
    let key = k("job", "t1", "x");
    let race = |make: fn(Key, usize) -> Op| {
        let s = s.clone();
        let key = key.clone();
        async move {
            let tasks: Vec<_> = (0..32)
                .map(|i| {
                    let s = s.clone();
                    let op = make(key.clone(), i);
                    tokio::spawn(async move { s.commit(vec![op]).await })
                })
                .collect();
            let mut won = 0;
            for t in tasks {
                if t.await.unwrap().is_ok() {
                    won += 1;
                }
            }
            won
        }
    };
    let created = race(|key, i| Op::Create {
        key,
        body: json!(i),
    })
    .await;
    assert_eq!(created, 1);
    let updated = race(|key, i| Op::Update {
        key,
        expected: None,
        body: json!(100 + i),
    })
    .await;
    assert_eq!(updated, 32);
    let deleted = race(|key, _| Op::Delete {
        key,
        expected: None,
    })
    .await;
    assert_eq!(deleted, 1);
    assert_eq!(s.get(&key).await.unwrap(), None);
    let log = s.changes(start, 1000).await.unwrap();
    let ops: Vec<ChangeOp> = log.iter().map(|c| c.op).collect();
    assert_eq!(ops.len(), 34);
    assert_eq!(ops[0], ChangeOp::Created);
    assert!(ops[1..33].iter().all(|o| *o == ChangeOp::Updated));
    assert_eq!(ops[33], ChangeOp::Deleted);
    // The deletion carries the last update's body.
    assert_eq!(log[33].object.body, log[32].object.body);
    assert!(log.windows(2).all(|w| w[0].version() < w[1].version()));
}

/// Compaction drops old change-log entries: changes (and watches) after a
/// compacted revision fail with `Compacted`, later ones still work, objects and
/// the revision are untouched, and the mark never goes down.
pub async fn compaction<S: Store>(s: S) {
    assert_eq!(s.compacted().await.unwrap(), 0);
    let start = s.revision().await.unwrap();
    let mut old_watcher = s.watch(start, WatchFilter::default());
    let a = s.create(k("job", "t1", "a"), json!(1)).await.unwrap();
    let b = s.create(k("job", "t1", "b"), json!(1)).await.unwrap();
    let a2 = s.update(a.key(), None, json!(2)).await.unwrap();
    let db = s.delete(b.key(), None).await.unwrap();
    let mid = b.version;
    assert_eq!(s.compact(mid).await.unwrap(), mid);
    assert_eq!(s.compacted().await.unwrap(), mid);
    // After the mark: the rest of the log, deletions included.
    let rest: Vec<u64> = s
        .changes(mid, 100)
        .await
        .unwrap()
        .iter()
        .map(|c| c.version())
        .collect();
    assert_eq!(rest, [a2.version, db.version]);
    // Before it: a clear error naming both revisions.
    for after in [start, mid - 1] {
        assert_eq!(
            s.changes(after, 100).await.unwrap_err(),
            StoreError::Compacted {
                requested: after,
                compacted: mid
            }
        );
    }
    let e = tokio::time::timeout(Duration::from_secs(10), old_watcher.next())
        .await
        .expect("the watcher answers")
        .unwrap_err();
    assert!(matches!(e, StoreError::Compacted { .. }), "{e:?}");
    assert!(e.to_string().contains("list again"), "{e}");
    // Objects and the revision are untouched.
    let rev = s.revision().await.unwrap();
    assert_eq!(rev, db.version);
    assert_eq!(s.get(&a.key()).await.unwrap().unwrap(), a2);
    assert_eq!(s.list("job", None).await.unwrap().revision, rev);
    // The mark never goes down.
    assert_eq!(s.compact(start).await.unwrap(), mid);
    // Compacting past the end stops at the latest revision; the log is empty, and
    // the next write still takes the next revision.
    assert_eq!(s.compact(u64::MAX).await.unwrap(), rev);
    assert_eq!(s.revision().await.unwrap(), rev);
    assert!(s.changes(rev, 100).await.unwrap().is_empty());
    let mut w = s.watch(rev, WatchFilter::default());
    let c = s.create(k("job", "t1", "c"), json!(3)).await.unwrap();
    assert_eq!(c.version, rev + 1);
    let got = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("a watcher from the compacted revision works")
        .unwrap();
    assert_eq!(got[0].version(), c.version);
}

/// Runs every conformance case as its own `#[tokio::test]`, with stores from
/// `$factory` (an `async fn() -> Option<(S, G)>`; `None` skips with a message).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::conformance_tests!(@cases $factory;
            create_get, create_existing, update_cas, delete_cas, list_scoping,
            commit_atomic, changes_log, watch_filtered, concurrent_cas, concurrent_same_key, compaction);
    };
    (@cases $factory:path; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                match $factory().await {
                    Some((store, _guard)) => $crate::conformance::$case(store).await,
                    None => {}
                }
            }
        )*
    };
}

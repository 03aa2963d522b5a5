//! `PgStore` against the conformance suite. Runs when `TESSERA_PG_URL` is set
//! (e.g. `postgres://tessera:tessera@127.0.0.1:5432/tessera_test`); otherwise each
//! case prints that PostgreSQL was skipped.

use std::sync::atomic::{AtomicU32, Ordering};

use tessera_store::PgStore;

static NEXT: AtomicU32 = AtomicU32::new(0);

async fn pg() -> Option<(PgStore, ())> {
    let Ok(url) = std::env::var("TESSERA_PG_URL") else {
        // Straight to stderr, past the test harness's capture, so it shows.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "PostgreSQL skipped: TESSERA_PG_URL is not set"
        );
        return None;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!(
        "conf_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    );
    let store = PgStore::connect_in_schema(&url, Some(&schema))
        .await
        .unwrap_or_else(|e| panic!("TESSERA_PG_URL is set but {e}"));
    Some((store, ()))
}

tessera_store::conformance_tests!(pg);

/// Of two replicas (two stores on one schema), only one leads at a time; the other
/// takes over when the first lets go. A store in another schema is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time() {
    let Ok(url) = std::env::var("TESSERA_PG_URL") else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "PostgreSQL skipped: TESSERA_PG_URL is not set"
        );
        return;
    };
    let schema = format!("lead_{}", std::process::id());
    let a = PgStore::connect_in_schema(&url, Some(&schema))
        .await
        .unwrap();
    let b = PgStore::connect_in_schema(&url, Some(&schema))
        .await
        .unwrap();
    let key = 42;
    let first = a.lead(key).await.unwrap();
    let Some((other, ())) = pg().await else {
        return;
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), other.lead(key))
        .await
        .expect("another schema leads independently")
        .unwrap();
    let mut second = Box::pin(b.lead(key));
    let waited = tokio::time::timeout(std::time::Duration::from_millis(1500), &mut second).await;
    assert!(
        waited.is_err(),
        "a second leader while the first holds the lock"
    );
    drop(first);
    tokio::time::timeout(std::time::Duration::from_secs(30), second)
        .await
        .expect("the second takes over")
        .unwrap();
    PgStore::drop_schema(&url, &schema).await.unwrap();
}

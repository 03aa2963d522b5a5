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

//! `SqliteStore` against the conformance suite, plus durability across reopen.

use serde_json::json;
use tessera_store::{Key, SqliteStore, Store};

async fn sqlite() -> Option<(SqliteStore, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path().join("data")).unwrap();
    Some((s, dir))
}

tessera_store::conformance_tests!(sqlite);

#[tokio::test]
async fn reopen_keeps_objects_and_revision() {
    let dir = tempfile::tempdir().unwrap();
    let (o, rev) = {
        let s = SqliteStore::open(dir.path()).unwrap();
        let o = s
            .create(Key::new("job", "t", "a"), json!({"x": 1}))
            .await
            .unwrap();
        (o, s.revision().await.unwrap())
    };
    let s = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(s.get(&o.key()).await.unwrap().unwrap(), o);
    assert_eq!(s.revision().await.unwrap(), rev);
    let o2 = s.create(Key::new("job", "t", "b"), json!(2)).await.unwrap();
    assert_eq!(o2.version, rev + 1);
}

/// A store compacted through its latest revision reopens at that revision (the
/// revision does not come from the change log alone).
#[tokio::test]
async fn reopen_after_compacting_everything_keeps_the_revision() {
    let dir = tempfile::tempdir().unwrap();
    let rev = {
        let s = SqliteStore::open(dir.path()).unwrap();
        for i in 0..3 {
            s.create(Key::new("job", "t", format!("j{i}")), json!(i))
                .await
                .unwrap();
        }
        let rev = s.revision().await.unwrap();
        assert_eq!(s.compact(rev).await.unwrap(), rev);
        rev
    };
    let s = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(s.revision().await.unwrap(), rev);
    assert_eq!(s.compacted().await.unwrap(), rev);
    let o = s
        .create(Key::new("job", "t", "next"), json!(0))
        .await
        .unwrap();
    assert_eq!(o.version, rev + 1);
}

//! Xid and ECC events from (fake) NVML reach the node's fault watcher, and are
//! judged: a task's own fault or a GPU to stop placing work on.

use std::time::Duration;

use tessera_gpushare::fake::{self, FakeDriver};
use tessera_gpushare::health::{FaultKind, FaultWatcher, Verdict, classify};

#[test]
fn xid_and_ecc_events_reach_the_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let build = match fake::build(&dir.path().join("fake"), &[]) {
        Ok(b) => b,
        Err(e @ fake::FakeError::NoCompiler(_)) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let _one = fake::exclusive();
    let state = dir.path().join("dev.state");
    FakeDriver::load(&build).unwrap().attach(&state).unwrap();
    let mut w = FaultWatcher::open_library(&build.lib, &[0]).unwrap();
    assert_eq!(
        w.next(Duration::from_millis(20)).unwrap(),
        None,
        "nothing yet"
    );
    // Another process (a task, the driver) raises them.
    let o = build
        .probe(
            None,
            None,
            Some(&state),
            &["event", "8", "79", "event", "8", "31", "event", "2", "0"],
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut got = Vec::new();
    while let Some(f) = w.next(Duration::from_secs(5)).unwrap() {
        assert_eq!(f.device_index, 0);
        assert!(
            f.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")),
            "{f:?}"
        );
        got.push(f.kind);
        if got.len() == 3 {
            break;
        }
    }
    assert_eq!(
        got,
        [
            FaultKind::Xid(Some(79)),
            FaultKind::Xid(Some(31)),
            FaultKind::DoubleBitEcc
        ]
    );
    let verdicts: Vec<bool> = got
        .iter()
        .map(|k| matches!(classify(k), Verdict::GpuUnhealthy { .. }))
        .collect();
    assert_eq!(verdicts, [true, false, true]);
}

//! Compute time slicing through the interposer on the fake driver's simulated
//! device, with this test process as the node's monitor.

mod common;

use common::*;
use tessera_gpushare::fake::{ShareScenario, run_share_scenario};

#[test]
fn smoke_shares() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("shares");
    let o = run_share_scenario(f, &interposer(), &dir, &ShareScenario::default()).unwrap();
    println!("{o:?}");
}

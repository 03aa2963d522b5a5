//! Memory caps through the interposer on the fake driver: across processes,
//! children, shells and re-execs; over the cap fails or waits; dead processes
//! give their memory back.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn smoke() {
    let Some(f) = fake_build() else { return };
    let dir = workdir("smoke");
    let (rp, _r) = region(&dir, "smoke", 64 * MIB, 1000, Duration::ZERO);
    let o = run(f.probe(Some(&interposer()), Some(&rp), None, &["init", "alloc", "40M", "alloc", "40M", "info", "free", "0", "alloc", "40M"]));
    println!("{:?}\n{}", stdout(&o), stderr(&o));
}

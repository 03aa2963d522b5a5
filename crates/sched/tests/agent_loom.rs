//! Model checking of the binder protocol with loom. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p tessera-sched --release --test agent_loom`.
//! Without `--cfg loom` this file is empty.
#![cfg(loom)]

use loom::thread;
use tessera_sched::agent::{
    AgentConfig, AgentScheduler, AgentTask, Bound, CommitError, Demand, FixedClock, NodePhase,
    NodeTable, Owner, ShardMode, TenantId,
};

fn node(cpu: u64) -> Demand {
    Demand {
        cpu_milli: cpu,
        memory: 100,
        gpu_milli: 0,
        pods: 100,
    }
}

fn table(nodes: &[u64]) -> &'static NodeTable {
    let phases = vec![NodePhase::InUse(Owner::Agent); nodes.len()];
    Box::leak(Box::new(NodeTable::new(
        nodes.iter().map(|c| node(*c)).collect(),
        &phases,
    )))
}

/// The bare protocol: read, commit at the read version, re-read on conflict.
fn bind(t: &NodeTable, nodes: u32, d: Demand) -> Option<u32> {
    for _ in 0..4 {
        let mut stale = false;
        for n in 0..nodes {
            let r = t.read(n).unwrap();
            if !d.fits_in(&r.free) {
                continue;
            }
            match t.try_commit(n, r.version, &d, Owner::Agent, ShardMode::Hard) {
                Ok(_) => return Some(n),
                Err(CommitError::Stale) => stale = true,
                Err(_) => {}
            }
        }
        if !stale {
            return None;
        }
        loom::thread::yield_now();
    }
    None
}

#[test]
fn two_binders_one_node_room_for_one() {
    loom::model(|| {
        let t = table(&[10]);
        let d = Demand::new(10, 1);
        let h = thread::spawn(move || bind(t, 1, d));
        let a = bind(t, 1, d);
        let b = h.join().unwrap();
        // Exactly one wins; the node is full, never below zero.
        assert_eq!(a.is_some() as u32 + b.is_some() as u32, 1);
        assert_eq!(t.read(0).unwrap().free.cpu_milli, 0);
    });
}

#[test]
fn two_binders_two_nodes_both_bound_apart() {
    loom::model(|| {
        let t = table(&[10, 10]);
        let d = Demand::new(10, 1);
        let h = thread::spawn(move || bind(t, 2, d));
        let a = bind(t, 2, d);
        let b = h.join().unwrap();
        let (a, b) = (a.expect("room for both"), b.expect("room for both"));
        assert_ne!(a, b, "both tasks on one node of room for one");
        assert_eq!(t.read(0).unwrap().free.cpu_milli, 0);
        assert_eq!(t.read(1).unwrap().free.cpu_milli, 0);
    });
}

#[test]
fn hand_over_races_a_commit() {
    loom::model(|| {
        let t = table(&[10]);
        let d = Demand::new(5, 1);
        let r = t.read(0).unwrap();
        let h = thread::spawn(move || t.set_phase(0, NodePhase::ToRemove(Owner::Agent)));
        let res = t.try_commit(0, r.version, &d, Owner::Agent, ShardMode::Hard);
        h.join().unwrap();
        let after = t.read(0).unwrap();
        // Either the commit came first (and the hand-over after it), or it was refused.
        match res {
            Ok(_) => assert_eq!(after.free.cpu_milli, 5),
            Err(e) => {
                assert!(matches!(e, CommitError::Stale | CommitError::Denied));
                assert_eq!(after.free.cpu_milli, 10);
            }
        }
        assert_eq!(after.phase, NodePhase::ToRemove(Owner::Agent));
    });
}

/// Two full workers over every node of `t`, one attempt per task allowed,
/// `tasks` tasks of 10 cores each, `steps` steps each (enough for every task to
/// be tried). Returns the scheduler and every binding.
fn two_workers(
    t: &'static NodeTable,
    tasks: u64,
    steps: usize,
) -> (loom::sync::Arc<AgentScheduler<'static>>, Vec<Bound>) {
    let mut cfg = AgentConfig::new();
    cfg.batch = 1;
    cfg.queue.max_attempts = 1;
    let nodes = (0..t.len() as u32).collect();
    let s = loom::sync::Arc::new(AgentScheduler::new(t, cfg, nodes, vec![]));
    let list: Vec<AgentTask> = (0..tasks)
        .map(|i| AgentTask::new(i, TenantId(0), Demand::new(10, 1)))
        .collect();
    s.submit(&list);
    let work = move |s: &AgentScheduler<'static>, id: usize| {
        let mut w = s.worker(id, 2);
        let mut out = Vec::new();
        for _ in 0..steps {
            s.step(&mut w, &FixedClock(0), &mut out);
        }
        out
    };
    let s2 = s.clone();
    let h = thread::spawn(move || work(&s2, 1));
    let mut all = work(&s, 0);
    all.extend(h.join().unwrap());
    (s, all)
}

#[test]
fn two_workers_share_queue_and_nodes() {
    // The whole worker step (queue lock, selection, binder, requeue) is a large
    // state space; bound preemptions to keep the check to seconds. The bare
    // protocol above is checked without a bound.
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let t = table(&[10, 10]);
        let (s, all) = two_workers(t, 3, 3);
        // Room for two: never more, never a task twice, never one node twice.
        assert!(all.len() <= 2);
        let mut ids: Vec<u64> = all.iter().map(|b| b.task.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all.len());
        let mut nodes: Vec<u32> = all.iter().map(|b| b.node).collect();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), all.len());
        // Whatever was not bound is still queued somewhere, nothing lost.
        assert_eq!(all.len() + s.with_queue(|q| q.len()), 3);
        for n in 0..2 {
            let free = t.read(n).unwrap().free.cpu_milli;
            let used = all.iter().filter(|b| b.node == n).count() as u64 * 10;
            assert_eq!(free + used, 10);
        }
    });
}

#[test]
fn contention_is_not_lack_of_room() {
    // One node with room for both tasks. In the interleavings where one
    // worker selects while the other holds the node's write lock, the first
    // finds no candidate; that must not count as a failed attempt (one is
    // enough to make a task unschedulable here).
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let (s, all) = two_workers(table(&[20]), 2, 2);
        assert_eq!(
            s.queue_lens().unschedulable,
            0,
            "a task that fits was given up"
        );
        assert!(all.len() <= 2);
    });
}

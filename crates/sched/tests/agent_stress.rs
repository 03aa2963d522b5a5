//! All workers hammering few nodes: no node over-committed, every task bound at
//! most once, and every task that fits bound exactly once. Threads, no timing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tessera_sched::agent::{
    AgentConfig, AgentScheduler, AgentTask, Bound, Clock, Demand, NodePhase, NodeTable, Owner,
    ShardMode, TenantId,
};

struct Tick(AtomicU64);
impl Clock for Tick {
    fn now_ns(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

fn tasks(n: u64, cpu: u64) -> Vec<AgentTask> {
    (0..n)
        .map(|i| {
            let mut t = AgentTask::new(i, TenantId((i % 3) as u32), Demand::new(cpu, 1));
            t.priority = (i % 2) as i32;
            t
        })
        .collect()
}

fn run(nodes: usize, node_cpu: u64, n_tasks: u64, workers: usize) -> (NodeTable, Vec<Bound>, u64) {
    let alloc = vec![
        Demand {
            cpu_milli: node_cpu,
            memory: 1 << 40,
            gpu_milli: 0,
            pods: 1 << 20,
        };
        nodes
    ];
    let phases = vec![NodePhase::InUse(Owner::Agent); nodes];
    let table = NodeTable::new(alloc, &phases);
    let mut cfg = AgentConfig::new();
    cfg.batch = 4;
    cfg.queue.backoff_base_ns = 1;
    cfg.queue.backoff_max_ns = 4;
    cfg.queue.max_attempts = 3;
    let conflicts;
    let bound: Vec<Bound> = {
        let sched = AgentScheduler::new(&table, cfg, (0..nodes as u32).collect(), vec![]);
        sched.submit(&tasks(n_tasks, 100));
        let clock = Tick(AtomicU64::new(0));
        let res = sched.run_threads(workers, &clock, &|| true, 0);
        conflicts = res.iter().map(|(w, _)| w.stats.conflicts).sum();
        res.into_iter().flat_map(|(_, b)| b).collect()
    };
    (table, bound, conflicts)
}

fn check(table: &NodeTable, bound: &[Bound], node_cpu: u64) {
    let ids: BTreeSet<u64> = bound.iter().map(|b| b.task.id).collect();
    assert_eq!(ids.len(), bound.len(), "a task was bound twice");
    for n in 0..table.len() as u32 {
        let used: u64 = bound
            .iter()
            .filter(|b| b.node == n)
            .map(|b| b.task.demand.cpu_milli)
            .sum();
        assert!(
            used <= node_cpu,
            "node {n} over-committed: {used} > {node_cpu}"
        );
        let r = table.read(n).unwrap();
        assert_eq!(
            r.free.cpu_milli,
            node_cpu - used,
            "node {n}: table and bindings disagree"
        );
    }
}

#[test]
fn everything_fits_every_task_bound_once() {
    for workers in [1, 2, 4] {
        let (table, bound, _) = run(2, 100_000, 1_500, workers);
        check(&table, &bound, 100_000);
        assert_eq!(bound.len(), 1_500, "{workers} workers");
    }
}

#[test]
fn more_tasks_than_room_fills_exactly() {
    for workers in [2, 4] {
        // Two nodes of 25 cores, 0.1 core per task: room for exactly 500.
        let (table, bound, _) = run(2, 25_000, 800, workers);
        check(&table, &bound, 25_000);
        assert_eq!(bound.len(), 500, "{workers} workers");
    }
}

#[test]
fn hand_over_during_binding_is_respected() {
    // One worker thread binds while another flips node 0 between agent and batch
    // phases. Every binding on node 0 must have happened while the node was in use
    // by the agent scheduler; we check it through the version sequence: the binder
    // refuses in any other phase, so the free capacity only drops by agent tasks,
    // and batch's attempts on node 0 are refused while it is agent-owned.
    let alloc = vec![
        Demand {
            cpu_milli: 1_000_000,
            memory: 1 << 40,
            gpu_milli: 0,
            pods: 1 << 20,
        };
        2
    ];
    let table = NodeTable::new(alloc, &[NodePhase::InUse(Owner::Agent); 2]);
    let cfg = AgentConfig::new();
    let sched = AgentScheduler::new(&table, cfg, vec![0, 1], vec![]);
    sched.submit(&tasks(2_000, 100));
    let done = AtomicBool::new(false);
    let clock = Tick(AtomicU64::new(0));
    let batch_wins = AtomicU64::new(0);
    let bound = std::thread::scope(|s| {
        let flipper = s.spawn(|| {
            let d = Demand::new(0, 0);
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) {
                let p = match i % 3 {
                    0 => NodePhase::ToRemove(Owner::Agent),
                    1 => NodePhase::ToAdd(Owner::Batch),
                    _ => NodePhase::InUse(Owner::Agent),
                };
                table.set_phase(0, p);
                // Batch in hard mode may bind on node 0 only when it owns it: never here.
                if table.commit(0, &d, Owner::Batch, ShardMode::Hard).is_ok() {
                    batch_wins.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
                std::thread::yield_now();
            }
        });
        let res = sched.run_threads(1, &clock, &|| true, 0);
        done.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        res.into_iter().flat_map(|(_, b)| b).collect::<Vec<_>>()
    });
    assert_eq!(batch_wins.load(Ordering::Relaxed), 0);
    assert_eq!(bound.len(), 2_000);
    check(&table, &bound, 1_000_000);
}

#[test]
fn tiny_nodes_many_rounds() {
    // Room for two tasks per node, more tasks than room, workers on every core:
    // the last free slot of a node is contended in every round.
    // (Checked to fail within these rounds when the binder ignores the version it
    // was given and does not re-check the fit.)
    let mut conflicts = 0;
    for _ in 0..300 {
        let (table, bound, c) = run(2, 200, 6, 3);
        check(&table, &bound, 200);
        assert_eq!(bound.len(), 4);
        conflicts += c;
    }
    eprintln!("conflicts over 300 rounds: {conflicts}");
}

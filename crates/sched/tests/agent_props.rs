//! Invariants of the agent scheduler's pure parts, by property testing.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessera_sched::agent::{
    Access, AgentQueue, AgentTask, ControllerState, Cursor, Demand, NodePhase, NodeTable, Owner,
    SelectConfig, ShardLoad, ShardMode, ShardTable, TenantId, decide, default_policies,
};

fn task(id: u64, tenant: u32, prio: i32) -> AgentTask {
    let mut t = AgentTask::new(id, TenantId(tenant), Demand::new(10, 10));
    t.priority = prio;
    t
}

proptest! {
    /// Every task pushed comes out exactly once; priorities never invert; within a
    /// priority a tenant never gets two turns in a row while another waits.
    #[test]
    fn queue_is_fair_and_loses_nothing(spec in prop::collection::vec((0u32..4, -1i32..2), 0..200)) {
        let mut q = AgentQueue::default();
        for (i, (ten, p)) in spec.iter().enumerate() {
            q.push(task(i as u64, *ten, *p));
        }
        let out: Vec<AgentTask> = std::iter::from_fn(|| q.pop()).collect();
        prop_assert_eq!(out.len(), spec.len());
        let ids: BTreeSet<u64> = out.iter().map(|t| t.id).collect();
        prop_assert_eq!(ids.len(), spec.len());
        for w in out.windows(2) {
            prop_assert!(w[0].priority >= w[1].priority);
        }
        // Fairness: count of each tenant's tasks still waiting in the same band.
        let mut left: BTreeMap<(i32, u32), usize> = BTreeMap::new();
        for t in &out { *left.entry((t.priority, t.tenant.0)).or_default() += 1; }
        for w in out.windows(2) {
            *left.get_mut(&(w[0].priority, w[0].tenant.0)).unwrap() -= 1;
            if w[0].priority == w[1].priority && w[0].tenant == w[1].tenant {
                let others = left.iter().any(|((p, t), n)| *p == w[0].priority && *t != w[0].tenant.0 && *n > 0);
                prop_assert!(!others, "tenant {} served twice while another waited", w[0].tenant.0);
            }
        }
    }

    /// Through any sequence of rebalances and acknowledgements, no node is ever
    /// placeable by both schedulers, and a node changing hands by neither.
    #[test]
    fn hand_over_never_shares_a_node(
        n in 1usize..12,
        agent0 in 0usize..12,
        ops in prop::collection::vec((0u8..3, 0usize..12), 0..40),
    ) {
        let mut t = ShardTable::split(n, agent0.min(n));
        let cost: Vec<u64> = (0..n as u64).map(|i| (i * 7) % 5).collect();
        for (op, arg) in ops {
            match op {
                0 => { t.rebalance(arg.min(n), &cost); }
                1 => { t.ack(Owner::Batch); }
                _ => { t.ack(Owner::Agent); }
            }
            for p in t.phases() {
                for mode in [ShardMode::Hard, ShardMode::Soft] {
                    let a = p.access(Owner::Agent, mode);
                    let b = p.access(Owner::Batch, mode);
                    prop_assert!(!(a == Access::Own && b == Access::Own));
                    if mode == ShardMode::Hard {
                        prop_assert!(a == Access::Denied || b == Access::Denied);
                    }
                    if !matches!(p, NodePhase::InUse(_)) {
                        prop_assert!(a == Access::Denied && b == Access::Denied);
                    }
                }
            }
            let c = t.counts();
            prop_assert_eq!(c.agent_in_use + c.batch_in_use + c.to_agent + c.to_batch, n);
        }
        // Two rounds of acknowledgements finish every hand-over.
        for _ in 0..2 { t.ack(Owner::Batch); t.ack(Owner::Agent); }
        let c = t.counts();
        prop_assert_eq!(c.to_agent + c.to_batch, 0);
    }

    /// Candidates fit, are placeable, are at most k, and come best first.
    #[test]
    fn candidates_are_feasible(
        free in prop::collection::vec(0u64..2_000, 1..40),
        own_mask in prop::collection::vec(any::<bool>(), 40),
        need in 1u64..1_500,
        k in 1usize..5,
        scan in 1usize..10,
        start in 0usize..40,
        soft in any::<bool>(),
    ) {
        let n = free.len();
        let alloc: Vec<Demand> = free.iter().map(|c| Demand { cpu_milli: *c, memory: 100, gpu_milli: 0, pods: 10 }).collect();
        let phases: Vec<NodePhase> = (0..n).map(|i| NodePhase::InUse(if own_mask[i] { Owner::Agent } else { Owner::Batch })).collect();
        let table = NodeTable::new(alloc, &phases);
        let own: Vec<u32> = (0..n as u32).filter(|i| own_mask[*i as usize]).collect();
        let borrow: Vec<u32> = (0..n as u32).filter(|i| !own_mask[*i as usize]).collect();
        let mode = if soft { ShardMode::Soft } else { ShardMode::Hard };
        let cfg = SelectConfig { k, scan, mode, ..Default::default() };
        let mut cur = Cursor { own: start, borrow: start };
        let (mut found, mut out) = (Vec::new(), Vec::new());
        let d = Demand::new(need, 1);
        tessera_sched::agent::select::select(&table, &own, &borrow, &mut cur, &d, Owner::Agent, &cfg, &mut found, &mut out);
        prop_assert!(out.len() <= k);
        for c in &out {
            prop_assert!(d.fits_in(&free_of(&table, c.node)));
            prop_assert_eq!(c.borrowed, !own_mask[c.node as usize]);
            prop_assert!(soft || !c.borrowed);
        }
        for w in out.windows(2) {
            prop_assert!(w[0].borrowed <= w[1].borrowed);
            if w[0].borrowed == w[1].borrowed {
                prop_assert!(free[w[0].node as usize] >= free[w[1].node as usize]);
            }
        }
        // "No candidate" means no room anywhere it may look.
        if out.is_empty() {
            for i in &own { prop_assert!(free[*i as usize] < need); }
            if soft { for i in &borrow { prop_assert!(free[*i as usize] < need); } }
        }
    }

    /// The controller's answer respects the node-count bounds and the step limit.
    #[test]
    fn controller_respects_bounds(
        nodes in 0usize..200, alloc in 0u64..2_000_000, pending in 0u64..2_000_000, now in 0u64..20_000_000_000,
    ) {
        let pols = default_policies(200);
        let load = ShardLoad {
            agent_nodes: nodes,
            node_capacity: Demand { cpu_milli: 16_000, memory: 64 << 30, gpu_milli: 0, pods: 110 },
            agent_allocated: Demand::new(alloc, 0),
            agent_pending: Demand::new(pending, 0),
        };
        let d = decide(&pols, &load, &ControllerState { started_ns: 0, last_change_ns: Some(1) }, now);
        prop_assert!(d.desired >= 1 && d.desired <= 200);
        prop_assert!(d.desired.abs_diff(nodes) <= 8 || nodes == 0 || nodes > 200);
        if now < 5_000_000_001 { prop_assert!(d.desired >= nodes.min(200)); }
    }
}

fn free_of(t: &NodeTable, n: u32) -> Demand {
    t.read(n).unwrap().free
}

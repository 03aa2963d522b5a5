//! Where an API sandbox runs: placed by the agent scheduler (`tessera-sched`'s
//! `agent` part: its queue, candidate selection and compare-and-swap binder over
//! a shared node table) on the nodes this server runs sandboxes on — in `tessera
//! up`, the one local node, with the capacity it gives sandboxes. A placement
//! takes the sandbox's CPU and memory limits off the node's free capacity until
//! the sandbox is killed or expires; a sandbox that fits no node is refused with
//! the reason (each node's free capacity against the ask). Each call binds
//! through a short-lived scheduler over the shared table, so concurrent creates
//! race on the node's version and the binder settles them; nothing is
//! over-committed.

use std::sync::atomic::{AtomicU64, Ordering};

use tessera_sched::agent::{
    AgentConfig, AgentScheduler, AgentTask, Demand, FixedClock, NodePhase, NodeTable, Owner,
    TenantId,
};

/// The sandbox nodes and what they have free.
#[derive(Debug)]
pub struct Placer {
    names: Vec<String>,
    table: NodeTable,
    seq: AtomicU64,
}

/// A placement decision the binder committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    index: u32,
    pub demand: Demand,
    /// Candidates lost to concurrent commits before this one.
    pub conflicts: u32,
}

fn mib(b: u64) -> u64 {
    b >> 20
}

/// A node's capacity for sandboxes: CPU and memory; the number of sandboxes is
/// not bounded here (the per-tenant limit is).
pub fn capacity(cpu_milli: u64, memory: u64) -> Demand {
    Demand {
        cpu_milli,
        memory,
        gpu_milli: 0,
        pods: u64::MAX / 2,
    }
}

impl Placer {
    /// Nodes by name with the capacity each gives sandboxes.
    pub fn new(nodes: Vec<(String, Demand)>) -> Placer {
        let (names, caps): (Vec<String>, Vec<Demand>) = nodes.into_iter().unzip();
        let phases = vec![NodePhase::InUse(Owner::Agent); caps.len()];
        Placer {
            names,
            table: NodeTable::new(caps, &phases),
            seq: AtomicU64::new(1),
        }
    }

    /// Places a sandbox of `demand`, or says why no node can take it.
    pub fn place(&self, demand: Demand) -> Result<Placement, String> {
        let n = self.table.len() as u32;
        let sched = AgentScheduler::new(&self.table, AgentConfig::new(), (0..n).collect(), vec![]);
        let id = self.seq.fetch_add(1, Ordering::Relaxed);
        sched.submit(&[AgentTask::new(id, TenantId(0), demand)]);
        let mut w = sched.worker(0, 1);
        let mut out = Vec::new();
        // A lost race puts the task back at the head: a few steps settle it.
        for _ in 0..8 {
            sched.step(&mut w, &FixedClock(0), &mut out);
            if let Some(b) = out.first() {
                return Ok(Placement {
                    node: self.names[b.node as usize].clone(),
                    index: b.node,
                    demand,
                    conflicts: b.conflicts,
                });
            }
            if sched.queue_lens().active == 0 {
                break;
            }
        }
        Err(self.why_not(&demand))
    }

    /// Gives a placement's capacity back (the sandbox is gone).
    pub fn release(&self, p: &Placement) {
        self.table.release(p.index, &p.demand);
    }

    /// A node's free capacity for sandboxes.
    pub fn free(&self, node: &str) -> Option<Demand> {
        let i = self.names.iter().position(|n| n == node)?;
        self.table.read(i as u32).map(|r| r.free)
    }

    fn why_not(&self, d: &Demand) -> String {
        let nodes: Vec<String> = (0..self.table.len() as u32)
            .filter_map(|i| {
                let r = self.table.read(i)?;
                let a = self.table.allocatable(i)?;
                Some(format!(
                    "node {} has {}m CPU and {} MiB free of {}m and {} MiB",
                    self.names[i as usize],
                    r.free.cpu_milli,
                    mib(r.free.memory),
                    a.cpu_milli,
                    mib(a.memory)
                ))
            })
            .collect();
        format!(
            "no node has room for this sandbox ({}m CPU, {} MiB): {}; kill a sandbox or ask for less",
            d.cpu_milli,
            mib(d.memory),
            if nodes.is_empty() {
                "no node runs sandboxes".to_string()
            } else {
                nodes.join("; ")
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_take_capacity_and_a_full_node_refuses_with_the_reason() {
        let p = Placer::new(vec![("local".into(), capacity(2000, 1 << 30))]);
        let a = p.place(Demand::new(1000, 512 << 20)).unwrap();
        assert_eq!(a.node, "local");
        assert_eq!(
            p.free("local").map(|f| (f.cpu_milli, f.memory)),
            Some((1000, 512 << 20))
        );
        let b = p.place(Demand::new(1000, 512 << 20)).unwrap();
        let e = p.place(Demand::new(500, 256 << 20)).unwrap_err();
        assert!(
            e.contains("node local has 0m CPU and 0 MiB free of 2000m and 1024 MiB"),
            "{e}"
        );
        p.release(&a);
        assert!(p.place(Demand::new(500, 256 << 20)).is_ok());
        p.release(&b);
        assert!(Placer::new(vec![]).place(Demand::new(1, 1)).is_err());
    }

    #[test]
    fn concurrent_placements_never_overcommit() {
        let p = std::sync::Arc::new(Placer::new(vec![
            ("a".into(), capacity(4000, 4 << 30)),
            ("b".into(), capacity(4000, 4 << 30)),
        ]));
        let placed: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let p = p.clone();
                    s.spawn(move || {
                        (0..10)
                            .filter(|_| p.place(Demand::new(500, 256 << 20)).is_ok())
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // 8 sandboxes of 500m fit each node's 4000m: 16 in all, never more.
        assert_eq!(placed.iter().sum::<usize>(), 16);
        assert_eq!(p.free("a").unwrap().cpu_milli, 0);
        assert_eq!(p.free("b").unwrap().cpu_milli, 0);
    }
}

//! Agent pods (`scheduling.tessera.dev/kind: agent`) on the agent shard's nodes,
//! placed by the agent scheduler (`tessera_sched::agent`): tenant-fair queue,
//! K candidates, compare-version binder. Pure: the free capacity of each agent
//! node comes from the snapshot, and time is a fixed value.

use std::collections::BTreeMap;

use tessera_model::Resources;
use tessera_sched::agent::{
    AgentConfig, AgentScheduler, AgentTask, Bound, Demand, FixedClock, NodePhase, NodeTable, Owner,
    TenantId,
};

use crate::state::{AgentPod, PodKey};

/// Where each agent pod goes; pods that found no room are left out.
pub fn place(pods: &[AgentPod], nodes: &[(String, Resources)]) -> Vec<(PodKey, String)> {
    if pods.is_empty() || nodes.is_empty() {
        return Vec::new();
    }
    let free: Vec<Demand> = nodes.iter().map(|(_, r)| Demand::from(r)).collect();
    let phases = vec![NodePhase::InUse(Owner::Agent); free.len()];
    let table = NodeTable::new(free, &phases);
    let own: Vec<u32> = (0..nodes.len() as u32).collect();
    let sched = AgentScheduler::new(&table, AgentConfig::new(), own, Vec::new());
    let mut tenants: BTreeMap<&str, u32> = BTreeMap::new();
    let tasks: Vec<AgentTask> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let next = tenants.len() as u32;
            let t = *tenants.entry(p.tenant.as_str()).or_insert(next);
            let mut d = Demand::from(&p.request);
            d.pods = 1;
            let mut task = AgentTask::new(i as u64, TenantId(t), d);
            task.priority = p.priority;
            task
        })
        .collect();
    sched.submit(&tasks);
    let mut w = sched.worker(0, 1);
    let clock = FixedClock(0);
    let mut out: Vec<Bound> = Vec::with_capacity(pods.len());
    // Tasks without room go to back-off, which a stopped clock never releases:
    // the loop ends when the active queue is empty.
    let mut rounds = 0;
    while sched.step(&mut w, &clock, &mut out) > 0 && rounds < pods.len() * 4 + 16 {
        rounds += 1;
    }
    out.iter()
        .map(|b| {
            (
                pods[b.task.id as usize].key.clone(),
                nodes[b.node as usize].0.clone(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_within_free_capacity() {
        let pods: Vec<AgentPod> = (0..5)
            .map(|i| AgentPod {
                key: ("ns".into(), format!("a{i}")),
                request: Resources::new(1000, 1 << 30).with_pods(1),
                priority: 0,
                tenant: if i % 2 == 0 { "t1".into() } else { "t2".into() },
            })
            .collect();
        let nodes = vec![
            (
                "n1".to_string(),
                Resources::new(2000, 8 << 30).with_pods(10),
            ),
            (
                "n2".to_string(),
                Resources::new(1500, 8 << 30).with_pods(10),
            ),
        ];
        let placed = place(&pods, &nodes);
        assert_eq!(placed.len(), 3);
        let on_n1 = placed.iter().filter(|(_, n)| n == "n1").count();
        assert_eq!(on_n1, 2);
    }
}

//! The shard controller: how many nodes the agent shard should have.
//!
//! A pure function of the load and a chain of policies, in the spirit of
//! Volcano's sharding controller. Each policy sees the proposal of the policies
//! before it and may change it; the last word is the desired agent shard size,
//! which [`super::shard::ShardTable::rebalance`] turns into hand-overs.

use serde::{Deserialize, Serialize};

use super::task::Demand;

/// One policy of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Policy {
    /// Keep the agent shard's allocation rate (allocated plus pending demand over
    /// capacity, on the dominant dimension) between `low` and `high`; when it
    /// leaves the range, size the shard so that the rate becomes `target`.
    AllocationRate { low: f64, high: f64, target: f64 },
    /// Bounds on the agent shard's size.
    NodeCount { min: usize, max: usize },
    /// For `ns` after the controller starts and after each change it made, the
    /// shard may grow but not shrink (new nodes warm up; no flapping).
    WarmUp { ns: u64 },
    /// At most this many nodes change hands per round.
    MaxStep { nodes: usize },
}

/// The default chain: rate 0.5..0.85 towards 0.7, 1 node at least, a 5 s warm-up,
/// at most 8 nodes a round.
pub fn default_policies(total_nodes: usize) -> Vec<Policy> {
    vec![
        Policy::AllocationRate {
            low: 0.5,
            high: 0.85,
            target: 0.7,
        },
        Policy::NodeCount {
            min: 1.min(total_nodes),
            max: total_nodes,
        },
        Policy::WarmUp { ns: 5_000_000_000 },
        Policy::MaxStep { nodes: 8 },
    ]
}

/// What the controller reads.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ShardLoad {
    /// Nodes the agent shard has, counting hand-overs in flight towards it.
    pub agent_nodes: usize,
    /// Allocatable of one typical node (for sizing).
    pub node_capacity: Demand,
    /// Allocated to agent tasks.
    pub agent_allocated: Demand,
    /// Demand of agent tasks still waiting.
    pub agent_pending: Demand,
}

/// What the controller remembers between rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ControllerState {
    pub started_ns: u64,
    pub last_change_ns: Option<u64>,
}

/// One step of the chain's reasoning, for logs and tests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub policy: &'static str,
    pub proposal: usize,
}

/// The controller's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub desired: usize,
    pub steps: Vec<Step>,
}

fn nodes_for(demand: &Demand, node: &Demand, target: f64) -> usize {
    let per = |d: u64, n: u64| {
        if n == 0 || d == 0 {
            0.0
        } else {
            d as f64 / (n as f64 * target)
        }
    };
    let need = per(demand.cpu_milli, node.cpu_milli)
        .max(per(demand.memory, node.memory))
        .max(per(demand.gpu_milli, node.gpu_milli))
        .max(per(demand.pods, node.pods));
    need.ceil() as usize
}

/// Runs the policy chain. Pure: same inputs, same answer.
pub fn decide(
    policies: &[Policy],
    load: &ShardLoad,
    state: &ControllerState,
    now_ns: u64,
) -> Decision {
    let current = load.agent_nodes;
    let mut p = current;
    let mut steps = Vec::with_capacity(policies.len());
    for pol in policies {
        let name = match *pol {
            Policy::AllocationRate { low, high, target } => {
                let demand = load.agent_allocated.saturating_add(&load.agent_pending);
                let cap = Demand {
                    cpu_milli: load.node_capacity.cpu_milli * current as u64,
                    memory: load.node_capacity.memory * current as u64,
                    gpu_milli: load.node_capacity.gpu_milli * current as u64,
                    pods: load.node_capacity.pods * current as u64,
                };
                let rate = if current == 0 {
                    if demand == Demand::ZERO {
                        0.0
                    } else {
                        f64::INFINITY
                    }
                } else {
                    demand.share_of(&cap)
                };
                if rate > high || rate < low {
                    p = nodes_for(&demand, &load.node_capacity, target.max(0.01));
                }
                "allocation_rate"
            }
            Policy::NodeCount { min, max } => {
                p = p.clamp(min, max.max(min));
                "node_count"
            }
            Policy::WarmUp { ns } => {
                let since = state.last_change_ns.unwrap_or(state.started_ns);
                if p < current && now_ns < since.saturating_add(ns) {
                    p = current;
                }
                "warm_up"
            }
            Policy::MaxStep { nodes } => {
                p = if p > current {
                    p.min(current + nodes)
                } else {
                    p.max(current.saturating_sub(nodes))
                };
                "max_step"
            }
        };
        steps.push(Step {
            policy: name,
            proposal: p,
        });
    }
    Decision { desired: p, steps }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(nodes: usize, alloc_cpu: u64, pending_cpu: u64) -> ShardLoad {
        ShardLoad {
            agent_nodes: nodes,
            node_capacity: Demand {
                cpu_milli: 10_000,
                memory: 0,
                gpu_milli: 0,
                pods: 0,
            },
            agent_allocated: Demand::new(alloc_cpu, 0),
            agent_pending: Demand::new(pending_cpu, 0),
        }
    }

    #[test]
    fn grows_under_load_shrinks_after_warm_up() {
        let pols = default_policies(100);
        let st = ControllerState::default();
        // 4 nodes, 38 cores wanted: rate 0.95 > 0.85, target 0.7 -> 6 nodes.
        assert_eq!(decide(&pols, &load(4, 30_000, 8_000), &st, 0).desired, 6);
        // Within the range: no change.
        assert_eq!(decide(&pols, &load(4, 28_000, 0), &st, 0).desired, 4);
        // Idle: wants 1, but warm-up holds until 5 s after the last change.
        let st = ControllerState {
            started_ns: 0,
            last_change_ns: Some(1_000_000_000),
        };
        assert_eq!(
            decide(&pols, &load(20, 1_000, 0), &st, 2_000_000_000).desired,
            20
        );
        // After warm-up: at most 8 nodes per round.
        assert_eq!(
            decide(&pols, &load(20, 1_000, 0), &st, 7_000_000_000).desired,
            12
        );
    }

    #[test]
    fn bounds_hold() {
        let pols = [
            Policy::AllocationRate {
                low: 0.1,
                high: 0.2,
                target: 0.15,
            },
            Policy::NodeCount { min: 2, max: 5 },
        ];
        let st = ControllerState::default();
        assert_eq!(decide(&pols, &load(3, 1_000_000, 0), &st, 0).desired, 5);
        assert_eq!(decide(&pols, &load(0, 0, 0), &st, 0).desired, 2);
    }
}

//! Node shards and the hand-over of a node from one scheduler to the other.
//!
//! Every node belongs to the batch scheduler or to the agent scheduler. A node
//! changes hands in three steps, as Volcano's `NodeShard` does (`nodesInUse`,
//! `nodesToRemove`, `nodesToAdd`):
//!
//! ```text
//! InUse(from) --begin_move--> ToRemove(from) --ack by `from`--> ToAdd(to) --ack by `to`--> InUse(to)
//! ```
//!
//! While a node is `ToRemove` or `ToAdd` *nobody* places on it, in either mode, so
//! the two schedulers can never both place on a node that is changing hands. The
//! old owner acknowledges the removal only once it can no longer bind there (its
//! in-flight bindings are checked against the phase under the node's lock, see
//! [`super::table`]), and the new owner starts using it only after its own
//! acknowledgement. Pure: a table of phases and transitions.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One of the two schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Owner {
    Batch,
    Agent,
}

impl Owner {
    pub fn other(self) -> Owner {
        match self {
            Owner::Batch => Owner::Agent,
            Owner::Agent => Owner::Batch,
        }
    }
}

/// Whether a scheduler may only place on its own shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardMode {
    /// Only on its own shard.
    #[default]
    Hard,
    /// Prefers its own shard, may borrow nodes the other scheduler holds in use.
    Soft,
}

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodePhase {
    /// Held by this scheduler.
    InUse(Owner),
    /// Leaving this scheduler; waits for its acknowledgement.
    ToRemove(Owner),
    /// Joining this scheduler; waits for its acknowledgement.
    ToAdd(Owner),
}

/// What a scheduler may do with a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Own,
    Borrow,
    Denied,
}

impl NodePhase {
    /// Whether `by` may place on a node in this phase, in `mode`.
    #[inline]
    pub fn access(self, by: Owner, mode: ShardMode) -> Access {
        match self {
            NodePhase::InUse(o) if o == by => Access::Own,
            NodePhase::InUse(_) if mode == ShardMode::Soft => Access::Borrow,
            _ => Access::Denied,
        }
    }

    /// A small number, for storing the phase in an atomic.
    pub fn encode(self) -> u32 {
        let o = |o: Owner| match o {
            Owner::Batch => 0,
            Owner::Agent => 1,
        };
        match self {
            NodePhase::InUse(x) => o(x),
            NodePhase::ToRemove(x) => 2 + o(x),
            NodePhase::ToAdd(x) => 4 + o(x),
        }
    }

    pub fn decode(v: u32) -> NodePhase {
        let o = if v & 1 == 0 {
            Owner::Batch
        } else {
            Owner::Agent
        };
        match v / 2 {
            0 => NodePhase::InUse(o),
            1 => NodePhase::ToRemove(o),
            _ => NodePhase::ToAdd(o),
        }
    }
}

/// A transition that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandOverError {
    #[error("node {node} does not exist (the table has {len} nodes)")]
    NoSuchNode { node: u32, len: usize },
    #[error(
        "node {node} is {phase:?}; only a node in use by the other scheduler can move to {to:?}"
    )]
    NotMovable {
        node: u32,
        phase: NodePhase,
        to: Owner,
    },
}

/// The phase of every node, by index.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShardTable {
    phases: Vec<NodePhase>,
}

/// How many nodes are in each phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShardCounts {
    pub batch_in_use: usize,
    pub agent_in_use: usize,
    /// Leaving batch, or joining agent.
    pub to_agent: usize,
    /// Leaving agent, or joining batch.
    pub to_batch: usize,
}

impl ShardTable {
    pub fn new(phases: Vec<NodePhase>) -> Self {
        ShardTable { phases }
    }

    /// The first `agent` nodes to the agent scheduler, the rest to batch.
    pub fn split(nodes: usize, agent: usize) -> Self {
        ShardTable {
            phases: (0..nodes)
                .map(|i| {
                    NodePhase::InUse(if i < agent {
                        Owner::Agent
                    } else {
                        Owner::Batch
                    })
                })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.phases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.phases.is_empty()
    }

    pub fn phase(&self, node: u32) -> Option<NodePhase> {
        self.phases.get(node as usize).copied()
    }

    pub fn phases(&self) -> &[NodePhase] {
        &self.phases
    }

    /// Starts moving `node` to `to`: it must be in use by the other scheduler.
    pub fn begin_move(&mut self, node: u32, to: Owner) -> Result<(), HandOverError> {
        let len = self.phases.len();
        let p = self
            .phases
            .get_mut(node as usize)
            .ok_or(HandOverError::NoSuchNode { node, len })?;
        if *p != NodePhase::InUse(to.other()) {
            return Err(HandOverError::NotMovable {
                node,
                phase: *p,
                to,
            });
        }
        *p = NodePhase::ToRemove(to.other());
        Ok(())
    }

    /// Scheduler `by` acknowledges: nodes leaving it become `ToAdd` for the other
    /// one, nodes joining it become `InUse` by it. Returns the nodes that changed,
    /// with their new phase, in index order.
    pub fn ack(&mut self, by: Owner) -> Vec<(u32, NodePhase)> {
        let mut changed = Vec::new();
        for (i, p) in self.phases.iter_mut().enumerate() {
            let next = match *p {
                NodePhase::ToRemove(o) if o == by => NodePhase::ToAdd(by.other()),
                NodePhase::ToAdd(o) if o == by => NodePhase::InUse(by),
                _ => continue,
            };
            *p = next;
            changed.push((i as u32, next));
        }
        changed
    }

    /// Nodes in use by `o`, in index order.
    pub fn in_use(&self, o: Owner) -> Vec<u32> {
        self.phases
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == NodePhase::InUse(o))
            .map(|(i, _)| i as u32)
            .collect()
    }

    pub fn counts(&self) -> ShardCounts {
        let mut c = ShardCounts::default();
        for p in &self.phases {
            match p {
                NodePhase::InUse(Owner::Batch) => c.batch_in_use += 1,
                NodePhase::InUse(Owner::Agent) => c.agent_in_use += 1,
                NodePhase::ToRemove(Owner::Batch) | NodePhase::ToAdd(Owner::Agent) => {
                    c.to_agent += 1
                }
                NodePhase::ToRemove(Owner::Agent) | NodePhase::ToAdd(Owner::Batch) => {
                    c.to_batch += 1
                }
            }
        }
        c
    }

    /// Nodes the agent shard will have once every hand-over completes.
    pub fn agent_target(&self) -> usize {
        let c = self.counts();
        c.agent_in_use + c.to_agent
    }

    /// Starts the moves that bring the agent shard to `desired` nodes (counting
    /// hand-overs in flight). `cost[i]` is what moving node `i` disturbs (lower
    /// moves first; ties by index). Returns the nodes that started to move.
    pub fn rebalance(&mut self, desired: usize, cost: &[u64]) -> Vec<(u32, Owner)> {
        let target = self.agent_target();
        let (from, to, n) = if desired > target {
            (Owner::Batch, Owner::Agent, desired - target)
        } else if desired < target {
            (Owner::Agent, Owner::Batch, target - desired)
        } else {
            return Vec::new();
        };
        let mut pick: Vec<(u64, u32)> = self
            .in_use(from)
            .into_iter()
            .map(|i| (cost.get(i as usize).copied().unwrap_or(u64::MAX), i))
            .collect();
        pick.sort_unstable();
        let mut moved = Vec::new();
        for (_, i) in pick.into_iter().take(n) {
            if self.begin_move(i, to).is_ok() {
                moved.push((i, to));
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_codes_round_trip() {
        for o in [Owner::Batch, Owner::Agent] {
            for p in [
                NodePhase::InUse(o),
                NodePhase::ToRemove(o),
                NodePhase::ToAdd(o),
            ] {
                assert_eq!(NodePhase::decode(p.encode()), p);
            }
        }
    }

    #[test]
    fn hand_over_takes_two_acks() {
        let mut t = ShardTable::split(3, 1);
        assert_eq!(t.rebalance(2, &[0, 5, 1]), vec![(2, Owner::Agent)]);
        assert_eq!(t.phase(2), Some(NodePhase::ToRemove(Owner::Batch)));
        // The agent scheduler acknowledging first changes nothing.
        assert!(t.ack(Owner::Agent).is_empty());
        assert_eq!(
            t.ack(Owner::Batch),
            vec![(2, NodePhase::ToAdd(Owner::Agent))]
        );
        for o in [Owner::Batch, Owner::Agent] {
            for m in [ShardMode::Hard, ShardMode::Soft] {
                assert_eq!(t.phase(2).unwrap().access(o, m), Access::Denied);
            }
        }
        assert_eq!(
            t.ack(Owner::Agent),
            vec![(2, NodePhase::InUse(Owner::Agent))]
        );
        assert_eq!(t.counts().agent_in_use, 2);
        assert!(t.begin_move(2, Owner::Agent).is_err());
        assert!(t.begin_move(9, Owner::Agent).is_err());
    }
}

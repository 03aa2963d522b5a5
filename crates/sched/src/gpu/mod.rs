//! Device selection on one node: which GPUs a task gets.
//!
//! The batch session keeps one [`NodeGpus`] per node and asks it, for a task
//! that passed the node-level checks, for concrete GPU indices.

pub mod frag;
pub mod policy;

pub use frag::{TypicalPod, Workload};
pub use policy::{GpuCluster, NodeState, Placement, PodShape, Policy, RandomSource};

use tessera_model::{GpuRequest, Node};

/// The state of one GPU during a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlot {
    pub index: u32,
    pub model: String,
    /// Milli-GPU still free (1000 = untouched).
    pub free_milli: u32,
    /// Bytes of device memory still free.
    pub free_memory: u64,
    /// Bytes of device memory in total.
    pub memory: u64,
}

/// The GPUs of one node and what is free on each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeGpus {
    pub slots: Vec<GpuSlot>,
}

impl NodeGpus {
    /// Builds the device view of a node. A node that only states a GPU count
    /// (`allocatable.gpu_milli` without `gpus`) gets anonymous devices.
    pub fn from_node(node: &Node) -> Self {
        if !node.gpus.is_empty() {
            let slots = node
                .gpus
                .iter()
                .map(|g| GpuSlot {
                    index: g.index,
                    model: g.model.clone(),
                    free_milli: 1000,
                    free_memory: g.memory,
                    memory: g.memory,
                })
                .collect();
            return NodeGpus { slots };
        }
        let n = u32::try_from(node.allocatable.gpu_milli / 1000).unwrap_or(u32::MAX);
        let per_gpu_mem = node
            .allocatable
            .gpu_memory
            .checked_div(u64::from(n))
            .unwrap_or(0);
        let model = node
            .labels
            .get("nvidia.com/gpu.product")
            .cloned()
            .unwrap_or_default();
        NodeGpus {
            slots: (0..n)
                .map(|index| GpuSlot {
                    index,
                    model: model.clone(),
                    free_milli: 1000,
                    free_memory: per_gpu_mem,
                    memory: per_gpu_mem,
                })
                .collect(),
        }
    }

    /// Number of GPUs with nothing allocated on them.
    pub fn whole_free(&self) -> u32 {
        self.slots.iter().filter(|s| s.free_milli == 1000).count() as u32
    }

    fn model_ok(slot: &GpuSlot, models: &[String]) -> bool {
        models.is_empty() || models.contains(&slot.model)
    }

    /// Chooses GPUs for `req`, or `None` if this node cannot hold it.
    /// Whole GPUs: the lowest free indices. A shared GPU: the fullest GPU that still
    /// fits (best fit), so that whole GPUs stay whole.
    pub fn select(&self, req: &GpuRequest) -> Option<Vec<u32>> {
        match req {
            GpuRequest::None => Some(Vec::new()),
            GpuRequest::Whole { count, models } => {
                let picked: Vec<u32> = self
                    .slots
                    .iter()
                    .filter(|s| s.free_milli == 1000 && Self::model_ok(s, models))
                    .take(*count as usize)
                    .map(|s| s.index)
                    .collect();
                (picked.len() == *count as usize).then_some(picked)
            }
            GpuRequest::Shared {
                milli,
                memory,
                models,
            } => self
                .slots
                .iter()
                .filter(|s| {
                    s.free_milli >= *milli && s.free_memory >= *memory && Self::model_ok(s, models)
                })
                .min_by_key(|s| (s.free_milli, s.index))
                .map(|s| vec![s.index]),
        }
    }

    /// Records that `req` holds the GPUs `indices`. Returns false (and changes
    /// nothing) when they are not free enough: the caller's accounting is wrong.
    pub fn assign(&mut self, req: &GpuRequest, indices: &[u32]) -> bool {
        let (milli, mem) = per_gpu(req);
        let ok = indices.iter().all(|i| {
            self.slots
                .iter()
                .find(|s| s.index == *i)
                .is_some_and(|s| s.free_milli >= milli && s.free_memory >= mem)
        });
        if !ok {
            return false;
        }
        for i in indices {
            if let Some(s) = self.slots.iter_mut().find(|s| s.index == *i) {
                s.free_milli -= milli;
                s.free_memory -= mem;
            }
        }
        true
    }

    /// Gives back what `req` held on `indices`.
    pub fn release(&mut self, req: &GpuRequest, indices: &[u32]) {
        let (milli, mem) = per_gpu(req);
        for i in indices {
            if let Some(s) = self.slots.iter_mut().find(|s| s.index == *i) {
                s.free_milli = (s.free_milli + milli).min(1000);
                s.free_memory = (s.free_memory + mem).min(s.memory);
            }
        }
    }
}

/// What a request takes from each GPU it is given: (milli-GPU, bytes of memory).
fn per_gpu(req: &GpuRequest) -> (u32, u64) {
    match req {
        GpuRequest::None => (0, 0),
        GpuRequest::Whole { .. } => (1000, 0),
        GpuRequest::Shared { milli, memory, .. } => (*milli, *memory),
    }
}

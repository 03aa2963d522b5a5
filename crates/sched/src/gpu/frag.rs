//! GPU fragmentation as the FGD paper (Weng et al., USENIX ATC'23) defines it.
//!
//! A node's idle GPU capacity is *fragmented* for a task when the task cannot use
//! it: the node lacks CPU, the GPU model is wrong, too few GPUs are free enough, or
//! (when the task fits) the GPUs whose free share is below what the task needs per
//! GPU. The fragmentation of a node is the expectation of that amount over a
//! *target workload*: a distribution of typical task shapes. FGD places each task
//! where the expected fragmentation grows least.
//!
//! The amounts are in milli-GPU. Everything here is pure arithmetic on a
//! [`NodeState`]; callers own the state and the workload.

use super::policy::{NodeState, PodShape};

/// One typical task shape and its share of the workload. A shape with `mem > 0`
/// makes memory count too: a node without that much memory left cannot take it
/// (the FGD paper's definition looks at CPU and GPU only; its typical pods have
/// `mem == 0`).
#[derive(Debug, Clone, PartialEq)]
pub struct TypicalPod {
    pub shape: PodShape,
    /// Probability in the target workload (the shares of a workload sum to 1).
    pub share: f64,
}

/// Typical pods with the same GPU shape, their CPU thresholds sorted ascending.
#[derive(Debug, Clone)]
struct Group {
    milli: u32,
    num: u32,
    models: u64,
    /// (cpu milli, cumulative share of the pods up to and including this one).
    cpu_cum: Vec<(i64, f64)>,
    /// (cpu milli, memory, share) when some typical pod of the group asks for
    /// memory; then the CPU-only prefix sums do not apply.
    cpu_mem: Vec<(i64, i64, f64)>,
    total: f64,
}

/// The target workload, compiled for fast evaluation.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    pods: Vec<TypicalPod>,
    /// Share of typical pods that ask for no GPU: for them, all idle GPU capacity
    /// of any node counts as fragmented (the FGD simulator's definition).
    no_gpu_share: f64,
    groups: Vec<Group>,
}

impl Workload {
    /// Compiles typical pods. Shares are used as given (callers normalise).
    pub fn new(pods: Vec<TypicalPod>) -> Self {
        let mut no_gpu_share = 0.0;
        let mut groups: Vec<Group> = Vec::new();
        for t in &pods {
            if t.shape.milli == 0 || t.shape.num_gpu == 0 {
                no_gpu_share += t.share;
                continue;
            }
            let key = (t.shape.milli, t.shape.num_gpu, t.shape.models);
            let g = match groups
                .iter_mut()
                .find(|g| (g.milli, g.num, g.models) == key)
            {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        milli: key.0,
                        num: key.1,
                        models: key.2,
                        cpu_cum: Vec::new(),
                        cpu_mem: Vec::new(),
                        total: 0.0,
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            g.cpu_cum.push((t.shape.cpu, t.share));
            g.cpu_mem.push((t.shape.cpu, t.shape.mem, t.share));
            g.total += t.share;
        }
        for g in &mut groups {
            if g.cpu_mem.iter().all(|c| c.1 <= 0) {
                g.cpu_mem.clear();
            }
            g.cpu_cum.sort_by_key(|c| c.0);
            let mut acc = 0.0;
            for c in &mut g.cpu_cum {
                acc += c.1;
                c.1 = acc;
            }
        }
        Workload {
            pods,
            no_gpu_share,
            groups,
        }
    }

    /// The typical pods of a list of task shapes, as the FGD simulator picks
    /// them: shapes (CPU, GPU per GPU, GPU count, models) by decreasing
    /// frequency until `coverage` of the tasks is reached, shares
    /// renormalised; with `memory`, each shape also asks for the least memory
    /// its tasks ask for.
    pub fn typical(shapes: &[PodShape], coverage: f64, memory: bool) -> Self {
        use std::collections::BTreeMap;
        let mut by: BTreeMap<(i64, u32, u32, u64), (u64, PodShape)> = BTreeMap::new();
        for s in shapes {
            let e = by.entry((s.cpu, s.milli, s.num_gpu, s.models)).or_insert((
                0,
                PodShape {
                    mem: i64::MAX,
                    ..s.clone()
                },
            ));
            e.0 += 1;
            e.1.mem = e.1.mem.min(s.mem);
        }
        type Key = (i64, u32, u32, u64);
        let mut list: Vec<(Key, u64, PodShape)> =
            by.into_iter().map(|(k, (c, s))| (k, c, s)).collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let want = coverage * shapes.len() as f64;
        let mut cum = 0.0;
        let mut chosen = Vec::new();
        for (_, c, mut shape) in list {
            if cum >= want {
                break;
            }
            if !memory {
                shape.mem = 0;
            }
            cum += c as f64;
            chosen.push((shape, c as f64));
        }
        Workload::new(
            chosen
                .into_iter()
                .map(|(shape, c)| TypicalPod {
                    shape,
                    share: c / cum,
                })
                .collect(),
        )
    }

    pub fn pods(&self) -> &[TypicalPod] {
        &self.pods
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Expected fragmented GPU capacity of a node (milli-GPU), FGD's `F_n(M)`.
    pub fn frag(&self, node: &NodeState) -> f64 {
        self.frag_of(node.cpu_left, node.mem_left, node.model, &node.gpu_left)
    }

    /// [`Workload::frag`] on loose parts, so callers can evaluate a hypothetical
    /// state without building a node.
    pub fn frag_of(&self, cpu_left: i64, mem_left: i64, model: u16, gpu_left: &[u32]) -> f64 {
        let total: u64 = gpu_left.iter().map(|&g| u64::from(g)).sum();
        if total == 0 {
            return 0.0;
        }
        let total = total as f64;
        let mut frag = self.no_gpu_share * total;
        for g in &self.groups {
            if !model_allowed(g.models, model) {
                frag += g.total * total;
                continue;
            }
            let mut fits = 0u32;
            let mut partial = 0u64;
            for &l in gpu_left {
                if l >= g.milli {
                    fits += 1;
                } else {
                    partial += u64::from(l);
                }
            }
            if fits < g.num {
                frag += g.total * total;
                continue;
            }
            // Share of this group's pods whose CPU (and memory) fit.
            let ok = if g.cpu_mem.is_empty() {
                let idx = g.cpu_cum.partition_point(|c| c.0 <= cpu_left);
                if idx == 0 { 0.0 } else { g.cpu_cum[idx - 1].1 }
            } else {
                g.cpu_mem
                    .iter()
                    .filter(|c| c.0 <= cpu_left && c.1 <= mem_left)
                    .map(|c| c.2)
                    .sum()
            };
            frag += ok * partial as f64 + (g.total - ok) * total;
        }
        frag
    }
}

/// Whether a GPU model (by id) satisfies a model mask (0 = any model).
pub fn model_allowed(mask: u64, model: u16) -> bool {
    mask == 0 || (model < 64 && mask & (1u64 << model) != 0)
}

/// The textbook (slow) definition, one typical pod at a time; the fast path in
/// [`Workload::frag`] must agree with it.
pub fn frag_reference(pods: &[TypicalPod], node: &NodeState) -> f64 {
    let total: u64 = node.gpu_left.iter().map(|&g| u64::from(g)).sum();
    let mut frag = 0.0;
    for t in pods {
        let s = &t.shape;
        if s.milli == 0 || s.num_gpu == 0 {
            frag += t.share * total as f64;
            continue;
        }
        if !model_allowed(s.models, node.model) {
            frag += t.share * total as f64;
            continue;
        }
        let fits = node.gpu_left.iter().filter(|&&l| l >= s.milli).count() as u32;
        if fits >= s.num_gpu && node.cpu_left >= s.cpu && node.mem_left >= s.mem {
            let partial: u64 = node
                .gpu_left
                .iter()
                .filter(|&&l| l < s.milli)
                .map(|&l| u64::from(l))
                .sum();
            frag += t.share * partial as f64;
        } else {
            frag += t.share * total as f64;
        }
    }
    frag
}

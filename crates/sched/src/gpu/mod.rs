//! Device selection on one node: which GPUs a task gets.
//!
//! The batch session keeps one [`NodeGpus`] per node and asks it, for a task
//! that passed the node-level checks, for concrete GPU indices. Whole GPUs come
//! from one NVLink domain when the node has domains (the fullest domain that
//! still fits, so large domains stay whole); [`NodeGpus::select_with`] makes an
//! NVLink / PCIe-root / NUMA constraint hard or soft. MIG-enabled GPUs hand out
//! instances of a profile on their memory-slice bitmap ([`NodeGpus::select_mig`]),
//! re-partitioning idle instances when that is the only way.
//!
//! [`policy`] and [`frag`] hold the cluster-level placement policies (FGD and the
//! baselines of its paper).

pub mod frag;
pub mod outlook;
pub mod policy;

pub use frag::{TypicalPod, Workload};
pub use outlook::Outlook;
pub use policy::{
    GpuCluster, NodeState, Placement, PodShape, Policy, RandomSource, tessera_score_on,
};

use std::collections::BTreeMap;

use tessera_model::mig::{self, MigGeometry, Occupancy};
use tessera_model::topology::{GpuScope, GpuTopology, MigRequest, Strength};
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
    pub nvlink_domain: Option<u32>,
    pub pcie_root: Option<String>,
    pub numa: Option<u32>,
    /// Present when MIG is enabled: such a GPU serves MIG requests only.
    pub mig: Option<MigState>,
}

/// The MIG partitioning of one GPU during a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigState {
    pub geometry: &'static MigGeometry,
    /// (profile, start slot, in use) per instance.
    pub instances: Vec<(String, u8, bool)>,
}

impl MigState {
    /// Occupancy of the instances that `keep` accepts.
    fn occupancy(&self, keep: impl Fn(&(String, u8, bool)) -> bool) -> Occupancy {
        self.instances
            .iter()
            .filter(|i| keep(i))
            .fold(Occupancy::default(), |o, (p, s, _)| {
                self.geometry.add(o, p, *s).unwrap_or(Occupancy {
                    slices: u16::MAX,
                    compute: u8::MAX,
                })
            })
    }
}

/// Where a MIG instance goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigChoice {
    pub gpu: u32,
    pub start: u8,
    /// The instance does not exist yet and is created (in free slices, or
    /// after `remove_idle`); false: an idle instance of the profile is reused.
    pub create: bool,
    /// Idle instances to destroy first (a re-partition step); empty normally.
    pub remove_idle: Vec<(String, u8)>,
}

/// What device selection hands a task on one node: GPU indices, and for a MIG
/// request the instance on `gpus[0]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pick {
    pub gpus: Vec<u32>,
    pub mig: Option<MigChoice>,
}

/// Whether GPU `index` is in the exclusion bitmask (indices from 64 up are
/// never excluded).
fn excluded(exclude: u64, index: u32) -> bool {
    index < 64 && exclude & (1u64 << index) != 0
}

/// One domain of whole GPUs on a node; see [`NodeGpus::domain_units`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainUnit {
    pub label: String,
    pub gpus: Vec<u32>,
    pub free: u32,
}

/// The GPUs of one node and what is free on each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeGpus {
    pub slots: Vec<GpuSlot>,
    /// GPUs (bit = index, below 64) the node reported unhealthy
    /// (`GpuDevice::unhealthy`): never picked for new work.
    pub unhealthy: u64,
}

impl NodeGpus {
    /// Builds the device view of a node. A node that only states a GPU count
    /// (`allocatable.gpu_milli` without `gpus`) gets anonymous devices.
    pub fn from_node(node: &Node) -> Self {
        if !node.gpus.is_empty() {
            let slots = node
                .gpus
                .iter()
                .map(|g| {
                    let mig = g.mig.as_ref().map(|l| MigState {
                        // Unknown models get a geometry with no profiles: the GPU
                        // then serves nothing, which is safer than guessing.
                        geometry: mig::geometry(&g.model).unwrap_or(&NO_MIG),
                        instances: l
                            .instances
                            .iter()
                            .map(|i| (i.profile.clone(), i.start, i.in_use))
                            .collect(),
                    });
                    GpuSlot {
                        index: g.index,
                        model: g.model.clone(),
                        free_milli: if mig.is_some() { 0 } else { 1000 },
                        free_memory: if mig.is_some() { 0 } else { g.memory },
                        memory: g.memory,
                        nvlink_domain: g.nvlink_domain,
                        pcie_root: g.pcie_root.clone(),
                        numa: g.numa,
                        mig,
                    }
                })
                .collect();
            let unhealthy = node
                .gpus
                .iter()
                .filter(|g| g.unhealthy.is_some() && g.index < 64)
                .fold(0u64, |m, g| m | (1u64 << g.index));
            return NodeGpus { slots, unhealthy };
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
                    nvlink_domain: None,
                    pcie_root: None,
                    numa: None,
                    mig: None,
                })
                .collect(),
            unhealthy: 0,
        }
    }

    /// Number of GPUs with nothing allocated on them (MIG GPUs excluded).
    pub fn whole_free(&self) -> u32 {
        self.slots
            .iter()
            .filter(|s| {
                s.free_milli == 1000 && s.mig.is_none() && !excluded(self.unhealthy, s.index)
            })
            .count() as u32
    }

    fn model_ok(slot: &GpuSlot, models: &[String]) -> bool {
        models.is_empty() || models.contains(&slot.model)
    }

    /// Chooses GPUs for `req`, or `None` if this node cannot hold it.
    /// Whole GPUs: from one NVLink domain when the node has domains (soft), else
    /// the lowest free indices. A shared GPU: the fullest GPU that still fits (best
    /// fit), so that whole GPUs stay whole.
    pub fn select(&self, req: &GpuRequest) -> Option<Vec<u32>> {
        self.select_with(req, self.default_topology(req))
    }

    /// [`NodeGpus::select`] under a topology constraint: with `Hard`, all GPUs of
    /// the request share one domain of `scope` or the node does not fit; with
    /// `Soft`, one domain if possible, else as few domains as possible. A GPU
    /// without the attribute is a domain of its own.
    pub fn select_with(&self, req: &GpuRequest, topo: Option<GpuTopology>) -> Option<Vec<u32>> {
        self.select_excluding(req, topo, 0)
    }

    /// The default topology of a request on this node: for whole GPUs, one
    /// NVLink domain as a preference when the node has domains.
    pub fn default_topology(&self, req: &GpuRequest) -> Option<GpuTopology> {
        (matches!(req, GpuRequest::Whole { .. })
            && self.slots.iter().any(|s| s.nvlink_domain.is_some()))
        .then_some(GpuTopology {
            scope: GpuScope::NvlinkDomain,
            strength: Strength::Soft,
        })
    }

    /// Device selection for a task: GPUs (whole or a fraction, under `topo`,
    /// or the node's default topology when `None`) or a MIG instance, never on
    /// the GPUs in the `exclude` bitmask.
    pub fn pick(&self, req: &GpuRequest, topo: Option<GpuTopology>, exclude: u64) -> Option<Pick> {
        if let GpuRequest::Mig { profile, models } = req {
            let c = self.select_mig_excluding(profile, models, exclude)?;
            return Some(Pick {
                gpus: vec![c.gpu],
                mig: Some(c),
            });
        }
        let topo = topo.or_else(|| self.default_topology(req));
        self.select_excluding(req, topo, exclude)
            .map(|gpus| Pick { gpus, mig: None })
    }

    /// [`NodeGpus::select_with`], never on the GPUs in the `exclude` bitmask.
    pub fn select_excluding(
        &self,
        req: &GpuRequest,
        topo: Option<GpuTopology>,
        exclude: u64,
    ) -> Option<Vec<u32>> {
        let exclude = exclude | self.unhealthy;
        match req {
            GpuRequest::None => Some(Vec::new()),
            GpuRequest::Mig { profile, models } => self
                .select_mig_excluding(profile, models, exclude)
                .map(|c| vec![c.gpu]),
            GpuRequest::Whole { count, models } => {
                let free: Vec<&GpuSlot> = self
                    .slots
                    .iter()
                    .filter(|s| {
                        s.free_milli == 1000
                            && s.mig.is_none()
                            && Self::model_ok(s, models)
                            && !excluded(exclude, s.index)
                    })
                    .collect();
                let n = *count as usize;
                if free.len() < n {
                    return None;
                }
                let Some(topo) = topo else {
                    return Some(free.iter().take(n).map(|s| s.index).collect());
                };
                let mut domains: BTreeMap<DomainKey, Vec<u32>> = BTreeMap::new();
                for s in &free {
                    domains
                        .entry(domain_key(s, topo.scope))
                        .or_default()
                        .push(s.index);
                }
                // Best fit: the smallest domain that holds the whole request.
                if let Some(d) = domains
                    .values()
                    .filter(|d| d.len() >= n)
                    .min_by_key(|d| (d.len(), d[0]))
                {
                    return Some(d[..n].to_vec());
                }
                if topo.strength == Strength::Hard {
                    return None;
                }
                // Soft: the fewest domains, biggest first.
                let mut ds: Vec<&Vec<u32>> = domains.values().collect();
                ds.sort_by_key(|d| (std::cmp::Reverse(d.len()), d[0]));
                let mut out: Vec<u32> = ds.into_iter().flatten().copied().take(n).collect();
                out.sort_unstable();
                Some(out)
            }
            GpuRequest::Shared {
                milli,
                memory,
                models,
            } => self
                .slots
                .iter()
                .filter(|s| {
                    s.mig.is_none()
                        && s.free_milli >= *milli
                        && s.free_memory >= *memory
                        && Self::model_ok(s, models)
                        && !excluded(exclude, s.index)
                })
                .min_by_key(|s| (s.free_milli, s.index))
                .map(|s| vec![s.index]),
        }
    }

    /// Whether any GPU here states a domain of `scope`.
    pub fn has_scope(&self, scope: GpuScope) -> bool {
        self.slots.iter().any(|s| match scope {
            GpuScope::NvlinkDomain => s.nvlink_domain.is_some(),
            GpuScope::PcieRoot => s.pcie_root.is_some(),
            GpuScope::Numa => s.numa.is_some(),
        })
    }

    /// The node's whole-GPU domains of `scope` (MIG GPUs and other models left
    /// out): each with a label (`nvlink domain 1`, `pcie root pci-0`, `numa 0`),
    /// its GPUs and how many of them are free now. A node that states no domain
    /// of `scope` is one unit labelled `node`.
    pub fn domain_units(&self, scope: GpuScope, models: &[String]) -> Vec<DomainUnit> {
        let eligible = || {
            self.slots
                .iter()
                .filter(|s| s.mig.is_none() && Self::model_ok(s, models))
        };
        if !self.has_scope(scope) {
            let gpus: Vec<u32> = eligible().map(|s| s.index).collect();
            let free = eligible().filter(|s| s.free_milli == 1000).count() as u32;
            return vec![DomainUnit {
                label: "node".into(),
                gpus,
                free,
            }];
        }
        let mut by: BTreeMap<DomainKey, DomainUnit> = BTreeMap::new();
        for s in eligible() {
            let key = domain_key(s, scope);
            let u = by.entry(key.clone()).or_insert_with(|| DomainUnit {
                label: match (&key, scope) {
                    (DomainKey::Id(d), GpuScope::NvlinkDomain) => format!("nvlink domain {d}"),
                    (DomainKey::Id(d), _) => format!("numa {d}"),
                    (DomainKey::Name(r), _) => format!("pcie root {r}"),
                    (DomainKey::Alone(i), _) => format!("gpu {i}"),
                },
                gpus: Vec::new(),
                free: 0,
            });
            u.gpus.push(s.index);
            if s.free_milli == 1000 {
                u.free += 1;
            }
        }
        by.into_values().collect()
    }

    /// How many distinct domains of `scope` the GPUs `indices` span (1 is best).
    pub fn domains_spanned(&self, indices: &[u32], scope: GpuScope) -> usize {
        let mut keys: Vec<DomainKey> = indices
            .iter()
            .filter_map(|i| self.slots.iter().find(|s| s.index == *i))
            .map(|s| domain_key(s, scope))
            .collect();
        keys.sort();
        keys.dedup();
        keys.len()
    }

    /// Chooses a MIG GPU and start slot for `req`. First an idle instance of
    /// the profile (nothing to reconfigure; on the GPU with the least room
    /// left, lowest index among equals). Then a new instance in free slices:
    /// among GPUs of an allowed model with a free legal start, the one left with
    /// the least room afterwards (best fit, so emptier GPUs stay open for big
    /// profiles); on that GPU the start that leaves the most room. When no GPU
    /// has a free start, a GPU whose *idle* instances can be destroyed to make
    /// one is chosen, with a re-partition step.
    pub fn select_mig(&self, req: &MigRequest) -> Option<MigChoice> {
        self.select_mig_excluding(&req.profile, &req.models, 0)
    }

    fn select_mig_excluding(
        &self,
        profile: &str,
        models: &[String],
        exclude: u64,
    ) -> Option<MigChoice> {
        let exclude = exclude | self.unhealthy;
        let allowed = |s: &GpuSlot| {
            (models.is_empty() || models.contains(&s.model)) && !excluded(exclude, s.index)
        };
        let mig_slots = || {
            self.slots
                .iter()
                .filter(move |s| allowed(s))
                .filter_map(|s| s.mig.as_ref().map(|m| (s, m)))
        };
        // Reuse an idle instance of the profile.
        let mut reuse: Option<(usize, u32, u8)> = None;
        for (s, m) in mig_slots() {
            if let Some((_, start, _)) = m
                .instances
                .iter()
                .filter(|i| !i.2 && i.0 == profile)
                .min_by_key(|i| i.1)
            {
                let room = m.geometry.room(m.occupancy(|_| true));
                if reuse.is_none_or(|(r, i, _)| (room, s.index) < (r, i)) {
                    reuse = Some((room, s.index, *start));
                }
            }
        }
        if let Some((_, gpu, start)) = reuse {
            return Some(MigChoice {
                gpu,
                start,
                create: false,
                remove_idle: Vec::new(),
            });
        }
        let mut best: Option<(usize, u32, u8)> = None;
        for (s, m) in mig_slots() {
            let occ = m.occupancy(|_| true);
            if let Some(start) = m.geometry.best_start(occ, profile) {
                let after = m.geometry.add(occ, profile, start).ok()?;
                let room = m.geometry.room(after);
                if best.is_none_or(|(r, i, _)| (room, s.index) < (r, i)) {
                    best = Some((room, s.index, start));
                }
            }
        }
        if let Some((_, gpu, start)) = best {
            return Some(MigChoice {
                gpu,
                start,
                create: true,
                remove_idle: Vec::new(),
            });
        }
        // Dynamic MIG: destroy idle instances where the new one would go; the
        // start that destroys the fewest, on the lowest GPU.
        let mut repart: Option<(usize, MigChoice)> = None;
        for (s, m) in mig_slots() {
            let Some(p) = m.geometry.profile(profile) else {
                continue;
            };
            let busy = m.occupancy(|i| i.2);
            for start in m.geometry.free_starts(busy, profile) {
                let mask = p.mask(start);
                let hit = |prof: &str, st: u8| {
                    m.geometry
                        .profile(prof)
                        .is_some_and(|q| q.mask(st) & mask != 0)
                };
                let remove_idle: Vec<(String, u8)> = m
                    .instances
                    .iter()
                    .filter(|(prof, st, used)| !used && hit(prof, *st))
                    .map(|(prof, st, _)| (prof.clone(), *st))
                    .collect();
                // What stays must leave room (memory and compute) for it.
                let kept = m.occupancy(|(prof, st, used)| *used || !hit(prof, *st));
                if m.geometry.add(kept, profile, start).is_err() {
                    continue;
                }
                if repart
                    .as_ref()
                    .is_none_or(|(n, c)| (remove_idle.len(), s.index, start) < (*n, c.gpu, c.start))
                {
                    repart = Some((
                        remove_idle.len(),
                        MigChoice {
                            gpu: s.index,
                            start,
                            create: true,
                            remove_idle,
                        },
                    ));
                }
            }
        }
        repart.map(|(_, c)| c)
    }

    /// Records a MIG choice: removes the idle instances it names and adds an
    /// in-use instance. Returns false (and changes nothing) if it is not legal now.
    pub fn assign_mig(&mut self, profile: &str, c: &MigChoice) -> bool {
        let Some(slot) = self.slots.iter_mut().find(|s| s.index == c.gpu) else {
            return false;
        };
        let Some(m) = &mut slot.mig else { return false };
        if !c.create {
            return match m
                .instances
                .iter_mut()
                .find(|i| i.0 == profile && i.1 == c.start && !i.2)
            {
                Some(i) => {
                    i.2 = true;
                    true
                }
                None => false,
            };
        }
        let mut next = m.clone();
        for (p, st) in &c.remove_idle {
            match next
                .instances
                .iter()
                .position(|i| &i.0 == p && i.1 == *st && !i.2)
            {
                Some(k) => {
                    next.instances.remove(k);
                }
                None => return false,
            }
        }
        let occ = next.occupancy(|_| true);
        if next.geometry.add(occ, profile, c.start).is_err() {
            return false;
        }
        next.instances.push((profile.to_string(), c.start, true));
        *m = next;
        true
    }

    /// Frees an instance (it stays, idle, for the next task of that profile).
    pub fn release_mig(&mut self, gpu: u32, profile: &str, start: u8) {
        if let Some(m) = self
            .slots
            .iter_mut()
            .find(|s| s.index == gpu)
            .and_then(|s| s.mig.as_mut())
        {
            if let Some(i) = m
                .instances
                .iter_mut()
                .find(|i| i.0 == profile && i.1 == start && i.2)
            {
                i.2 = false;
            }
        }
    }

    /// Undoes [`NodeGpus::assign_mig`] exactly: an instance it created is
    /// removed again and the idle instances it destroyed come back; a reused
    /// instance turns idle.
    pub fn unassign_mig(&mut self, profile: &str, c: &MigChoice) {
        let Some(m) = self
            .slots
            .iter_mut()
            .find(|s| s.index == c.gpu)
            .and_then(|s| s.mig.as_mut())
        else {
            return;
        };
        let Some(k) = m
            .instances
            .iter()
            .position(|i| i.0 == profile && i.1 == c.start && i.2)
        else {
            return;
        };
        if c.create {
            m.instances.remove(k);
            for (p, st) in &c.remove_idle {
                m.instances.push((p.clone(), *st, false));
            }
        } else {
            m.instances[k].2 = false;
        }
    }

    /// Marks the instance `profile@start` on `gpu` in use for a task that
    /// already runs there: an in-use one is claimed as it is, an idle one is
    /// turned in use, a missing one is created if the slices are free.
    /// Returns false when none of that is possible.
    pub fn claim_mig(&mut self, gpu: u32, profile: &str, start: u8) -> bool {
        let Some(m) = self
            .slots
            .iter_mut()
            .find(|s| s.index == gpu)
            .and_then(|s| s.mig.as_mut())
        else {
            return false;
        };
        if let Some(i) = m
            .instances
            .iter_mut()
            .find(|i| i.0 == profile && i.1 == start)
        {
            i.2 = true;
            return true;
        }
        let occ = m.occupancy(|_| true);
        if m.geometry.add(occ, profile, start).is_ok() {
            m.instances.push((profile.to_string(), start, true));
            return true;
        }
        false
    }

    /// In-use instances of `profile` on this node, as (gpu, start), in order.
    pub fn mig_in_use(&self, profile: &str) -> Vec<(u32, u8)> {
        let mut v: Vec<(u32, u8)> = self
            .slots
            .iter()
            .filter_map(|s| s.mig.as_ref().map(|m| (s.index, m)))
            .flat_map(|(g, m)| {
                m.instances
                    .iter()
                    .filter(|i| i.2 && i.0 == profile)
                    .map(move |i| (g, i.1))
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Bytes of GPU memory still free on GPUs that are not fully taken (MIG
    /// GPUs excluded): what fractional and whole-GPU tasks can still use.
    pub fn free_memory(&self) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.mig.is_none() && s.free_milli > 0)
            .map(|s| s.free_memory)
            .sum()
    }

    /// Records that `req` holds the GPUs `indices`. Returns false (and changes
    /// nothing) when they are not free enough, or name one GPU twice (a task holds
    /// a device once): the caller's accounting is wrong.
    pub fn assign(&mut self, req: &GpuRequest, indices: &[u32]) -> bool {
        let (milli, mem) = per_gpu(req);
        let twice = indices
            .iter()
            .enumerate()
            .any(|(k, i)| indices[..k].contains(i));
        let ok = !twice
            && indices.iter().all(|i| {
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

/// A geometry without profiles, for MIG layouts on models Tessera does not know.
static NO_MIG: MigGeometry = MigGeometry {
    model: "unknown",
    aliases: &[],
    memory_slices: 0,
    compute_slices: 0,
    profiles: &[],
};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum DomainKey {
    Id(u64),
    Name(String),
    /// No attribute: the GPU is its own domain.
    Alone(u32),
}

fn domain_key(s: &GpuSlot, scope: GpuScope) -> DomainKey {
    match scope {
        GpuScope::NvlinkDomain => s.nvlink_domain.map(|d| DomainKey::Id(u64::from(d))),
        GpuScope::Numa => s.numa.map(|d| DomainKey::Id(u64::from(d))),
        GpuScope::PcieRoot => s.pcie_root.clone().map(DomainKey::Name),
    }
    .unwrap_or(DomainKey::Alone(s.index))
}

/// What a request takes from each GPU it is given: (milli-GPU, bytes of memory).
fn per_gpu(req: &GpuRequest) -> (u32, u64) {
    match req {
        GpuRequest::None | GpuRequest::Mig { .. } => (0, 0),
        GpuRequest::Whole { .. } => (1000, 0),
        GpuRequest::Shared { milli, memory, .. } => (*milli, *memory),
    }
}

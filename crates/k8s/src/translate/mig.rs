//! MIG on Kubernetes: the instances a node has, read from what NVIDIA's GPU
//! Feature Discovery (GFD) and device plugin publish; the instance a pod asks
//! for; Tessera's record of the instance it gave a pod; and what happens to a
//! plan that would create or destroy instances. Pure, like the rest of
//! [`crate::translate`]: a child of it that uses only its siblings `keys` and
//! `error`, never the parent (which calls into this module).
//!
//! # What the cluster publishes
//!
//! From NVIDIA/k8s-device-plugin, which now holds GFD (`internal/lm/nvml.go`,
//! `internal/lm/mig-strategy.go`, `internal/lm/resource.go`,
//! `internal/resource/nvml-mig-device.go`, `docs/gpu-feature-discovery/README.md`):
//!
//! * `nvidia.com/mig.capable`: `true` when any GPU of the node can do MIG.
//! * `nvidia.com/mig.strategy`: `single` or `mixed` (absent under `none`).
//! * **mixed**: the device plugin advertises each MIG profile as its own
//!   extended resource `nvidia.com/mig-<profile>` (a `+` in NVML's profile name,
//!   as in `1g.10gb+me`, becomes `.`), and GFD labels per profile
//!   `nvidia.com/mig-<profile>.count`, `.memory` (MiB), `.multiprocessors`,
//!   `.slices.gi` (NVML's `GpuInstanceSliceCount`: the instance's *compute*
//!   slices, the `Ng` of the name; the README's table has `gi`/`ci` swapped),
//!   `.slices.ci`, `.engines.*`, `.product` (`<GPU>-MIG-<profile>`) and
//!   `.replicas`. `nvidia.com/gpu.product`, `gpu.count` and `gpu.memory` keep
//!   describing the physical GPUs, MIG-enabled ones included, while the
//!   `nvidia.com/gpu` resource counts only the GPUs without MIG.
//! * **single**: every GPU is cut into instances of one profile, and each
//!   instance *is* an `nvidia.com/gpu`: the resource counts instances,
//!   `nvidia.com/gpu.product` is `<GPU>-MIG-<profile>` (`<GPU>-MIG-INVALID`
//!   with count 0 when the node breaks the rule), `gpu.count` the instances,
//!   `gpu.memory` one instance's memory, plus `gpu.slices.gi` and the rest.
//!
//! # What Tessera makes of it
//!
//! Labels and resources give *counts per profile*, never which GPU an instance
//! sits on nor at which memory slice it starts. So:
//!
//! * **mixed**: the instances of the profiles Tessera's MIG tables know for the
//!   node's model are laid out on the MIG-enabled GPUs (`gpu.count` minus the
//!   `nvidia.com/gpu` count; when `gpu.count` is absent, the fewest on which a
//!   bounded search fits them exactly, else first fit) in legal layouts,
//!   indexed after the GPUs without MIG. The layout
//!   is Tessera's bookkeeping, not the hardware's: the same labels always give
//!   the same layout, so the instance recorded on a pod is found again after a
//!   restart, but the device plugin and kubelet pick the physical instance. A
//!   model the tables do not know gets one idle instance per advertised device,
//!   numbered in order (the scheduler can reuse them, never create any). The
//!   `nvidia.com/mig-<profile>` counts also stay in `allocatable.extended`, and
//!   a MIG pod keeps asking for its resource there: the count is the hard
//!   guard that no more pods land on a node than it has instances.
//! * **single**: instances are GPUs to Kubernetes (pods ask for
//!   `nvidia.com/gpu`), so they stay whole devices named `<GPU>-MIG-<profile>`
//!   with one instance's memory; the labels are only checked. An `-MIG-INVALID`
//!   node offers no GPUs.
//! * While NVIDIA's mig-manager re-partitions a node
//!   (`nvidia.com/mig.config.state` is `pending` or `rebooting`, as its
//!   `reconfigure-mig.sh` in NVIDIA/mig-parted sets it before `success` or
//!   `failed`), the node offers no MIG instances.
//! * A profile the device plugin time-slices (`nvidia.com/mig-<profile>.replicas`
//!   above 1) is advertised `replicas` times per instance: the count is divided
//!   for the layout, and its pods are counted, not given instances
//!   ([`time_sliced_profiles`]).
//! * Labels that do not add up cost the node only its MIG layout, never its
//!   place ([`apply_to_node`]).
//! * Tessera never creates or destroys instances on Kubernetes: a plan that
//!   would is held back with a reason ([`hold_reconfigurations`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::OnceLock;

use tessera_model::mig::{self, MigGeometry, MigInstance, MigLayout, Occupancy};
use tessera_model::{GpuDevice, GpuRequest, Node, Pending, Plan, Resources};

use super::error::{TranslateError, err};
use super::keys::{self, gpu_model};

/// Prefix of the extended resources of MIG profiles (mixed strategy).
pub const RESOURCE_PREFIX: &str = "nvidia.com/mig-";

fn label_field(key: &str) -> String {
    format!("metadata.labels[{key}]")
}

/// A label holding a whole number, if present.
fn label_u64(
    object: &str,
    labels: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<u64>, TranslateError> {
    labels
        .get(key)
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| err(object, &label_field(key), v, "not a whole number"))
        })
        .transpose()
}

/// The profile named by an extended resource, `nvidia.com/mig-3g.40gb` -> `3g.40gb`.
pub fn profile_of_resource(name: &str) -> Option<&str> {
    name.strip_prefix(RESOURCE_PREFIX).filter(|p| !p.is_empty())
}

/// Whether some GPU model in Tessera's MIG tables has this profile.
pub fn known_profile(profile: &str) -> bool {
    mig::GEOMETRIES.iter().any(|g| g.profile(profile).is_some())
}

/// The MIG geometry of a GFD product label (`NVIDIA-A100-SXM4-40GB`), by the
/// label as it is or without its vendor prefix.
pub fn geometry_of_product(product: &str) -> Option<&'static MigGeometry> {
    mig::geometry(product.trim()).or_else(|| mig::geometry(&gpu_model(product)))
}

/// GFD's `nvidia.com/mig.strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    None,
    Single,
    Mixed,
}

fn strategy(
    object: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Option<Strategy>, TranslateError> {
    match labels.get(keys::GFD_MIG_STRATEGY).map(|s| s.trim()) {
        None => Ok(None),
        Some("none") => Ok(Some(Strategy::None)),
        Some("single") => Ok(Some(Strategy::Single)),
        Some("mixed") => Ok(Some(Strategy::Mixed)),
        Some(v) => Err(err(
            object,
            &label_field(keys::GFD_MIG_STRATEGY),
            v,
            "not a MIG strategy (none, single, mixed)",
        )),
    }
}

/// Adds what a node's MIG labels and resources say to `node`, whose GPUs
/// without MIG (from `nvidia.com/gpu`) are already there. See the module
/// documentation for what is read and what is assumed.
///
/// MIG labels never cost a node its place: when they are malformed or do not
/// add up, the node is left as it was without them (its CPUs, memory, GPUs
/// without MIG and every extended-resource count, `nvidia.com/mig-*`
/// included, which still limit the pods kubelet admits) and the problem is
/// returned for the caller to report.
pub fn apply_to_node(
    object: &str,
    labels: &BTreeMap<String, String>,
    node: &mut Node,
) -> Option<TranslateError> {
    let r = (|| {
        if let Some(v) = labels.get(keys::GFD_MIG_CAPABLE)
            && !matches!(v.trim(), "true" | "false")
        {
            return Err(err(
                object,
                &label_field(keys::GFD_MIG_CAPABLE),
                v,
                "not true or false",
            ));
        }
        let strategy = strategy(object, labels)?;
        if strategy == Some(Strategy::Single) {
            return single(object, labels, node);
        }
        mixed(object, labels, node)
    })();
    r.err().map(|mut e| {
        e.problem.push_str(
            "; the node's MIG labels are ignored (no MIG instances are placed on it; its \
             nvidia.com/mig-* counts still limit the pods it takes)",
        );
        e
    })
}

/// Single strategy: the instances are the node's `nvidia.com/gpu` devices.
fn single(
    object: &str,
    labels: &BTreeMap<String, String>,
    node: &mut Node,
) -> Result<(), TranslateError> {
    let Some(product) = labels.get(keys::GFD_PRODUCT) else {
        return Ok(());
    };
    let Some((parent, profile)) = product.trim().rsplit_once("-MIG-") else {
        // A node of GPUs without MIG under the single strategy.
        return Ok(());
    };
    let field = label_field(keys::GFD_PRODUCT);
    if profile == "INVALID" {
        // GFD's verdict: MIG is on but the node is not cut into one profile.
        // Nothing on it can be handed out as a GPU.
        node.gpus.clear();
        node.allocatable.gpu_milli = 0;
        node.allocatable.gpu_memory = 0;
        return Ok(());
    }
    if profile.is_empty() || parent.is_empty() {
        return Err(err(
            object,
            &field,
            product,
            "not <GPU>-MIG-<profile> (single MIG strategy)",
        ));
    }
    let gi = label_u64(object, labels, keys::GFD_SLICES_GI)?;
    if let Some(g) = geometry_of_product(parent) {
        let Some(p) = g.profile(profile) else {
            return Err(err(
                object,
                &field,
                product,
                format!("{} has no MIG profile {profile}", g.model),
            ));
        };
        if let Some(gi) = gi
            && gi != u64::from(p.compute)
        {
            return Err(err(
                object,
                &label_field(keys::GFD_SLICES_GI),
                &gi.to_string(),
                format!(
                    "{profile} on {} has {} compute slices, the label says {gi}",
                    g.model, p.compute
                ),
            ));
        }
    }
    Ok(())
}

/// One distinct way to fill a GPU: instances per profile (in the geometry's
/// profile order) and a layout that has them.
struct Shape {
    counts: Vec<u64>,
    layout: Vec<(&'static str, u8)>,
}

/// Every distinct per-profile count vector of `g`'s legal layouts, fullest first.
fn shapes(g: &MigGeometry) -> Vec<Shape> {
    let mut seen: BTreeMap<Vec<u64>, Vec<(&'static str, u8)>> = BTreeMap::new();
    for l in g.all_layouts() {
        let mut counts = vec![0u64; g.profiles.len()];
        for (p, _) in &l {
            if let Some(i) = g.profiles.iter().position(|q| q.name == *p) {
                counts[i] += 1;
            }
        }
        seen.entry(counts).or_insert(l);
    }
    let mut v: Vec<Shape> = seen
        .into_iter()
        .map(|(counts, layout)| Shape { counts, layout })
        .collect();
    let weight = |s: &Shape| -> u64 {
        s.counts
            .iter()
            .zip(g.profiles)
            .map(|(c, p)| c * u64::from(p.slices) * 16 + c * u64::from(p.compute))
            .sum()
    };
    v.sort_by(|a, b| weight(b).cmp(&weight(a)).then(b.counts.cmp(&a.counts)));
    v
}

/// [`shapes`] of a model of the tables, worked out once per process.
fn shapes_of(g: &MigGeometry) -> &'static [Shape] {
    static ALL: OnceLock<Vec<Vec<Shape>>> = OnceLock::new();
    let all = ALL.get_or_init(|| mig::GEOMETRIES.iter().map(shapes).collect());
    mig::GEOMETRIES
        .iter()
        .position(|x| x.model == g.model)
        .map_or(&[], |i| all[i].as_slice())
}

/// Chooses a shape for each of `gpus` GPUs so that the shapes add up to
/// `want` exactly: depth first over shapes in a fixed order (each GPU takes a
/// shape no earlier in the list than the GPU before it), remembering states
/// that failed. `None` when there is no such choice or the search ran past its
/// budget.
fn fit(shapes: &[Shape], want: &[u64], gpus: usize) -> Option<Vec<usize>> {
    fn go(
        shapes: &[Shape],
        left: &mut Vec<u64>,
        gpus: usize,
        from: usize,
        out: &mut Vec<usize>,
        failed: &mut BTreeSet<(Vec<u64>, usize, usize)>,
        budget: &mut u32,
    ) -> bool {
        if left.iter().all(|c| *c == 0) {
            return true;
        }
        if gpus == 0 || *budget == 0 || failed.contains(&(left.clone(), gpus, from)) {
            return false;
        }
        *budget -= 1;
        for (i, s) in shapes.iter().enumerate().skip(from) {
            if s.counts.iter().all(|c| *c == 0)
                || s.counts.iter().zip(left.iter()).any(|(c, l)| c > l)
            {
                continue;
            }
            for (l, c) in left.iter_mut().zip(&s.counts) {
                *l -= c;
            }
            out.push(i);
            if go(shapes, left, gpus - 1, i, out, failed, budget) {
                return true;
            }
            out.pop();
            for (l, c) in left.iter_mut().zip(&s.counts) {
                *l += c;
            }
        }
        if *budget > 0 {
            failed.insert((left.clone(), gpus, from));
        }
        false
    }
    let mut left = want.to_vec();
    let mut out = Vec::new();
    let mut budget = 5_000;
    go(
        shapes,
        &mut left,
        gpus,
        0,
        &mut out,
        &mut BTreeSet::new(),
        &mut budget,
    )
    .then_some(out)
}

/// First fit by decreasing size, opening GPUs as needed: legal layouts, not
/// always the fewest GPUs.
fn first_fit(g: &MigGeometry, want: &[u64]) -> Vec<Vec<(&'static str, u8)>> {
    let mut order: Vec<&mig::MigProfile> = Vec::new();
    for (p, c) in g.profiles.iter().zip(want) {
        for _ in 0..*c {
            order.push(p);
        }
    }
    order.sort_by(|a, b| (b.slices, b.compute, a.name).cmp(&(a.slices, a.compute, b.name)));
    let mut gpus: Vec<(Occupancy, Vec<(&'static str, u8)>)> = Vec::new();
    for p in order {
        let slot = gpus
            .iter()
            .position(|(occ, _)| !g.free_starts(*occ, p.name).is_empty());
        let k = match slot {
            Some(k) => k,
            None => {
                gpus.push((Occupancy::default(), Vec::new()));
                gpus.len() - 1
            }
        };
        let (occ, l) = &mut gpus[k];
        if let Some(&s) = g.free_starts(*occ, p.name).first()
            && let Ok(next) = g.add(*occ, p.name, s)
        {
            *occ = next;
            l.push((p.name, s));
        }
    }
    gpus.into_iter().map(|(_, l)| l).collect()
}

/// Compute slices of a profile by its name (`3g.40gb` -> 3; 1 when the name
/// does not say).
fn compute_of(profile: &str) -> u64 {
    profile
        .split_once('g')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// Most instances a node may advertise before Tessera calls it nonsense
/// (1024 GPUs of 7 instances); also the bound on any one advertised count.
const MAX_INSTANCES: u64 = 7 * 1024;

/// Most GPUs a node may have.
const MAX_GPUS: u64 = 1024;

/// How many more GPUs than the slices need [`place`] tries an exact layout on
/// before it falls back to first fit.
const EXTRA_GPUS_TRIED: u64 = 3;

/// Layouts of the instances `want` (per profile of `g`) on `gpus` MIG-enabled
/// GPUs, or on as few as [`place`] finds when `gpus` is `None`. Pure;
/// computed by [`place`] and kept in a small per-thread cache keyed by the
/// inputs, since the same node status comes again with every heartbeat and
/// relist and a search with no exact answer spends its whole budget.
fn layouts_for(
    g: &'static MigGeometry,
    gpus: Option<u64>,
    want: &[u64],
) -> Vec<Vec<(&'static str, u8)>> {
    type Key = (&'static str, Option<u64>, Vec<u64>);
    type Cache = BTreeMap<Key, Vec<Vec<(&'static str, u8)>>>;
    thread_local! {
        static CACHE: std::cell::RefCell<Cache> = const { std::cell::RefCell::new(BTreeMap::new()) };
    }
    let key = (g.model, gpus, want.to_vec());
    if let Some(hit) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return hit;
    }
    let placed = place(g, gpus, want);
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= 256 {
            c.clear();
        }
        c.insert(key, placed.clone());
    });
    placed
}

thread_local! {
    /// Layout searches [`place`] ran on this thread (tests read it).
    static SEARCHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Searches run so far on this thread.
#[cfg(test)]
fn searches() -> u64 {
    SEARCHES.with(std::cell::Cell::get)
}

/// Legal layouts holding `want`: an exact fit on `gpus` GPUs; without a GPU
/// count, on the fewest GPUs the search finds, from the least the slices
/// need up; first fit by size when the bounded search finds nothing.
fn place(g: &MigGeometry, gpus: Option<u64>, want: &[u64]) -> Vec<Vec<(&'static str, u8)>> {
    SEARCHES.with(|c| c.set(c.get() + 1));
    let shapes = shapes_of(g);
    let pick = |n: u64| {
        fit(shapes, want, n as usize)
            .map(|pick| pick.iter().map(|&i| shapes[i].layout.clone()).collect())
    };
    if let Some(n) = gpus {
        return pick(n).unwrap_or_else(|| first_fit(g, want));
    }
    let ff = first_fit(g, want);
    let (mem, comp) = slices(g, want);
    let least = mem
        .div_ceil(u64::from(g.memory_slices.max(1)))
        .max(comp.div_ceil(u64::from(g.compute_slices.max(1))))
        .max(1);
    (least..(ff.len() as u64).min(least + EXTRA_GPUS_TRIED))
        .find_map(pick)
        .unwrap_or(ff)
}

/// Memory and compute slices the instances `want` take.
fn slices(g: &MigGeometry, want: &[u64]) -> (u64, u64) {
    g.profiles
        .iter()
        .zip(want)
        .fold((0u64, 0u64), |(m, c), (p, k)| {
            (
                m.saturating_add(k.saturating_mul(u64::from(p.slices))),
                c.saturating_add(k.saturating_mul(u64::from(p.compute))),
            )
        })
}

/// Mixed strategy: MIG-enabled GPUs laid out from `nvidia.com/mig-<profile>`.
/// An `Err` leaves `node` as it was, but for the zeroed counts of a node that
/// mig-manager is re-partitioning.
fn mixed(
    object: &str,
    labels: &BTreeMap<String, String>,
    node: &mut Node,
) -> Result<(), TranslateError> {
    // The advertised devices (allocatable is what kubelet admits against).
    let mut advertised: Vec<(String, u64)> = node
        .allocatable
        .extended
        .iter()
        .filter_map(|(k, v)| profile_of_resource(k).map(|p| (p.to_string(), *v)))
        .filter(|(_, v)| *v > 0)
        .collect();
    for (p, c) in &advertised {
        if *c > MAX_INSTANCES {
            return Err(err(
                object,
                &format!("status.allocatable[{RESOURCE_PREFIX}{p}]"),
                &c.to_string(),
                format!("more MIG instances than {MAX_INSTANCES}"),
            ));
        }
    }
    // GFD's per-profile labels must at least be well formed.
    for (p, _) in &advertised {
        for suffix in ["count", "memory", "slices.gi", "slices.ci", "replicas"] {
            label_u64(object, labels, &format!("{RESOURCE_PREFIX}{p}.{suffix}"))?;
        }
    }
    // NVIDIA's mig-manager is re-partitioning the node (it stops the device
    // plugin and GFD, then sets `success` or `failed`): what is advertised is
    // on its way out, so nothing is handed out until it is done.
    if matches!(
        labels.get(keys::MIG_CONFIG_STATE).map(|s| s.trim()),
        Some("pending" | "rebooting")
    ) {
        for (p, _) in advertised.drain(..) {
            node.allocatable
                .extended
                .insert(format!("{RESOURCE_PREFIX}{p}"), 0);
        }
    }
    // Time-sliced profiles: the device plugin advertises each instance
    // `nvidia.com/mig-<profile>.replicas` times.
    for (p, c) in &mut advertised {
        let r = label_u64(object, labels, &format!("{RESOURCE_PREFIX}{p}.replicas"))?
            .unwrap_or(1)
            .max(1);
        if *c % r != 0 {
            return Err(err(
                object,
                &format!("status.allocatable[{RESOURCE_PREFIX}{p}]"),
                &c.to_string(),
                format!(
                    "not a multiple of the {r} replicas of each instance \
                     ({RESOURCE_PREFIX}{p}.replicas)"
                ),
            ));
        }
        *c /= r;
    }
    // Each count is at most MAX_INSTANCES, and there are few: no overflow.
    let total = advertised
        .iter()
        .try_fold(0u64, |t, (_, c)| t.checked_add(*c))
        .unwrap_or(u64::MAX);
    if total == 0 {
        return Ok(());
    }
    if total > MAX_INSTANCES {
        return Err(err(
            object,
            &format!("status.allocatable[{RESOURCE_PREFIX}*]"),
            &total.to_string(),
            format!("more MIG instances than {MAX_INSTANCES}"),
        ));
    }
    let product = labels.get(keys::GFD_PRODUCT).map(|p| p.trim());
    let geometry = product.and_then(geometry_of_product);
    let memory = label_u64(object, labels, keys::GFD_MEMORY)?
        .unwrap_or(0)
        .saturating_mul(1 << 20);
    // GPUs without MIG, as the device plugin counts them (each once, also when
    // time-slicing advertises it `nvidia.com/gpu.replicas` times, and under
    // the name `nvidia.com/gpu.shared` when the plugin renames shared GPUs).
    let replicas = labels
        .get(keys::GFD_REPLICAS)
        .and_then(|r| r.trim().parse::<u64>().ok())
        .unwrap_or(1)
        .max(1);
    let shared = node
        .allocatable
        .extended
        .get(SHARED_GPU_RESOURCE)
        .copied()
        .unwrap_or(0);
    let whole = (node.gpus.len() as u64)
        .saturating_add(shared)
        .div_ceil(replicas);
    let count_label = label_u64(object, labels, keys::GFD_COUNT)?;
    // MIG-enabled GPUs: GFD counts them in gpu.count, the device plugin leaves
    // them out of nvidia.com/gpu.
    let mig_gpus = count_label.map(|c| c.saturating_sub(whole).min(MAX_GPUS));

    let layouts: Vec<Vec<MigInstance>> = match geometry {
        Some(g) => {
            let mut want = vec![0u64; g.profiles.len()];
            for (p, c) in &advertised {
                match g.profiles.iter().position(|q| q.name == p) {
                    Some(i) => want[i] = *c,
                    // A profile no table knows (e.g. a `+me` variant) stays an
                    // extended-resource count; one the tables know for other
                    // models contradicts the product label.
                    None if !known_profile(p) => {}
                    None => {
                        return Err(err(
                            object,
                            &format!("status.allocatable[{RESOURCE_PREFIX}{p}]"),
                            &c.to_string(),
                            format!(
                                "{} (from {} {:?}) has no MIG profile {p}",
                                g.model,
                                keys::GFD_PRODUCT,
                                product.unwrap_or_default()
                            ),
                        ));
                    }
                }
                let gi = label_u64(object, labels, &format!("{RESOURCE_PREFIX}{p}.slices.gi"))?;
                if let (Some(gi), Some(q)) = (gi, g.profile(p))
                    && gi != u64::from(q.compute)
                {
                    return Err(err(
                        object,
                        &label_field(&format!("{RESOURCE_PREFIX}{p}.slices.gi")),
                        &gi.to_string(),
                        format!(
                            "{p} on {} has {} compute slices, the label says {gi}",
                            g.model, q.compute
                        ),
                    ));
                }
            }
            let (mem, comp) = slices(g, &want);
            if let Some(n) = mig_gpus
                && (mem > n * u64::from(g.memory_slices) || comp > n * u64::from(g.compute_slices))
            {
                return Err(err(
                    object,
                    &label_field(keys::GFD_COUNT),
                    &count_label.unwrap_or(0).to_string(),
                    format!(
                        "{total} MIG instances need {mem} memory and {comp} compute \
                         slices, more than {n} MIG-enabled {} GPUs have \
                         ({whole} of the GPUs are without MIG)",
                        g.model
                    ),
                ));
            }
            layouts_for(g, mig_gpus, &want)
                .into_iter()
                .map(|l| {
                    let mut v: Vec<MigInstance> = l
                        .into_iter()
                        .map(|(p, s)| MigInstance {
                            profile: p.to_string(),
                            start: s,
                            in_use: false,
                        })
                        .collect();
                    v.sort();
                    v
                })
                .collect()
        }
        None => {
            // No geometry: one idle instance per advertised device, dealt out
            // over the MIG-enabled GPUs, numbered in order on each. Without
            // gpu.count, as many GPUs as the instances' compute slices (the
            // `Ng` of a profile's name) fill at 7 a GPU.
            let n = mig_gpus
                .unwrap_or_else(|| {
                    let compute = advertised
                        .iter()
                        .map(|(p, c)| c.saturating_mul(compute_of(p)))
                        .fold(0u64, u64::saturating_add);
                    compute.div_ceil(7)
                })
                .clamp(1, MAX_GPUS);
            let mut out: Vec<Vec<MigInstance>> = vec![Vec::new(); n as usize];
            let mut k = 0u64;
            // `total` is at most MAX_INSTANCES.
            for (p, c) in &advertised {
                for _ in 0..*c {
                    let gpu = &mut out[(k % n) as usize];
                    let start = u8::try_from(gpu.len()).unwrap_or(u8::MAX);
                    gpu.push(MigInstance {
                        profile: p.clone(),
                        start,
                        in_use: false,
                    });
                    k += 1;
                }
            }
            out
        }
    };
    let mig_gpus = mig_gpus.map(|n| n as usize).unwrap_or(0).max(layouts.len());
    let model = match (geometry, product) {
        (Some(g), _) => g.model.to_string(),
        (None, Some(p)) => gpu_model(p),
        (None, None) => "nvidia-gpu".to_string(),
    };
    let first = node.gpus.len() as u32;
    for k in 0..mig_gpus {
        let mut d = GpuDevice::new(first + k as u32, model.clone(), memory);
        d.mig = Some(MigLayout {
            instances: layouts.get(k).cloned().unwrap_or_default(),
        });
        node.gpus.push(d);
    }
    node.allocatable.gpu_milli = node
        .allocatable
        .gpu_milli
        .saturating_add(mig_gpus as u64 * 1000);
    node.allocatable.gpu_memory = node
        .allocatable
        .gpu_memory
        .saturating_add(memory.saturating_mul(mig_gpus as u64));
    Ok(())
}

/// The profiles a node's device plugin time-slices (GFD's
/// `nvidia.com/mig-<profile>.replicas` above 1). Pods asking for them are
/// counted, not given an instance: several share one.
pub fn time_sliced_profiles(labels: &BTreeMap<String, String>) -> BTreeSet<String> {
    labels
        .range(RESOURCE_PREFIX.to_string()..)
        .take_while(|(k, _)| k.starts_with(RESOURCE_PREFIX))
        .filter_map(|(k, v)| {
            let p = profile_of_resource(k)?.strip_suffix(".replicas")?;
            (v.trim().parse::<u64>().ok()? > 1).then(|| p.to_string())
        })
        .collect()
}

/// What the device plugin advertises GPUs without MIG as when time-slicing
/// renames them (`renameByDefault`).
pub const SHARED_GPU_RESOURCE: &str = "nvidia.com/gpu.shared";

/// What a pod asks of MIG: one instance of a profile the tables know, from its
/// summed requests (`nvidia.com/mig-<profile>: 1`), replacing `gpu` (what
/// `nvidia.com/gpu` and the fraction annotations asked for). `None`: no such
/// request (profiles no table knows stay extended-resource counts).
///
/// The model places one instance per pod. A pod that asks for more (two of a
/// profile, two profiles, or an instance and `nvidia.com/gpu` or a fraction)
/// is scheduled as before MIG support: by its extended-resource counts alone,
/// with no particular instance; the second value says so when the pod is not
/// bound yet (a bound pod runs already, and is only counted).
pub fn pod_request(
    object: &str,
    req: &Resources,
    gpu: &GpuRequest,
    bound: bool,
    models: &[String],
) -> (Option<GpuRequest>, Option<TranslateError>) {
    let asked: Vec<(&str, u64)> = req
        .extended
        .iter()
        .filter_map(|(k, v)| profile_of_resource(k).map(|p| (p, *v)))
        .filter(|(p, v)| *v > 0 && known_profile(p))
        .collect();
    let counted = |field: &str, value: &str, why: &str| {
        (!bound).then(|| {
            err(
                object,
                field,
                value,
                format!(
                    "{why}: Tessera places one MIG instance per pod, so this pod is scheduled \
                     by its nvidia.com/mig-* counts alone, on no particular instance"
                ),
            )
        })
    };
    match asked.as_slice() {
        [] => (None, None),
        [(profile, 1)] if *gpu == GpuRequest::None => (Some(mig_request(profile, models)), None),
        [(profile, count)] if *count != 1 => (
            None,
            counted(
                &format!("resources.requests[{RESOURCE_PREFIX}{profile}]"),
                &count.to_string(),
                "more than one instance",
            ),
        ),
        [(profile, _)] => (
            None,
            counted(
                &format!("resources.requests[{RESOURCE_PREFIX}{profile}]"),
                "1",
                "a MIG instance together with nvidia.com/gpu or a GPU fraction",
            ),
        ),
        _ => {
            let names: Vec<String> = asked
                .iter()
                .map(|(p, _)| format!("{RESOURCE_PREFIX}{p}"))
                .collect();
            (
                None,
                counted(
                    "resources.requests",
                    &names.join(", "),
                    "instances of several profiles",
                ),
            )
        }
    }
}

/// The model names in `gpu-models` as MIG GPUs are named (the tables'
/// canonical names, `NVIDIA-A100-SXM4-40GB` -> `A100-40GB`), others as given.
fn mig_request(profile: &str, models: &[String]) -> GpuRequest {
    GpuRequest::Mig {
        profile: profile.to_string(),
        models: models
            .iter()
            .map(|m| geometry_of_product(m).map_or_else(|| m.clone(), |g| g.model.to_string()))
            .collect(),
    }
}

/// The MIG instance a pod holds, as Tessera records it in the pod annotation
/// [`keys::MIG_INSTANCE`]: `gpu=2,profile=3g.40gb,start=4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// GPU index on the node (in Tessera's layout; see the module docs).
    pub gpu: u32,
    pub profile: String,
    /// First memory slice.
    pub start: u8,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu={},profile={},start={}",
            self.gpu, self.profile, self.start
        )
    }
}

impl Instance {
    /// Parses the annotation of `object`; every part is required once.
    pub fn parse(object: &str, v: &str) -> Result<Instance, TranslateError> {
        let field = format!("metadata.annotations[{}]", keys::MIG_INSTANCE);
        let bad = |why: &str| {
            err(
                object,
                &field,
                v,
                format!("{why} (gpu=N,profile=P,start=S)"),
            )
        };
        let (mut gpu, mut profile, mut start) = (None, None, None);
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, val)) = part.split_once('=') else {
                return Err(bad(&format!("`{part}` is not key=value")));
            };
            let dup = match k.trim() {
                "gpu" => gpu
                    .replace(
                        val.trim()
                            .parse::<u32>()
                            .map_err(|_| bad("gpu is not a GPU index"))?,
                    )
                    .is_some(),
                "profile" if !val.trim().is_empty() => {
                    profile.replace(val.trim().to_string()).is_some()
                }
                "start" => start
                    .replace(
                        val.trim()
                            .parse::<u8>()
                            .map_err(|_| bad("start is not a memory slice"))?,
                    )
                    .is_some(),
                _ => return Err(bad(&format!("unknown or empty `{part}`"))),
            };
            if dup {
                return Err(bad(&format!("`{k}` given twice")));
            }
        }
        match (gpu, profile, start) {
            (Some(gpu), Some(profile), Some(start)) => Ok(Instance {
                gpu,
                profile,
                start,
            }),
            _ => Err(bad("gpu, profile and start are all needed")),
        }
    }
}

/// Holds back every group of `plan` with a binding whose MIG step creates an
/// instance or destroys idle ones: Kubernetes has no API to make one MIG
/// instance, and re-partitioning a GPU (NVIDIA's mig-manager, through the
/// node's `nvidia.com/mig.config` label) stops every GPU workload on the node.
/// Such a group's bindings are removed and it is pending with a reason that
/// names the node, GPU and the instance it would need. The whole group waits,
/// so a gang stays all or nothing.
pub fn hold_reconfigurations(plan: &mut Plan) {
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for b in &plan.bindings {
        let Some(m) = &b.mig else { continue };
        if !m.create && m.destroy.is_empty() {
            continue;
        }
        if held.contains_key(&b.task.group) {
            continue;
        }
        let gpu = b.gpus.first().map_or_else(|| "?".into(), u32::to_string);
        let destroy = if m.destroy.is_empty() {
            String::new()
        } else {
            let d: Vec<String> = m.destroy.iter().map(ToString::to_string).collect();
            format!(" after destroying idle {}", d.join(", "))
        };
        held.insert(
            b.task.group.clone(),
            format!(
                "node {} has no idle MIG {} instance: placing {} would need a new one on GPU \
                 {gpu} at memory slice {}{destroy}, and Tessera does not change MIG layouts on \
                 Kubernetes (the node's MIG configuration, e.g. nvidia.com/mig.config for \
                 NVIDIA's mig-manager, decides which instances exist); waiting for a free {} \
                 instance",
                b.node, m.profile, b.task, m.start, m.profile
            ),
        );
    }
    if held.is_empty() {
        return;
    }
    plan.bindings.retain(|b| !held.contains_key(&b.task.group));
    for p in &mut plan.pending {
        if let Some(r) = held.remove(&p.group) {
            p.admitted = true;
            p.reason = r;
        }
    }
    for (group, reason) in held {
        plan.pending.push(Pending {
            group,
            admitted: true,
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1 as core;
    use proptest::prelude::*;
    use tessera_model::{Binding, MigStep, TaskId};

    use super::*;
    use crate::state::State;
    use crate::translate;

    /// A node as GFD and the device plugin publish it: `labels` on top of the
    /// driver's usual ones, `alloc` beside cpu, memory and pods.
    fn gfd_node(name: &str, labels: &[(&str, &str)], alloc: &[(&str, &str)]) -> core::Node {
        let mut l = serde_json::Map::new();
        for (k, v) in [
            ("nvidia.com/cuda.driver.major", "550"),
            ("nvidia.com/gpu.family", "ampere"),
            ("nvidia.com/gpu.replicas", "0"),
            ("nvidia.com/mps.capable", "false"),
        ] {
            l.insert(k.into(), v.into());
        }
        for (k, v) in labels {
            l.insert((*k).into(), (*v).into());
        }
        let mut a = serde_json::json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
        for (k, v) in alloc {
            a[*k] = (*v).into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": l},
            "status": {"allocatable": a}
        }))
        .unwrap()
    }

    /// GFD's labels for one mixed-strategy profile.
    fn profile_labels(p: &str, count: u32, mem: u32, gi: u32) -> Vec<(String, String)> {
        vec![
            (format!("nvidia.com/mig-{p}.count"), count.to_string()),
            (format!("nvidia.com/mig-{p}.memory"), mem.to_string()),
            (
                format!("nvidia.com/mig-{p}.multiprocessors"),
                (14 * gi).to_string(),
            ),
            (format!("nvidia.com/mig-{p}.slices.gi"), gi.to_string()),
            (format!("nvidia.com/mig-{p}.slices.ci"), gi.to_string()),
            (format!("nvidia.com/mig-{p}.engines.copy"), gi.to_string()),
            (format!("nvidia.com/mig-{p}.engines.decoder"), "0".into()),
            (format!("nvidia.com/mig-{p}.replicas"), "1".into()),
        ]
    }

    /// A DGX A100 (8 × A100-SXM4-40GB), mig-manager's `all-balanced`: each GPU
    /// has 2 × 1g.5gb, 1 × 2g.10gb and 1 × 3g.20gb.
    fn dgx_a100_balanced(name: &str) -> core::Node {
        let mut labels: Vec<(String, String)> = vec![
            (
                "nvidia.com/gpu.product".into(),
                "NVIDIA-A100-SXM4-40GB".into(),
            ),
            ("nvidia.com/gpu.count".into(), "8".into()),
            ("nvidia.com/gpu.memory".into(), "40960".into()),
            ("nvidia.com/mig.capable".into(), "true".into()),
            ("nvidia.com/mig.strategy".into(), "mixed".into()),
            ("nvidia.com/mig.config".into(), "all-balanced".into()),
            ("nvidia.com/mig.config.state".into(), "success".into()),
        ];
        labels.extend(profile_labels("1g.5gb", 16, 4864, 1));
        labels.extend(profile_labels("2g.10gb", 8, 9856, 2));
        labels.extend(profile_labels("3g.20gb", 8, 19968, 3));
        let l: Vec<(&str, &str)> = labels
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        gfd_node(
            name,
            &l,
            &[
                ("nvidia.com/mig-1g.5gb", "16"),
                ("nvidia.com/mig-2g.10gb", "8"),
                ("nvidia.com/mig-3g.20gb", "8"),
            ],
        )
    }

    fn per_profile(n: &Node) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for g in &n.gpus {
            for i in g.mig.iter().flat_map(|l| &l.instances) {
                *m.entry(i.profile.clone()).or_default() += 1;
            }
        }
        m
    }

    fn check_layouts(n: &Node) {
        for g in &n.gpus {
            if let Some(l) = &g.mig
                && let Some(geo) = mig::geometry(&g.model)
            {
                geo.check(l)
                    .unwrap_or_else(|e| panic!("GPU {} of {}: {e}", g.index, n.name));
            }
        }
    }

    #[test]
    fn mixed_a100_all_balanced() {
        let n = translate::node(&dgx_a100_balanced("a1")).unwrap();
        assert_eq!(n.gpus.len(), 8);
        assert!(
            n.gpus
                .iter()
                .all(|g| g.model == "A100-40GB" && g.mig.is_some())
        );
        assert_eq!(n.gpus[7].index, 7);
        assert_eq!(n.gpus[0].memory, 40960 << 20);
        assert_eq!(n.allocatable.gpu_milli, 8000);
        assert_eq!(n.allocatable.gpu_memory, 8 * (40960 << 20));
        check_layouts(&n);
        // On the eight GPUs gpu.count names, found by search: first fit by
        // size would have needed nine.
        assert!(
            n.gpus
                .iter()
                .all(|g| !g.mig.as_ref().unwrap().instances.is_empty())
        );
        let a100 = mig::geometry("A100-40GB").unwrap();
        assert_eq!(first_fit(a100, &[16, 0, 8, 8, 0, 0]).len(), 9);
        assert_eq!(
            per_profile(&n),
            BTreeMap::from([
                ("1g.5gb".into(), 16),
                ("2g.10gb".into(), 8),
                ("3g.20gb".into(), 8)
            ])
        );
        // The counts stay, as the guard.
        assert_eq!(
            n.allocatable.extended.get("nvidia.com/mig-1g.5gb"),
            Some(&16)
        );
        // Same labels, same layout.
        assert_eq!(n, translate::node(&dgx_a100_balanced("a1")).unwrap());
    }

    #[test]
    fn mixed_h100_with_gpus_without_mig() {
        // Four of eight H100s cut into 7 × 1g.10gb, four whole.
        let mut labels: Vec<(String, String)> = vec![
            (
                "nvidia.com/gpu.product".into(),
                "NVIDIA-H100-80GB-HBM3".into(),
            ),
            ("nvidia.com/gpu.count".into(), "8".into()),
            ("nvidia.com/gpu.memory".into(), "81559".into()),
            (
                "nvidia.com/gpu.clique".into(),
                "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1".into(),
            ),
            ("nvidia.com/mig.capable".into(), "true".into()),
            ("nvidia.com/mig.strategy".into(), "mixed".into()),
        ];
        labels.extend(profile_labels("1g.10gb", 28, 9984, 1));
        let l: Vec<(&str, &str)> = labels
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let n = translate::node(&gfd_node(
            "h1",
            &l,
            &[("nvidia.com/gpu", "4"), ("nvidia.com/mig-1g.10gb", "28")],
        ))
        .unwrap();
        assert_eq!(n.gpus.len(), 8);
        for g in &n.gpus[..4] {
            assert_eq!(
                (g.model.as_str(), g.mig.is_none()),
                ("H100-80GB-HBM3", true)
            );
        }
        for g in &n.gpus[4..] {
            assert_eq!(g.model, "H100-80GB");
            assert_eq!(g.mig.as_ref().unwrap().instances.len(), 7);
        }
        assert_eq!(n.allocatable.gpu_milli, 8000);
        check_layouts(&n);
    }

    #[test]
    fn nothing_is_handed_out_while_mig_manager_repartitions() {
        let mut node = dgx_a100_balanced("a1");
        for (state, offered) in [
            ("pending", 0),
            ("rebooting", 0),
            ("success", 16),
            ("failed", 16),
        ] {
            node.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("nvidia.com/mig.config.state".into(), state.into());
            let n = translate::node(&node).unwrap();
            assert_eq!(
                n.allocatable.extended.get("nvidia.com/mig-1g.5gb"),
                Some(&offered),
                "{state}"
            );
            assert_eq!(
                per_profile(&n).get("1g.5gb").copied().unwrap_or(0),
                offered as usize
            );
        }
    }

    #[test]
    fn mixed_without_gpu_count_uses_as_few_gpus_as_hold_them() {
        let n = translate::node(&gfd_node(
            "a2",
            &[("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")],
            &[("nvidia.com/mig-3g.40gb", "3")],
        ))
        .unwrap();
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.gpus[0].model, "A100-80GB");
        check_layouts(&n);
    }

    #[test]
    fn mixed_on_a_model_without_tables_lists_the_instances() {
        let n = translate::node(&gfd_node(
            "b1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-B200"),
                ("nvidia.com/gpu.count", "2"),
                ("nvidia.com/mig.strategy", "mixed"),
            ],
            &[("nvidia.com/mig-1g.23gb", "3")],
        ))
        .unwrap();
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.gpus[0].model, "B200");
        let starts: Vec<Vec<u8>> = n
            .gpus
            .iter()
            .map(|g| {
                g.mig
                    .as_ref()
                    .unwrap()
                    .instances
                    .iter()
                    .map(|i| i.start)
                    .collect()
            })
            .collect();
        assert_eq!(starts, vec![vec![0, 1], vec![0]]);
        // Without gpu.count: 9 × 1g and 1 × 3g fill two GPUs of 7 compute slices.
        let n = translate::node(&gfd_node(
            "b2",
            &[("nvidia.com/gpu.product", "NVIDIA-B200")],
            &[
                ("nvidia.com/mig-1g.23gb", "9"),
                ("nvidia.com/mig-3g.90gb", "1"),
            ],
        ))
        .unwrap();
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.allocatable.gpu_milli, 2000);
    }

    #[test]
    fn time_sliced_gpus_without_mig_count_once() {
        // Two whole A100s shared 4 ways, two cut into 3g.20gb.
        let n = translate::node(&gfd_node(
            "t1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "4"),
                ("nvidia.com/gpu.replicas", "4"),
                ("nvidia.com/mig.strategy", "mixed"),
            ],
            &[("nvidia.com/gpu", "8"), ("nvidia.com/mig-3g.20gb", "4")],
        ))
        .unwrap();
        let mig: Vec<usize> = n
            .gpus
            .iter()
            .filter_map(|g| g.mig.as_ref().map(|l| l.instances.len()))
            .collect();
        assert_eq!(mig, vec![2, 2]);
    }

    #[test]
    fn without_gpu_count_the_layout_uses_as_few_gpus_as_the_slices_allow() {
        // all-balanced on 8 GPUs: first fit by size needs 9, the search 8.
        let mut node = dgx_a100_balanced("a1");
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove("nvidia.com/gpu.count");
        let n = translate::node(&node).unwrap();
        assert_eq!(n.gpus.len(), 8);
        assert_eq!(n.allocatable.gpu_milli, 8000);
        check_layouts(&n);
        assert_eq!(per_profile(&n).values().sum::<usize>(), 32);
    }

    #[test]
    fn a_layout_is_searched_once_for_the_same_labels() {
        // The same node status again and again (heartbeats, relists).
        let node = gfd_node(
            "a1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "3"),
            ],
            &[
                ("nvidia.com/mig-3g.20gb", "4"),
                ("nvidia.com/mig-1g.5gb", "5"),
            ],
        );
        let before = searches();
        let n = translate::node(&node).unwrap();
        for _ in 0..10 {
            assert_eq!(translate::node(&node).unwrap(), n);
        }
        assert_eq!(searches() - before, 1);
        // Other inputs, another search.
        translate::node(&dgx_a100_balanced("a2")).unwrap();
        assert_eq!(searches() - before, 2);
    }

    #[test]
    fn absurd_counts_drop_the_layout_not_the_node() {
        for alloc in [
            vec![("nvidia.com/mig-1g.5gb", "18446744073709551615")],
            vec![
                ("nvidia.com/mig-1g.5gb", "18446744073709551615"),
                ("nvidia.com/mig-2g.10gb", "1"),
            ],
            vec![("nvidia.com/mig-1g.23gb", "18446744073709551615")],
        ] {
            for product in ["NVIDIA-A100-SXM4-40GB", "NVIDIA-B200"] {
                let (n, e) = translate::node_noting(&gfd_node(
                    "x1",
                    &[("nvidia.com/gpu.product", product)],
                    &alloc,
                ))
                .unwrap();
                let e = e.expect("a problem");
                assert_eq!(
                    (e.field.as_str(), e.value.as_str()),
                    (
                        &*format!("status.allocatable[{}]", alloc[0].0),
                        "18446744073709551615"
                    )
                );
                assert!(n.gpus.is_empty());
                assert_eq!(n.allocatable.cpu_milli, 64_000);
                assert_eq!(n.allocatable.extended.get(alloc[0].0), Some(&u64::MAX));
            }
        }
    }

    #[test]
    fn time_sliced_mig_keeps_the_node_and_counts_its_pods() {
        // One A100 as 7 × 1g.5gb, each instance shared 2 ways: 14 advertised.
        let mut labels: Vec<(String, String)> = vec![
            (
                "nvidia.com/gpu.product".into(),
                "NVIDIA-A100-SXM4-40GB".into(),
            ),
            ("nvidia.com/gpu.count".into(), "1".into()),
            ("nvidia.com/mig.strategy".into(), "mixed".into()),
        ];
        labels.extend(profile_labels("1g.5gb", 7, 4864, 1));
        labels.retain(|(k, _)| k != "nvidia.com/mig-1g.5gb.replicas");
        labels.push(("nvidia.com/mig-1g.5gb.replicas".into(), "2".into()));
        let l: Vec<(&str, &str)> = labels
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let node = gfd_node("t1", &l, &[("nvidia.com/mig-1g.5gb", "14")]);
        let (n, e) = translate::node_noting(&node).unwrap();
        assert!(e.is_none(), "{e:?}");
        assert_eq!(per_profile(&n), BTreeMap::from([("1g.5gb".into(), 7)]));
        check_layouts(&n);
        assert_eq!(
            time_sliced_profiles(&n.labels),
            BTreeSet::from(["1g.5gb".to_string()])
        );

        // Its pods are counted: 14 bind, with no instance each.
        let mut s = State::new("tessera");
        s.apply_node(&node);
        for i in 0..16 {
            s.apply_pod(&mig_pod(
                &format!("p{i}"),
                serde_json::json!({"cpu": "1", "nvidia.com/mig-1g.5gb": "1"}),
                serde_json::json!({}),
            ));
        }
        let bound = settle(&mut s);
        assert_eq!(bound.len(), 14);
        assert!(bound.iter().all(|b| b.node == "t1" && b.mig.is_none()));

        // Replicas that do not divide the count: the layout goes, the node stays.
        let bad = gfd_node("t2", &l, &[("nvidia.com/mig-1g.5gb", "13")]);
        let (n, e) = translate::node_noting(&bad).unwrap();
        let e = e.unwrap();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("status.allocatable[nvidia.com/mig-1g.5gb]", "13")
        );
        assert!(n.gpus.is_empty());
        let mut s = State::new("tessera");
        s.apply_node(&bad);
        assert_eq!(s.node_count(), 1);
        assert!(
            s.errors.iter().any(|x| x.contains("replicas")),
            "{:?}",
            s.errors
        );
    }

    #[test]
    fn renamed_shared_gpus_are_not_taken_for_mig_ones() {
        // renameByDefault: two whole A100s shared 2 ways as
        // nvidia.com/gpu.shared (no nvidia.com/gpu), two cut into 3g.20gb.
        let n = translate::node(&gfd_node(
            "t1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "4"),
                ("nvidia.com/gpu.replicas", "2"),
                ("nvidia.com/mig.strategy", "mixed"),
            ],
            &[
                ("nvidia.com/gpu.shared", "4"),
                ("nvidia.com/mig-3g.20gb", "4"),
            ],
        ))
        .unwrap();
        assert_eq!(n.gpus.len(), 2);
        assert!(n.gpus.iter().all(|g| g.mig.is_some()));
        assert_eq!(n.allocatable.gpu_milli, 2000);
    }

    #[test]
    fn bound_pods_with_bad_records_still_count() {
        // One A100 with 2 × 3g.20gb, both held by bound pods, one of them
        // with a record someone garbled: the new pod must not bind.
        let node = gfd_node(
            "a1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "1"),
            ],
            &[("nvidia.com/mig-3g.20gb", "2")],
        );
        for record in [
            "gpu=0,profile=3g.20gb,start=0",
            "gpu=0,profile=3g.20gb,start=4",
        ] {
            let mut s = State::new("tessera");
            s.apply_node(&node);
            s.apply_pod(&mig_pod(
                "ok",
                serde_json::json!({"nvidia.com/mig-3g.20gb": "1"}),
                serde_json::json!({"spec": {"nodeName": "a1"}, "metadata": {"annotations": {
                    "scheduling.tessera.dev/mig-instance": record}}}),
            ));
            s.apply_pod(&mig_pod(
                "garbled",
                serde_json::json!({"cpu": "60", "nvidia.com/mig-3g.20gb": "1"}),
                serde_json::json!({"spec": {"nodeName": "a1"}, "metadata": {"annotations": {
                    "scheduling.tessera.dev/mig-instance": "gpu=0,profile=7g.40gb,start=0"}}}),
            ));
            assert!(
                s.errors.iter().any(|e| e.contains("pod ns/garbled")
                    && e.contains("mig-instance")
                    && e.contains("ignored")),
                "{:?}",
                s.errors
            );
            for p in ["new", "cpu"] {
                let req = if p == "new" {
                    serde_json::json!({"nvidia.com/mig-3g.20gb": "1"})
                } else {
                    serde_json::json!({"cpu": "8"})
                };
                s.apply_pod(&mig_pod(p, req, serde_json::json!({})));
            }
            let bound = settle(&mut s);
            assert!(bound.is_empty(), "{bound:?}");
        }
        // A record that reads well but names no instance of the layout (no
        // such GPU, no such start): nothing panics, and the count still
        // guards the node.
        for nowhere in [
            "gpu=99,profile=3g.20gb,start=0",
            "gpu=0,profile=3g.20gb,start=3",
            "gpu=0,profile=3g.20gb,start=255",
        ] {
            let mut s = State::new("tessera");
            s.apply_node(&node);
            for (p, record) in [("ok", "gpu=0,profile=3g.20gb,start=0"), ("odd", nowhere)] {
                s.apply_pod(&mig_pod(
                    p,
                    serde_json::json!({"nvidia.com/mig-3g.20gb": "1"}),
                    serde_json::json!({"spec": {"nodeName": "a1"}, "metadata": {"annotations": {
                        "scheduling.tessera.dev/mig-instance": record}}}),
                ));
            }
            s.apply_pod(&mig_pod(
                "new",
                serde_json::json!({"nvidia.com/mig-3g.20gb": "1"}),
                serde_json::json!({}),
            ));
            let bound = settle(&mut s);
            assert!(bound.is_empty(), "{nowhere}: {bound:?}");
        }
        // The same for a whole-GPU pod's gpu-indices.
        let mut s = State::new("tessera");
        s.apply_node(&gfd_node(
            "g1",
            &[("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")],
            &[("nvidia.com/gpu", "1")],
        ));
        s.apply_pod(&mig_pod(
            "old",
            serde_json::json!({"nvidia.com/gpu": "1"}),
            serde_json::json!({"spec": {"nodeName": "g1"}, "metadata": {"annotations": {
                "scheduling.tessera.dev/gpu-indices": "0,zero"}}}),
        ));
        assert!(
            s.errors
                .iter()
                .any(|e| e.contains("gpu-indices") && e.contains("\"0,zero\"")),
            "{:?}",
            s.errors
        );
        assert_eq!(
            s.pod(&("ns".into(), "old".into()))
                .unwrap()
                .task
                .gpu_indices,
            Vec::<u32>::new()
        );
        s.apply_pod(&mig_pod(
            "new",
            serde_json::json!({"nvidia.com/gpu": "1"}),
            serde_json::json!({}),
        ));
        assert!(settle(&mut s).is_empty());
    }

    #[test]
    fn single_strategy_instances_are_gpus() {
        let single = |product: &str, count: &str| {
            gfd_node(
                "s1",
                &[
                    ("nvidia.com/gpu.product", product),
                    ("nvidia.com/gpu.count", count),
                    ("nvidia.com/gpu.memory", "4864"),
                    ("nvidia.com/gpu.slices.gi", "1"),
                    ("nvidia.com/gpu.slices.ci", "1"),
                    ("nvidia.com/mig.capable", "true"),
                    ("nvidia.com/mig.strategy", "single"),
                ],
                &[("nvidia.com/gpu", count)],
            )
        };
        let n = translate::node(&single("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "56")).unwrap();
        assert_eq!(n.gpus.len(), 56);
        assert_eq!(n.gpus[0].model, "A100-SXM4-40GB-MIG-1g.5gb");
        assert_eq!(n.gpus[0].memory, 4864 << 20);
        assert!(n.gpus.iter().all(|g| g.mig.is_none()));
        assert_eq!(n.allocatable.gpu_milli, 56_000);
        let n = translate::node(&single("NVIDIA-A100-SXM4-40GB-MIG-INVALID", "0")).unwrap();
        assert!(n.gpus.is_empty());
        assert_eq!(n.allocatable.gpu_milli, 0);
        let (n, e) =
            translate::node_noting(&single("NVIDIA-A100-SXM4-40GB-MIG-3g.40gb", "16")).unwrap();
        let e = e.unwrap();
        // Kept as 16 GPUs, as nvidia.com/gpu says.
        assert_eq!(n.gpus.len(), 16);
        assert_eq!(e.field, "metadata.labels[nvidia.com/gpu.product]");
        assert_eq!(e.value, "NVIDIA-A100-SXM4-40GB-MIG-3g.40gb");
        assert!(
            e.problem.contains("A100-40GB has no MIG profile 3g.40gb"),
            "{e}"
        );
    }

    #[test]
    fn bad_mig_labels_name_field_and_value() {
        let with = |extra: &[(&str, &str)], alloc: &[(&str, &str)]| {
            let mut l = vec![
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "1"),
                ("nvidia.com/mig.strategy", "mixed"),
            ];
            l.extend_from_slice(extra);
            // The node stays, with its CPUs and counts, without MIG GPUs.
            let (n, e) = translate::node_noting(&gfd_node("x1", &l, alloc)).unwrap();
            assert_eq!(n.allocatable.cpu_milli, 64_000);
            assert!(n.gpus.is_empty(), "{:?}", n.gpus);
            for (k, v) in alloc {
                assert_eq!(
                    n.allocatable
                        .extended
                        .get(*k)
                        .map(u64::to_string)
                        .as_deref(),
                    Some(*v)
                );
            }
            let e = e.expect("a problem");
            assert!(e.problem.contains("MIG labels are ignored"), "{e}");
            e
        };
        let one = [("nvidia.com/mig-1g.5gb", "7")];
        let e = with(&[("nvidia.com/mig.strategy", "half")], &one);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("metadata.labels[nvidia.com/mig.strategy]", "half")
        );
        let e = with(&[("nvidia.com/mig.capable", "yes")], &one);
        assert_eq!(e.field, "metadata.labels[nvidia.com/mig.capable]");
        let e = with(&[("nvidia.com/mig-1g.5gb.count", "seven")], &one);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("metadata.labels[nvidia.com/mig-1g.5gb.count]", "seven")
        );
        let e = with(&[("nvidia.com/mig-1g.5gb.slices.gi", "2")], &one);
        assert_eq!(e.field, "metadata.labels[nvidia.com/mig-1g.5gb.slices.gi]");
        assert!(e.problem.contains("has 1 compute slices"), "{e}");
        // Eight 1g.5gb instances cannot be on one GPU (seven compute slices).
        let e = with(&[], &[("nvidia.com/mig-1g.5gb", "8")]);
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("metadata.labels[nvidia.com/gpu.count]", "1")
        );
        assert!(e.to_string().starts_with("node x1: "), "{e}");
        // A profile of another model.
        let e = with(&[], &[("nvidia.com/mig-3g.40gb", "1")]);
        assert_eq!(e.field, "status.allocatable[nvidia.com/mig-3g.40gb]");
        assert!(e.problem.contains("A100-40GB"), "{e}");
    }

    fn mig_pod(name: &str, requests: serde_json::Value, extra: serde_json::Value) -> core::Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"schedulerName": "tessera",
                "containers": [{"name": "c", "resources": {"requests": requests}}]}
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn pod_asks_for_one_instance() {
        let req = serde_json::json!({"cpu": "1", "nvidia.com/mig-3g.40gb": "1"});
        let p = mig_pod(
            "p",
            req.clone(),
            serde_json::json!({"metadata": {"annotations": {
                "scheduling.tessera.dev/gpu-models": "NVIDIA-H100-80GB-HBM3, T4"}}}),
        );
        let i = translate::pod(&p).unwrap();
        assert_eq!(
            i.task.gpu,
            GpuRequest::Mig {
                profile: "3g.40gb".into(),
                models: vec!["H100-80GB".into(), "T4".into()]
            }
        );
        assert_eq!(
            i.task.resources.extended.get("nvidia.com/mig-3g.40gb"),
            Some(&1)
        );
        assert_eq!(i.task.request().gpu_milli, 428);

        // More than one instance: scheduled by the counts, as before MIG
        // support, with a note naming the request.
        for (req, gpu, field, value) in [
            (
                serde_json::json!({"nvidia.com/mig-1g.10gb": "2"}),
                GpuRequest::None,
                "resources.requests[nvidia.com/mig-1g.10gb]",
                "2",
            ),
            (
                serde_json::json!({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}),
                GpuRequest::None,
                "resources.requests",
                "nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb",
            ),
            (
                serde_json::json!({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}),
                GpuRequest::Whole {
                    count: 1,
                    models: vec![],
                },
                "resources.requests[nvidia.com/mig-1g.10gb]",
                "1",
            ),
        ] {
            let i = translate::pod(&mig_pod("p", req.clone(), serde_json::json!({}))).unwrap();
            assert_eq!(i.task.gpu, gpu, "{req}");
            assert_eq!(
                i.task.resources.extended.get("nvidia.com/mig-1g.10gb"),
                req["nvidia.com/mig-1g.10gb"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .as_ref()
            );
            assert_eq!(i.notes.len(), 1, "{req}");
            assert!(
                i.notes[0].starts_with(&format!("pod ns/p: {field} = {value:?}: ")),
                "{}",
                i.notes[0]
            );
            assert!(i.notes[0].contains("counts alone"), "{}", i.notes[0]);
        }
        // A bound pod with two instances runs already: counted, not refused.
        let i = translate::pod(&mig_pod(
            "p",
            serde_json::json!({"nvidia.com/mig-1g.10gb": "2"}),
            serde_json::json!({"spec": {"nodeName": "n1"}}),
        ))
        .unwrap();
        assert_eq!(i.task.gpu, GpuRequest::None);
        assert_eq!(
            i.task.resources.extended.get("nvidia.com/mig-1g.10gb"),
            Some(&2)
        );
        // A profile no table knows stays a count.
        let i = translate::pod(&mig_pod(
            "p",
            serde_json::json!({"nvidia.com/mig-1g.10gb.me": "1"}),
            serde_json::json!({}),
        ))
        .unwrap();
        assert_eq!(i.task.gpu, GpuRequest::None);
    }

    #[test]
    fn bound_pod_reads_its_instance_back() {
        let bound = |ann: &str| {
            mig_pod(
                "p",
                serde_json::json!({"nvidia.com/mig-3g.40gb": "1"}),
                serde_json::json!({"spec": {"nodeName": "n1"}, "metadata": {"annotations": {
                    "scheduling.tessera.dev/gpu-indices": "2",
                    "scheduling.tessera.dev/mig-instance": ann}}}),
            )
        };
        let i = translate::pod(&bound("gpu=2,profile=3g.40gb,start=4")).unwrap();
        assert_eq!(
            (i.task.gpu_indices.as_slice(), i.task.mig_start),
            (&[2][..], Some(4))
        );
        // A bad record (anyone who may patch the pod can write one) is
        // reported and ignored: the pod still counts, on no particular
        // instance; `gpu-indices` does not stand in for it.
        for (bad, why) in [
            ("gpu=2,profile=3g.40gb", "all needed"),
            ("gpu=two,profile=3g.40gb,start=4", "not a GPU index"),
            ("gpu=2,profile=3g.40gb,start=4,start=0", "twice"),
            ("gpu=2,profile=3g.40gb,start=999", "memory slice"),
            ("gpu=2,colour=red,profile=3g.40gb,start=4", "unknown"),
            ("gpu=2,profile=1g.10gb,start=4", "not 1g.10gb"),
        ] {
            let i = translate::pod(&bound(bad)).unwrap();
            assert!(matches!(i.task.gpu, GpuRequest::Mig { .. }), "{bad}");
            assert_eq!(i.task.node.as_deref(), Some("n1"));
            assert_eq!(
                i.task.resources.extended.get("nvidia.com/mig-3g.40gb"),
                Some(&1)
            );
            assert_eq!(
                (i.task.gpu_indices.as_slice(), i.task.mig_start),
                (&[][..], None),
                "{bad}"
            );
            assert_eq!(i.notes.len(), 1, "{bad}");
            let n = &i.notes[0];
            assert!(
                n.starts_with(&format!(
                    "pod ns/p: metadata.annotations[scheduling.tessera.dev/mig-instance] = {bad:?}: "
                )),
                "{n}"
            );
            assert!(n.contains(why) && n.contains("ignored"), "{bad}: {n}");
        }
        let i = Instance {
            gpu: 3,
            profile: "1g.5gb".into(),
            start: 6,
        };
        assert_eq!(Instance::parse("pod a/b", &i.to_string()), Ok(i));
    }

    #[test]
    fn reconfiguration_holds_the_whole_group() {
        let bind = |task: &str, mig: Option<MigStep>| Binding {
            task: TaskId {
                group: "ns/job".into(),
                task: task.into(),
            },
            node: "a1".into(),
            gpus: vec![3],
            after_evictions: false,
            mig,
        };
        let step = |create: bool| MigStep {
            profile: "3g.20gb".into(),
            start: 4,
            create,
            destroy: vec![tessera_model::MigRef {
                profile: "1g.5gb".into(),
                start: 4,
            }]
            .into_iter()
            .filter(|_| create)
            .collect(),
        };
        let mut other = bind("solo", Some(step(false)));
        other.task.group = "ns/solo@pod".into();
        let mut plan = Plan {
            bindings: vec![
                bind("a", Some(step(false))),
                bind("b", Some(step(true))),
                other,
            ],
            ..Plan::default()
        };
        hold_reconfigurations(&mut plan);
        assert_eq!(plan.bindings.len(), 1);
        assert_eq!(plan.bindings[0].task.task, "solo");
        assert_eq!(plan.pending.len(), 1);
        let r = &plan.pending[0].reason;
        assert!(
            r.contains("node a1 has no idle MIG 3g.20gb instance")
                && r.contains("GPU 3 at memory slice 4 after destroying idle 1g.5gb@4"),
            "{r}"
        );
    }

    fn plan_of(s: &State) -> (crate::state::Built, Plan) {
        let b = s.build();
        let plan = tessera_sched::schedule(&b.snapshot, &tessera_sched::Config::default());
        (b, plan)
    }

    /// Idle instances of each profile in a built snapshot: those its nodes
    /// have, less those its bound (or assumed) tasks hold.
    fn idle(b: &crate::state::Built) -> BTreeMap<String, i64> {
        let mut m: BTreeMap<String, i64> = BTreeMap::new();
        for n in &b.snapshot.nodes {
            for i in n
                .gpus
                .iter()
                .filter_map(|g| g.mig.as_ref())
                .flat_map(|l| &l.instances)
            {
                *m.entry(i.profile.clone()).or_default() += 1;
            }
        }
        for t in b.snapshot.groups.iter().flat_map(|g| &g.tasks) {
            if let GpuRequest::Mig { profile, .. } = &t.gpu
                && t.node.is_some()
                && t.mig_start.is_some()
            {
                *m.entry(profile.clone()).or_default() -= 1;
            }
        }
        m
    }

    /// Schedules until nothing more binds, assuming every binding as the
    /// controller does; returns the bindings made. Checks each plan *before*
    /// [`hold_reconfigurations`]: the scheduler proposes to create or destroy
    /// instances for a profile only once its idle instances are all taken.
    fn settle(s: &mut State) -> Vec<Binding> {
        let mut all = Vec::new();
        loop {
            let (b, mut plan) = plan_of(s);
            let idle = idle(&b);
            let mut reused: BTreeMap<&str, i64> = BTreeMap::new();
            for bd in &plan.bindings {
                if let Some(m) = &bd.mig
                    && !m.create
                    && m.destroy.is_empty()
                {
                    *reused.entry(m.profile.as_str()).or_default() += 1;
                }
            }
            for bd in &plan.bindings {
                if let Some(m) = &bd.mig
                    && (m.create || !m.destroy.is_empty())
                {
                    let left = idle.get(&m.profile).copied().unwrap_or(0)
                        - reused.get(m.profile.as_str()).copied().unwrap_or(0);
                    assert!(
                        left <= 0,
                        "reconfigures with {left} idle left: {bd:?}\n{plan}"
                    );
                }
            }
            hold_reconfigurations(&mut plan);
            if plan.bindings.is_empty() {
                return all;
            }
            for bd in plan.bindings {
                let key = b.pod_of(&bd.task.group, &bd.task.task).unwrap();
                s.assume(
                    key,
                    bd.node.clone(),
                    bd.gpus.clone(),
                    bd.mig.as_ref().map(|m| m.start),
                );
                all.push(bd);
            }
        }
    }

    #[test]
    fn mig_pod_lands_where_its_profile_is_free() {
        let mut s = State::new("tessera");
        // a1 has 1g.5gb instances; b1 only 3g.20gb ones (and free slices).
        s.apply_node(&dgx_a100_balanced("a1"));
        s.apply_node(&gfd_node(
            "b1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "1"),
                ("nvidia.com/mig.strategy", "mixed"),
            ],
            &[("nvidia.com/mig-3g.20gb", "1")],
        ));
        for i in 0..20 {
            s.apply_pod(&mig_pod(
                &format!("p{i}"),
                serde_json::json!({"cpu": "1", "nvidia.com/mig-1g.5gb": "1"}),
                serde_json::json!({}),
            ));
        }
        let bound = settle(&mut s);
        // 16 instances of 1g.5gb, all on a1, each once, none created.
        assert_eq!(bound.len(), 16);
        let mut seen = BTreeSet::new();
        for b in &bound {
            assert_eq!(b.node, "a1");
            let m = b.mig.as_ref().unwrap();
            assert!(
                seen.insert((b.gpus[0], m.start)),
                "instance given twice: {b:?}"
            );
        }
        let (_, plan) = plan_of(&s);
        assert_eq!(plan.pending.len(), 4, "{plan}");
        assert!(
            plan.pending[0]
                .reason
                .ends_with("0/2 nodes fit: 2 nodes lack free nvidia.com/mig-1g.5gb"),
            "{plan}"
        );
    }

    #[test]
    fn recorded_instances_survive_a_restart() {
        // A fresh State (a restarted controller) sees a bound pod with its
        // annotation: a new pod gets another instance, on a1's 1 × 3g.20gb +
        // 1 × 3g.20gb GPU.
        let node = gfd_node(
            "a1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "1"),
            ],
            &[("nvidia.com/mig-3g.20gb", "2")],
        );
        let n = translate::node(&node).unwrap();
        let starts: Vec<u8> = n.gpus[0]
            .mig
            .as_ref()
            .unwrap()
            .instances
            .iter()
            .map(|i| i.start)
            .collect();
        assert_eq!(starts, vec![0, 4]);
        for held in [0u8, 4] {
            let mut s = State::new("tessera");
            s.apply_node(&node);
            s.apply_pod(&mig_pod(
                "old",
                serde_json::json!({"nvidia.com/mig-3g.20gb": "1"}),
                serde_json::json!({"spec": {"nodeName": "a1"}, "metadata": {"annotations": {
                    "scheduling.tessera.dev/mig-instance":
                        format!("gpu=0,profile=3g.20gb,start={held}")}}}),
            ));
            for p in ["new", "newer"] {
                s.apply_pod(&mig_pod(
                    p,
                    serde_json::json!({"nvidia.com/mig-3g.20gb": "1"}),
                    serde_json::json!({}),
                ));
            }
            let bound = settle(&mut s);
            assert_eq!(bound.len(), 1, "{bound:?}");
            assert_eq!(bound[0].mig.as_ref().unwrap().start, 4 - held);
        }
    }

    #[test]
    fn mig_pod_on_a_model_without_tables() {
        let mut s = State::new("tessera");
        s.apply_node(&gfd_node(
            "b1",
            &[
                ("nvidia.com/gpu.product", "NVIDIA-B200"),
                ("nvidia.com/gpu.count", "1"),
            ],
            &[
                ("nvidia.com/mig-1g.23gb", "1"),
                ("nvidia.com/mig-3g.40gb", "1"),
            ],
        ));
        s.apply_pod(&mig_pod(
            "p",
            serde_json::json!({"nvidia.com/mig-3g.40gb": "1"}),
            serde_json::json!({}),
        ));
        s.apply_pod(&mig_pod(
            "q",
            serde_json::json!({"nvidia.com/mig-3g.40gb": "1"}),
            serde_json::json!({}),
        ));
        let bound = settle(&mut s);
        assert_eq!(bound.len(), 1, "{bound:?}");
        let m = bound[0].mig.as_ref().unwrap();
        assert_eq!((bound[0].gpus[0], m.start, m.create), (0, 1, false));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Whatever legal layouts a node's GPUs have, the labels give a legal
        /// layout with the same counts, and no more MIG pods are bound on the
        /// node than it has instances of their profile, none twice on one
        /// instance, none by creating one.
        #[test]
        fn never_more_pods_than_instances(
            shapes_ix in proptest::collection::vec(0usize..1000, 1..4),
            pods in proptest::collection::vec(0usize..6, 0..24),
        ) {
            let g = mig::geometry("A100-40GB").unwrap();
            let layouts = g.all_layouts();
            let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
            for i in &shapes_ix {
                for (p, _) in &layouts[i % layouts.len()] {
                    *counts.entry(p).or_default() += 1;
                }
            }
            let gpus = shapes_ix.len().to_string();
            let alloc: Vec<(String, String)> = counts
                .iter()
                .map(|(p, c)| (format!("nvidia.com/mig-{p}"), c.to_string()))
                .collect();
            let alloc: Vec<(&str, &str)> = alloc.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            let node = gfd_node(
                "a1",
                &[("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"), ("nvidia.com/gpu.count", &gpus)],
                &alloc,
            );
            let n = translate::node(&node).unwrap();
            check_layouts(&n);
            let have: BTreeMap<String, usize> = counts.iter().map(|(p, c)| (p.to_string(), *c as usize)).collect();
            prop_assert_eq!(per_profile(&n), have.clone());

            let mut s = State::new("tessera");
            s.apply_node(&node);
            for (i, p) in pods.iter().enumerate() {
                let profile = g.profiles[*p].name;
                s.apply_pod(&mig_pod(
                    &format!("p{i}"),
                    serde_json::json!({"nvidia.com/mig-".to_string() + profile: "1"}),
                    serde_json::json!({}),
                ));
            }
            let bound = settle(&mut s);
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            let mut seen = BTreeSet::new();
            for b in &bound {
                let m = b.mig.as_ref().unwrap();
                prop_assert!(seen.insert((b.gpus[0], m.start)));
                *per.entry(m.profile.clone()).or_default() += 1;
            }
            for (p, k) in &per {
                prop_assert!(*k <= have.get(p).copied().unwrap_or(0), "{p}: {k} bound, {have:?}");
            }
            // And as many as both allow are bound.
            for (i, prof) in g.profiles.iter().enumerate() {
                let asked = pods.iter().filter(|p| **p == i).count();
                let want = asked.min(have.get(prof.name).copied().unwrap_or(0));
                prop_assert_eq!(per.get(prof.name).copied().unwrap_or(0), want, "{}", prof.name);
            }
        }
    }
}

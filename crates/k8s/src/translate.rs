//! Pure translation of Kubernetes objects into the model's vocabulary: nodes
//! (allocatable, taints, GPU Feature Discovery labels), pods (requests, GPUs,
//! selectors, tolerations, node affinity), queues and pod groups. No I/O: an
//! object in, a model value or an error that names the object, field and value
//! out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ApiResource;
use serde::{Deserialize, Serialize};
use tessera_model::{
    GpuDevice, GpuRequest, GroupKind, NetworkTier, Queue, Resources, Strength, Taint, TaintEffect,
    Task, Toleration, TolerationOperator, parse_bytes, parse_count, parse_cpu_milli,
};

use crate::crd;
use crate::gang::{self, Flavour, GangSource, QueueSource};

pub mod keys;
pub mod mig;

mod error;

pub use error::TranslateError;
pub(crate) use error::err;
pub use keys::gpu_model;

/// Adds a resource list (`cpu`, `memory`, `pods`, extended names) into `r`.
/// `nvidia.com/gpu` is returned separately (whole GPUs), not added.
fn add_list(
    object: &str,
    field: &str,
    list: &BTreeMap<String, Quantity>,
    r: &mut Resources,
) -> Result<u64, TranslateError> {
    let mut gpus = 0;
    for (k, Quantity(v)) in list {
        let f = || format!("{field}.{k}");
        let bad = |e: tessera_model::QuantityError| err(object, &f(), v, e.to_string());
        match k.as_str() {
            "cpu" => r.cpu_milli = r.cpu_milli.saturating_add(parse_cpu_milli(v).map_err(bad)?),
            "memory" => r.memory = r.memory.saturating_add(parse_bytes(v).map_err(bad)?),
            "pods" => r.pods = r.pods.saturating_add(parse_count(v).map_err(bad)?),
            keys::NVIDIA_GPU => gpus += parse_count(v).map_err(bad)?,
            // Not scheduled on by Tessera.
            "ephemeral-storage" | "storage" => {}
            k if k.starts_with("hugepages-") => {}
            k if k.contains('/') => {
                let n = parse_count(v).map_err(bad)?;
                let e = r.extended.entry(k.to_string()).or_insert(0);
                *e = e.saturating_add(n);
            }
            _ => {}
        }
    }
    Ok(gpus)
}

/// A resource list as the model's [`Resources`] (GPUs as milli-GPU).
pub fn resources(
    object: &str,
    field: &str,
    list: &BTreeMap<String, Quantity>,
) -> Result<Resources, TranslateError> {
    let mut r = Resources::default();
    let gpus = add_list(object, field, list, &mut r)?;
    r.gpu_milli = gpus.saturating_mul(1000);
    Ok(r)
}

fn taint_effect(object: &str, field: &str, e: &str) -> Result<TaintEffect, TranslateError> {
    match e {
        "NoSchedule" => Ok(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Ok(TaintEffect::PreferNoSchedule),
        "NoExecute" => Ok(TaintEffect::NoExecute),
        _ => Err(err(
            object,
            field,
            e,
            "not a taint effect (NoSchedule, PreferNoSchedule, NoExecute)",
        )),
    }
}

/// Translates a Node: allocatable (status.allocatable, else capacity), labels,
/// taints, cordon, and its GPUs from `nvidia.com/gpu` plus GPU Feature
/// Discovery labels (product, memory in MiB, NVLink clique), and MIG-enabled
/// GPUs from the MIG labels and `nvidia.com/mig-<profile>` ([`mig`]).
pub fn node(n: &core::Node) -> Result<tessera_model::Node, TranslateError> {
    node_noting(n).map(|(node, _)| node)
}

/// [`node`], with the problem of MIG labels that were ignored, if any (the
/// node is kept without its MIG instances; see [`mig::apply_to_node`]).
pub fn node_noting(
    n: &core::Node,
) -> Result<(tessera_model::Node, Option<TranslateError>), TranslateError> {
    let name = n.metadata.name.clone().unwrap_or_default();
    let object = format!("node {name}");
    let status = n.status.as_ref();
    let empty = BTreeMap::new();
    let (field, list) = match status.and_then(|s| s.allocatable.as_ref()) {
        Some(a) => ("status.allocatable", a),
        None => (
            "status.capacity",
            status.and_then(|s| s.capacity.as_ref()).unwrap_or(&empty),
        ),
    };
    let mut alloc = Resources::default();
    let gpus = add_list(&object, field, list, &mut alloc)?;
    if alloc.pods == 0 && !list.contains_key("pods") {
        alloc.pods = 110;
    }
    let labels = n.metadata.labels.clone().unwrap_or_default();
    let mut node = tessera_model::Node::new(name, alloc);
    if gpus > 0 {
        let product = labels
            .get(keys::GFD_PRODUCT)
            .map(|p| gpu_model(p))
            .unwrap_or_else(|| "nvidia-gpu".to_string());
        let memory = match labels.get(keys::GFD_MEMORY) {
            Some(m) => {
                let mib = m.parse::<u64>().map_err(|_| {
                    err(
                        &object,
                        &format!("metadata.labels[{}]", keys::GFD_MEMORY),
                        m,
                        "not a whole number of MiB",
                    )
                })?;
                mib.saturating_mul(1 << 20)
            }
            None => 0,
        };
        // A clique (NVLink fabric) label: the node's GPUs share one NVLink domain.
        let domain = labels.get(keys::GFD_CLIQUE).map(|_| 0);
        for i in 0..gpus.min(1024) as u32 {
            let mut d = GpuDevice::new(i, product.clone(), memory);
            d.nvlink_domain = domain;
            node.gpus.push(d);
        }
        node.allocatable.gpu_milli = gpus * 1000;
        node.allocatable.gpu_memory = memory.saturating_mul(gpus);
    }
    let mig_problem = mig::apply_to_node(&object, &labels, &mut node);
    node.labels = labels;
    if let Some(spec) = &n.spec {
        node.unschedulable = spec.unschedulable.unwrap_or(false);
        for (i, t) in spec.taints.iter().flatten().enumerate() {
            node.taints.push(Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: taint_effect(&object, &format!("spec.taints[{i}].effect"), &t.effect)?,
            });
        }
    }
    Ok((node, mig_problem))
}

/// Which PodGroup a pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GroupRef {
    /// No PodGroup: the pod is a gang of one.
    None,
    /// A PodGroup of that name in the pod's namespace (whichever API serves it).
    Named(String),
}

/// What Tessera needs of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub scheduler: String,
    pub group: GroupRef,
    /// Queue from the pod's annotations (used when it has no PodGroup).
    pub queue: Option<String>,
    pub kind: Option<GroupKind>,
    pub priority_class: Option<String>,
    /// `spec.priority`, as the Priority admission plugin resolved it.
    pub priority: Option<i32>,
    /// The task; `node` is `spec.nodeName`, `gpu_indices` from Tessera's annotation.
    pub task: Task,
    /// Required node affinity (`requiredDuringSchedulingIgnoredDuringExecution`).
    pub affinity: Option<core::NodeSelector>,
    /// ResourceClaims the pod uses (names of ResourceClaim objects).
    pub claims: Vec<String>,
    /// Claims still to be created from templates (the pod waits for them).
    pub claims_missing: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// Creation time, milliseconds since the epoch.
    pub created_ms: u64,
    pub preemptable: bool,
    /// Whether `PodScheduled=False` is already set with this message.
    pub scheduled_message: Option<String>,
    /// Problems that did not stop the translation (a bad annotation that is
    /// ignored, a MIG request scheduled by counts alone), to be reported.
    pub notes: Vec<String>,
}

impl PodInfo {
    pub fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
}

fn parse_kind(object: &str, field: &str, v: &str) -> Result<GroupKind, TranslateError> {
    match v {
        "training" => Ok(GroupKind::Training),
        "inference" => Ok(GroupKind::Inference),
        "batch" => Ok(GroupKind::Batch),
        "agent" => Ok(GroupKind::Agent),
        _ => Err(err(
            object,
            field,
            v,
            "not a kind (training, inference, batch, agent)",
        )),
    }
}

/// Parses a group kind named in a PodGroup spec.
pub fn group_kind(object: &str, v: Option<&str>) -> Result<Option<GroupKind>, TranslateError> {
    v.map(|v| parse_kind(object, "spec.kind", v)).transpose()
}

fn toleration(object: &str, i: usize, t: &core::Toleration) -> Result<Toleration, TranslateError> {
    let field = format!("spec.tolerations[{i}]");
    let operator = match t.operator.as_deref().unwrap_or("Equal") {
        "Equal" => TolerationOperator::Equal,
        "Exists" => TolerationOperator::Exists,
        o => {
            return Err(err(
                object,
                &format!("{field}.operator"),
                o,
                "not Equal or Exists",
            ));
        }
    };
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(e) => Some(taint_effect(object, &format!("{field}.effect"), e)?),
    };
    Ok(Toleration {
        key: t.key.clone().unwrap_or_default(),
        operator,
        value: t.value.clone().unwrap_or_default(),
        effect,
    })
}

/// Translates a pod. `scheduler` is copied from `spec.schedulerName`; the caller
/// decides whether the pod is Tessera's to place.
pub fn pod(p: &core::Pod) -> Result<PodInfo, TranslateError> {
    let namespace = p.metadata.namespace.clone().unwrap_or_default();
    let name = p.metadata.name.clone().unwrap_or_default();
    let object = format!("pod {namespace}/{name}");
    let spec = p.spec.as_ref();
    let ann = p.metadata.annotations.clone().unwrap_or_default();
    let labels = p.metadata.labels.clone().unwrap_or_default();

    // Requests: the sum over containers, at least the largest init container,
    // plus the pod overhead (kube-scheduler's rule).
    let mut req = Resources::default();
    let mut gpus = 0u64;
    if let Some(spec) = spec {
        for (i, c) in spec.containers.iter().enumerate() {
            if let Some(r) = c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
                let f = format!("spec.containers[{i}].resources.requests");
                gpus += add_list(&object, &f, r, &mut req)?;
            }
        }
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            if let Some(r) = c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
                let f = format!("spec.initContainers[{i}].resources.requests");
                let mut ir = Resources::default();
                let ig = add_list(&object, &f, r, &mut ir)?;
                if c.restart_policy.as_deref() == Some("Always") {
                    // A sidecar runs beside the containers.
                    req.add_assign_saturating(&ir);
                    gpus += ig;
                } else {
                    req = req.max(&ir);
                    gpus = gpus.max(ig);
                }
            }
        }
        if let Some(o) = &spec.overhead {
            gpus += add_list(&object, "spec.overhead", o, &mut req)?;
        }
    }
    req.pods = 0;
    let models: Vec<String> = ann
        .get(keys::GPU_MODELS)
        .map(|m| {
            m.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let mig_models = models.clone();
    let gpu = match (gpus, ann.get(keys::GPU_MILLI)) {
        (0, None) => GpuRequest::None,
        (n, None) => GpuRequest::Whole {
            count: u32::try_from(n).map_err(|_| {
                err(
                    &object,
                    "resources.requests[nvidia.com/gpu]",
                    &n.to_string(),
                    "too many GPUs",
                )
            })?,
            models,
        },
        (0, Some(m)) => {
            let field = format!("metadata.annotations[{}]", keys::GPU_MILLI);
            let milli: u32 = m.trim().parse().map_err(|_| {
                err(
                    &object,
                    &field,
                    m,
                    "not a whole number of milli-GPU (1..999 for a fraction)",
                )
            })?;
            let memory = match ann.get(keys::GPU_MEMORY) {
                Some(v) => parse_bytes(v).map_err(|e| {
                    err(
                        &object,
                        &format!("metadata.annotations[{}]", keys::GPU_MEMORY),
                        v,
                        e.to_string(),
                    )
                })?,
                None => 0,
            };
            match milli {
                0 => GpuRequest::None,
                1..=999 => GpuRequest::Shared {
                    milli,
                    memory,
                    models,
                },
                m if m % 1000 == 0 => GpuRequest::Whole {
                    count: m / 1000,
                    models,
                },
                _ => {
                    return Err(err(
                        &object,
                        &field,
                        &milli.to_string(),
                        "above 1000 only whole GPUs (multiples of 1000) can be asked for",
                    ));
                }
            }
        }
        (_, Some(m)) => {
            return Err(err(
                &object,
                &format!("metadata.annotations[{}]", keys::GPU_MILLI),
                m,
                "a pod asks either for nvidia.com/gpu or for a GPU fraction, not both",
            ));
        }
    };

    // One MIG instance (`nvidia.com/mig-<profile>: 1`); its count stays in the
    // extended resources too, as the node's guard.
    let bound = spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let mut notes = Vec::new();
    let (mig, note) = mig::pod_request(&object, &req, &gpu, bound, &mig_models);
    notes.extend(note.map(|e| e.to_string()));
    let gpu = mig.unwrap_or(gpu);

    let mut task = Task::new(name.clone(), req).with_gpu(gpu);
    let mut affinity = None;
    let mut claims = Vec::new();
    let mut claims_missing = Vec::new();
    if let Some(spec) = spec {
        task.node_selector = spec.node_selector.clone().unwrap_or_default();
        for (i, t) in spec.tolerations.iter().flatten().enumerate() {
            task.tolerations.push(toleration(&object, i, t)?);
        }
        task.node = spec.node_name.clone().filter(|n| !n.is_empty());
        affinity = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .clone()
            })
            .filter(|s| !s.node_selector_terms.is_empty());
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref());
        for c in spec.resource_claims.iter().flatten() {
            if let Some(n) = &c.resource_claim_name {
                claims.push(n.clone());
            } else if c.resource_claim_template_name.is_some() {
                match statuses
                    .into_iter()
                    .flatten()
                    .find(|s| s.name == c.name)
                    .and_then(|s| s.resource_claim_name.clone())
                {
                    Some(n) => claims.push(n),
                    None => claims_missing.push(c.name.clone()),
                }
            }
        }
    }
    // What Tessera recorded at binding. Anyone who may patch the pod may
    // change it, so it never makes a bound pod fail to translate (that would
    // drop the pod and its resources from the snapshot, and overcommit its
    // node): a bad record is reported and ignored, and the pod still counts.
    if task.node.is_some() {
        let ignored = |field: &str, v: &str, why: String| {
            err(
                &object,
                &format!("metadata.annotations[{field}]"),
                v,
                format!(
                    "{why}; ignored, the pod still counts on its node but on no particular GPU"
                ),
            )
            .to_string()
        };
        if let GpuRequest::Mig { profile, .. } = &task.gpu {
            if let Some(v) = ann.get(keys::MIG_INSTANCE) {
                match mig::Instance::parse(&object, v) {
                    Ok(i) if &i.profile == profile => {
                        task.gpu_indices = vec![i.gpu];
                        task.mig_start = Some(i.start);
                    }
                    Ok(i) => notes.push(ignored(
                        keys::MIG_INSTANCE,
                        v,
                        format!("the pod asks for MIG {profile}, not {}", i.profile),
                    )),
                    Err(e) => notes.push(ignored(keys::MIG_INSTANCE, v, e.problem)),
                }
            }
        } else if let Some(g) = ann.get(keys::GPU_INDICES) {
            match g
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::parse::<u32>)
                .collect::<Result<Vec<u32>, _>>()
            {
                Ok(v) => task.gpu_indices = v,
                Err(_) => notes.push(ignored(
                    keys::GPU_INDICES,
                    g,
                    "not a comma-separated list of GPU indices".into(),
                )),
            }
        }
    }
    let kind = match ann.get(keys::KIND).or_else(|| labels.get(keys::KIND)) {
        Some(k) => Some(parse_kind(
            &object,
            &format!("metadata.annotations[{}]", keys::KIND),
            k,
        )?),
        None => None,
    };
    let group = ann
        .get(keys::VOLCANO_GROUP)
        .or_else(|| labels.get(keys::TESSERA_GROUP))
        .or_else(|| labels.get(keys::X_K8S_GROUP))
        .filter(|g| !g.is_empty())
        .map(|g| GroupRef::Named(g.clone()))
        .unwrap_or(GroupRef::None);
    let queue = ann
        .get(keys::TESSERA_QUEUE)
        .or_else(|| ann.get(keys::VOLCANO_QUEUE))
        .cloned();
    let scheduled_message = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.message.clone());
    Ok(PodInfo {
        uid: p.metadata.uid.clone().unwrap_or_default(),
        scheduler: spec
            .and_then(|s| s.scheduler_name.clone())
            .unwrap_or_else(|| "default-scheduler".into()),
        group,
        queue,
        kind,
        priority_class: spec.and_then(|s| s.priority_class_name.clone()),
        priority: spec.and_then(|s| s.priority),
        task,
        affinity,
        claims,
        claims_missing,
        labels,
        terminating: p.metadata.deletion_timestamp.is_some(),
        created_ms: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_millisecond().max(0) as u64)
            .unwrap_or(0),
        preemptable: ann.get(keys::PREEMPTABLE).map(String::as_str) != Some("false"),
        scheduled_message,
        notes,
        namespace,
        name,
    })
}

/// Whether a pod has finished (its resources are free).
pub fn pod_finished(p: &core::Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A PodGroup from any of the three APIs, in one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    /// Which API the object came from.
    pub api: Flavour,
    pub namespace: String,
    pub name: String,
    pub min_member: u32,
    pub min_resources: Option<Resources>,
    pub queue: Option<String>,
    pub priority_class: Option<String>,
    pub kind: Option<GroupKind>,
    /// All pods within one domain of a network tier (`spec.networkTopology`).
    pub network_topology: Option<NetworkTier>,
    pub created_ms: u64,
    /// The status Tessera last saw on the object (to write only changes).
    pub status_phase: Option<String>,
    pub status_running: Option<i32>,
}

fn meta_ms(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    m.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond().max(0) as u64)
        .unwrap_or(0)
}

fn min_member(object: &str, v: Option<i32>) -> Result<u32, TranslateError> {
    match v {
        None => Ok(1),
        Some(n) if n >= 0 => Ok(n as u32),
        Some(n) => Err(err(
            object,
            "spec.minMember",
            &n.to_string(),
            "must be 0 or more",
        )),
    }
}

/// Volcano's `networkTopology` as the model's [`NetworkTier`]: `mode` (`hard`,
/// the default, or `soft`) is the strength, `highestTierAllowed` the tier (0 =
/// one node, 1 = one domain of tier 1, 2 = one of tier 2 or below, …; default
/// 1, as Volcano's Job API). `highestTierName` is an error (tier names are not
/// resolved yet).
pub fn network_topology(
    object: &str,
    nt: Option<&crd::NetworkTopologySpec>,
) -> Result<Option<NetworkTier>, TranslateError> {
    let Some(nt) = nt else {
        return Ok(None);
    };
    let strength = match nt.mode.as_deref() {
        None | Some("") | Some("hard") => Strength::Hard,
        Some("soft") => Strength::Soft,
        Some(m) => {
            return Err(err(
                object,
                "spec.networkTopology.mode",
                m,
                "not a mode (hard, soft)",
            ));
        }
    };
    let name = nt.highest_tier_name.as_deref().filter(|n| !n.is_empty());
    let tier = match (nt.highest_tier_allowed, name) {
        (Some(_), Some(n)) => {
            return Err(err(
                object,
                "spec.networkTopology.highestTierName",
                n,
                "set together with highestTierAllowed; give one of them",
            ));
        }
        (None, Some(n)) => {
            return Err(err(
                object,
                "spec.networkTopology.highestTierName",
                n,
                "tier names are not supported yet; give the tier as highestTierAllowed",
            ));
        }
        // Volcano's Job API defaults the field to 1 (`+kubebuilder:default=1`
        // in volcano-sh/apis batch/v1alpha1), and its PodGroups copy it.
        (None, None) => 1,
        (Some(t), None) => t,
    };
    let tier = u8::try_from(tier).map_err(|_| {
        err(
            object,
            "spec.networkTopology.highestTierAllowed",
            &tier.to_string(),
            "must be a tier from 0 to 255",
        )
    })?;
    Ok(Some(NetworkTier { tier, strength }))
}

fn min_res(
    object: &str,
    r: Option<&crd::ResourceList>,
) -> Result<Option<Resources>, TranslateError> {
    r.map(|r| resources(object, "spec.minResources", r))
        .transpose()
}

/// A PodGroup of any flavour, in one shape.
pub fn group<G: GangSource>(g: &G) -> Result<GroupSpec, TranslateError> {
    let m = g.meta();
    let (ns, name) = (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    );
    let object = gang::object(&ApiResource::erase::<G>(&()), Some(&ns), &name);
    let f = g.fields();
    Ok(GroupSpec {
        api: G::FLAVOUR,
        min_member: min_member(&object, f.min_member)?,
        min_resources: min_res(&object, f.min_resources)?,
        queue: f.queue.map(str::to_string),
        priority_class: f.priority_class.map(str::to_string),
        kind: group_kind(&object, f.kind)?,
        network_topology: network_topology(&object, f.network_topology)?,
        created_ms: meta_ms(m),
        status_phase: f.phase.map(str::to_string),
        status_running: f.running,
        namespace: ns,
        name,
    })
}

fn queue_from(object: &str, name: String, s: &crd::QueueSpec) -> Result<Queue, TranslateError> {
    let mut q = Queue::new(name);
    q.parent = s.parent.clone().filter(|p| !p.is_empty() && p != "root");
    if let Some(w) = s.weight {
        if w < 1 {
            return Err(err(
                object,
                "spec.weight",
                &w.to_string(),
                "must be 1 or more",
            ));
        }
        q.weight = w as u32;
    }
    if let Some(c) = &s.capability {
        let mut cap = resources(object, "spec.capability", c)?;
        // A dimension the capability does not name is not bounded (as in
        // Volcano): `capability: {cpu: 2}` limits CPU only. (Extended
        // resources it does not name are unbounded in the scheduler already.)
        if !c.contains_key("cpu") {
            cap.cpu_milli = u64::MAX;
        }
        if !c.contains_key("memory") {
            cap.memory = u64::MAX;
        }
        if !c.contains_key(keys::NVIDIA_GPU) {
            cap.gpu_milli = u64::MAX;
        }
        if !c.contains_key("pods") {
            cap.pods = u64::MAX;
        }
        cap.gpu_memory = u64::MAX;
        q.capability = Some(cap);
    }
    if let Some(g) = s.guarantee.as_ref().and_then(|g| g.resource.as_ref()) {
        q.guarantee = resources(object, "spec.guarantee.resource", g)?;
    }
    q.reclaimable = s.reclaimable.unwrap_or(true);
    Ok(q)
}

/// A Queue of either flavour.
pub fn queue<Q: QueueSource>(q: &Q) -> Result<Queue, TranslateError> {
    let name = q.meta().name.clone().unwrap_or_default();
    let object = gang::object(&ApiResource::erase::<Q>(&()), None, &name);
    queue_from(&object, name, &q.spec())
}

/// Whether `labels` match a label selector (matchLabels and matchExpressions
/// with In, NotIn, Exists, DoesNotExist). An empty selector matches everything.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let have = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or(&[]);
        let ok = match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

fn requirement_matches(r: &core::NodeSelectorRequirement, have: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => have.is_some_and(|v| values.contains(v)),
        "NotIn" => have.is_none_or(|v| !values.contains(v)),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" | "Lt" => {
            let (Some(h), Some(v)) = (
                have.and_then(|h| h.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" { h > v } else { h < v }
        }
        _ => false,
    }
}

/// Whether a node matches a required node affinity: any term matches when all
/// its expressions (on labels) and fields (`metadata.name`) match.
pub fn node_selector_matches(
    sel: &core::NodeSelector,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let name = node_name.to_string();
    sel.node_selector_terms.iter().any(|t| {
        let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
        let fields = t.match_fields.as_deref().unwrap_or(&[]);
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        exprs
            .iter()
            .all(|r| requirement_matches(r, labels.get(&r.key)))
            && fields
                .iter()
                .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&name)))
    })
}

/// The synthetic label key for one node affinity (stable: a hash of its JSON).
pub fn affinity_key(sel: &core::NodeSelector) -> String {
    let json = serde_json::to_string(sel).unwrap_or_default();
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in json.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{}{h:016x}", keys::AFFINITY_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    fn gpu_node() -> core::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "g1", "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.clique": "abc.1"
            }},
            "spec": {"taints": [{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110",
                "nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "0", "ephemeral-storage": "1Ti"}}
        }))
        .unwrap()
    }

    #[test]
    fn node_with_gfd_labels() {
        let n = node(&gpu_node()).unwrap();
        assert_eq!(n.allocatable.cpu_milli, 96_000);
        assert_eq!(n.allocatable.memory, 1 << 40);
        assert_eq!(n.allocatable.gpu_milli, 8000);
        assert_eq!(n.allocatable.pods, 110);
        assert_eq!(n.gpus.len(), 8);
        assert_eq!(n.gpus[3].model, "H100-80GB-HBM3");
        assert_eq!(n.gpus[3].memory, 81559 << 20);
        assert_eq!(n.gpus[3].nvlink_domain, Some(0));
        assert_eq!(n.allocatable.gpu_memory, 8 * (81559 << 20));
        assert_eq!(n.taints[0].effect, TaintEffect::NoSchedule);
        assert_eq!(
            n.allocatable.extended.get("nvidia.com/mig-1g.10gb"),
            Some(&0)
        );
    }

    #[test]
    fn bad_quantity_names_field_and_value() {
        let mut n = gpu_node();
        n.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert("cpu".into(), q("lots"));
        let e = node(&n).unwrap_err();
        assert_eq!(e.field, "status.allocatable.cpu");
        assert_eq!(e.value, "lots");
        assert!(
            e.to_string()
                .starts_with("node g1: status.allocatable.cpu = \"lots\"")
        );
    }

    fn pod_json(v: serde_json::Value) -> core::Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_requests_init_and_gpus() {
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns",
                "annotations": {"scheduling.k8s.io/group-name": "job1"}},
            "spec": {"schedulerName": "tessera", "priority": 7,
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1", "example.com/fpga": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {"zone": "a"}}
        }));
        let i = pod(&p).unwrap();
        assert_eq!(i.task.resources.cpu_milli, 4000);
        assert_eq!(i.task.resources.memory, 1 << 30);
        assert_eq!(i.task.resources.extended.get("example.com/fpga"), Some(&1));
        assert_eq!(
            i.task.gpu,
            GpuRequest::Whole {
                count: 2,
                models: vec![]
            }
        );
        assert_eq!(i.group, GroupRef::Named("job1".into()));
        assert_eq!(i.priority, Some(7));
        assert_eq!(i.task.tolerations[0].operator, TolerationOperator::Exists);
        assert_eq!(
            i.task.node_selector.get("zone").map(String::as_str),
            Some("a")
        );
        assert_eq!(i.scheduler, "tessera");
    }

    #[test]
    fn gpu_fraction_annotation() {
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {
                "scheduling.tessera.dev/gpu-milli": "250",
                "scheduling.tessera.dev/gpu-memory": "10Gi",
                "scheduling.tessera.dev/gpu-models": "H100-80GB-HBM3, A100"}},
            "spec": {"containers": [{"name": "a"}]}
        }));
        let i = pod(&p).unwrap();
        assert_eq!(
            i.task.gpu,
            GpuRequest::Shared {
                milli: 250,
                memory: 10 << 30,
                models: vec!["H100-80GB-HBM3".into(), "A100".into()]
            }
        );
        let bad = pod_json(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {
                "scheduling.tessera.dev/gpu-milli": "1500"}},
            "spec": {"containers": [{"name": "a"}]}
        }));
        let e = pod(&bad).unwrap_err();
        assert!(e.to_string().contains("gpu-milli"), "{e}");
    }

    #[test]
    fn node_affinity_operators() {
        let sel: core::NodeSelector = serde_json::from_value(serde_json::json!({
            "nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "gen", "operator": "Gt", "values": ["3"]},
                    {"key": "bad", "operator": "DoesNotExist"}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
            ]
        }))
        .unwrap();
        let l = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(node_selector_matches(
            &sel,
            "n",
            &l(&[("zone", "a"), ("gen", "4")])
        ));
        assert!(!node_selector_matches(
            &sel,
            "n",
            &l(&[("zone", "a"), ("gen", "3")])
        ));
        assert!(!node_selector_matches(
            &sel,
            "n",
            &l(&[("zone", "a"), ("gen", "4"), ("bad", "")])
        ));
        assert!(!node_selector_matches(
            &sel,
            "n",
            &l(&[("zone", "c"), ("gen", "9")])
        ));
        assert!(node_selector_matches(&sel, "special", &l(&[])));
        assert_eq!(affinity_key(&sel), affinity_key(&sel.clone()));
    }

    #[test]
    fn label_selector() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "db"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["test"]}]
        }))
        .unwrap();
        let mut l = BTreeMap::from([("app".to_string(), "db".to_string())]);
        assert!(selector_matches(&sel, &l));
        l.insert("tier".into(), "test".into());
        assert!(!selector_matches(&sel, &l));
        assert!(selector_matches(&LabelSelector::default(), &l));
    }

    #[test]
    fn network_topology_of_pod_groups() {
        let tg: crd::PodGroup = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "job", "namespace": "ns"},
            "spec": {"minMember": 2, "networkTopology": {"mode": "soft", "highestTierAllowed": 2}}
        }))
        .unwrap();
        assert_eq!(
            group(&tg).unwrap().network_topology,
            Some(NetworkTier {
                tier: 2,
                strength: Strength::Soft
            })
        );
        let vg = |nt: serde_json::Value| -> crd::volcano::PodGroup {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": "job", "namespace": "ns"},
                "spec": {"minMember": 2, "networkTopology": nt}
            }))
            .unwrap()
        };
        // Volcano's default mode is hard.
        assert_eq!(
            group(&vg(serde_json::json!({"highestTierAllowed": 1})))
                .unwrap()
                .network_topology,
            Some(NetworkTier {
                tier: 1,
                strength: Strength::Hard
            })
        );
        assert_eq!(
            group(&vg(
                serde_json::json!({"mode": "hard", "highestTierAllowed": 0})
            ))
            .unwrap()
            .network_topology
            .map(|n| n.tier),
            Some(0)
        );
        // No tier: 1, Volcano's Job API default.
        assert_eq!(
            group(&vg(serde_json::json!({"mode": "soft"})))
                .unwrap()
                .network_topology,
            Some(NetworkTier {
                tier: 1,
                strength: Strength::Soft
            })
        );
        let mut none = vg(serde_json::json!({}));
        none.spec.network_topology = None;
        assert_eq!(group(&none).unwrap().network_topology, None);
        for (nt, field, value) in [
            (
                serde_json::json!({"mode": "strict", "highestTierAllowed": 1}),
                "spec.networkTopology.mode",
                "strict",
            ),
            (
                serde_json::json!({"highestTierAllowed": -1}),
                "spec.networkTopology.highestTierAllowed",
                "-1",
            ),
            (
                serde_json::json!({"highestTierAllowed": 256}),
                "spec.networkTopology.highestTierAllowed",
                "256",
            ),
            (
                serde_json::json!({"highestTierName": "rack"}),
                "spec.networkTopology.highestTierName",
                "rack",
            ),
            (
                serde_json::json!({"highestTierName": "rack", "highestTierAllowed": 1}),
                "spec.networkTopology.highestTierName",
                "rack",
            ),
        ] {
            let e = group(&vg(nt.clone())).unwrap_err();
            assert_eq!(
                (e.object.as_str(), e.field.as_str(), e.value.as_str()),
                ("podgroup.scheduling.volcano.sh ns/job", field, value),
                "{nt}: {e}"
            );
        }
    }

    #[test]
    fn queue_fields() {
        let qu: crd::Queue = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": "team-a"},
            "spec": {"weight": 3, "capability": {"cpu": "10", "nvidia.com/gpu": "4"},
                "guarantee": {"resource": {"cpu": "2"}}, "reclaimable": false, "parent": "root"}
        }))
        .unwrap();
        let m = queue(&qu).unwrap();
        assert_eq!(m.weight, 3);
        let cap = m.capability.as_ref().unwrap();
        assert_eq!(cap.gpu_milli, 4000);
        assert_eq!(cap.cpu_milli, 10_000);
        // Dimensions the capability does not name are not bounded.
        assert_eq!(cap.memory, u64::MAX);
        assert_eq!(cap.pods, u64::MAX);
        assert_eq!(m.guarantee.cpu_milli, 2000);
        assert!(!m.reclaimable);
        assert_eq!(m.parent, None);
    }
}

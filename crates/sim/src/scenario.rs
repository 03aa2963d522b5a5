//! Scenario files: a cluster, queues, groups (some tasks already running) and a
//! scheduler configuration, in YAML. `tessera sched plan FILE` and the scenario
//! tests read them. The format is documented in `docs/scenario-format.md`.
//!
//! Every error names the file, the field path (`groups[2].tasks[0].cpu`) and
//! what is wrong; nothing in a scenario file can make the loader panic.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use tessera_model::mig::{self, MigInstance, MigLayout};
use tessera_model::{
    GpuDevice, GpuRequest, GpuTopology, GroupKind, NetworkTier, Node, PodGroup, Queue, Resources,
    Snapshot, Taint, Task, Toleration, parse_bytes, parse_count, parse_milli,
};
use tessera_sched::{Config, Profile, SharePolicy};

mod group;

/// A loaded, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub snapshot: Snapshot,
    pub config: Config,
    pub description: Option<String>,
}

/// A scenario file that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// Field path, e.g. `groups[2].tasks[0].cpu`; empty for the whole file.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.message)
        }
    }
}

impl std::error::Error for ScenarioError {}

/// A number or a string with a unit, as written in YAML (`4`, `0.5`, `"500m"`, `16Gi`).
#[derive(Debug, Clone, PartialEq)]
struct Qty(String);

impl<'de> Deserialize<'de> for Qty {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Qty;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as 4, 0.5, \"500m\" or \"16Gi\"")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Qty, E> {
                Ok(Qty(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Qty, E> {
                Ok(Qty(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Qty, E> {
                if !v.is_finite() {
                    return Err(E::custom("a quantity must be a finite number"));
                }
                Ok(Qty(format!("{v}")))
            }
            fn visit_str<E>(self, v: &str) -> Result<Qty, E> {
                Ok(Qty(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    config: Option<RawConfig>,
    #[serde(default)]
    nodes: Vec<RawNode>,
    #[serde(default)]
    queues: Vec<RawQueue>,
    #[serde(default)]
    groups: Vec<RawGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    actions: RawActions,
    tiers: Vec<RawTier>,
    /// Placement profile per workload kind, over the defaults (training
    /// binpack, inference spread).
    #[serde(default)]
    profiles: BTreeMap<GroupKind, Profile>,
    /// How fractions of a GPU are placed: `profile` (default) or `tessera`.
    #[serde(default)]
    share_policy: Option<SharePolicy>,
}

/// Actions as a YAML list, or as Volcano writes them: one comma-separated string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawActions {
    List(Vec<String>),
    Joined(String),
}

impl RawActions {
    fn names(&self) -> Vec<String> {
        match self {
            RawActions::List(v) => v.clone(),
            RawActions::Joined(s) => s
                .split(',')
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    plugins: Vec<RawPlugin>,
}

/// A plugin by name, or as Volcano writes it: `{name: gang}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawPlugin {
    Name(String),
    Named { name: String },
}

impl RawPlugin {
    fn name(&self) -> &str {
        match self {
            RawPlugin::Name(n) | RawPlugin::Named { name: n } => n,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    taints: Vec<Taint>,
    cpu: Qty,
    memory: Qty,
    #[serde(default)]
    pods: Option<Qty>,
    #[serde(default)]
    gpus: Option<Qty>,
    #[serde(default)]
    gpu_model: Option<String>,
    #[serde(default)]
    gpu_memory: Option<Qty>,
    #[serde(default)]
    extended: BTreeMap<String, Qty>,
    #[serde(default)]
    unschedulable: bool,
    /// GPU indices per NVLink domain.
    #[serde(default)]
    nvlink_domains: Vec<Vec<u32>>,
    /// GPU indices per PCIe root complex.
    #[serde(default)]
    pcie_roots: Vec<Vec<u32>>,
    /// GPU indices per NUMA node.
    #[serde(default)]
    numa_nodes: Vec<Vec<u32>>,
    /// MIG-enabled GPUs and their current instances.
    #[serde(default)]
    mig: Vec<RawMigGpu>,
    /// Network tier domains above the node, bottom up (`[rack-0, spine-0]`).
    #[serde(default)]
    network: Vec<String>,
    /// Runtime classes the node runs (`[standard, isolated]`): one
    /// `runtime-class.tessera.io/NAME` label each, as a Tessera node advertises them.
    #[serde(default)]
    runtime_classes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMigGpu {
    gpu: u32,
    #[serde(default)]
    instances: Vec<MigInstance>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    name: String,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    guarantee: BTreeMap<String, Qty>,
    #[serde(default)]
    capability: Option<BTreeMap<String, Qty>>,
    #[serde(default)]
    reclaimable: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: String,
    queue: String,
    #[serde(default)]
    min_member: Option<u32>,
    #[serde(default)]
    min_resources: Option<BTreeMap<String, Qty>>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    kind: GroupKind,
    #[serde(default)]
    creation: u64,
    #[serde(default)]
    preemptable: Option<bool>,
    #[serde(default)]
    network_topology: Option<NetworkTier>,
    tasks: Vec<RawTask>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    name: String,
    #[serde(default)]
    replicas: Option<u32>,
    #[serde(default)]
    cpu: Option<Qty>,
    #[serde(default)]
    memory: Option<Qty>,
    #[serde(default)]
    gpu: Option<Qty>,
    #[serde(default)]
    gpu_milli: Option<Qty>,
    #[serde(default)]
    gpu_memory: Option<Qty>,
    #[serde(default)]
    gpu_models: Vec<String>,
    /// A MIG profile (one instance), instead of `gpu` / `gpu_milli`; or a
    /// list of profiles in order of preference.
    #[serde(default)]
    mig: Option<OneOrMany>,
    /// More device shapes the task accepts, in order of preference after
    /// its own.
    #[serde(default)]
    gpu_alternatives: Vec<RawAlternative>,
    #[serde(default)]
    gpu_topology: Option<GpuTopology>,
    #[serde(default)]
    extended: BTreeMap<String, Qty>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    /// The runtime class the task needs (`isolated`): it runs only on nodes that list
    /// it under `runtime_classes`.
    #[serde(default)]
    runtime_class: Option<String>,
    #[serde(default)]
    tolerations: Vec<Toleration>,
    #[serde(default)]
    priority: Option<i32>,
    /// The first `running_on.len()` replicas already run on these nodes.
    #[serde(default)]
    running_on: Vec<String>,
    /// GPU indices each running replica holds, in `running_on` order; a MIG
    /// task gives one GPU. Default: what a fresh selection picks.
    #[serde(default)]
    running_gpus: Vec<Vec<u32>>,
}

/// A runtime class name: 1 to 63 of a-z, 0-9 and '-', starting with a letter (as
/// `tessera-sandbox`'s class table takes them).
pub(crate) fn check_class(c: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&c.len())
        && c.starts_with(|ch: char| ch.is_ascii_lowercase())
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "runtime class {c:?} is not valid: 1 to 63 of a-z, 0-9 and '-', starting with a letter"
        ))
    }
}

/// One string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn first(&self) -> Option<&String> {
        match self {
            OneOrMany::One(s) => Some(s),
            OneOrMany::Many(v) => v.first(),
        }
    }
    fn iter(&self) -> std::slice::Iter<'_, String> {
        match self {
            OneOrMany::One(s) => std::slice::from_ref(s).iter(),
            OneOrMany::Many(v) => v.iter(),
        }
    }
}

/// A device shape a task also accepts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlternative {
    #[serde(default)]
    gpu: Option<Qty>,
    #[serde(default)]
    gpu_milli: Option<Qty>,
    #[serde(default)]
    gpu_memory: Option<Qty>,
    #[serde(default)]
    gpu_models: Vec<String>,
    #[serde(default)]
    mig: Option<String>,
}

fn config_from_raw(c: &RawConfig, file: &str, prefix: &str) -> Result<Config, ScenarioError> {
    let err = |path: String, message: String| ScenarioError {
        file: file.to_string(),
        path,
        message,
    };
    let actions = c.actions.names();
    for (i, a) in actions.iter().enumerate() {
        a.parse::<tessera_sched::Action>()
            .map_err(|e| err(format!("{prefix}actions[{i}]"), e.to_string()))?;
    }
    for (ti, t) in c.tiers.iter().enumerate() {
        for (pi, p) in t.plugins.iter().enumerate() {
            p.name()
                .parse::<tessera_sched::PluginName>()
                .map_err(|e| err(format!("{prefix}tiers[{ti}].plugins[{pi}]"), e.to_string()))?;
        }
    }
    let tiers: Vec<Vec<&str>> = c
        .tiers
        .iter()
        .map(|t| t.plugins.iter().map(RawPlugin::name).collect())
        .collect();
    let mut cfg = Config::from_names(&actions, &tiers)
        .map_err(|e| err(prefix.trim_end_matches('.').to_string(), e.to_string()))?;
    cfg.profiles
        .extend(c.profiles.iter().map(|(k, p)| (*k, *p)));
    if let Some(p) = c.share_policy {
        cfg.share_policy = p;
    }
    Ok(cfg)
}

/// Reads a scheduler configuration file: `actions` and `tiers`, as under
/// `config` in a scenario file. Volcano's spelling is accepted too
/// (`actions: "enqueue, allocate"`, `plugins: [{name: gang}]`).
pub fn load_config(path: &Path) -> Result<Config, ScenarioError> {
    let (text, file) = read(path)?;
    parse_config(&text, &file)
}

/// Reads a file, naming it in the error; returns its text and its display name.
fn read(path: &Path) -> Result<(String, String), ScenarioError> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((text, file)),
        Err(e) => Err(ScenarioError {
            file,
            path: String::new(),
            message: format!("cannot read the file: {e}"),
        }),
    }
}

/// Parses scheduler configuration text; `file` names it in errors.
pub fn parse_config(text: &str, file: &str) -> Result<Config, ScenarioError> {
    let de = serde_norway::Deserializer::from_str(text);
    let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| yaml_error(e, file))?;
    config_from_raw(&raw, file, "")
}

fn yaml_error(e: serde_path_to_error::Error<serde_norway::Error>, file: &str) -> ScenarioError {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let mut message = e.into_inner().to_string();
    // The YAML error repeats a location prefix ("nodes[0]: "); the path
    // already says where, so keep only what is wrong (and line/column).
    if let Some((head, rest)) = message.split_once(": ") {
        if !head.contains(' ') && !path.is_empty() {
            message = rest.to_string();
        }
    }
    ScenarioError {
        file: file.to_string(),
        path,
        message,
    }
}

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let (text, file) = read(path)?;
    parse(&text, &file)
}

/// Parses and validates scenario text; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
    let de = serde_norway::Deserializer::from_str(text);
    let raw: RawScenario = serde_path_to_error::deserialize(de).map_err(|e| yaml_error(e, file))?;
    Builder { file }.build(raw)
}

struct Builder<'a> {
    file: &'a str,
}

impl Builder<'_> {
    fn err(&self, path: impl Into<String>, message: impl Into<String>) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            path: path.into(),
            message: message.into(),
        }
    }

    fn qty(
        &self,
        path: &str,
        q: &Qty,
        parse: fn(&str) -> Result<u64, tessera_model::QuantityError>,
    ) -> Result<u64, ScenarioError> {
        parse(&q.0).map_err(|e| self.err(path, e.to_string()))
    }

    fn resources(&self, path: &str, m: &BTreeMap<String, Qty>) -> Result<Resources, ScenarioError> {
        let mut r = Resources::default();
        for (k, v) in m {
            let p = format!("{path}.{k}");
            match k.as_str() {
                "cpu" => r.cpu_milli = self.qty(&p, v, parse_milli)?,
                "memory" => r.memory = self.qty(&p, v, parse_bytes)?,
                "gpu" => r.gpu_milli = self.qty(&p, v, parse_milli)?,
                "gpu_memory" => r.gpu_memory = self.qty(&p, v, parse_bytes)?,
                "pods" => r.pods = self.qty(&p, v, parse_count)?,
                other if other.contains('/') => {
                    r.extended
                        .insert(other.to_string(), self.qty(&p, v, parse_count)?);
                }
                other => {
                    return Err(self.err(
                        p,
                        format!(
                            "unknown resource `{other}`; use cpu, memory, gpu, gpu_memory, pods, or a domain-qualified name such as example.com/fpga"
                        ),
                    ));
                }
            }
        }
        Ok(r)
    }

    fn build(&self, raw: RawScenario) -> Result<Scenario, ScenarioError> {
        let config = match &raw.config {
            None => Config::default(),
            Some(c) => self.config(c)?,
        };
        let nodes = self.nodes(&raw.nodes)?;
        let queues = self.queues(&raw.queues)?;
        let node_names: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let queue_names: BTreeSet<&str> = queues.iter().map(|q| q.name.as_str()).collect();
        let parents: BTreeSet<&str> = queues.iter().filter_map(|q| q.parent.as_deref()).collect();
        let mut groups = Vec::new();
        let mut origins = Vec::new();
        let mut seen = BTreeSet::new();
        for (gi, g) in raw.groups.iter().enumerate() {
            let path = format!("groups[{gi}]");
            if !seen.insert(g.name.as_str()) {
                return Err(self.err(
                    format!("{path}.name"),
                    format!("duplicate group name `{}`", g.name),
                ));
            }
            if !queue_names.contains(g.queue.as_str()) {
                return Err(self.err(
                    format!("{path}.queue"),
                    format!("queue `{}` is not defined under `queues`", g.queue),
                ));
            }
            if parents.contains(g.queue.as_str()) {
                return Err(self.err(
                    format!("{path}.queue"),
                    format!(
                        "queue `{}` has child queues; groups go into leaf queues",
                        g.queue
                    ),
                ));
            }
            let (group, origin) = self.group(&path, g, &node_names)?;
            groups.push(group);
            origins.push(origin);
        }
        let snapshot = Snapshot {
            nodes,
            queues,
            groups,
        };
        // Running tasks' GPUs: in range, not listed twice, not held twice.
        if let Some(i) = snapshot.validate().into_iter().next() {
            let (ti, k) = origins[i.group][i.task];
            let mut path = format!("groups[{}].tasks[{ti}].running_gpus[{k}]", i.group);
            if let Some(x) = i.index {
                path.push_str(&format!("[{x}]"));
            }
            return Err(self.err(path, i.message));
        }
        Ok(Scenario {
            snapshot,
            config,
            description: raw.description,
        })
    }

    fn config(&self, c: &RawConfig) -> Result<Config, ScenarioError> {
        config_from_raw(c, self.file, "config.")
    }

    fn nodes(&self, raw: &[RawNode]) -> Result<Vec<Node>, ScenarioError> {
        let mut out: Vec<Node> = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, n) in raw.iter().enumerate() {
            let path = format!("nodes[{i}]");
            let mut alloc = Resources {
                cpu_milli: self.qty(&format!("{path}.cpu"), &n.cpu, parse_milli)?,
                memory: self.qty(&format!("{path}.memory"), &n.memory, parse_bytes)?,
                pods: match &n.pods {
                    Some(p) => self.qty(&format!("{path}.pods"), p, parse_count)?,
                    None => 110,
                },
                ..Default::default()
            };
            for (k, v) in &n.extended {
                alloc.extended.insert(
                    k.clone(),
                    self.qty(&format!("{path}.extended.{k}"), v, parse_count)?,
                );
            }
            let count = match &n.gpus {
                Some(g) => self.qty(&format!("{path}.gpus"), g, parse_count)?,
                None => 0,
            };
            if count > 64 {
                return Err(self.err(
                    format!("{path}.gpus"),
                    format!("{count} GPUs on one node is more than 64"),
                ));
            }
            let per_mem = match &n.gpu_memory {
                Some(m) => self.qty(&format!("{path}.gpu_memory"), m, parse_bytes)?,
                None => 0,
            };
            if count == 0 && (n.gpu_model.is_some() || n.gpu_memory.is_some()) {
                return Err(self.err(
                    format!("{path}.gpu_model"),
                    "gpu_model and gpu_memory need `gpus` to be at least 1",
                ));
            }
            let model = n.gpu_model.clone().unwrap_or_else(|| "gpu".into());
            let mut gpus: Vec<GpuDevice> = (0..count as u32)
                .map(|i| GpuDevice::new(i, model.clone(), per_mem))
                .collect();
            self.gpu_topology(&path, n, &model, &mut gpus)?;
            alloc.gpu_milli = count * 1000;
            alloc.gpu_memory = count * per_mem;
            let mut labels = n.labels.clone();
            for (ci, c) in n.runtime_classes.iter().enumerate() {
                check_class(c).map_err(|m| self.err(format!("{path}.runtime_classes[{ci}]"), m))?;
                labels.insert(tessera_model::runtime_class_label(c), "true".into());
            }
            if count > 0 {
                labels
                    .entry("nvidia.com/gpu.product".into())
                    .or_insert(model.clone());
            }
            let names: Vec<String> = match n.count {
                None => vec![n.name.clone()],
                Some(0) => {
                    return Err(self.err(format!("{path}.count"), "count must be at least 1"));
                }
                Some(c) => (0..c).map(|k| format!("{}-{k}", n.name)).collect(),
            };
            for name in names {
                if !seen.insert(name.clone()) {
                    return Err(self.err(
                        format!("{path}.name"),
                        format!("duplicate node name `{name}`"),
                    ));
                }
                out.push(Node {
                    name,
                    labels: labels.clone(),
                    taints: n.taints.clone(),
                    allocatable: alloc.clone(),
                    gpus: gpus.clone(),
                    unschedulable: n.unschedulable,
                    network: n.network.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Applies a node's `nvlink_domains`, `pcie_roots`, `numa_nodes` and `mig`
    /// to its GPUs, checking indices and MIG layouts.
    fn gpu_topology(
        &self,
        path: &str,
        n: &RawNode,
        model: &str,
        gpus: &mut [GpuDevice],
    ) -> Result<(), ScenarioError> {
        let count = gpus.len() as u32;
        for (field, lists) in [
            ("nvlink_domains", &n.nvlink_domains),
            ("pcie_roots", &n.pcie_roots),
            ("numa_nodes", &n.numa_nodes),
        ] {
            let mut seen = BTreeSet::new();
            for (d, list) in lists.iter().enumerate() {
                for (k, &g) in list.iter().enumerate() {
                    let p = format!("{path}.{field}[{d}][{k}]");
                    if g >= count {
                        return Err(self.err(
                            p,
                            format!(
                                "GPU {g} does not exist; the node has {count} GPUs (0..{count})"
                            ),
                        ));
                    }
                    if !seen.insert(g) {
                        return Err(self.err(p, format!("GPU {g} is listed in two {field}")));
                    }
                    let dev = &mut gpus[g as usize];
                    match field {
                        "nvlink_domains" => dev.nvlink_domain = Some(d as u32),
                        "pcie_roots" => dev.pcie_root = Some(format!("pcie-{d}")),
                        _ => dev.numa = Some(d as u32),
                    }
                }
            }
        }
        let mut seen = BTreeSet::new();
        for (k, m) in n.mig.iter().enumerate() {
            let p = format!("{path}.mig[{k}]");
            if m.gpu >= count {
                return Err(self.err(
                    format!("{p}.gpu"),
                    format!(
                        "GPU {} does not exist; the node has {count} GPUs (0..{count})",
                        m.gpu
                    ),
                ));
            }
            if !seen.insert(m.gpu) {
                return Err(self.err(format!("{p}.gpu"), format!("GPU {} is listed twice", m.gpu)));
            }
            let Some(geo) = mig::geometry(model) else {
                let known: Vec<&str> = mig::GEOMETRIES.iter().map(|g| g.model).collect();
                return Err(self.err(
                    format!("{path}.gpu_model"),
                    format!(
                        "GPU model `{model}` has no MIG geometry; MIG needs one of {}",
                        known.join(", ")
                    ),
                ));
            };
            let layout = MigLayout {
                instances: m.instances.clone(),
            };
            geo.check(&layout)
                .map_err(|e| self.err(format!("{p}.instances"), e.to_string()))?;
            gpus[m.gpu as usize].mig = Some(layout);
        }
        Ok(())
    }

    fn queues(&self, raw: &[RawQueue]) -> Result<Vec<Queue>, ScenarioError> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, q) in raw.iter().enumerate() {
            let path = format!("queues[{i}]");
            if !seen.insert(q.name.as_str()) {
                return Err(self.err(
                    format!("{path}.name"),
                    format!("duplicate queue name `{}`", q.name),
                ));
            }
            if q.weight == Some(0) {
                return Err(self.err(format!("{path}.weight"), "weight must be at least 1"));
            }
            let guarantee = self.resources(&format!("{path}.guarantee"), &q.guarantee)?;
            // Dimensions a capability does not name are not bounded.
            let capability = match &q.capability {
                Some(c) => {
                    let mut cap = self.resources(&format!("{path}.capability"), c)?;
                    for (k, d) in [
                        ("cpu", &mut cap.cpu_milli),
                        ("memory", &mut cap.memory),
                        ("gpu", &mut cap.gpu_milli),
                        ("gpu_memory", &mut cap.gpu_memory),
                        ("pods", &mut cap.pods),
                    ] {
                        if !c.contains_key(k) {
                            *d = u64::MAX;
                        }
                    }
                    Some(cap)
                }
                None => None,
            };
            if let Some(cap) = &capability {
                if !guarantee.fits_in(cap) {
                    return Err(self.err(
                        format!("{path}.guarantee"),
                        "guarantee is larger than capability",
                    ));
                }
            }
            out.push(Queue {
                name: q.name.clone(),
                parent: q.parent.clone(),
                weight: q.weight.unwrap_or(1),
                guarantee,
                capability,
                reclaimable: q.reclaimable.unwrap_or(true),
            });
        }
        // Parents exist, and the hierarchy has no cycle.
        let by_name: BTreeMap<&str, Option<&str>> = out
            .iter()
            .map(|q| (q.name.as_str(), q.parent.as_deref()))
            .collect();
        for (i, q) in out.iter().enumerate() {
            if let Some(p) = &q.parent {
                if !by_name.contains_key(p.as_str()) {
                    return Err(self.err(
                        format!("queues[{i}].parent"),
                        format!("parent queue `{p}` is not defined"),
                    ));
                }
            }
            let mut chain = vec![q.name.as_str()];
            let mut cur = q.parent.as_deref();
            while let Some(c) = cur {
                if chain.contains(&c) {
                    chain.push(c);
                    return Err(self.err(
                        format!("queues[{i}].parent"),
                        format!("queue hierarchy has a cycle: {}", chain.join(" -> ")),
                    ));
                }
                chain.push(c);
                cur = by_name.get(c).copied().flatten();
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, "s.yaml").unwrap_err().to_string()
    }

    const BASE: &str = "nodes:\n  - {name: n, cpu: 8, memory: 32Gi}\nqueues:\n  - {name: q}\n";

    #[test]
    fn errors_name_file_and_field() {
        assert!(
            err("nodes:\n  - {name: n, cpus: 8, memory: 1Gi}\n")
                .starts_with("s.yaml: nodes[0].cpus: unknown field `cpus`")
        );
        assert_eq!(
            err("nodes:\n  - {name: n, cpu: -1, memory: 1Gi}\n"),
            "s.yaml: nodes[0].cpu: quantity `-1` is negative; quantities must be zero or more"
        );
        let e = err(&format!(
            "{BASE}groups:\n  - {{name: g, queue: q, min_member: 3, tasks: [{{name: t, replicas: 2, cpu: 1}}]}}\n"
        ));
        assert_eq!(
            e,
            "s.yaml: groups[0].min_member: min_member is 3 but the group has only 2 tasks"
        );
        let e = err("queues:\n  - {name: a, parent: b}\n  - {name: b, parent: a}\n");
        assert_eq!(
            e,
            "s.yaml: queues[0].parent: queue hierarchy has a cycle: a -> b -> a"
        );
        let e = err(&format!(
            "config:\n  actions: [allocate]\n  tiers: [{{plugins: [gang, fairshare]}}]\n{BASE}"
        ));
        assert!(
            e.starts_with("s.yaml: config.tiers[0].plugins[1]: unknown plugin `fairshare`"),
            "{e}"
        );
        let e = err(&format!(
            "{BASE}groups:\n  - {{name: g, queue: nope, tasks: [{{name: t}}]}}\n"
        ));
        assert_eq!(
            e,
            "s.yaml: groups[0].queue: queue `nope` is not defined under `queues`"
        );
        assert!(err("nodes: 5\n").starts_with("s.yaml: nodes: invalid type"));
        assert!(err(": : :\n").starts_with("s.yaml"));
    }

    #[test]
    fn volcano_style_config() {
        let c = parse_config(
            "actions: \"enqueue, allocate, backfill\"\ntiers:\n- plugins:\n  - name: priority\n  - name: gang\n- plugins:\n  - name: drf\n  - name: proportion\n",
            "v.yaml",
        )
        .unwrap();
        assert_eq!(c.actions.len(), 3);
        assert!(c.enabled(tessera_sched::PluginName::Proportion));
        let e = parse_config(
            "actions: [allocate]\ntiers:\n- plugins: [{name: conformance}]\n",
            "v.yaml",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "v.yaml: tiers[0].plugins[0]: unknown plugin `conformance`; known plugins: priority, gang, drf, proportion, predicates, binpack, spread, reservation"
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "[a-z:{}\\[\\], \\n0-9-]{0,200}") {
            let _ = parse(&s, "x.yaml");
        }
        #[test]
        fn never_panics_near_valid(n in 0usize..200, garbage in ".{0,8}") {
            let mut t = format!("{BASE}groups:\n  - {{name: g, queue: q, min_member: 1, tasks: [{{name: t, replicas: 2, cpu: 1, gpu_milli: 500}}]}}\n");
            let at = n.min(t.len());
            if t.is_char_boundary(at) {
                t.insert_str(at, &garbage);
            }
            let _ = parse(&t, "x.yaml");
        }
    }
}

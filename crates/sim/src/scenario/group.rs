//! Tasks and their GPU requests, from a scenario file's groups: the part of
//! the [`Builder`](super::Builder) that reads `groups[..].tasks[..]`.

use super::*;

impl Builder<'_> {
    /// A task's (or an alternative's) GPU request from its fields; `tp` is
    /// the field path's prefix, `mig_path` what follows `.mig` in it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gpu_request(
        &self,
        tp: &str,
        gpu: &Option<Qty>,
        gpu_milli: &Option<Qty>,
        gpu_memory: &Option<Qty>,
        gpu_models: &[String],
        mig: &Option<String>,
        gpu_topology: &Option<GpuTopology>,
        mig_path: &str,
    ) -> Result<GpuRequest, ScenarioError> {
        if let Some(profile) = mig {
            if gpu.is_some() || gpu_milli.is_some() || gpu_memory.is_some() {
                return Err(self.err(
                    format!("{tp}.mig{mig_path}"),
                    "set `mig` (one MIG instance) without `gpu`, `gpu_milli` or `gpu_memory`",
                ));
            }
            if mig::profile_milli(profile, gpu_models) == 0 {
                return Err(self.err(
                        format!("{tp}.mig{mig_path}"),
                        format!(
                            "unknown MIG profile `{profile}`{}; profiles look like 1g.10gb, 3g.40gb (H100-80GB) or 2g.12gb (A30-24GB)",
                            if gpu_models.is_empty() {
                                String::new()
                            } else {
                                format!(" on {}", gpu_models.join("|"))
                            }
                        ),
                    ));
            }
        }
        if gpu_topology.is_some() && gpu.is_none() {
            return Err(self.err(
                format!("{tp}.gpu_topology"),
                "gpu_topology constrains whole GPUs; it needs `gpu`",
            ));
        }
        let req = match (gpu, gpu_milli) {
            _ if mig.is_some() => GpuRequest::Mig {
                profile: mig.clone().unwrap_or_default(),
                models: gpu_models.to_vec(),
            },
            (Some(_), Some(_)) => {
                return Err(self.err(
                        format!("{tp}.gpu_milli"),
                        "set either `gpu` (whole GPUs) or `gpu_milli` (a fraction of one GPU), not both",
                    ));
            }
            (Some(g), None) => {
                let count = self.qty(&format!("{tp}.gpu"), g, parse_count)?;
                if gpu_memory.is_some() {
                    return Err(self.err(
                        format!("{tp}.gpu_memory"),
                        "gpu_memory goes with gpu_milli; whole GPUs come with all their memory",
                    ));
                }
                let count = u32::try_from(count)
                    .map_err(|_| self.err(format!("{tp}.gpu"), "too many GPUs"))?;
                if count == 0 {
                    GpuRequest::None
                } else {
                    GpuRequest::Whole {
                        count,
                        models: gpu_models.to_vec(),
                    }
                }
            }
            (None, Some(m)) => {
                let milli = self.qty(&format!("{tp}.gpu_milli"), m, parse_count)?;
                if milli == 0 || milli >= 1000 {
                    return Err(self.err(format!("{tp}.gpu_milli"), format!("gpu_milli is {milli}; a fraction of a GPU is 1..999 (use `gpu` for whole GPUs)")));
                }
                let memory = match gpu_memory {
                    Some(q) => self.qty(&format!("{tp}.gpu_memory"), q, parse_bytes)?,
                    None => 0,
                };
                GpuRequest::Shared {
                    milli: milli as u32,
                    memory,
                    models: gpu_models.to_vec(),
                }
            }
            (None, None) => {
                if !gpu_models.is_empty() || gpu_memory.is_some() {
                    return Err(self.err(
                        format!("{tp}.gpu_models"),
                        "gpu_models and gpu_memory need `gpu` or `gpu_milli`",
                    ));
                }
                GpuRequest::None
            }
        };
        Ok(req)
    }

    pub(super) fn group(
        &self,
        path: &str,
        g: &RawGroup,
        nodes: &BTreeSet<&str>,
    ) -> Result<(PodGroup, Vec<(usize, usize)>), ScenarioError> {
        let mut tasks = Vec::new();
        // Per task made: (index under `tasks` in the file, replica).
        let mut origin = Vec::new();
        let mut seen = BTreeSet::new();
        if g.tasks.is_empty() {
            return Err(self.err(format!("{path}.tasks"), "a group needs at least one task"));
        }
        for (ti, t) in g.tasks.iter().enumerate() {
            let tp = format!("{path}.tasks[{ti}]");
            let mut res = Resources::default();
            if let Some(c) = &t.cpu {
                res.cpu_milli = self.qty(&format!("{tp}.cpu"), c, parse_milli)?;
            }
            if let Some(m) = &t.memory {
                res.memory = self.qty(&format!("{tp}.memory"), m, parse_bytes)?;
            }
            for (k, v) in &t.extended {
                res.extended.insert(
                    k.clone(),
                    self.qty(&format!("{tp}.extended.{k}"), v, parse_count)?,
                );
            }
            let mig_first = t.mig.as_ref().and_then(|m| m.first()).cloned();
            let gpu = self.gpu_request(
                &tp,
                &t.gpu,
                &t.gpu_milli,
                &t.gpu_memory,
                &t.gpu_models,
                &mig_first,
                &t.gpu_topology,
                "",
            )?;
            // More shapes the task accepts, in order: `mig: [a, b]` lists
            // profiles; `gpu_alternatives` any shape.
            let mut alternatives = Vec::new();
            if let Some(m) = &t.mig {
                for (k, profile) in m.iter().enumerate().skip(1) {
                    alternatives.push(self.gpu_request(
                        &tp,
                        &None,
                        &None,
                        &None,
                        &t.gpu_models,
                        &Some(profile.clone()),
                        &None,
                        &format!("[{k}]"),
                    )?);
                }
            }
            for (k, a) in t.gpu_alternatives.iter().enumerate() {
                let ap = format!("{tp}.gpu_alternatives[{k}]");
                let alt = self.gpu_request(
                    &ap,
                    &a.gpu,
                    &a.gpu_milli,
                    &a.gpu_memory,
                    &a.gpu_models,
                    &a.mig,
                    &None,
                    "",
                )?;
                if alt == GpuRequest::None {
                    return Err(self.err(
                        ap,
                        "an alternative asks for GPUs: set gpu, gpu_milli or mig",
                    ));
                }
                alternatives.push(alt);
            }
            let names: Vec<String> = match t.replicas {
                None => vec![t.name.clone()],
                Some(0) => {
                    return Err(self.err(format!("{tp}.replicas"), "replicas must be at least 1"));
                }
                Some(r) if r > 100_000 => {
                    return Err(
                        self.err(format!("{tp}.replicas"), "replicas must be at most 100000")
                    );
                }
                Some(r) => (0..r).map(|k| format!("{}-{k}", t.name)).collect(),
            };
            if t.running_on.len() > names.len() {
                return Err(self.err(
                    format!("{tp}.running_on"),
                    format!(
                        "{} nodes listed for {} replicas",
                        t.running_on.len(),
                        names.len()
                    ),
                ));
            }
            if t.running_gpus.len() > t.running_on.len() {
                return Err(self.err(
                    format!("{tp}.running_gpus"),
                    format!(
                        "{} GPU lists for {} running replicas (`running_on`)",
                        t.running_gpus.len(),
                        t.running_on.len()
                    ),
                ));
            }
            if !t.running_gpus.is_empty() && t.running_gpus.len() < t.running_on.len() {
                return Err(self.err(
                    format!("{tp}.running_gpus"),
                    format!(
                        "{} GPU lists for {} running replicas (`running_on`); give one per running replica, or none (each then holds what a fresh selection picks)",
                        t.running_gpus.len(),
                        t.running_on.len()
                    ),
                ));
            }
            for (ri, g) in t.running_gpus.iter().enumerate() {
                if g.len() != gpu.devices() as usize {
                    return Err(self.err(
                        format!("{tp}.running_gpus[{ri}]"),
                        format!("{} GPUs listed; the task holds {}", g.len(), gpu.devices()),
                    ));
                }
            }
            for (ri, n) in t.running_on.iter().enumerate() {
                if !nodes.contains(n.as_str()) {
                    return Err(self.err(
                        format!("{tp}.running_on[{ri}]"),
                        format!("node `{n}` is not defined under `nodes`"),
                    ));
                }
            }
            let mut node_selector = t.node_selector.clone();
            if let Some(c) = &t.runtime_class {
                super::check_class(c).map_err(|m| self.err(format!("{tp}.runtime_class"), m))?;
                node_selector.insert(tessera_model::runtime_class_label(c), "true".into());
            }
            for (k, name) in names.into_iter().enumerate() {
                origin.push((ti, k));
                if !seen.insert(name.clone()) {
                    return Err(self.err(
                        format!("{tp}.name"),
                        format!("duplicate task name `{name}` in group `{}`", g.name),
                    ));
                }
                tasks.push(Task {
                    name,
                    resources: res.clone(),
                    gpu: gpu.clone(),
                    node_selector: node_selector.clone(),
                    tolerations: t.tolerations.clone(),
                    priority: t.priority,
                    node: t.running_on.get(k).cloned(),
                    gpu_indices: t.running_gpus.get(k).cloned().unwrap_or_default(),
                    topology: t.gpu_topology,
                    mig_start: None,
                    gpu_alternatives: alternatives.clone(),
                    gpu_choice: None,
                });
            }
        }
        let min_member = g.min_member.unwrap_or(tasks.len() as u32);
        if min_member == 0 {
            return Err(self.err(
                format!("{path}.min_member"),
                "min_member must be at least 1",
            ));
        }
        if min_member as usize > tasks.len() {
            return Err(self.err(
                format!("{path}.min_member"),
                format!(
                    "min_member is {min_member} but the group has only {} tasks",
                    tasks.len()
                ),
            ));
        }
        let min_resources = match &g.min_resources {
            Some(m) => Some(self.resources(&format!("{path}.min_resources"), m)?),
            None => None,
        };
        Ok((
            PodGroup {
                name: g.name.clone(),
                queue: g.queue.clone(),
                min_member,
                min_resources,
                priority: g.priority,
                kind: g.kind,
                creation: g.creation,
                preemptable: g.preemptable.unwrap_or(true),
                network_topology: g.network_topology,
                tasks,
            },
            origin,
        ))
    }
}

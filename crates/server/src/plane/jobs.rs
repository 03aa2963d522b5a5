//! The control plane's jobs: submit, list, get, cancel, delete, and their logs.

use super::*;

impl ControlPlane {
    fn check_job(spec: &JobSpec) -> Result<(), ApiError> {
        check_name("name", &spec.name)?;
        check_name("queue", &spec.queue)?;
        if spec.tasks.is_empty() {
            return Err(ApiError::invalid("tasks", "a job needs at least one task"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in spec.tasks.iter().enumerate() {
            check_name(&format!("tasks[{i}].name"), &t.name)?;
            if !names.insert(&t.name) {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].name"),
                    format!("task {:?} appears twice", t.name),
                ));
            }
            if t.resources.gpu_milli != 0 || t.resources.gpu_memory != 0 {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].resources"),
                    "ask for GPUs with `gpu` (whole or shared), not with resources.gpu_milli/gpu_memory",
                ));
            }
            if let Some(d) = t.duration
                && !(d.is_finite() && d >= 0.0)
            {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].duration"),
                    format!("{d} is not a duration: give seconds, 0 or more"),
                ));
            }
            if let tessera_model::GpuRequest::Shared { milli, .. } = t.gpu
                && !(1..=999).contains(&milli)
            {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].gpu.shared.milli"),
                    format!("{milli} is not a fraction of a GPU: use 1 to 999"),
                ));
            }
            let env: Vec<(String, String)> = t
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect();
            tessera_node::spec::check_env(&env)
                .map_err(|m| ApiError::invalid(format!("tasks[{i}].env"), m))?;
            if let Some(d) = &t.working_dir
                && (!d.starts_with('/') || d.contains('\0') || d.split('/').any(|c| c == ".."))
            {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].working_dir"),
                    format!(
                        "{d:?} is not an absolute path inside the sandbox (e.g. /workspace/run)"
                    ),
                ));
            }
            tessera_node::spec::sandbox_limits(
                &t.resources,
                &t.limits,
                &tessera_node::Defaults::default(),
            )
            .map_err(|e| ApiError::invalid(format!("tasks[{i}].{}", e.field), e.to_string()))?;
        }
        if let Some(g) = spec.termination_grace_period_seconds
            && g > 24 * 3600
        {
            return Err(ApiError::invalid(
                "termination_grace_period_seconds",
                format!("{g} is more than a day: give 0 to 86400"),
            ));
        }
        if let Some(m) = spec.min_member
            && (m == 0 || m as usize > spec.tasks.len())
        {
            return Err(ApiError::invalid(
                "min_member",
                format!(
                    "{m} must be between 1 and the number of tasks ({})",
                    spec.tasks.len()
                ),
            ));
        }
        Ok(())
    }

    /// Submits a job; the scheduler loop picks it up.
    pub async fn submit_job(&self, c: &Caller, spec: JobSpec) -> Result<Value, ApiError> {
        c.require(Role::Developer)?;
        let mut spec = spec
            .normalize()
            .map_err(|(field, m)| ApiError::invalid(field, m))?;
        Self::check_job(&spec)?;
        // Each task's class as decided now (the tenant's minimum where it names
        // none) is what is stored: the scheduler and the node read it back.
        for (i, t) in spec.tasks.iter_mut().enumerate() {
            let d = self.classes.decide(
                &c.tenant,
                &format!("tasks[{i}].runtime_class"),
                t.runtime_class.as_deref(),
                t.gpu != tessera_model::GpuRequest::None,
            )?;
            t.runtime_class = Some(d.class);
        }
        // A template is a registered name (or `host`), never a host path, and one the
        // trust policy admits for the tenant and the task's class. The name is pinned
        // here: the digest it names now is what runs, whatever the name names later.
        for (i, t) in spec.tasks.iter_mut().enumerate() {
            if let Some(tpl) = &t.template {
                let class = t.runtime_class.as_deref().unwrap_or_default();
                let who = tessera_sandbox::trust::Subject::new(&c.tenant, class);
                let (root, digest) =
                    self.resolve_template(&format!("tasks[{i}].template"), tpl, &who)?;
                // Only a registered template has a digest to pin (`host` has none).
                if let tessera_sandbox::Template::Dir(_) = root
                    && let Ok((name, None)) = tessera_sandbox::registry::parse_reference(tpl)
                {
                    t.template = Some(format!("{name}@{digest}"));
                }
            }
            // A rule that requires attestation: the task runs only on attested nodes.
            if let Some(p) = self.templates.as_ref().and_then(|r| r.policy()) {
                let class = t.runtime_class.as_deref().unwrap_or_default();
                let who = tessera_sandbox::trust::Subject::new(&c.tenant, class);
                let name = t
                    .template
                    .as_deref()
                    .and_then(|r| tessera_sandbox::registry::parse_reference(r).ok())
                    .map(|(n, _)| n.to_string())
                    .unwrap_or_else(|| tessera_sandbox::registry::HOST_TEMPLATE.to_string());
                if p.requires_attestation(&name, &who).is_some() {
                    t.node_selector
                        .insert(tessera_model::ATTESTED_LABEL.into(), "true".into());
                }
            }
        }
        // Weights: ones the tenant owns or was granted, in a class their policy
        // allows; such a task runs only on attested nodes (the key service releases
        // to no other).
        for (i, t) in spec.tasks.iter_mut().enumerate() {
            if t.weights.is_empty() {
                continue;
            }
            let class = t.runtime_class.clone().unwrap_or_default();
            for (j, w) in t.weights.iter().enumerate() {
                crate::weights::admit(&self.store, &c.tenant, w, &class)
                    .await
                    .map_err(|e| ApiError::invalid(format!("tasks[{i}].weights[{j}]"), e))?;
            }
            t.node_selector
                .insert(tessera_model::ATTESTED_LABEL.into(), "true".into());
        }
        if self
            .store
            .get(&Key::new(kind::QUEUE, &c.tenant, &spec.queue))
            .await?
            .is_none()
        {
            return Err(ApiError::invalid(
                "queue",
                format!(
                    "queue {:?} does not exist in tenant {:?}: create it with `tessera queue create`",
                    spec.queue, c.tenant
                ),
            ));
        }
        let now = now_ms();
        let name = spec.name.clone();
        let body = JobBody {
            spec,
            status: JobStatus::default(),
            created_at: now,
        };
        let out = self
            .store
            .commit(vec![
                Op::Create {
                    key: Key::new(kind::JOB, &c.tenant, &name),
                    body: to_value(&body)?,
                },
                self.audit(c, "create", format!("job/{name}"), now)?,
            ])
            .await?;
        Ok(render(&out[0]))
    }

    pub async fn list_jobs(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store.list(kind::JOB, Some(&c.tenant)).await?;
        Ok(l.objects.iter().map(render).collect())
    }

    pub async fn get_job(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let o = self
            .store
            .get(&Key::new(kind::JOB, &c.tenant, name))
            .await?;
        o.map(|o| render(&o))
            .ok_or_else(|| ApiError::not_found(format!("job {name:?}")))
    }

    /// Cancels a job: it leaves the scheduler; tasks not started are released at
    /// once, running ones once the node has stopped their trees (SIGTERM, the job's
    /// grace period, SIGKILL).
    pub async fn cancel_job(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Developer)?;
        self.stop_job(c, name, false).await.map(|(v, _)| v)
    }

    /// Cancels (when `delete` is false) or deletes a job, retrying on a concurrent
    /// change (the executor claims tasks with compare-and-swap). Returns the job as
    /// written and whether it is gone from the store.
    async fn stop_job(
        &self,
        c: &Caller,
        name: &str,
        delete: bool,
    ) -> Result<(Value, bool), ApiError> {
        let key = Key::new(kind::JOB, &c.tenant, name);
        for _ in 0..50 {
            let o = self
                .store
                .get(&key)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("job {name:?}")))?;
            let mut job: JobBody = from_value(&o)?;
            if !delete && job.status.phase.is_final() {
                return Ok((render(&o), false));
            }
            let now = now_ms();
            let was_final = job.status.phase.is_final();
            crate::jobs::cancel(&mut job, &c.subject, now);
            let action = if delete { "delete" } else { "cancel" };
            let mut ops = vec![self.audit(c, action, format!("job/{name}"), now)?];
            let gone = delete && !crate::jobs::has_live(&job);
            if gone {
                ops.insert(
                    0,
                    Op::Delete {
                        key: key.clone(),
                        expected: Some(o.version),
                    },
                );
            } else {
                job.status.deleting |= delete;
                ops.insert(
                    0,
                    Op::Update {
                        key: key.clone(),
                        expected: Some(o.version),
                        body: to_value(&job)?,
                    },
                );
            }
            if !was_final {
                ops.push(event_op(
                    &c.tenant,
                    format!("job/{name}"),
                    "Cancelled",
                    format!("cancelled by {}", c.subject),
                    now,
                )?);
            }
            match self.store.commit(ops).await {
                Ok(out) => {
                    let v = if gone {
                        let mut v = render(&o);
                        v["status"] = serde_json::to_value(&job.status).unwrap_or_default();
                        v
                    } else {
                        render(&out[0])
                    };
                    return Ok((v, gone));
                }
                Err(tessera_store::StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ApiError::new(
            Code::Conflict,
            format!("job {name:?} kept changing; try again"),
        ))
    }

    /// Deletes a job, so that its name can be used again: at once when none of its
    /// tasks has a process; else it is cancelled and deleted (with its logs) once the
    /// node has stopped its trees. Returns the job and whether it is already gone.
    pub async fn delete_job(&self, c: &Caller, name: &str) -> Result<(Value, bool), ApiError> {
        c.require(Role::Developer)?;
        self.stop_job(c, name, true).await
    }

    /// The output of a job's tasks that ran on this machine (the last 1 MiB of each).
    /// The job whose logs a viewer asks for, and where this server keeps logs.
    async fn job_for_logs(
        &self,
        c: &Caller,
        name: &str,
    ) -> Result<(JobBody, &std::path::Path), ApiError> {
        c.require(Role::Viewer)?;
        // Names go into a path: only valid names get that far.
        check_name("name", name).map_err(|_| ApiError::not_found(format!("job {name:?}")))?;
        let o = self
            .store
            .get(&Key::new(kind::JOB, &c.tenant, name))
            .await?
            .ok_or_else(|| ApiError::not_found(format!("job {name:?}")))?;
        let job: JobBody = from_value(&o)?;
        let Some(logs) = &self.logs else {
            return Err(ApiError::not_found("logs: this server runs no executor"));
        };
        Ok((job, logs))
    }

    /// One task's log from byte `from` of its file (at most 1 MiB, ending on a whole
    /// UTF-8 character), redacted, and the offset to ask for next: how `tessera job logs
    /// --follow` reads a growing log without reading it all again.
    pub async fn job_log_from(
        &self,
        c: &Caller,
        name: &str,
        task: &str,
        from: u64,
    ) -> Result<(String, u64), ApiError> {
        let (job, logs) = self.job_for_logs(c, name).await?;
        if !job.spec.tasks.iter().any(|x| x.name == task) {
            return Err(ApiError::not_found(format!(
                "task {task:?} of job {name:?}"
            )));
        }
        let path = crate::exec::log_path(logs, &c.tenant, name, job.created_at, task);
        let bytes = std::fs::read(&path).unwrap_or_default();
        let start = (from as usize).min(bytes.len());
        let mut end = bytes.len().min(start + (1 << 20));
        // End on a whole character; the rest comes with the next call.
        if let Err(e) = std::str::from_utf8(&bytes[start..end])
            && e.error_len().is_none()
        {
            end = start + e.valid_up_to();
        }
        let text = String::from_utf8_lossy(&bytes[start..end]).into_owned();
        let text = self.redact_text(&c.tenant, &format!("job {name}/{task} log"), text);
        Ok((text, end as u64))
    }

    pub async fn job_logs(
        &self,
        c: &Caller,
        name: &str,
        task: Option<&str>,
    ) -> Result<String, ApiError> {
        let (job, logs) = self.job_for_logs(c, name).await?;
        let tasks: Vec<&str> = match task {
            Some(t) => {
                if !job.spec.tasks.iter().any(|x| x.name == t) {
                    return Err(ApiError::not_found(format!("task {t:?} of job {name:?}")));
                }
                vec![t]
            }
            None => job.spec.tasks.iter().map(|t| t.name.as_str()).collect(),
        };
        let mut out = String::new();
        for t in &tasks {
            let path = crate::exec::log_path(logs, &c.tenant, name, job.created_at, t);
            let text = match std::fs::read(&path) {
                Ok(b) => {
                    let from = b.len().saturating_sub(1 << 20);
                    String::from_utf8_lossy(&b[from..]).into_owned()
                }
                Err(_) => String::new(),
            };
            // A task's output is redacted again on the way out (a log written before a
            // tenant tightened its policy, or by an older version, is covered too).
            let text = self.redact_text(&c.tenant, &format!("job {name}/{t} log"), text);
            if tasks.len() > 1 {
                out.push_str(&format!("==> {t} <==\n"));
            }
            out.push_str(&text);
        }
        Ok(out)
    }
}

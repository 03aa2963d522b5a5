//! Warm pools: one per runtime template (by digest), the sandbox a runtime's sessions get.

use std::sync::Arc;
use std::time::Instant;

use tessera_sandbox::{Limits, PoolConfig, SandboxSpec, Template, WarmPool};

use crate::error::AgentError;
use crate::runtimes::RuntimeSpec;

use super::{Host, PoolEntry};

/// The sandbox `tenant`'s sessions of a runtime get, and its template's digest. The
/// template is resolved through the registry (a name, never a host path) and admitted
/// by its trust policy for the tenant in the class agent sessions run in.
fn sandbox_spec(
    tenant: &str,
    spec: &RuntimeSpec,
    templates: Option<&tessera_sandbox::TemplateRegistry>,
) -> Result<(SandboxSpec, String), AgentError> {
    let who = tessera_sandbox::trust::Subject::new(tenant, tessera_sandbox::class::DEFAULT_CLASS);
    let (template, digest) = tessera_sandbox::registry::resolve_in(templates, &spec.template, &who)
        .map_err(|e| AgentError::invalid("template", e.to_string()))?;
    Ok((
        SandboxSpec {
            template,
            limits: Limits {
                memory_bytes: Some(spec.resources.memory_mb << 20),
                cpu_millis: Some(spec.resources.cpu_millis),
                pids: Some(spec.resources.pids),
                disk_bytes: spec.resources.disk_mb << 20,
            },
            hostname: "agent".into(),
            ..SandboxSpec::default()
        },
        digest,
    ))
}

/// A pool's key: the template's digest (never its path, so no spelling of a path
/// makes a second pool) and everything else of the spec.
fn pool_key(s: &SandboxSpec, digest: &str) -> String {
    let mut k = s.clone();
    k.template = Template::Host;
    format!("{digest}|{}", serde_json::to_string(&k).unwrap_or_default())
}

impl Host {
    pub(super) fn pool(
        &self,
        tenant: &str,
        spec: &RuntimeSpec,
    ) -> Result<Arc<WarmPool>, AgentError> {
        let rt =
            self.inner.rt.clone().map_err(|e| {
                AgentError::Unavailable(format!("sandboxes cannot be made here: {e}"))
            })?;
        let (ss, digest) = sandbox_spec(tenant, spec, self.inner.cfg.templates.as_ref())?;
        let k = pool_key(&ss, &digest);
        let mut pools = self.inner.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = pools.get_mut(&k) {
            e.last_used = Instant::now();
            e.tenants.insert(tenant.to_string());
            return Ok(e.pool.clone());
        }
        let cfg = &self.inner.cfg;
        if pools.len() >= cfg.max_pools.max(1) {
            // The least recently used pool goes (its ready sandboxes with it; claimed
            // ones stay with their sessions).
            if let Some(old) = pools
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            {
                pools.remove(&old);
            }
        }
        let pool = Arc::new(WarmPool::new(
            rt,
            ss,
            PoolConfig {
                min: cfg.pool_min,
                max: cfg.pool_max,
                ..PoolConfig::default()
            },
        ));
        pools.insert(
            k,
            PoolEntry {
                pool: pool.clone(),
                tenants: [tenant.to_string()].into(),
                digest,
                last_used: Instant::now(),
            },
        );
        Ok(pool)
    }

    /// Checks that this host can run `tenant`'s runtime: its template is registered
    /// here and the trust policy admits it.
    pub fn check(&self, tenant: &str, spec: &RuntimeSpec) -> Result<(), AgentError> {
        sandbox_spec(tenant, spec, self.inner.cfg.templates.as_ref()).map(drop)
    }

    /// Starts a warm pool for the runtime's template (called when a runtime
    /// is created or updated), so its first session claims a ready sandbox.
    /// Fails when the runtime's template is not registered.
    pub fn prime(&self, tenant: &str, spec: &RuntimeSpec) -> Result<(), AgentError> {
        match self.pool(tenant, spec) {
            Ok(_) | Err(AgentError::Unavailable(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Statistics of the warm pools `tenant`'s runtimes use (another tenant's are not
    /// shown), with each pool's template digest.
    pub fn pool_stats(&self, tenant: &str) -> Vec<(String, tessera_sandbox::PoolStats)> {
        self.inner
            .pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|e| e.tenants.contains(tenant))
            .map(|e| (e.digest.clone(), e.pool.stats()))
            .collect()
    }
}

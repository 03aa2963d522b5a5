//! Giving a sandbox back, metering its CPU and memory, and ending sessions.

use std::sync::Arc;
use std::time::Instant;

use tessera_sandbox::Sandbox;

use crate::error::{AgentError, now_ms};
use crate::meter::{self, UsageKind, UsageRecord};
use crate::sessions::{self, Session, State};

use super::{Host, Live, idle};

/// CPU seconds used by a sandbox's processes, read from `/proc`: each live
/// process's own time plus that of the children it reaped (the sandbox's init
/// reaps every orphan, so whatever ran there is counted once). Not from a
/// cgroup's accounting: a host may mount `cpu` and `cpuacct` apart (cgroup v1),
/// and a sandbox placed in `cpu` only is in the *root* `cpuacct` group, whose
/// counter is the whole machine's.
pub fn sandbox_cpu_seconds(sb: &Sandbox) -> Option<f64> {
    let mut pids = std::collections::BTreeSet::new();
    let mut todo = vec![sb.pid()];
    while let Some(p) = todo.pop() {
        if !pids.insert(p) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    if let Some(c) = sb.cgroup() {
        pids.extend(c.procs());
    }
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100) as f64;
    let ticks: Vec<f64> = pids.into_iter().filter_map(proc_cpu_ticks).collect();
    (!ticks.is_empty()).then(|| ticks.iter().sum::<f64>() / tck)
}

/// utime + stime + cutime + cstime of `pid`, in clock ticks.
fn proc_cpu_ticks(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name's ")": field 3 onwards; fields 14 to 17.
    let f: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    (11..=14).map(|i| f.get(i)?.parse::<f64>().ok()).sum()
}

impl Host {
    /// Gives the sandbox back (destroyed in the background) and records its
    /// CPU seconds and memory GB-seconds.
    pub(super) async fn release(&self, tenant: &str, session: &str, mut live: Live, why: &str) {
        tracing::info!(
            tenant = %tenant,
            session_id = %session,
            sandbox = %live.sb.id(),
            "session {session}: sandbox released ({why})"
        );
        if let Some(c) = live.control.take() {
            c.abort();
        }
        sample_memory(&mut live);
        let cpu = sandbox_cpu_seconds(&live.sb);
        let sbid = live.sb.id().to_string();
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), session.to_string()));
        let _ = live.sb.destroy();
        if let Ok(sb) = Arc::try_unwrap(live.sb) {
            live.pool.release(sb);
        }
        let store = &self.inner.store;
        for (kind, q) in [
            (UsageKind::CpuSeconds, cpu),
            (UsageKind::MemoryGbSeconds, Some(live.mem_gb_s)),
        ] {
            let Some(q) = q else { continue };
            let rec = UsageRecord {
                tenant: tenant.into(),
                session: session.into(),
                runtime: live.runtime.clone(),
                kind,
                quantity: q,
                at_ms: now_ms(),
                source_id: format!("{session}/sandbox/{sbid}/{}", kind.as_str()),
            };
            let _ = meter::record(store, rec).await;
        }
    }

    /// Ends a session (`Ended`, `Killed`), destroying its sandbox at once.
    pub async fn end(
        &self,
        tenant: &str,
        id: &str,
        state: State,
        reason: &str,
    ) -> Result<Session, AgentError> {
        sessions::update(&self.inner.store, tenant, id, |x| {
            if x.state.is_final() {
                return Ok(false);
            }
            x.state = state;
            x.reason = Some(reason.to_string());
            x.updated_at_ms = now_ms();
            Ok(true)
        })
        .await?;
        // Destroy now, even while an invocation holds the slot.
        let sb = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(tenant.to_string(), id.to_string()))
            .cloned();
        if let Some(sb) = sb {
            let _ = tokio::task::spawn_blocking(move || sb.destroy()).await;
        }
        let slot = self.slot(tenant, id);
        let mut g = slot.lock().await;
        if let Some(l) = g.live.take() {
            self.release(tenant, id, l, reason).await;
        }
        drop(g);
        // Its files kept from an idle release go with it.
        if let Some(root) = &self.inner.cfg.snapshots {
            idle::forget(root, tenant, id);
        }
        self.inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), id.to_string()));
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), id.to_string()));
        sessions::update(&self.inner.store, tenant, id, |x| {
            if x.sandbox.is_none() {
                return Ok(false);
            }
            x.sandbox = None;
            x.sandbox_pid = None;
            Ok(true)
        })
        .await
    }

    /// Kills a session: its sandbox is destroyed and it takes no more invocations.
    pub async fn kill(&self, tenant: &str, id: &str, reason: &str) -> Result<Session, AgentError> {
        self.end(tenant, id, State::Killed, reason).await
    }
}

pub(super) fn sample_memory(l: &mut Live) {
    let dt = l.last_sample.elapsed().as_secs_f64();
    l.last_sample = Instant::now();
    if let Some(bytes) = l.sb.cgroup().and_then(|c| c.memory_current()) {
        l.mem_gb_s += bytes as f64 / 1e9 * dt;
    }
}

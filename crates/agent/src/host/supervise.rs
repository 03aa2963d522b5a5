//! Supervision: taking back orphaned sessions, the tick that pings, restarts, releases
//! idle sandboxes and ends sessions at their lifetime, and shutdown.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tessera_sandbox::Sandbox;
use tessera_store::Store;

use crate::error::{AgentError, now_ms};
use crate::runtimes;
use crate::sessions::{self, Session, State};
use crate::unixhttp;

use super::release::sample_memory;
use super::{Host, SlotRef, idle, owner_host, ping_status};

impl Host {
    /// Takes back sessions whose host is gone: run at start, then
    /// periodically. A session starting or active under another owner is
    /// orphaned when this host is the only one on its store (`exclusive`: the
    /// owner was a previous process), or when its owner stopped renewing its
    /// lease (several replicas on PostgreSQL); sessions of a live replica are
    /// left alone. An orphan's sandbox is destroyed if it outlived its server
    /// on this machine, and the session becomes idle (resumable).
    pub async fn recover(&self) -> Result<usize, AgentError> {
        let store = &self.inner.store;
        let me = self.inner.owner.clone();
        let mine = owner_host(&me).to_string();
        let exclusive = self.inner.cfg.exclusive;
        let mut n = 0;
        for st in [State::Starting, State::Active] {
            let l = store.list(&st.index_kind(), None).await?;
            for o in l.objects {
                let id = o.name.rsplit('/').next().unwrap_or_default();
                let Some(s) = sessions::get(store, &o.tenant, id).await? else {
                    continue;
                };
                let orphaned = |x: &Session| {
                    matches!(x.state, State::Starting | State::Active)
                        && x.owner.as_deref() != Some(me.as_str())
                        && (exclusive || x.owner.is_none() || now_ms() >= x.lease_until_ms)
                };
                if !orphaned(&s) {
                    continue;
                }
                let local = exclusive || s.owner.as_deref().map(owner_host) == Some(mine.as_str());
                if let (Some(pid), true) = (s.sandbox_pid, local) {
                    kill_stale_sandbox(pid);
                }
                let prev = s.owner.clone();
                let changed = sessions::update(store, &o.tenant, id, |x| {
                    if !orphaned(x) || x.owner != prev {
                        return Ok(false);
                    }
                    x.state = State::Idle;
                    x.sandbox = None;
                    x.sandbox_pid = None;
                    x.owner = None;
                    x.reason =
                        Some("its server stopped; the next invocation resumes the session".into());
                    x.updated_at_ms = now_ms();
                    Ok(true)
                })
                .await?;
                if changed.state == State::Idle {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// One round of the supervision loop: ping every live agent (restart the
    /// ones that exited or failed `ping_failures` pings in a row), release
    /// idle sandboxes, end sessions at their maximum lifetime.
    pub async fn tick(&self) {
        let slots: Vec<((String, String), SlotRef)> = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((tenant, id), slot) in slots {
            // Busy with an invocation: the agent is working.
            let Ok(mut g) = slot.try_lock() else { continue };
            let Some(live) = g.live.as_mut() else {
                continue;
            };
            sample_memory(live);
            let Ok(Some(s)) = sessions::get(&self.inner.store, &tenant, &id).await else {
                continue;
            };
            if s.state.is_final() {
                if let Some(l) = g.live.take() {
                    self.release(&tenant, &id, l, "session ended").await;
                }
                continue;
            }
            if now_ms() >= s.expires_at_ms {
                drop(g);
                let _ = self
                    .end(&tenant, &id, State::Ended, "reached its maximum lifetime")
                    .await;
                continue;
            }
            // Renew this host's claim at half its lease.
            let lease_ms = self.inner.cfg.lease.as_millis() as u64;
            if s.owner.as_deref() == Some(self.inner.owner.as_str())
                && s.lease_until_ms < now_ms() + lease_ms / 2
            {
                let me = self.inner.owner.clone();
                let _ = sessions::update(&self.inner.store, &tenant, &id, |x| {
                    if x.owner.as_deref() != Some(me.as_str()) {
                        return Ok(false);
                    }
                    x.lease_until_ms = now_ms() + lease_ms;
                    Ok(true)
                })
                .await;
            }
            let ping = unixhttp::request(
                &live.socket,
                "GET",
                "/ping",
                &[],
                b"",
                Duration::from_secs(2),
            )
            .await;
            let busy = match &ping {
                Ok(r) if r.status == 200 => match ping_status(&r.body) {
                    Some(b) => {
                        live.failures = 0;
                        b
                    }
                    None => {
                        live.failures += 1;
                        false
                    }
                },
                _ => {
                    live.failures += 1;
                    false
                }
            };
            if live.exited.load(Ordering::Acquire) || live.failures >= self.inner.cfg.ping_failures
            {
                // Restart: a new sandbox and agent, the same session.
                let why = if live.exited.load(Ordering::Acquire) {
                    "the agent exited"
                } else {
                    "the agent stopped answering /ping"
                };
                let Some(old) = g.live.take() else { continue };
                self.release(&tenant, &id, old, why).await;
                let rv =
                    match runtimes::get_version(&self.inner.store, &tenant, &s.runtime, s.version)
                        .await
                    {
                        Ok(rv) => rv,
                        Err(_) => continue,
                    };
                match self.start(&tenant, &s, &rv).await {
                    Ok(l) => g.live = Some(l),
                    Err(_) => continue,
                }
                continue;
            }
            let idle = live.last_used.elapsed() >= Duration::from_secs(s.idle_timeout_s);
            if idle && !busy {
                let Some(old) = g.live.take() else { continue };
                let mut kept = false;
                if let Some(root) = self.inner.cfg.snapshots.clone() {
                    let (t, sid, b) = (tenant.clone(), id.clone(), old.sb.clone());
                    match tokio::task::spawn_blocking(move || idle::keep(&root, &t, &sid, &b))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()))
                    {
                        Ok(()) => kept = true,
                        Err(e) => tracing::warn!(
                            tenant = %tenant,
                            session_id = %id,
                            "session {tenant}/{id}: its files were not kept on disk ({e}); they go with its sandbox"
                        ),
                    }
                }
                self.release(&tenant, &id, old, "idle timeout").await;
                let _ = sessions::update(&self.inner.store, &tenant, &id, |x| {
                    if x.state.is_final() {
                        return Ok(false);
                    }
                    x.state = State::Idle;
                    x.sandbox = None;
                    x.sandbox_pid = None;
                    x.owner = None;
                    x.reason = Some(format!(
                        "idle for {} s: sandbox released{}; the next invocation resumes",
                        x.idle_timeout_s,
                        if kept { ", its files kept on disk" } else { "" }
                    ));
                    x.updated_at_ms = now_ms();
                    Ok(true)
                })
                .await;
            }
        }
    }

    /// Runs [`Host::tick`] every `ping_interval` until `stop` turns true.
    /// With several hosts on one store (not `exclusive`), also takes over the
    /// sessions of hosts that stopped renewing their leases, once per lease.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut last_recover = Instant::now();
        loop {
            if *stop.borrow() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.inner.cfg.ping_interval) => self.tick().await,
                r = stop.changed() => if r.is_err() { break },
            }
            if !self.inner.cfg.exclusive && last_recover.elapsed() >= self.inner.cfg.lease {
                last_recover = Instant::now();
                let _ = self.recover().await;
            }
        }
        self.shutdown().await;
    }

    /// Destroys every live sandbox (server shutdown).
    pub async fn shutdown(&self) {
        let sbs: Vec<Arc<Sandbox>> = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, v)| v)
            .collect();
        for sb in sbs {
            let _ = sb.destroy();
        }
    }
}

/// Kills a sandbox init left by a server that died, if `pid` still is one.
fn kill_stale_sandbox(pid: i32) {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return;
    };
    if String::from_utf8_lossy(&cmd).contains("tessera-sandbox-init") {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

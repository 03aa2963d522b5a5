//! Starting a session: its key, a sandbox claimed from the pool (with its kept files put
//! back), the agent launched inside it and its control-plane socket, until `/ping`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_sandbox::{ExecRequest, Sandbox, WarmPool};

use crate::error::{AgentError, now_ms};
use crate::runtimes::RuntimeVersion;
use crate::sessions::{self, Session, State};
use crate::unixhttp;

use super::{AGENT_SOCKET, CONTROL_SOCKET, Host, Live, idle, ping_status};

impl Host {
    async fn key_for(&self, tenant: &str, s: &Session) -> Result<String, AgentError> {
        let k = (tenant.to_string(), s.id.clone());
        if let Some(v) = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&k)
        {
            return Ok(v.clone());
        }
        let Some(m) = &self.inner.minter else {
            return Ok(String::new());
        };
        let ttl = s.expires_at_ms.saturating_sub(now_ms()) / 1000 + 60;
        let key = m(tenant.to_string(), s.id.clone(), ttl)
            .await
            .map_err(|e| AgentError::Unavailable(format!("cannot mint the session's key: {e}")))?;
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(k, key.clone());
        Ok(key)
    }

    /// Claims a sandbox, starts the agent, waits for `/ping`. Retries with
    /// backoff; after the last attempt the session is left idle (resumable).
    pub(super) async fn start(
        &self,
        tenant: &str,
        s: &Session,
        rv: &RuntimeVersion,
    ) -> Result<Live, AgentError> {
        let store = &self.inner.store;
        let pool = self.pool(tenant, &rv.spec)?;
        let key = self.key_for(tenant, s).await?;
        let mut last = String::new();
        for attempt in 0..self.inner.cfg.start_attempts.max(1) {
            if attempt > 0 {
                let ms = (100u64 << attempt.min(6)).min(5000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let cur = sessions::get(store, tenant, &s.id).await?;
            if cur.as_ref().is_some_and(|c| c.state.is_final()) {
                return Err(AgentError::State(format!(
                    "session {:?} was stopped while starting",
                    s.id
                )));
            }
            let lease_ms = self.inner.cfg.lease.as_millis() as u64;
            sessions::update(store, tenant, &s.id, |x| {
                x.state = State::Starting;
                x.sandbox = None;
                x.owner = Some(self.inner.owner.clone());
                x.lease_until_ms = now_ms() + lease_ms;
                x.updated_at_ms = now_ms();
                Ok(true)
            })
            .await?;
            let p = pool.clone();
            let sb = match tokio::task::spawn_blocking(move || p.claim()).await {
                Ok(Ok(mut sb)) => {
                    // The guard checks this session's commands as its tenant's.
                    sb.set_tenant(Some(tenant.to_string()));
                    Arc::new(sb)
                }
                Ok(Err(e)) => {
                    last = format!("claiming a sandbox: {e}");
                    continue;
                }
                Err(e) => {
                    last = format!("claiming a sandbox: {e}");
                    continue;
                }
            };
            // The files it had when it was last released for being idle.
            if let Some(root) = self.inner.cfg.snapshots.clone() {
                let (t, sid, b) = (tenant.to_string(), s.id.clone(), sb.clone());
                let restored =
                    tokio::task::spawn_blocking(move || idle::restore(&root, &t, &sid, &b))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(e) = restored {
                    // Not a passing fault: say why, keep the files, leave it resumable.
                    last = e;
                    let _ = sb.destroy();
                    if let Ok(sb) = Arc::try_unwrap(sb) {
                        pool.release(sb);
                    }
                    break;
                }
            }
            let id_key = (tenant.to_string(), s.id.clone());
            self.inner
                .sandboxes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id_key.clone(), sb.clone());
            sessions::update(store, tenant, &s.id, |x| {
                x.sandbox = Some(sb.id().to_string());
                x.sandbox_pid = Some(sb.pid());
                Ok(true)
            })
            .await?;
            match self.launch(tenant, s, rv, &sb, &key, pool.clone()).await {
                Ok(live) => {
                    let was_started = cur.as_ref().is_some_and(|c| c.starts > 0);
                    let upd = sessions::update(store, tenant, &s.id, |x| {
                        if x.state.is_final() {
                            return Err(AgentError::State(format!(
                                "session {:?} was stopped while starting",
                                x.id
                            )));
                        }
                        x.state = State::Active;
                        x.owner = Some(self.inner.owner.clone());
                        x.lease_until_ms = now_ms() + lease_ms;
                        x.starts += 1;
                        if was_started {
                            x.restarts += 1;
                        }
                        x.reason = None;
                        x.updated_at_ms = now_ms();
                        Ok(true)
                    })
                    .await;
                    if let Err(e) = upd {
                        self.release(tenant, &s.id, live, "stopped while starting")
                            .await;
                        return Err(e);
                    }
                    tracing::info!(
                        tenant = %tenant,
                        session_id = %s.id,
                        agent_id = %s.runtime,
                        agent_version = s.version,
                        sandbox = %sb.id(),
                        restarted = was_started,
                        "session {}: its agent answers in sandbox {}",
                        s.id,
                        sb.id()
                    );
                    return Ok(live);
                }
                Err(e) => {
                    tracing::warn!(
                        tenant = %tenant,
                        session_id = %s.id,
                        agent_id = %s.runtime,
                        "session {}: its agent did not start: {e}",
                        s.id
                    );
                    last = e;
                    self.inner
                        .sandboxes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id_key);
                    let _ = sb.destroy();
                    if let Ok(sb) = Arc::try_unwrap(sb) {
                        pool.release(sb);
                    }
                }
            }
        }
        let msg = format!(
            "session {:?}: could not start its agent after {} attempts: {last}; the session stays resumable",
            s.id, self.inner.cfg.start_attempts
        );
        let _ = sessions::update(store, tenant, &s.id, |x| {
            if x.state.is_final() {
                return Ok(false);
            }
            x.state = State::Idle;
            x.sandbox = None;
            x.sandbox_pid = None;
            x.owner = None;
            x.reason = Some(msg.clone());
            Ok(true)
        })
        .await;
        Err(AgentError::Unavailable(msg))
    }

    async fn launch(
        &self,
        tenant: &str,
        s: &Session,
        rv: &RuntimeVersion,
        sb: &Arc<Sandbox>,
        key: &str,
        pool: Arc<WarmPool>,
    ) -> Result<Live, String> {
        let root = PathBuf::from(format!("/proc/{}/root", sb.pid()));
        let socket = root.join(AGENT_SOCKET.trim_start_matches('/'));
        // The control plane inside the sandbox.
        let control = match self.inner.cfg.api_addr {
            Some(addr) => {
                let path = root.join(CONTROL_SOCKET.trim_start_matches('/'));
                let _ = std::fs::remove_file(&path);
                let l = bind_in_sandbox(&path)?;
                let l = tokio::net::UnixListener::from_std(l)
                    .map_err(|e| format!("listening on {}: {e}", path.display()))?;
                Some(tokio::spawn(forward(l, addr)))
            }
            None => None,
        };
        let mut req = ExecRequest::argv(rv.spec.command.clone());
        for (k, v) in &rv.spec.env {
            req = req.env(k, v);
        }
        req = req
            .env("TESSERA_AGENT_SOCKET", AGENT_SOCKET)
            .env("TESSERA_SESSION_ID", &s.id)
            .env("TESSERA_RUNTIME", &s.runtime)
            .env("TESSERA_RUNTIME_VERSION", s.version.to_string())
            .env("TESSERA_TENANT", tenant);
        if control.is_some() {
            req = req
                .env("TESSERA_URL", format!("unix://{CONTROL_SOCKET}"))
                .env("TESSERA_API_KEY", key);
        }
        if let Some(c) = &rv.spec.cwd {
            req = req.cwd(c);
        }
        req.max_output = 1 << 20;
        let exited = Arc::new(AtomicBool::new(false));
        let output = Arc::new(Mutex::new(String::new()));
        {
            let (sb, exited, output) = (sb.clone(), exited.clone(), output.clone());
            let name = format!("agent-{}", s.id);
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let tail = |o: &Arc<Mutex<String>>, st: tessera_sandbox::Stream, d: &[u8]| {
                    let mut g = o.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = st;
                    g.push_str(&String::from_utf8_lossy(d));
                    if g.len() > 8192 {
                        let cut = g.len() - 4096;
                        let cut = (cut..g.len())
                            .find(|i| g.is_char_boundary(*i))
                            .unwrap_or(cut);
                        g.drain(..cut);
                    }
                };
                let r = sb.exec_streaming(&req, |st, d| tail(&output, st, d));
                let msg = match r {
                    Ok(o) => format!("\n[agent exited: {:?}]", o.status),
                    Err(e) => format!("\n[agent could not run: {e}]"),
                };
                output
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&msg);
                exited.store(true, Ordering::Release);
            });
            if let Err(e) = spawned {
                return Err(format!("starting the agent thread: {e}"));
            }
        }
        // Wait for /ping → Healthy.
        let deadline = Instant::now() + self.inner.cfg.start_timeout;
        let mut delay = Duration::from_millis(5);
        loop {
            if exited.load(Ordering::Acquire) {
                let out = output.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(c) = control {
                    c.abort();
                }
                return Err(format!(
                    "the agent exited before answering /ping: {}",
                    out.trim()
                ));
            }
            if let Ok(r) =
                unixhttp::request(&socket, "GET", "/ping", &[], b"", Duration::from_secs(2)).await
            {
                if r.status == 200 && ping_status(&r.body).is_some() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                if let Some(c) = control {
                    c.abort();
                }
                let out = output.lock().unwrap_or_else(|p| p.into_inner()).clone();
                return Err(format!(
                    "the agent did not answer GET /ping on $TESSERA_AGENT_SOCKET within {:?}; its output: {}",
                    self.inner.cfg.start_timeout,
                    out.trim()
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(100));
        }
        Ok(Live {
            sb: sb.clone(),
            pool,
            socket,
            exited,
            output,
            control,
            last_used: Instant::now(),
            failures: 0,
            mem_gb_s: 0.0,
            last_sample: Instant::now(),
            runtime: s.runtime.clone(),
        })
    }
}

/// Binds a unix socket at `path` (inside a sandbox's filesystem, through
/// `/proc/<pid>/root`). The sandbox's tmpfs belongs to its user namespace, which
/// does not map the host's root: a root supervisor binds with the file-system
/// uid of the sandbox's user (per thread, so in a thread of its own), which
/// also makes the socket the sandbox user's to connect to.
fn bind_in_sandbox(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, String> {
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let root = nix::unistd::geteuid().is_root();
        if root {
            let id = tessera_sandbox::sandbox::HOST_ID_BASE + tessera_sandbox::sandbox::SANDBOX_UID;
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(id));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(id));
        }
        let r = std::os::unix::net::UnixListener::bind(&p);
        if root {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
        }
        let l = r.map_err(|e| format!("binding {}: {e}", p.display()))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("binding {}: {e}", p.display()))?;
        Ok(l)
    })
    .join()
    .map_err(|_| "the bind thread panicked".to_string())?
}

async fn forward(l: tokio::net::UnixListener, addr: std::net::SocketAddr) {
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            return;
        };
        tokio::spawn(async move {
            if let Ok(mut up) = tokio::net::TcpStream::connect(addr).await {
                let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
            }
        });
    }
}

//! Test helpers: a local HTTP tool that counts its executions per idempotency
//! key, for tests (and the end-to-end test) that check "exactly once".
//!
//! ```no_run
//! # async fn f() {
//! use tessera_agent::tools::testing::{CountingService, CountingConfig};
//! let svc = CountingService::start(CountingConfig { honour_keys: false, ..Default::default() })
//!     .await
//!     .unwrap();
//! // register a tool with target {"type": "http", "url": svc.url()} ... call it ...
//! assert!(svc.max_executions() <= 1);
//! # }
//! ```
//!
//! Every `POST` executes (or, with `honour_keys`, replays the first reply for a
//! key it has seen) and answers `{"key", "executions", "arguments"}`.
//! `GET /count?key=K` answers `{"key", "executions"}` (for reconciliation by
//! processes that cannot call [`CountingService::executions`]); `GET /counts`
//! answers every key's count.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the counting service behaves.
#[derive(Debug, Clone, Default)]
pub struct CountingConfig {
    /// Replay the first reply for a repeated `Idempotency-Key` instead of
    /// executing again (a tool that honours idempotency keys).
    pub honour_keys: bool,
    /// How long each execution takes.
    pub delay: Duration,
    /// Listen here (default `127.0.0.1:0`).
    pub listen: Option<SocketAddr>,
}

#[derive(Default)]
struct Counts {
    executions: HashMap<String, u64>,
    replies: HashMap<String, Value>,
    requests: u64,
}

/// A running counting service; it stops when dropped.
pub struct CountingService {
    addr: SocketAddr,
    counts: Arc<Mutex<Counts>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for CountingService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingService")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for CountingService {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingService {
    pub async fn start(cfg: CountingConfig) -> std::io::Result<CountingService> {
        let l = TcpListener::bind(
            cfg.listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .await?;
        let addr = l.local_addr()?;
        let counts = Arc::new(Mutex::new(Counts::default()));
        let c = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let _ = s.set_nodelay(true);
                tokio::spawn(serve(s, c.clone(), cfg.clone()));
            }
        });
        Ok(CountingService { addr, counts, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to register as an HTTP tool's target.
    pub fn url(&self) -> String {
        format!("http://{}/tool", self.addr)
    }

    /// How many times the call with this idempotency key executed.
    pub fn executions(&self, key: &str) -> u64 {
        self.counts
            .lock()
            .unwrap()
            .executions
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Executions of every key.
    pub fn all(&self) -> HashMap<String, u64> {
        self.counts.lock().unwrap().executions.clone()
    }

    /// The most executions of any one key (0 when none).
    pub fn max_executions(&self) -> u64 {
        self.counts
            .lock()
            .unwrap()
            .executions
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Requests received (executed or replayed).
    pub fn requests(&self) -> u64 {
        self.counts.lock().unwrap().requests
    }
}

async fn serve(mut s: TcpStream, counts: Arc<Mutex<Counts>>, cfg: CountingConfig) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Read one request: headers, then Content-Length bytes of body.
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let first = lines.next().unwrap_or_default().to_string();
        let mut len = 0usize;
        let mut key = None;
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                let k = k.trim().to_ascii_lowercase();
                if k == "content-length" {
                    len = v.trim().parse().unwrap_or(0);
                } else if k == "idempotency-key" {
                    key = Some(v.trim().to_string());
                }
            }
        }
        while buf.len() < head_end + 4 + len {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = buf[head_end + 4..head_end + 4 + len].to_vec();
        buf.drain(..head_end + 4 + len);
        let mut parts = first.split(' ');
        let method = parts.next().unwrap_or_default();
        let target = parts.next().unwrap_or_default();
        let (status, reply) = if method == "GET" {
            let c = counts.lock().unwrap();
            if let Some(k) = target.strip_prefix("/count?key=") {
                let k = percent_decode(k);
                let n = c.executions.get(&k).copied().unwrap_or(0);
                (200, json!({"key": k, "executions": n}))
            } else if target == "/counts" {
                (
                    200,
                    json!({"executions": c.executions, "requests": c.requests}),
                )
            } else {
                (404, json!({"error": "GET /count?key=K or /counts"}))
            }
        } else {
            let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let key = key.unwrap_or_default();
            let replay = {
                let mut c = counts.lock().unwrap();
                c.requests += 1;
                if cfg.honour_keys && !key.is_empty() {
                    c.replies.get(&key).cloned()
                } else {
                    None
                }
            };
            match replay {
                Some(r) => (200, r),
                None => {
                    if !cfg.delay.is_zero() {
                        tokio::time::sleep(cfg.delay).await;
                    }
                    let mut c = counts.lock().unwrap();
                    if let Some(r) = cfg
                        .honour_keys
                        .then(|| c.replies.get(&key).cloned())
                        .flatten()
                    {
                        (200, r)
                    } else {
                        let n = {
                            let e = c.executions.entry(key.clone()).or_insert(0);
                            *e += 1;
                            *e
                        };
                        let r = json!({"key": key, "executions": n, "arguments": args});
                        if cfg.honour_keys {
                            c.replies.insert(key, r.clone());
                        }
                        (200, r)
                    }
                }
            }
        };
        let text = reply.to_string();
        let resp = format!(
            "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
            if status == 200 { "OK" } else { "Not Found" },
            text.len()
        );
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

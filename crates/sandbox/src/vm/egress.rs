//! Egress for micro-VMs, with no network device in the guest.
//!
//! The guest's sandbox has its proxy socket (`127.0.0.1:3128` inside its own network
//! namespace, `HTTPS_PROXY` set), as in the namespace tier, but the guest's agent
//! serves it as a relay ([`GuestEgress`]): each connection is numbered and announced
//! to the host, and its bytes cross the control channel both ways as
//! [`Msg::EgressOpen`], [`Msg::EgressData`] and [`Msg::EgressClose`]. On the host
//! ([`HostEgress`]) each connection becomes one end of a socket pair that
//! [`crate::proxy::serve_stream`] serves with the sandbox's policy: the allow-list, the
//! public-address check and the connection out are the host's, whatever the guest
//! runs. At most [`crate::proxy::MAX_TUNNELS`] at once per VM; a guest that opens more
//! has them closed at once, and one that sends for a connection it did not open (or
//! never closes one) costs the host nothing beyond that bound.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::Shared;
use super::wire::Msg;
use crate::proxy::MAX_TUNNELS;
use crate::spec::{EgressPolicy, Network, SandboxSpec};

/// Bytes read at once from either end of a tunnel (one message each).
const CHUNK: usize = 64 << 10;

/// The host's end: the policy, and the write halves of the open connections.
pub(super) struct HostEgress {
    policy: Option<EgressPolicy>,
    conns: Mutex<HashMap<u64, UnixStream>>,
    open: AtomicUsize,
}

impl HostEgress {
    /// For a VM made from `spec`: connections are served only with `Network::Proxy`.
    pub(super) fn new(spec: &SandboxSpec) -> Arc<HostEgress> {
        Arc::new(HostEgress {
            policy: match &spec.network {
                Network::Proxy(p) => Some(p.clone()),
                Network::None => None,
            },
            conns: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
        })
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, UnixStream>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One `Egress*` message from the guest.
    pub(super) fn handle(self: &Arc<Self>, shared: &Arc<Shared>, msg: Msg, body: &[u8]) {
        match msg {
            Msg::EgressOpen { conn } => self.open(shared, conn),
            Msg::EgressData { conn } => {
                let w = self.conns().get(&conn).and_then(|w| w.try_clone().ok());
                if let Some(mut w) = w {
                    let _ = w.write_all(body);
                }
            }
            Msg::EgressClose { conn } => {
                if let Some(w) = self.conns().remove(&conn) {
                    let _ = w.shutdown(Shutdown::Write);
                }
            }
            _ => {}
        }
    }

    fn open(self: &Arc<Self>, shared: &Arc<Shared>, conn: u64) {
        let refuse = || {
            let _ = shared.send(&Msg::EgressClose { conn }, &[]);
        };
        let Some(policy) = self.policy.clone() else {
            return refuse();
        };
        if self.open.load(Ordering::Acquire) >= MAX_TUNNELS {
            return refuse();
        }
        let Ok((mine, theirs)) = UnixStream::pair() else {
            return refuse();
        };
        let Ok(w) = mine.try_clone() else {
            return refuse();
        };
        self.open.fetch_add(1, Ordering::AcqRel);
        self.conns().insert(conn, w);
        let served = std::thread::Builder::new()
            .name("tessera-vm-egress".into())
            .spawn(move || {
                let _ = crate::proxy::serve_stream(theirs, &policy);
            });
        let (me, sh) = (self.clone(), shared.clone());
        let relayed = served.and_then(|_| {
            std::thread::Builder::new()
                .name("tessera-vm-egress-out".into())
                .spawn(move || {
                    let mut r = mine;
                    let mut buf = vec![0u8; CHUNK];
                    loop {
                        match r.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if sh.send(&Msg::EgressData { conn }, &buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = sh.send(&Msg::EgressClose { conn }, &[]);
                    me.conns().remove(&conn);
                    me.open.fetch_sub(1, Ordering::AcqRel);
                })
        });
        if relayed.is_err() {
            self.conns().remove(&conn);
            self.open.fetch_sub(1, Ordering::AcqRel);
            refuse();
        }
    }
}

/// Sends one message to the host (the guest agent's writer).
pub(super) type Send = Arc<dyn Fn(&Msg, &[u8]) + std::marker::Send + Sync>;

/// The guest's end: numbers connections and carries their bytes.
pub(super) struct GuestEgress {
    send: Send,
    next: AtomicU64,
    conns: Mutex<HashMap<u64, TcpStream>>,
}

impl GuestEgress {
    pub(super) fn new(send: Send) -> Arc<GuestEgress> {
        Arc::new(GuestEgress {
            send,
            next: AtomicU64::new(1),
            conns: Mutex::new(HashMap::new()),
        })
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Relays one connection to the sandbox's proxy socket until its client stops
    /// writing (the host's half goes on until the host closes it).
    pub(super) fn relay(&self, c: TcpStream) {
        let conn = self.next.fetch_add(1, Ordering::Relaxed);
        let Ok(w) = c.try_clone() else { return };
        self.conns().insert(conn, w);
        (self.send)(&Msg::EgressOpen { conn }, &[]);
        let mut r = c;
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => (self.send)(&Msg::EgressData { conn }, &buf[..n]),
            }
        }
        (self.send)(&Msg::EgressClose { conn }, &[]);
    }

    /// Bytes from the host for `conn`. Written at once: a client that does not read
    /// holds up the agent's other messages, its own sandbox's only.
    pub(super) fn data(&self, conn: u64, body: &[u8]) {
        let w = self.conns().get(&conn).and_then(|w| w.try_clone().ok());
        if let Some(mut w) = w {
            let _ = w.write_all(body);
        }
    }

    /// The host closed its half of `conn`.
    pub(super) fn close(&self, conn: u64) {
        if let Some(w) = self.conns().remove(&conn) {
            let _ = w.shutdown(Shutdown::Write);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::EgressPolicy;
    use std::sync::RwLock;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A host end whose guest is this test: what the host sends comes out of `guest`.
    fn host(network: Network) -> (Arc<Shared>, UnixStream) {
        let (mine, guest) = UnixStream::pair().unwrap();
        let spec = SandboxSpec {
            network,
            ..SandboxSpec::default()
        };
        let shared = Arc::new(Shared {
            tx: Mutex::new(mine),
            calls: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            guard: Arc::new(crate::AllowAll),
            tenant: RwLock::new(None),
            quiet: Mutex::new(None),
            dead: AtomicBool::new(false),
            egress: HostEgress::new(&spec),
        });
        guest
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        (shared, guest)
    }

    fn from_guest(s: &Arc<Shared>, msg: Msg, body: &[u8]) {
        s.egress.clone().handle(s, msg, body);
    }

    fn next(guest: &mut UnixStream) -> (Msg, Vec<u8>) {
        super::super::wire::read_msg(guest)
            .unwrap()
            .expect("a message")
    }

    #[test]
    fn without_a_proxy_every_connection_is_closed_at_once() {
        let (s, mut guest) = host(Network::None);
        from_guest(&s, Msg::EgressOpen { conn: 1 }, &[]);
        assert!(matches!(next(&mut guest).0, Msg::EgressClose { conn: 1 }));
        // Bytes and closes for connections that do not exist change nothing.
        from_guest(
            &s,
            Msg::EgressData { conn: 1 },
            b"CONNECT x:1 HTTP/1.1\r\n\r\n",
        );
        from_guest(&s, Msg::EgressClose { conn: 9 }, &[]);
        assert!(s.egress.conns().is_empty());
    }

    #[test]
    fn a_relayed_tunnel_gets_the_hosts_policy() {
        let up = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = up.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for c in up.incoming().flatten() {
                let mut line = String::new();
                let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut line);
                let _ = (&c).write_all(format!("echo:{line}").as_bytes());
            }
        });
        let (s, mut guest) = host(Network::Proxy(EgressPolicy {
            allow_domains: vec!["localhost".into()],
            allow_private: true,
        }));
        let read_until = |guest: &mut UnixStream, conn: u64, want: &str| {
            let mut got = String::new();
            while !got.contains(want) {
                match next(guest) {
                    (Msg::EgressData { conn: c }, b) if c == conn => {
                        got.push_str(&String::from_utf8_lossy(&b))
                    }
                    (Msg::EgressClose { conn: c }, _) if c == conn => break,
                    _ => {}
                }
            }
            got
        };
        from_guest(&s, Msg::EgressOpen { conn: 7 }, &[]);
        let head = format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\nping\n");
        from_guest(&s, Msg::EgressData { conn: 7 }, head.as_bytes());
        let got = read_until(&mut guest, 7, "echo:ping");
        assert!(
            got.starts_with("HTTP/1.1 200") && got.contains("echo:ping"),
            "{got:?}"
        );
        // A name off the allow-list is refused by the host, whatever the guest sends.
        from_guest(&s, Msg::EgressOpen { conn: 8 }, &[]);
        from_guest(
            &s,
            Msg::EgressData { conn: 8 },
            format!("CONNECT example.org:{port} HTTP/1.1\r\n\r\n").as_bytes(),
        );
        let got = read_until(&mut guest, 8, "403");
        assert!(got.starts_with("HTTP/1.1 403"), "{got:?}");
    }

    #[test]
    fn past_the_tunnel_bound_connections_are_closed_at_once() {
        let (s, mut guest) = host(Network::Proxy(EgressPolicy {
            allow_domains: vec![],
            allow_private: false,
        }));
        for conn in 0..MAX_TUNNELS as u64 {
            from_guest(&s, Msg::EgressOpen { conn }, &[]);
        }
        assert_eq!(s.egress.open.load(Ordering::Acquire), MAX_TUNNELS);
        from_guest(&s, Msg::EgressOpen { conn: 1000 }, &[]);
        assert!(matches!(
            next(&mut guest).0,
            Msg::EgressClose { conn: 1000 }
        ));
        assert_eq!(s.egress.conns().len(), MAX_TUNNELS);
    }
}

//! The egress proxy: a sandbox with `Network::Proxy` has a listening socket at
//! `127.0.0.1:3128` inside its own network namespace, created by its init and served by
//! the supervisor from outside (no bridge, no veth, no iptables). It speaks HTTP
//! `CONNECT` only, and connects out from the host's network namespace to allowed
//! domains, refusing non-public addresses unless the policy allows them.
//!
//! A micro-VM's guest has no network at all: there the listener's connections are
//! handed to an [`EgressRelay`] (the guest's agent), which carries their bytes over the
//! control channel to the host, where [`serve_stream`] does what [`Proxy`] does here —
//! the allow-list is the host's, whatever the guest runs.

use crate::spec::EgressPolicy;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Open tunnels per sandbox, at most.
pub const MAX_TUNNELS: usize = 64;

/// Takes each connection to a sandbox's proxy socket instead of serving it here, and
/// returns when the connection is done (it runs on a thread of its own).
pub type EgressRelay = Arc<dyn Fn(TcpStream) + Send + Sync>;

/// A running proxy for one sandbox.
#[derive(Debug)]
pub struct Proxy {
    listener: TcpListener,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Serves `listener` (a listening socket from the sandbox) with `policy`.
    pub fn start(listener: OwnedFd, policy: EgressPolicy) -> io::Result<Proxy> {
        Proxy::start_with(
            listener,
            Arc::new(move |c: TcpStream| {
                let _ = serve(c, &policy);
            }),
        )
    }

    /// Hands each connection to `listener` to `relay`, at most [`MAX_TUNNELS`] at once.
    pub fn start_with(listener: OwnedFd, relay: EgressRelay) -> io::Result<Proxy> {
        let listener = TcpListener::from(listener);
        let accept = listener.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("tessera-egress".into())
            .spawn(move || {
                let open = Arc::new(AtomicUsize::new(0));
                for conn in accept.incoming() {
                    match conn {
                        Ok(mut c) => {
                            // Each tunnel costs the supervisor a thread or two: bound them.
                            if open.load(Ordering::Relaxed) >= MAX_TUNNELS {
                                let _ =
                                    reply(&mut c, "503 Service Unavailable", "too many tunnels\n");
                                continue;
                            }
                            open.fetch_add(1, Ordering::Relaxed);
                            let (r, mine) = (relay.clone(), open.clone());
                            let spawned = std::thread::Builder::new()
                                .name("tessera-egress-conn".into())
                                .spawn(move || {
                                    r(c);
                                    mine.fetch_sub(1, Ordering::Relaxed);
                                });
                            if spawned.is_err() {
                                // The closure (and its decrement) never ran.
                                open.fetch_sub(1, Ordering::Relaxed);
                            }
                        }
                        // Shut down by `stop`, or the namespace is gone.
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => return,
                    }
                }
            })?;
        Ok(Proxy {
            listener,
            thread: Some(thread),
        })
    }

    /// Stops accepting (open tunnels end when either side closes).
    pub fn stop(mut self) {
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&self.listener),
            nix::sys::socket::Shutdown::Both,
        );
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Does `host` fall under the allow-list? Case-insensitive; an entry allows itself
/// and its subdomains.
pub fn domain_allowed(host: &str, allow: &[String]) -> bool {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    if h.is_empty() {
        return false;
    }
    allow.iter().any(|a| {
        let a = a
            .trim_end_matches('.')
            .trim_start_matches("*.")
            .to_ascii_lowercase();
        !a.is_empty() && (h == a || h.ends_with(&format!(".{a}")))
    })
}

/// Public unicast addresses only.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => {
            let o = v.octets();
            !(v.is_loopback()
                || v.is_private()
                || v.is_link_local()
                || v.is_unspecified()
                || v.is_broadcast()
                || v.is_multicast()
                || v.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64/10 shared
                || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking
                || o[0] >= 240)
        }
        IpAddr::V6(v) => {
            if let Some(v4) = v.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v.segments();
            !(v.is_loopback()
                || v.is_unspecified()
                || v.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80) // link local
        }
    }
}

/// A client connection the proxy serves: a TCP connection from the sandbox, or one
/// end of a socket pair whose other end a micro-VM's relay feeds.
trait Client: Read + Write + Send + Sized + 'static {
    fn duplicate(&self) -> io::Result<Self>;
    fn close_write(&self);
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Client for TcpStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
}

impl Client for std::os::unix::net::UnixStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
}

/// Serves one tunnel request arriving on `c` (a relayed connection) with `policy`, as
/// [`Proxy`] serves a sandbox's own; returns when the tunnel is done.
pub fn serve_stream(c: std::os::unix::net::UnixStream, policy: &EgressPolicy) -> io::Result<()> {
    serve(c, policy)
}

fn reply(c: &mut impl Write, status: &str, why: &str) -> io::Result<()> {
    c.write_all(
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{why}",
            why.len()
        )
        .as_bytes(),
    )
}

/// Parses `CONNECT host:port HTTP/1.x`.
pub fn parse_connect(head: &str) -> Option<(String, u16)> {
    let line = head.lines().next()?;
    let mut it = line.split_whitespace();
    if !it.next()?.eq_ignore_ascii_case("CONNECT") {
        return None;
    }
    let target = it.next()?;
    if !it.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let (host, port) = target.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok()?;
    if host.is_empty() || port == 0 {
        return None;
    }
    Some((host.to_string(), port))
}

fn serve<C: Client>(mut c: C, policy: &EgressPolicy) -> io::Result<()> {
    c.read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.read(&mut b)?;
        if n == 0 || head.len() > 16 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let Some((host, port)) = parse_connect(&text) else {
        return reply(
            &mut c,
            "400 Bad Request",
            "only CONNECT host:port is supported\n",
        );
    };
    if !domain_allowed(&host, &policy.allow_domains) {
        return reply(
            &mut c,
            "403 Forbidden",
            &format!("{host} is not on the allow-list\n"),
        );
    }
    let addrs: Vec<SocketAddr> = match (host.as_str(), port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(_) => {
            return reply(
                &mut c,
                "502 Bad Gateway",
                &format!("cannot resolve {host}\n"),
            );
        }
    };
    let Some(addr) = addrs
        .into_iter()
        .find(|a| policy.allow_private || is_public(a.ip()))
    else {
        return reply(
            &mut c,
            "403 Forbidden",
            &format!("{host} resolves to a non-public address\n"),
        );
    };
    let up = match TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
        Ok(u) => u,
        Err(e) => return reply(&mut c, "502 Bad Gateway", &format!("{host}: {e}\n")),
    };
    c.read_timeout(None)?;
    c.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")?;
    // Bytes the client sent after the header belong to the tunnel.
    if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
        (&up).write_all(&head[end + 4..])?;
    }
    let (mut c2, mut up2) = (c.duplicate()?, up.try_clone()?);
    let t = std::thread::spawn(move || {
        let _ = io::copy(&mut c2, &mut up2);
        let _ = up2.shutdown(Shutdown::Write);
    });
    let (mut up3, mut c3) = (up, c);
    let _ = io::copy(&mut up3, &mut c3);
    c3.close_write();
    let _ = t.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_matches_domains_and_subdomains_only() {
        let allow = vec!["example.com".to_string(), "*.pypi.org".to_string()];
        assert!(domain_allowed("example.com", &allow));
        assert!(domain_allowed("API.Example.com.", &allow));
        assert!(domain_allowed("files.pypi.org", &allow));
        assert!(domain_allowed("pypi.org", &allow));
        assert!(!domain_allowed("evilexample.com", &allow));
        assert!(!domain_allowed("example.com.evil.net", &allow));
        assert!(!domain_allowed("", &allow));
        assert!(!domain_allowed("example.com", &[]));
    }

    #[test]
    fn non_public_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn connect_lines_parse() {
        assert_eq!(
            parse_connect("CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("example.com".into(), 443))
        );
        assert_eq!(
            parse_connect("CONNECT [::1]:80 HTTP/1.0\r\n\r\n"),
            Some(("::1".into(), 80))
        );
        assert_eq!(parse_connect("GET http://x/ HTTP/1.1\r\n\r\n"), None);
        assert_eq!(parse_connect("CONNECT example.com HTTP/1.1\r\n\r\n"), None);
        assert_eq!(
            parse_connect("CONNECT example.com:0 HTTP/1.1\r\n\r\n"),
            None
        );
        assert_eq!(parse_connect(""), None);
    }

    proptest::proptest! {
        #[test]
        fn parse_connect_never_panics(s in ".{0,200}") {
            let _ = parse_connect(&s);
        }
    }
}

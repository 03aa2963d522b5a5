//! A minimal HTTP/1.1 client over a unix socket (one request per connection),
//! for the agent contract: `GET /ping` and `POST /invocations` to the agent
//! inside its sandbox.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// An HTTP reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Largest reply accepted.
pub const MAX_REPLY: usize = 64 << 20;

/// Sends one request and reads the whole reply, within `timeout`.
pub async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Reply, String> {
    match tokio::time::timeout(timeout, request_inner(socket, method, path, headers, body)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no reply to {method} {path} within {timeout:?}")),
    }
}

async fn request_inner(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Reply, String> {
    let mut s = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(k);
        req.push_str(": ");
        req.push_str(v);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    s.write_all(body).await.map_err(|e| format!("send: {e}"))?;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        if buf.len() > 64 << 10 {
            return Err("reply headers larger than 64 KiB".into());
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed before a reply".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut rest = buf[head_end + 4..].to_vec();
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let chunked =
        get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let len: Option<usize> = get("content-length").and_then(|v| v.parse().ok());
    if let (false, Some(len)) = (chunked, len) {
        if len > MAX_REPLY {
            return Err(format!("reply of {len} bytes is larger than {MAX_REPLY}"));
        }
        while rest.len() < len {
            let mut chunk = vec![0u8; (len - rest.len()).min(1 << 16)];
            let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("connection closed in the reply body".into());
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        rest.truncate(len);
    } else {
        loop {
            let mut chunk = [0u8; 8192];
            let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&chunk[..n]);
            if rest.len() > MAX_REPLY {
                return Err(format!("reply larger than {MAX_REPLY} bytes"));
            }
        }
        if chunked {
            rest = dechunk(&rest)?;
        }
    }
    Ok(Reply {
        status,
        headers,
        body: rest,
    })
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let p = find(b, b"\r\n").ok_or("bad chunked body")?;
        let size_s = String::from_utf8_lossy(&b[..p]);
        let size = usize::from_str_radix(size_s.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size_s:?}"))?;
        b = &b[p + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            return Err("truncated chunked body".into());
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

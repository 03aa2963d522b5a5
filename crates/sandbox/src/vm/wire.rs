//! The control channel between the host and a micro-VM's guest agent: messages over
//! the virtio-serial port `tessera.ctl`, a byte stream.
//!
//! The operations are the namespace tier's (the guest agent runs them on a namespace
//! sandbox inside the guest, through the same [`crate::Sandbox`] API, whose jobs are
//! [`crate::proto::Job`]s): commands, the files API, tar in and out, ping; `execve`
//! checks go from the guest to the host's guard and back. What is new is the framing,
//! since a byte stream carries no file descriptors: stdin, output and file contents
//! travel as message bodies.
//!
//! A frame is `[u32 LE length of the rest][u8 flags][u32 LE json length][json][body]`.
//! Flag bit 0 says the body goes on in the next frame (whose json is empty); a message
//! is its first frame's JSON ([`Msg`]) with the bodies of all its frames. Frames are at
//! most [`MAX_FRAME`] bytes, a message's body at most [`MAX_BODY`]; anything else is a
//! broken (or hostile) peer, and the host ends the VM.

use crate::error::StepError;
use crate::spec::{DirEntry, ExitStatus, SandboxSpec};
use crate::tarball::TarLimits;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Bumped on any change to [`Msg`]: host and agent must agree.
pub const VERSION: u32 = 1;
/// Largest frame on the wire (header excluded).
pub const MAX_FRAME: usize = 1 << 20;
/// Largest body of one message.
pub const MAX_BODY: usize = (1 << 30) + (64 << 20);
const MAX_JSON: usize = 256 << 10;
const CONT: u8 = 1;

/// One operation, host -> guest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Call {
    /// Runs `argv` (checked by the host's guard already); body: stdin. With `stream`,
    /// output comes as [`Msg::Output`] and the reply's output is empty.
    Exec {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        timeout_ms: Option<u64>,
        max_output: usize,
        stream: bool,
    },
    /// Reply body: the file.
    ReadFile {
        path: String,
    },
    /// Body: the content.
    WriteFile {
        path: String,
    },
    List {
        path: String,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Mkdir {
        path: String,
    },
    /// Body: the archive (checked by the host already).
    UploadTar {
        dir: String,
        limits: TarLimits,
    },
    /// Reply body: the archive (redacted by the host).
    DownloadTar {
        dir: String,
        limits: TarLimits,
    },
    Ping,
}

/// How a command ended, as the guest's sandbox reported it. With a non-streaming exec
/// the reply's body is stdout then stderr (`stdout_len` bytes of stdout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireOutput {
    pub status: ExitStatus,
    pub stdout_len: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub alerts: Vec<String>,
}

/// What a call returned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Answer {
    Exec(WireOutput),
    /// Body carries the data, where there is any.
    Done,
    List(Vec<DirEntry>),
    Tar(crate::tarball::TarSummary),
}

/// A failed call: enough to rebuild the namespace tier's error on the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireError {
    Blocked(String),
    EmptyCommand,
    Start(StepError),
    Destroyed,
    Paused,
    BadPath(String),
    Op {
        path: String,
        source: StepError,
    },
    Archive {
        path: String,
        source: crate::tarball::TarError,
    },
    Other(String),
}

/// The guard's decision on one `execve`, as the host sends it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Verdict {
    Allow,
    Alert(Vec<String>),
    Block(Vec<String>),
}

/// A message (the first frame's JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Msg {
    /// Host -> guest, first: the sandbox to make (its template is the guest's root
    /// disk), and whether `execve`s are checked.
    Hello {
        version: u32,
        spec: SandboxSpec,
        checks_exec: bool,
    },
    /// Guest -> host: the sandbox is up.
    Ready {
        version: u32,
        /// `uname -r` of the guest.
        kernel: String,
        /// Milliseconds from the guest kernel's start to this message.
        uptime_ms: u64,
    },
    /// Guest -> host: setting up failed (the VM is useless).
    SetupFailed {
        error: String,
    },
    Call {
        id: u64,
        call: Call,
    },
    /// Guest -> host: a chunk of a streaming exec's output (body).
    Output {
        id: u64,
        stderr: bool,
    },
    Reply {
        id: u64,
        result: Result<Answer, WireError>,
    },
    /// Guest -> host: may this `execve` run? (`program`: what the guest identified
    /// the file as.)
    ExecCheck {
        id: u64,
        q: u64,
        argv: Vec<String>,
        program: Option<String>,
    },
    /// Host -> guest: the guard's answer to [`Msg::ExecCheck`] `q`.
    Verdict {
        q: u64,
        verdict: Verdict,
    },
    /// Host -> guest: end every running command.
    EndCommands,
    /// Host -> guest: send `signal` (a number, 1 to 64) to every process of the running
    /// commands (the node runtime's SIGTERM before a stop's grace period).
    SignalCommands {
        signal: i32,
    },
    /// Guest -> host: a connection to the sandbox's egress proxy socket opened
    /// (`conn`: the guest's number for it); its bytes follow ([`super::egress`]).
    EgressOpen {
        conn: u64,
    },
    /// Either way: bytes of connection `conn` (the body).
    EgressData {
        conn: u64,
    },
    /// Either way: the sender writes no more to `conn`.
    EgressClose {
        conn: u64,
    },
    /// Host -> guest: a snapshot is next; answer [`Msg::Quiet`] once no call runs.
    Quiesce,
    Quiet,
}

/// Writes one message, split into frames.
pub fn write_msg(w: &mut impl Write, msg: &Msg, body: &[u8]) -> io::Result<()> {
    let json = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if json.len() > MAX_JSON || body.len() > MAX_BODY {
        return Err(io::Error::other(format!(
            "message too large ({} bytes of JSON, {} of body)",
            json.len(),
            body.len()
        )));
    }
    let room = MAX_FRAME - json.len().min(MAX_FRAME / 2);
    let mut rest = body;
    let mut first = true;
    let mut out = Vec::with_capacity(16 + json.len() + body.len().min(MAX_FRAME));
    loop {
        let j: &[u8] = if first { &json } else { &[] };
        let cap = if first { room } else { MAX_FRAME };
        let n = rest.len().min(cap);
        let more = rest.len() > n;
        out.clear();
        let len = 1 + 4 + j.len() + n;
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.push(if more { CONT } else { 0 });
        out.extend_from_slice(&(j.len() as u32).to_le_bytes());
        out.extend_from_slice(j);
        out.extend_from_slice(&rest[..n]);
        w.write_all(&out)?;
        rest = &rest[n..];
        first = false;
        if !more {
            break;
        }
    }
    w.flush()
}

fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "frame cut")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads one message; `Ok(None)` at the end of the stream.
pub fn read_msg(r: &mut impl Read) -> io::Result<Option<(Msg, Vec<u8>)>> {
    let mut msg: Option<Msg> = None;
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; 9];
        if !read_exact_or_eof(r, &mut head)? {
            if msg.is_none() {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "stream ended inside a message",
            ));
        }
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as usize;
        let flags = head[4];
        let jlen = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes")) as usize;
        if !(5..=MAX_FRAME + 5 + MAX_JSON).contains(&len) || jlen > len - 5 || jlen > MAX_JSON {
            return Err(bad(format!("bad frame: length {len}, json {jlen}")));
        }
        let blen = len - 5 - jlen;
        if body.len() + blen > MAX_BODY {
            return Err(bad(format!("message body over {MAX_BODY} bytes")));
        }
        let mut j = vec![0u8; jlen];
        if !read_exact_or_eof(r, &mut j)? && jlen > 0 {
            return Err(bad("frame cut".into()));
        }
        match (&msg, jlen) {
            (None, 0) => return Err(bad("first frame without a message".into())),
            (None, _) => {
                msg =
                    Some(serde_json::from_slice(&j).map_err(|e| bad(format!("bad message: {e}")))?)
            }
            (Some(_), 0) => {}
            (Some(_), _) => return Err(bad("continuation frame with a message".into())),
        }
        let at = body.len();
        body.resize(at + blen, 0);
        if blen > 0 && !read_exact_or_eof(r, &mut body[at..])? {
            return Err(bad("frame cut".into()));
        }
        if flags & CONT == 0 {
            return Ok(Some((msg.expect("set above"), body)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Bodies up to three frames long; their bytes from a seed (random megabytes
        // per case would make this test take minutes in a debug build).
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn messages_round_trip_through_frames(
            len in prop_oneof![0..64usize, (MAX_FRAME - 64)..(MAX_FRAME + 64), 0..(3 * MAX_FRAME)],
            seed in any::<u8>(),
            id in any::<u64>(),
        ) {
            let body: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut buf = Vec::new();
            let m = Msg::Output { id, stderr: true };
            write_msg(&mut buf, &m, &body).unwrap();
            write_msg(&mut buf, &Msg::Quiet, &[]).unwrap();
            let mut r = &buf[..];
            let (got, b) = read_msg(&mut r).unwrap().unwrap();
            let ok = matches!(got, Msg::Output { id: i, stderr: true } if i == id);
            prop_assert!(ok, "got {:?}", got);
            prop_assert_eq!(b, body);
            prop_assert!(matches!(read_msg(&mut r).unwrap().unwrap().0, Msg::Quiet));
            prop_assert!(read_msg(&mut r).unwrap().is_none());
        }

        /// Whatever bytes a hostile guest sends, reading them fails or yields messages;
        /// it never panics and never allocates past the limits.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut r = &bytes[..];
            for _ in 0..8 {
                match read_msg(&mut r) {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_before_allocating() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&(u32::MAX).to_le_bytes());
        buf.push(0);
        buf.extend_from_slice(&2u32.to_le_bytes());
        let e = read_msg(&mut &buf[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}

//! Helpers shared by the CLI tests: start `tessera up` as a child process and
//! read the URL and admin key it prints.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_tessera");

/// Whether the tests run as root (effective uid 0, from /proc).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// A `tessera up` child: its URL, the admin key it printed, and the process.
pub struct Up {
    pub url: String,
    pub key: Option<String>,
    pub child: Child,
    /// Its stdout and stderr lines after those read at start.
    pub lines: mpsc::Receiver<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` with `stdin` (none: an empty one): (exit code, stdout, stderr).
pub fn run(mut cmd: Command, stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub fn up(data: &Path) -> Up {
    let d = data.to_str().unwrap();
    up_with(&["--data", d])
}

/// Starts `tessera up --listen 127.0.0.1:0` with `extra` arguments.
pub fn up_with(extra: &[&str]) -> Up {
    let mut child = Command::new(BIN)
        .args(["up", "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(l);
        }
    });
    let mut url = None;
    let mut key = None;
    while url.is_none() {
        let l = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("tessera up starts");
        if let Some(u) = l.strip_prefix("tessera: listening on ") {
            url = Some(u.to_string());
        }
        if let Some(k) = l.trim().strip_prefix("export TESSERA_API_KEY=") {
            key = Some(k.to_string());
        }
    }
    // The key is printed before the URL line on stderr, but the two pipes race.
    if key.is_none() {
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
            if let Some(k) = l.trim().strip_prefix("export TESSERA_API_KEY=") {
                key = Some(k.to_string());
                break;
            }
        }
    }
    Up {
        url: url.unwrap(),
        key,
        child,
        lines: rx,
    }
}

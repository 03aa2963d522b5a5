//! A sandbox must not outlive its supervisor: after `kill -9` of the process that
//! created it, no process of a running or a paused (frozen) sandbox is left, and its
//! cgroups are removed.
//!
//! The supervisor is this test binary run again with `TESSERA_TEST_SUPERVISOR` set,
//! which makes `helper_supervisor` create the sandboxes, print their ids, and wait to
//! be killed.

mod common;

use common::root_or_skip;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_sandbox::ExecRequest;

const HELPER_ENV: &str = "TESSERA_TEST_SUPERVISOR";

/// Not a test on its own: the supervisor process of `kill_9_of_the_supervisor_...`.
#[test]
fn helper_supervisor() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let rt = common::runtime();
    let running = rt.spawn(&Default::default()).expect("spawn");
    let paused = rt.spawn(&Default::default()).expect("spawn");
    // A pause needs a cgroup freezer; the caller checks cgroups are in use.
    paused.pause().expect("pause");
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\nSUPERVISOR {} {} {} {}",
        running.pid(),
        paused.pid(),
        running.id(),
        paused.id()
    )
    .unwrap();
    out.flush().unwrap();
    drop(out);
    // A long command in the running sandbox, so that it has more than its init.
    let _ = running.exec(&ExecRequest::argv(["sleep", "1000"]));
    std::thread::sleep(Duration::from_secs(1000));
}

fn state_of(pid: i32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().next().map(str::to_string)
}

fn alive(pid: i32) -> bool {
    matches!(state_of(pid), Some(s) if s != "Z" && s != "X")
}

fn ppid_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Live descendants of `root`.
fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in &all {
            if ppid_of(c) == Some(p) && alive(c) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "{what} (waited {limit:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_9_of_the_supervisor_leaves_no_sandbox_process_or_cgroup() {
    if std::env::var_os(HELPER_ENV).is_some()
        || !root_or_skip("kill_9_of_the_supervisor_leaves_no_sandbox_process_or_cgroup")
    {
        return;
    }
    let rt = common::runtime();
    let cg = rt.cgroups().expect("cgroups are in use as root");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_supervisor",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    // The test harness prints its own lines first.
    let fields = loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "helper ended early");
        if let Some(rest) = line.strip_prefix("SUPERVISOR ") {
            break rest.to_string();
        }
    };
    let f: Vec<&str> = fields.split_whitespace().collect();
    let (running, paused): (i32, i32) = (f[0].parse().unwrap(), f[1].parse().unwrap());
    let ids = [f[2].to_string(), f[3].to_string()];
    assert!(alive(running) && alive(paused));
    // Wait until `sleep` runs inside the running sandbox.
    wait_for(
        "sleep started in the sandbox",
        Duration::from_secs(30),
        || descendants(running).len() >= 2,
    );
    let mut inside = descendants(running);
    inside.push(running);
    inside.push(paused);

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    wait_for(
        "every process of both sandboxes is gone",
        Duration::from_secs(60),
        || inside.iter().all(|&p| !alive(p)),
    );
    wait_for(
        "the sandboxes' cgroups are removed",
        Duration::from_secs(60),
        || {
            !cg.list()
                .iter()
                .any(|p| ids.iter().any(|id| p.ends_with(id.as_str())))
        },
    );
}

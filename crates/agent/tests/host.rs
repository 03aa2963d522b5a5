//! Sessions on real sandboxes: the agent contract over the sandbox's unix
//! socket, affinity, usage from the agent, crash recovery, /ping restarts,
//! kill, budgets. Needs namespaces and `tessera-sandbox-init` (built with the
//! workspace); skips with a reason only when sandboxes cannot be made here
//! and `CI` is unset.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_agent::host::{Host, HostConfig};
use tessera_agent::runtimes::{self, RuntimeSpec};
use tessera_agent::sessions::{self, State};
use tessera_agent::{meter, trace};
use tessera_store::{AnyStore, SqliteStore};

const AGENT: &str = include_str!("agents/echo_agent.py");

fn spec(env: &[(&str, &str)]) -> RuntimeSpec {
    let mut s: RuntimeSpec = serde_json::from_value(json!({
        "command": ["python3", "-c", AGENT],
        "resources": {"memory_mb": 256},
        "idle_timeout_s": 600,
    }))
    .unwrap();
    for (k, v) in env {
        s.env.insert(k.to_string(), v.to_string());
    }
    s
}

fn setup(cfg: HostConfig) -> Option<(tempfile::TempDir, Host)> {
    let d = tempfile::tempdir().unwrap();
    let store: AnyStore = SqliteStore::open(d.path()).unwrap().into();
    // Can this machine make sandboxes at all?
    let probe = tessera_sandbox::Runtime::new(tessera_sandbox::RuntimeConfig::default())
        .and_then(|rt| rt.spawn(&tessera_sandbox::SandboxSpec::default()));
    if let Err(e) = probe {
        if std::env::var_os("CI").is_some() {
            panic!("sandboxes are needed in CI: {e}");
        }
        eprintln!("SKIP: cannot make sandboxes here: {e}");
        return None;
    }
    let host = Host::new(store, cfg, None);
    Some((d, host))
}

/// Waits until process `pid` has exited (gone, or a zombie not yet reaped).
async fn wait_dead(pid: i32) {
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(s) => {
                let state = s
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next());
                if matches!(state, Some("Z" | "X")) {
                    return;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

fn body(r: &tessera_agent::host::Invocation) -> Value {
    serde_json::from_slice(&r.reply.body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_have_affinity_meter_usage_and_survive_sandbox_kills() {
    let Some((_d, host)) = setup(HostConfig {
        pool_min: 1,
        ..HostConfig::default()
    }) else {
        return;
    };
    let st = host.store().clone();
    let t0 = std::time::Instant::now();
    runtimes::create(&st, "t1", "echo", spec(&[]), runtimes::Quotas::default(), 1)
        .await
        .unwrap();
    let r1 = host
        .invoke("t1", "echo", None, "s1", br#"{"q": 1}"#, "application/json")
        .await
        .unwrap();
    assert!(r1.created);
    let b1 = body(&r1);
    assert_eq!(b1["echo"]["q"], 1);
    assert_eq!(b1["session"], "s1");
    let r2 = host
        .invoke("t1", "echo", None, "s1", br#"{"q": 2}"#, "application/json")
        .await
        .unwrap();
    let b2 = body(&r2);
    // Affinity: the same agent process answered.
    assert_eq!(b2["pid"], b1["pid"]);
    assert_eq!(b2["count"], 2);
    let s = sessions::get(&st, "t1", "s1").await.unwrap().unwrap();
    assert_eq!(s.state, State::Active);
    assert_eq!(s.invocations, 2);
    // Usage reported by the agent was metered once per invocation.
    let tot = meter::session_totals(&st, "t1", "s1").await.unwrap();
    assert_eq!(tot.quantities[&meter::UsageKind::TokensIn], 20.0);
    // Kill the sandbox from outside: the next invocation resumes on a new one.
    let pid = s.sandbox_pid.unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    // SIGKILL is delivered asynchronously: until the sandbox's init has
    // exited (and with it, by the kernel, every process of its namespace), the
    // old agent can still answer. Wait for that, not for a time.
    wait_dead(pid).await;
    let r3 = host
        .invoke("t1", "echo", None, "s1", br#"{"q": 3}"#, "application/json")
        .await
        .unwrap();
    let b3 = body(&r3);
    assert_eq!(b3["count"], 1, "a new agent process: {b3}");
    let s = sessions::get(&st, "t1", "s1").await.unwrap().unwrap();
    assert_eq!(s.state, State::Active);
    assert_ne!(s.sandbox_pid, Some(pid));
    assert!(s.restarts >= 1, "{s:?}");
    // Listing by state reads the index.
    let active = sessions::list(&st, "t1", &[State::Active], None)
        .await
        .unwrap();
    assert_eq!(
        active.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["s1"]
    );
    // The trace has one invocation span per answered invocation.
    let spans = trace::spans(&st, "t1", "s1").await.unwrap();
    assert_eq!(spans.len(), 3);
    let text = trace::render("s1", &trace::tree(&spans));
    assert!(text.contains("invoke_agent echo"), "{text}");
    // Kill: the sandbox goes, the session says why and takes no more calls.
    host.kill("t1", "s1", "killed by test").await.unwrap();
    let e = host
        .invoke("t1", "echo", None, "s1", b"{}", "application/json")
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("session \"s1\" is killed (killed by test)"),
        "{e}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{}", s.sandbox_pid.unwrap())).exists() || {
            // A zombie until reaped; its cmdline is empty then.
            std::fs::read(format!("/proc/{}/cmdline", s.sandbox_pid.unwrap()))
                .map(|c| c.is_empty())
                .unwrap_or(true)
        }
    );
    // Sandbox CPU and memory were metered when sandboxes were released.
    let tot = meter::session_totals(&st, "t1", "s1").await.unwrap();
    assert!(
        tot.quantities
            .contains_key(&meter::UsageKind::MemoryGbSeconds),
        "{tot:?}"
    );
    // The sandboxes' CPU: what two small Python agents used, not the
    // machine's (a cpuacct group the sandbox is not in reads the whole host).
    // It can be 0: /proc counts in 10 ms ticks, and a sandbox this test
    // killed has no processes left to read when it is released.
    let cpu = tot.quantities[&meter::UsageKind::CpuSeconds];
    let elapsed = t0.elapsed().as_secs_f64();
    assert!(
        (0.0..=2.0 * elapsed + 1.0).contains(&cpu),
        "{cpu} CPU seconds in {elapsed} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_that_stops_answering_ping_is_restarted() {
    let cfg = HostConfig {
        pool_min: 1,
        ping_interval: Duration::from_millis(100),
        ping_failures: 2,
        ..HostConfig::default()
    };
    let Some((_d, host)) = setup(cfg) else { return };
    let st = host.store().clone();
    runtimes::create(
        &st,
        "t1",
        "flaky",
        spec(&[("AGENT_MODE", "stop_ping")]),
        runtimes::Quotas::default(),
        1,
    )
    .await
    .unwrap();
    let r1 = host
        .invoke("t1", "flaky", None, "s2", b"{}", "application/json")
        .await
        .unwrap();
    let pid1 = body(&r1)["pid"].clone();
    let first = sessions::get(&st, "t1", "s2")
        .await
        .unwrap()
        .unwrap()
        .sandbox_pid;
    // The supervision loop notices the failing /ping and restarts the agent.
    let mut restarted = false;
    for _ in 0..100 {
        host.tick().await;
        let s = sessions::get(&st, "t1", "s2").await.unwrap().unwrap();
        if s.restarts >= 1 && s.state == State::Active && s.sandbox_pid != first {
            restarted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        restarted,
        "{:?}",
        sessions::get(&st, "t1", "s2").await.unwrap()
    );
    let r2 = host
        .invoke("t1", "flaky", None, "s2", b"{}", "application/json")
        .await
        .unwrap();
    assert_eq!(
        body(&r2)["count"],
        1,
        "a fresh agent after the restart (pid was {pid1})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_over_budget_is_stopped_and_says_why() {
    let Some((_d, host)) = setup(HostConfig {
        pool_min: 1,
        ..HostConfig::default()
    }) else {
        return;
    };
    let st = host.store().clone();
    let mut s = spec(&[]);
    // 10 tokens in + 5 out per call = 0.000105; two calls spend it.
    s.session_budget = Some(0.0001);
    runtimes::create(&st, "t1", "cheap", s, runtimes::Quotas::default(), 1)
        .await
        .unwrap();
    host.invoke("t1", "cheap", None, "s3", b"{}", "application/json")
        .await
        .unwrap();
    let s = sessions::get(&st, "t1", "s3").await.unwrap().unwrap();
    assert_eq!(s.state, State::Killed);
    assert!(
        s.reason
            .as_deref()
            .unwrap()
            .contains("spent 0.000105 of its budget 0.000100"),
        "{s:?}"
    );
    let e = host
        .invoke("t1", "cheap", None, "s3", b"{}", "application/json")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("budget"), "{e}");
}

/// Several hosts on one store (replicas on PostgreSQL): a host takes over
/// only the sessions whose owner stopped renewing its lease, and refuses to
/// run a session a live replica runs. The embedded store's single host takes
/// over at once. No sandboxes needed: the sessions are set up in the store.
#[tokio::test]
async fn replicas_take_over_only_sessions_whose_owner_stopped_renewing() {
    let d = tempfile::tempdir().unwrap();
    let st: AnyStore = SqliteStore::open(d.path()).unwrap().into();
    let shared = HostConfig {
        exclusive: false,
        pool_min: 0,
        ..HostConfig::default()
    };
    let a = Host::new(st.clone(), shared.clone(), None);
    let b = Host::new(st.clone(), shared, None);
    assert_ne!(a.owner(), b.owner());
    let rv = runtimes::create(&st, "t1", "echo", spec(&[]), runtimes::Quotas::default(), 1)
        .await
        .unwrap();
    let _ = rv;
    let rv = runtimes::resolve(&st, "t1", "echo", None).await.unwrap();
    let now = tessera_agent::error::now_ms();
    for (id, lease) in [("live", now + 60_000), ("gone", now - 1)] {
        sessions::get_or_create(&st, "t1", id, &rv, now)
            .await
            .unwrap();
        sessions::update(&st, "t1", id, |x| {
            x.state = State::Active;
            x.owner = Some(a.owner().to_string());
            x.lease_until_ms = lease;
            Ok(true)
        })
        .await
        .unwrap();
    }
    // B takes over the session whose lease ran out, not the live one.
    assert_eq!(b.recover().await.unwrap(), 1);
    let live = sessions::get(&st, "t1", "live").await.unwrap().unwrap();
    let gone = sessions::get(&st, "t1", "gone").await.unwrap().unwrap();
    assert_eq!(live.state, State::Active);
    assert_eq!(live.owner.as_deref(), Some(a.owner()));
    assert_eq!(gone.state, State::Idle, "{gone:?}");
    assert_eq!(gone.owner, None);
    // B does not run A's live session (it would start a second sandbox).
    let err = b
        .invoke("t1", "echo", None, "live", b"{}", "application/json")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("running on another server"),
        "{err}"
    );
    // The owner's own recovery leaves its sessions alone.
    assert_eq!(a.recover().await.unwrap(), 0);
    // The single host of an embedded store takes over at once.
    let c = Host::new(st.clone(), HostConfig::default(), None);
    assert_eq!(c.recover().await.unwrap(), 1);
    let live = sessions::get(&st, "t1", "live").await.unwrap().unwrap();
    assert_eq!(live.state, State::Idle);
}

/// Issue 18: an idle session is paused to disk. Its sandbox is released at the idle
/// timeout with its writable folders written to the node's disk, and its next
/// invocation gets them back in a new sandbox (a new agent process: memory is not
/// kept in this tier). Ending the session removes what was kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_session_gets_its_files_back_at_its_next_invocation() {
    use tessera_agent::tools::SandboxAccess;
    let keep = tempfile::tempdir().unwrap();
    let root = keep.path().join("session-snapshots");
    let Some((_d, host)) = setup(HostConfig {
        pool_min: 1,
        snapshots: Some(root.clone()),
        ..HostConfig::default()
    }) else {
        return;
    };
    let st = host.store().clone();
    let mut quick = spec(&[]);
    quick.idle_timeout_s = 1;
    runtimes::create(&st, "t1", "echo", quick, runtimes::Quotas::default(), 1)
        .await
        .unwrap();
    let r1 = host
        .invoke("t1", "echo", None, "s9", b"{}", "application/json")
        .await
        .unwrap();
    assert_eq!(body(&r1)["count"], 1);
    let sb = host.sandbox("t1", "s9").expect("a live sandbox");
    sb.write_file("/workspace/notes.md", b"step 1 done\n")
        .unwrap();
    sb.mkdir("/home/user/.cache").unwrap();
    sb.write_file("/home/user/.cache/x", b"cached").unwrap();
    drop(sb);
    // Past its idle timeout, the supervision loop releases it, files kept.
    let mut idle = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        host.tick().await;
        let s = sessions::get(&st, "t1", "s9").await.unwrap().unwrap();
        if s.state == State::Idle {
            idle = Some(s);
            break;
        }
    }
    let s = idle.expect("the session went idle");
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .contains("files kept on disk"),
        "{s:?}"
    );
    assert!(host.sandbox("t1", "s9").is_none());
    let kept = root.join("t1").join("s9");
    assert!(kept.join("meta.json").exists(), "{}", kept.display());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", kept.display());
    }
    // The next invocation: a new sandbox and agent, the files back.
    let r2 = host
        .invoke("t1", "echo", None, "s9", b"{}", "application/json")
        .await
        .unwrap();
    // A new agent process (its pid means nothing here: each sandbox has its own pid
    // namespace).
    assert_eq!(body(&r2)["count"], 1, "a new agent");
    let sb = host.sandbox("t1", "s9").expect("a live sandbox again");
    assert_eq!(
        sb.read_file("/workspace/notes.md").unwrap(),
        b"step 1 done\n"
    );
    assert_eq!(sb.read_file("/home/user/.cache/x").unwrap(), b"cached");
    drop(sb);
    assert!(!kept.exists(), "restored, so no longer kept");
    // Idle again, then killed: nothing stays on disk.
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        host.tick().await;
        if kept.exists() {
            break;
        }
    }
    assert!(kept.exists(), "kept at the second idle release");
    host.kill("t1", "s9", "done").await.unwrap();
    assert!(!kept.exists(), "a killed session left its files on disk");
}

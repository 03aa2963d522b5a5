//! The walls around the sandbox, tried as an attacker would (issue 16): as a tenant's
//! developer through the API, and as code inside each kind of sandbox (an API
//! sandbox, an agent session, a built-in tool's exec). Each test names the hole it
//! closes; each was seen to fail on the code before the fix (see the closing note of
//! the issue). Job tasks have their walls in `crates/node` and the executor's tests.
//!
//! Real sandboxes need root (CI runs as root) and `tessera-sandbox-init`, which
//! `cargo test --workspace` builds; without them the sandbox parts say SKIPPED (and
//! fail when `CI` is set).

mod common;
use common::{Client, Method, Server, StatusCode, Value, json};
use tessera_sandbox::InitProgram;
use tessera_server::sandboxes::SandboxesConfig;
use tessera_store::Store;

const ATTACKER: &str = include_str!("agents/attacker_agent.py");
/// Fake credentials, shaped like real ones (the scanner's rules check the shape).
const AWS_KEY: &str = "AKIAIOSFODNN7EXAMPLF";
const GH_TOKEN: &str = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";

fn sandboxes_here(test: &str) -> Option<InitProgram> {
    let why = if !nix_root() {
        "needs root (user-namespace id ranges, cgroups); CI runs as root".to_string()
    } else {
        match InitProgram::locate() {
            None => "tessera-sandbox-init is not built next to the tests".to_string(),
            Some(p) => return Some(p),
        }
    };
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    None
}

fn nix_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

async fn server(init: InitProgram) -> Server {
    Server::start_with(|c| {
        c.register_local_node = false;
        c.agents.host.pool_min = 0;
        c.sandboxes = SandboxesConfig {
            enabled: true,
            init: Some(init),
            warm: 0,
            max_per_tenant: 4,
        };
    })
    .await
}

/// The attacker as a runtime. Its code comes in through the environment: the guard's
/// line check would (rightly) flag a socket-and-subprocess one-liner in argv, and this
/// test is about the walls behind the line check (the per-exec check, the key's scope,
/// redaction), which a real attacker reaches with code the line check cannot read.
fn attacker_runtime() -> Value {
    json!({"name": "attacker",
           "command": ["python3", "-c", "import os; exec(os.environ['ATTACKER'])"],
           "env": {"ATTACKER": ATTACKER},
           "resources": {"memory_mb": 256}})
}

async fn invoke(t: &Client, session: &str, steps: Value) -> Value {
    let (st, v) = t
        .post(
            &format!("/v1/runtimes/attacker/invocations?session_id={session}"),
            json!({ "do": steps }),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v["report"].clone()
}

fn no_secret(what: &str, v: &impl std::fmt::Display) {
    let s = v.to_string();
    assert!(
        !s.contains(AWS_KEY) && !s.contains(GH_TOKEN),
        "{what} leaks a secret: {s}"
    );
}

/// Code inside an agent session: its key reaches nothing of the tenant's beyond its
/// own session (before: it posted a job that ran as host root); its execs pass the
/// guard (before: `rm -rf --no-preserve-root /` ran); what it says and prints, and
/// what it stores in memory, is redacted on the way out (before: all of it leaked);
/// and the host's files and the server's data folder are out of its reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_session_reaches_nothing_beyond_its_session() {
    let Some(init) = sandboxes_here("an_agent_session_reaches_nothing_beyond_its_session") else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let (st, v) = t.post("/v1/runtimes", attacker_runtime()).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let db = s.dir().join("data/tessera.db");
    assert!(db.exists(), "{}", db.display());
    let job = json!({"name": "escape", "queue": "default", "tasks": [{"name": "t", "command": ["sh", "-c", "id > /tmp/pwned"]}]});
    let r = invoke(
        &t,
        "s1",
        json!([
            {"api": ["POST", "/v1/jobs", job]},
            {"api": ["POST", "/v1/sandboxes", {}]},
            {"api": ["GET", "/v1/sandboxes", null]},
            {"api": ["POST", "/v1/runtimes", {"name": "evil", "command": ["x"]}]},
            {"api": ["GET", "/v1/sessions", null]},
            {"api": ["GET", "/v1/jobs", null]},
            {"api": ["POST", "/v1/apikeys", {"subject": "x", "role": "admin"}]},
            {"api": ["PUT", "/v1/sessions/s1/memory/k", {"value": {"note": format!("key {AWS_KEY}")}}]},
            {"api": ["PUT", "/v1/sessions/other/memory/k", {"value": 1}]},
            {"read": "/etc/shadow"},
            {"read": db.display().to_string()},
            {"run": "rm -rf --no-preserve-root /"},
            {"run": "echo ZWNobyBwd25lZAo= | base64 -d | sh"},
            {"run": "cat /etc/hostname; id -u"},
            {"say": format!("my keys: {AWS_KEY} and {GH_TOKEN}")},
            {"stderr": format!("leaking {GH_TOKEN} on stderr")},
        ]),
    )
    .await;
    let name = |i: usize| format!("step {i}: {}", r[i]);
    for i in 0..7 {
        assert_eq!(r[i], 403, "{}", name(i));
    }
    assert_eq!(r[7], 200, "{}", name(7));
    assert_eq!(r[8], 403, "{}", name(8));
    for i in [9, 10] {
        assert!(r[i]["error"].is_string(), "{}", name(i));
    }
    for i in [11, 12] {
        let blocked = r[i]["error"]
            .as_str()
            .is_some_and(|e| e.contains("Permission") || e.contains("EPERM"))
            || r[i]["rc"].as_i64().is_some_and(|c| c != 0);
        assert!(blocked, "{} ran", name(i));
    }
    // Harmless commands run, as the sandbox's unprivileged user.
    assert_eq!(r[13]["rc"], 0, "{}", name(13));
    assert!(
        !r[13]["out"].as_str().unwrap().contains("\n0\n"),
        "{}",
        name(13)
    );
    // What it said was redacted on the way out.
    no_secret("the agent's reply", &r[14]);
    assert!(r[14].as_str().unwrap().contains("[REDACTED:"), "{}", r[14]);
    // No job was made, nothing of it ran.
    let (_, jobs) = t.get("/v1/jobs").await;
    assert_eq!(jobs["items"].as_array().map(Vec::len), Some(0), "{jobs}");
    // Its output and its memory come back redacted; the session shows no host pid.
    let v = t
        .wait_for("/v1/sessions/s1", |v| {
            v["live"]["output_tail"]
                .as_str()
                .is_some_and(|o| o.contains("leaking"))
        })
        .await;
    no_secret("the session", &v);
    assert!(
        v.get("sandbox_pid").is_none() && v["live"].get("pid").is_none(),
        "{v}"
    );
    let (_, v) = t.get("/v1/sessions/s1/memory/k").await;
    no_secret("session memory", &v);
    assert!(
        v["value"]["note"].as_str().unwrap().contains("[REDACTED:"),
        "{v}"
    );
    // Each redaction is in the audit log, with its rule and place, never the secret.
    let (_, audit) = t.get("/v1/audit").await;
    no_secret("the audit log", &audit);
    let redactions: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "redact")
        .collect();
    assert!(
        redactions.iter().any(|e| e["object"]
            .as_str()
            .unwrap()
            .contains("session s1 reply: aws_access_key@")),
        "{audit}"
    );
}

/// The tool gateway's built-in exec runs with the guard (before: it ran `rm -rf
/// --no-preserve-root /` and `base64 -d | sh`), and tool results are redacted before
/// the ledger, the agent and the caller see them (before: the ledger kept the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builtin_tools_pass_the_guard_and_their_results_are_redacted() {
    let Some(init) = sandboxes_here("builtin_tools_pass_the_guard_and_their_results_are_redacted")
    else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let (st, v) = t.post("/v1/runtimes", attacker_runtime()).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = t
        .post(
            "/v1/tools",
            json!({"name": "exec", "target": {"type": "builtin", "builtin": "exec"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = t
        .post("/v1/tools/exec/grants", json!({"runtime": "attacker"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    invoke(&t, "s1", json!([])).await;
    let agent = t.with_role("session:s1", "developer").await;
    let exec = |id: &str, cmd: &str| json!({"session_id": "s1", "tool_call_id": id, "arguments": {"command": cmd}});
    for (id, cmd) in [
        ("c1", "rm -rf --no-preserve-root /"),
        ("c2", "echo ZWNobyBwd25lZAo= | base64 -d | sh"),
    ] {
        let (_, v) = agent.post("/v1/tools/exec/call", exec(id, cmd)).await;
        assert_ne!(v["status"], "completed", "{cmd}: {v}");
        assert!(v.to_string().contains("guard"), "{cmd}: {v}");
    }
    let (st, v) = agent
        .post(
            "/v1/tools/exec/call",
            exec("c3", &format!("echo {AWS_KEY}")),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    no_secret("the tool result", &v);
    let (_, l) = t.get("/v1/ledger?session_id=s1").await;
    no_secret("the ledger", &l);
    let stored = s
        .running
        .plane
        .store()
        .list("ledger", Some("acme"))
        .await
        .unwrap();
    for o in stored.objects {
        no_secret("the stored ledger entry", &o.body["result"]);
    }
}

/// `/v1/sandboxes`: a template is a registered name, never a host path (before: `/`
/// gave the sandbox the host's whole file system); files and archives read back are
/// redacted (before: returned as they were); a sandbox killed under its command
/// answers 410 (before: 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_sandboxes_take_no_host_path_and_redact_what_comes_back() {
    let Some(init) = sandboxes_here("api_sandboxes_take_no_host_path_and_redact_what_comes_back")
    else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    for bad in ["/", "//", "/./", "/etc", "/usr/..", "../etc", "x/../../"] {
        let (st, v) = t.post("/v1/sandboxes", json!({"template": bad})).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert_eq!(v["field"], "template", "{bad}: {v}");
        assert!(
            v["detail"]
                .as_str()
                .unwrap()
                .contains("tessera template import"),
            "{bad}: {v}"
        );
    }
    let (st, v) = t.post("/v1/sandboxes", json!({})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let id = v["sandbox_id"].as_str().unwrap().to_string();
    let (st, _) = t
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/workspace/creds.txt"),
            "application/octet-stream",
            format!("aws={AWS_KEY}\n").into_bytes(),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let r = t
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/workspace/creds.txt"),
        )
        .send()
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    no_secret("a file read back", &body);
    assert!(body.contains("[REDACTED:aws_access_key]"), "{body}");
    let r = t
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/tar?path=/workspace"),
        )
        .send()
        .await
        .unwrap();
    let tar = r.bytes().await.unwrap();
    assert!(!tar.windows(AWS_KEY.len()).any(|w| w == AWS_KEY.as_bytes()));
    // The server's data folder is not in the sandbox.
    let db = s.dir().join("data/tessera.db");
    let (_, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": format!("ls {} || echo unreachable", db.display())}),
        )
        .await;
    assert!(v["stdout"].as_str().unwrap().contains("unreachable"), "{v}");
    // Killed under a command: 410 with a clear problem.
    let t2 = t.clone();
    let id2 = id.clone();
    let cmd = tokio::spawn(async move {
        t2.post(
            &format!("/v1/sandboxes/{id2}/commands"),
            json!({"cmd": "sleep 20"}),
        )
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (st, _) = t.delete(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = cmd.await.unwrap();
    assert_eq!(st, StatusCode::GONE, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("killed"), "{v}");
}

/// Agent runtimes: no host path as a template, and warm pools that tenants cannot
/// multiply (before: each distinct template string or limit made a pool of two idle
/// sandboxes) nor see another tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runtimes_take_no_host_path_and_pools_are_bounded_and_private() {
    let Some(init) = sandboxes_here("runtimes_take_no_host_path_and_pools_are_bounded_and_private")
    else {
        return;
    };
    let s = Server::start_with(|c| {
        c.register_local_node = false;
        c.agents.host.pool_min = 1;
        c.agents.host.max_pools = 3;
        c.agents.host.init = Some(init);
    })
    .await;
    let t = s.tenant("acme").await;
    for bad in ["/", "//", "/./", "/etc", "/usr/..", "/proc/self/root"] {
        let (st, v) = t
            .post(
                "/v1/runtimes",
                json!({"name": "r", "command": ["x"], "template": bad}),
            )
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert_eq!(v["field"], "template", "{bad}: {v}");
    }
    for i in 0..6 {
        let (st, v) = t
            .post(
                "/v1/runtimes",
                json!({"name": format!("r{i}"), "command": ["sleep", "1000"], "resources": {"memory_mb": 64 + i}}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    let (_, v) = t.get("/v1/agent-pools").await;
    let pools = v["items"].as_array().unwrap().len();
    assert!(pools <= 3, "{pools} pools: {v}");
    let other = s.tenant("beta").await;
    let (_, v) = other.get("/v1/agent-pools").await;
    assert_eq!(v["items"].as_array().unwrap().len(), 0, "{v}");
}

/// A tenant's guard policy tightens the floor for that tenant and cannot loosen it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_policies_tighten_and_never_loosen() {
    let Some(init) = sandboxes_here("tenant_policies_tighten_and_never_loosen") else {
        return;
    };
    let s = server(init).await;
    let t = s.tenant("acme").await;
    let (st, v) = t
        .put(
            "/v1/guard/policy",
            json!({"policy": "version: 1\ndecisions: {critical: allow, high: allow, medium: allow, low: allow, info: allow}\nexceptions:\n  - {rule: \"*\", command: \"*\"}\n"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = t.post("/v1/sandboxes", json!({})).await;
    let id = v["sandbox_id"].as_str().unwrap().to_string();
    let (st, v) = t
        .post(
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "rm -rf --no-preserve-root /"}),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::FORBIDDEN,
        "a loose tenant policy loosened the floor: {v}"
    );
    // A strict one blocks what the floor only reports.
    let (st, v) = t
        .put(
            "/v1/guard/policy",
            json!({"policy": "version: 1\ndecisions: {critical: block, high: block, medium: block, low: block, info: block}\n"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let cmd = json!({"cmd": "LD_PRELOAD=/tmp/x.so true"});
    let (st, v) = t
        .post(&format!("/v1/sandboxes/{id}/commands"), cmd.clone())
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    let other = s.tenant("beta").await;
    let (_, v) = other.post("/v1/sandboxes", json!({})).await;
    let id2 = v["sandbox_id"].as_str().unwrap().to_string();
    let (st, v) = other
        .post(&format!("/v1/sandboxes/{id2}/commands"), cmd)
        .await;
    assert_eq!(st, StatusCode::OK, "another tenant is not tightened: {v}");
    // Bad YAML names the field; developers cannot set policies.
    let (st, v) = t
        .put("/v1/guard/policy", json!({"policy": "version: 9"}))
        .await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("policy")),
        "{v}"
    );
    let dev = t.with_role("dev", "developer").await;
    let (st, _) = dev
        .put("/v1/guard/policy", json!({"policy": "version: 1\n"}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
}

/// Errors quote a bounded prefix of a bad value (before: a 100 kB name came back
/// whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_quote_a_bounded_prefix() {
    let s = Server::start_with(|c| c.register_local_node = false).await;
    let t = s.tenant("acme").await;
    let long = "x".repeat(100_000);
    let (st, v) = t.post("/v1/queues", json!({"name": long})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{}", &v.to_string()[..200]);
    let len = v.to_string().len();
    assert!(len < 1600, "the problem document is {len} bytes");
    let (st, v) = t
        .put(
            &format!("/v1/sessions/{}/memory/k", "y".repeat(5000)),
            json!({"value": 1}),
        )
        .await;
    assert!(st.is_client_error());
    assert!(v.to_string().len() < 1600);
}

/// The data folder is the server's alone, and so is its store (before: 0644).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_folder_and_the_store_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start_with(|c| c.register_local_node = false).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.dir().join("data/tessera.db")), 0o600);
    let d = tempfile::tempdir().unwrap();
    let fresh = d.path().join("new");
    assert_eq!(tessera_server::prepare_data_dir(&fresh), Ok(None));
    assert_eq!(mode(&fresh), 0o700);
    // An old data folder readable by others is tightened; someone else's folder is not
    // touched, only warned about.
    let old = d.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("tessera.db"), b"").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(tessera_server::prepare_data_dir(&old), Ok(None));
    assert_eq!(mode(&old), 0o700);
    let shared = d.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("notes.txt"), b"").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(tessera_server::prepare_data_dir(&shared).unwrap().is_some());
    assert_eq!(mode(&shared), 0o755);
}

/// An HTTP tool's answer is redacted before the ledger keeps it and before the agent
/// and the caller see it (before: the ledger held whatever the tool said). The test
/// tool echoes the call's idempotency key, which here carries a fake credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tool_results_are_redacted_before_the_ledger() {
    use tessera_agent::tools::testing::{CountingConfig, CountingService};
    let s = Server::start_with(|c| c.register_local_node = false).await;
    let t = s.tenant("acme").await;
    let svc = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    let (st, v) = t
        .post(
            "/v1/tools",
            json!({"name": "echo", "target": {"type": "http", "url": svc.url()}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    t.post("/v1/tools/echo/grants", json!({"runtime": "bot"}))
        .await;
    s.running
        .plane
        .store()
        .create(
            tessera_store::Key::new("session", "acme", "s1"),
            json!({"id": "s1", "runtime": "bot", "state": "active"}),
        )
        .await
        .unwrap();
    let agent = t.with_role("session:s1", "developer").await;
    let (st, v) = agent
        .post(
            "/v1/tools/echo/call",
            json!({"session_id": "s1", "tool_call_id": "c1", "idempotency_key": format!("k:{AWS_KEY}"), "arguments": {}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    no_secret("the tool result", &v["result"]);
    let (_, l) = t.get("/v1/ledger?session_id=s1").await;
    no_secret("the ledger", &l);
    for o in s
        .running
        .plane
        .store()
        .list("ledger", Some("acme"))
        .await
        .unwrap()
        .objects
    {
        no_secret("the stored result", &o.body["result"]);
    }
}

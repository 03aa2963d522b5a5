//! Runs the quick start of `README.md` (the same as `docs/api.md`) as a new user would: `tessera up` on a
//! fresh data folder, then the client commands against it, with the job file taken
//! from the document itself.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{BIN, Up, up};

fn tessera(up: &Up, key: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("TESSERA_URL", &up.url)
        .env("TESSERA_API_KEY", key)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The YAML block after "where `job.yaml` is:" in README.md, which must be the
/// same as the one in docs/api.md.
fn job_yaml_from_docs() -> String {
    let readme = job_yaml_in("README.md");
    assert_eq!(
        readme,
        job_yaml_in("docs/api.md"),
        "README.md and docs/api.md show different job files"
    );
    readme
}

fn job_yaml_in(file: &str) -> String {
    let doc =
        std::fs::read_to_string(format!("{}/../../{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let after = doc
        .split("where `job.yaml` is:")
        .nth(1)
        .expect("docs/api.md has the job file");
    let block = after.split("```yaml\n").nth(1).unwrap();
    block.split("```").next().unwrap().to_string()
}

#[test]
fn quick_start_from_the_docs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = up(&data);
    let key = server
        .key
        .clone()
        .expect("first start prints the admin key");
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, job_yaml_from_docs()).unwrap();
    let job = job.to_str().unwrap();

    let (c, out, err) = tessera(&server, &key, &["queue", "create", "default"]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("default"), "{out}");
    let (c, _, err) = tessera(&server, &key, &["job", "submit", "-f", job]);
    assert_eq!(c, 0, "{err}");
    let mut list = String::new();
    for _ in 0..400 {
        let (c, out, err) = tessera(&server, &key, &["job", "list"]);
        assert_eq!(c, 0, "{err}");
        list = out;
        if list.contains("running") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines: Vec<Vec<&str>> = list
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "QUEUE", "PHASE", "BOUND", "REASON"],
        "{list}"
    );
    assert_eq!(
        lines[1],
        ["hello", "default", "running", "2/2", "-"],
        "{list}"
    );
    // The tasks run, print, and end.
    let mut phase = String::new();
    for _ in 0..400 {
        let (_, out, _) = tessera(&server, &key, &["job", "get", "hello", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        phase = v["status"]["phase"].as_str().unwrap_or("").to_string();
        if phase == "succeeded" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(phase, "succeeded");
    let (c, out, err) = tessera(&server, &key, &["job", "logs", "hello"]);
    assert_eq!(c, 0, "{err}");
    assert!(
        out.contains("hello from worker-0") && out.contains("hello from worker-1"),
        "{out}"
    );
    // Following a finished job prints every line under its task's name and ends.
    let (c, out, err) = tessera(&server, &key, &["job", "logs", "hello", "--follow"]);
    assert_eq!(c, 0, "{err}");
    assert!(
        out.contains("[worker-0] hello from worker-0")
            && out.contains("[worker-1] hello from worker-1"),
        "{out}"
    );
    // `job get` shows the job and one row per task.
    let (c, out, err) = tessera(&server, &key, &["job", "get", "hello"]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("phase:") && out.contains("succeeded"), "{out}");
    assert!(out.contains("TASK") && out.contains("worker-1"), "{out}");
    let (c, out, _) = tessera(&server, &key, &["node", "list", "-o", "json"]);
    assert_eq!(c, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    let node = v["items"][0]["name"].as_str().unwrap().to_string();
    let (c, out, err) = tessera(&server, &key, &["node", "get", &node]);
    assert_eq!(c, 0, "{err}");
    assert!(
        out.contains("allocatable:") && out.contains("cpu "),
        "{out}"
    );
    let (c, out, err) = tessera(&server, &key, &["queue", "get", "default"]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("name:") && out.contains("default"), "{out}");
    // Following a running job waits for its lines and ends when the job does.
    let tick = dir.path().join("tick.yaml");
    std::fs::write(
        &tick,
        "name: tick\nqueue: default\ntasks:\n  - name: t\n    resources: {cpu: 0.1, memory: 64Mi}\n    command: [sh, -c, \"for i in 1 2 3; do echo tick $i; sleep 0.4; done\"]\n",
    )
    .unwrap();
    let (c, _, err) = tessera(
        &server,
        &key,
        &["job", "submit", "-f", tick.to_str().unwrap()],
    );
    assert_eq!(c, 0, "{err}");
    let o = Command::new("timeout")
        .args(["60", BIN, "job", "logs", "tick", "-f"])
        .env("TESSERA_URL", &server.url)
        .env("TESSERA_API_KEY", &key)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        out, "tick 1\ntick 2\ntick 3\n",
        "one task: no prefix, every line once"
    );
    // A queue with no jobs can be deleted; then it is gone.
    let (c, _, err) = tessera(&server, &key, &["queue", "create", "spare"]);
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = tessera(&server, &key, &["queue", "delete", "spare"]);
    assert_eq!(c, 0, "{err}");
    let (c, _, _) = tessera(&server, &key, &["queue", "get", "spare"]);
    assert_eq!(c, 2, "a missing queue is a 404: exit 2");

    // Bad input: the file and field are named, exit 2.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: x\nqueue: default\ntasks: [{name: t, resources: {cpus: 1}}]\n",
    )
    .unwrap();
    let (c, _, err) = tessera(
        &server,
        &key,
        &["job", "submit", "-f", bad.to_str().unwrap()],
    );
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("bad.yaml") && err.contains("tasks[0].resources.cpus"),
        "{err}"
    );
    // A wrong key: 401, exit 1, and a message that says so.
    let wrong = format!("tsk_{}_{}", "0".repeat(12), "0".repeat(64));
    let (c, _, err) = tessera(&server, &wrong, &["job", "list"]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("401"), "{err}");

    // A restart keeps everything and prints no key.
    drop(server);
    let again = up(&data);
    assert_eq!(again.key, None);
    let (c, out, _) = tessera(&again, &key, &["job", "get", "hello", "-o", "json"]);
    assert_eq!(c, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"]["phase"], "succeeded");
}

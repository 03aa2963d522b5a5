//! Job tasks through the whole server on the real node runtime: the walls around a
//! tenant's job (no host root, no host file, no server data, no other tenant's logs,
//! no server environment), the job lifecycle (restart policy and back-off, gang
//! failure, deadline, TTL, delete and name reuse), evictions carried out (SIGTERM →
//! grace → SIGKILL, the preemptor starting only once the victim's tree is gone),
//! GPU fencing, metering and the device-view check with fake GPUs, and a MIG step a crash
//! left half done finished at the next start.
//!
//! Each test checks `common::can_run_tasks` (root and the init program).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Client, Server, StatusCode, Value, json};
use tessera_node::gpu::{GpuSource, RawGpu, RawMig};

async fn queue(c: &Client) {
    let (st, v) = c.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

fn one(name: &str, cmd: &str) -> Value {
    json!({"name": name, "queue": "q", "tasks": [
        {"name": "t", "resources": {"cpu_milli": 100, "memory": 67108864},
         "command": ["sh", "-c", cmd]}]})
}

async fn submit(c: &Client, job: Value) {
    let (st, v) = c.post("/v1/jobs", job).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

async fn logs(c: &Client, job: &str) -> String {
    let r = c
        .request(common::Method::GET, &format!("/v1/jobs/{job}/logs"))
        .send()
        .await
        .unwrap();
    r.text().await.unwrap()
}

async fn ended(c: &Client, job: &str) -> Value {
    c.wait_for(&format!("/v1/jobs/{job}"), |v| {
        matches!(
            v["status"]["phase"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        ) && v["status"]["tasks"]
            .as_object()
            .is_none_or(|m| m.values().all(|t| t["state"] != "terminating"))
    })
    .await
}

fn lifecycle_fast(cfg: &mut tessera_server::ServerConfig) {
    cfg.node.lifecycle = tessera_server::jobs::Lifecycle {
        backoff_base: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(400),
    };
}

/// A tenant developer's job cannot reach the host: not /etc/shadow, not the
/// server's data folder or its store, not another tenant's job log, not a host file
/// to write; it runs as an unprivileged user, and its environment holds nothing of
/// the server's. (On the old executor, a plain child of the server as root, every
/// one of these read or wrote the host.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_walls_hold() {
    if !common::can_run_tasks("a_jobs_walls_hold") {
        return;
    }
    let s = Server::start().await;
    let data = s.dir().join("data");
    let db = data.join("tessera.db");
    assert!(db.exists());
    let logs_dir = s.dir().join("logs");
    let alpha = s.tenant("alpha").await;
    let beta = s.tenant("beta").await;
    let dev = alpha.with_role("dev", "developer").await;
    queue(&alpha).await;
    queue(&beta).await;
    // Beta's job leaves a secret-looking line in its log.
    submit(&beta, one("secret", "echo beta-private-marker")).await;
    ended(&beta, "secret").await;
    let beta_log = walk(&logs_dir)
        .into_iter()
        .find(|p| p.to_string_lossy().contains("/beta/"))
        .expect("beta's log on the host");
    // A host file to create and a root-owned one to append to, both the test's own
    // (a broken wall must not damage the machine the test runs on).
    let host_file = std::path::Path::new("/usr/local/tessera-wall-probe");
    let _ = std::fs::remove_file(host_file);
    let target = std::path::PathBuf::from(format!(
        "/usr/local/tessera-wall-target-{}",
        std::process::id()
    ));
    std::fs::write(&target, "root's\n").unwrap();
    // Said plainly, the guard refuses the command before anything runs.
    submit(&dev, one("plain", "cat /etc/shadow")).await;
    let v = ended(&alpha, "plain").await;
    let m = v["status"]["tasks"]["t"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(m.contains("runtime guard") && m.contains("shadow"), "{v}");
    // Paths computed at run time and read by the shell's own redirections (no
    // `execve` for the guard to see): what stops them is the sandbox itself.
    let probe = format!(
        "id -u; at() {{ printf '%s' \"$1\"; }}; \
         s=$(at /etc/sh)adow; while read -r l; do echo \"leak:$l\"; done < \"$s\"; \
         for f in {data}/*; do [ -e \"$f\" ] && echo \"leak:$f\"; done; \
         read -r l < {db} && echo \"leak:$l\"; \
         while read -r l; do echo \"leak:$l\"; done < {beta_log}; \
         w=$(at {host}); echo pwned > \"$w\"; \
         t=$(at {target}); echo pwned >> \"$t\"; env; echo done",
        data = data.display(),
        db = db.display(),
        beta_log = beta_log.display(),
        host = host_file.display(),
        target = target.display(),
    );
    submit(&dev, one("probe", &probe)).await;
    let v = ended(&alpha, "probe").await;
    let text = logs(&alpha, "probe").await;
    let appended = std::fs::read_to_string(&target).unwrap();
    let _ = std::fs::remove_file(&target);
    let created = host_file.exists();
    let _ = std::fs::remove_file(host_file);
    assert!(text.contains("done"), "{v} {text}");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("1000"),
        "runs as the unprivileged user: {text}"
    );
    assert!(
        !text.contains("leak:"),
        "a host file reached the job: {text}"
    );
    assert!(
        !text.contains("beta-private-marker"),
        "another tenant's log leaked: {text}"
    );
    assert!(!created, "the job created a host file");
    assert_eq!(appended, "root's\n", "the job wrote a root-owned host file");
    // Its environment: Tessera's and the sandbox's variables only (the test process
    // has cargo's, none of which may reach the job).
    for (k, _) in std::env::vars() {
        if !["PATH", "HOME", "USER", "LANG", "TERM", "PWD"].contains(&k.as_str())
            && !k.starts_with("TESSERA_")
        {
            assert!(
                !text.contains(&format!("\n{k}=")),
                "{k} reached the job: {text}"
            );
        }
    }
    assert!(text.contains("TESSERA_TENANT=alpha"), "{text}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// `OnFailure` restarts a failing task in place after a back-off, up to
/// `backoff_limit`; past it the job fails with `BackoffLimitExceeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policy_and_backoff() {
    if !common::can_run_tasks("restart_policy_and_backoff") {
        return;
    }
    let s = Server::start_with(lifecycle_fast).await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    let mut j = one(
        "flaky",
        "echo attempt $TESSERA_ATTEMPT; [ $TESSERA_ATTEMPT -ge 3 ]",
    );
    j["restart_policy"] = json!("OnFailure");
    j["backoff_limit"] = json!(3);
    submit(&a, j).await;
    let v = ended(&a, "flaky").await;
    assert_eq!(v["status"]["phase"], "succeeded", "{v}");
    let t = &v["status"]["tasks"]["t"];
    assert_eq!(
        (t["restarts"].as_u64(), t["attempt"].as_u64()),
        (Some(2), Some(3)),
        "{v}"
    );
    let text = logs(&a, "flaky").await;
    assert!(
        text.contains("attempt 1") && text.contains("attempt 3") && !text.contains("attempt 0"),
        "{text}"
    );

    let mut j = one("doomed", "exit 4");
    j["restart_policy"] = json!("OnFailure");
    j["backoff_limit"] = json!(1);
    submit(&a, j).await;
    let v = ended(&a, "doomed").await;
    assert_eq!(v["status"]["phase"], "failed");
    assert_eq!(v["status"]["reason"], "BackoffLimitExceeded", "{v}");
    assert_eq!(v["status"]["tasks"]["t"]["restarts"], 1);
    // Never (the default): the first failure fails the job.
    submit(&a, one("once", "exit 5")).await;
    let v = ended(&a, "once").await;
    assert_eq!(v["status"]["phase"], "failed");
    assert_eq!(v["status"]["tasks"]["t"]["exit_code"], 5);
    assert!(v["status"]["tasks"]["t"].get("restarts").is_none(), "{v}");
}

/// A failed task fails its gang: the sibling's tree is stopped, and it ends
/// `failed`, not `running`; no process of it is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_stops_its_gang() {
    if !common::can_run_tasks("a_failed_task_stops_its_gang") {
        return;
    }
    let s = Server::start().await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    submit(
        &a,
        json!({"name": "gang", "queue": "q", "termination_grace_period_seconds": 1, "tasks": [
            {"name": "bad", "resources": {"cpu_milli": 100, "memory": 67108864},
             "command": ["sh", "-c", "sleep 0.3; exit 3"]},
            {"name": "long", "resources": {"cpu_milli": 100, "memory": 67108864},
             "command": ["sh", "-c", "sleep 4242 & wait"]}]}),
    )
    .await;
    let v = ended(&a, "gang").await;
    assert_eq!(v["status"]["phase"], "failed", "{v}");
    assert_eq!(v["status"]["tasks"]["bad"]["exit_code"], 3);
    assert_eq!(v["status"]["tasks"]["long"]["state"], "failed", "{v}");
    assert_eq!(
        v["status"]["tasks"]["long"]["reason"],
        "BackoffLimitExceeded"
    );
    assert!(no_process_with("4242"), "the sibling's sleep survived");
}

/// Whether no live process has `arg` in its command line.
fn no_process_with(arg: &str) -> bool {
    for _ in 0..200 {
        let any = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let s = String::from_utf8_lossy(&c).replace('\0', " ");
                s.starts_with("sleep ") && s.contains(arg)
            })
        });
        if !any {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `active_deadline_seconds`: the job fails with `DeadlineExceeded` and its trees
/// are stopped; `ttl_seconds_after_finished` then deletes it and its logs, and the
/// name can be used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_then_ttl_then_the_name_again() {
    if !common::can_run_tasks("deadline_then_ttl_then_the_name_again") {
        return;
    }
    let s = Server::start().await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    let mut j = one("slow", "echo started; sleep 5151 & wait");
    j["active_deadline_seconds"] = json!(1);
    j["ttl_seconds_after_finished"] = json!(1);
    j["termination_grace_period_seconds"] = json!(0);
    submit(&a, j).await;
    let v = ended(&a, "slow").await;
    assert_eq!(v["status"]["reason"], "DeadlineExceeded", "{v}");
    assert!(
        no_process_with("5151"),
        "the deadline left the tree running"
    );
    assert!(logs(&a, "slow").await.contains("started"));
    let job_logs = s.dir().join("logs/alpha/slow");
    assert!(job_logs.exists());
    // Gone after its TTL.
    let mut gone = false;
    for _ in 0..200 {
        if a.get("/v1/jobs/slow").await.0 == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(gone, "the TTL did not delete the job");
    for _ in 0..100 {
        if !job_logs.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!job_logs.exists(), "its logs stayed");
    submit(&a, one("slow", "echo again")).await;
    let v = ended(&a, "slow").await;
    assert_eq!(v["status"]["phase"], "succeeded", "{v}");
    assert_eq!(logs(&a, "slow").await, "again\n");
}

/// `DELETE /v1/jobs/{name}`: with a running tree, 202 and the job goes once the
/// tree is gone; without one, 200 at once. The name is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_frees_the_name() {
    if !common::can_run_tasks("delete_frees_the_name") {
        return;
    }
    let s = Server::start().await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    submit(&a, one("d", "trap 'exit 0' TERM; sleep 6262 & wait")).await;
    a.wait_for("/v1/jobs/d", |v| {
        v["status"]["tasks"]["t"]["state"] == "running"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (st, v) = a.delete("/v1/jobs/d").await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["status"]["deleting"], true);
    let mut gone = false;
    for _ in 0..200 {
        if a.get("/v1/jobs/d").await.0 == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(gone);
    assert!(no_process_with("6262"));
    submit(&a, one("d", "true")).await;
    ended(&a, "d").await;
    let (st, _) = a.delete("/v1/jobs/d").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(a.get("/v1/jobs/d").await.0, StatusCode::NOT_FOUND);
    assert_eq!(a.delete("/v1/jobs/d").await.0, StatusCode::NOT_FOUND);
}

/// The scheduler preempts a low-priority job for a high-priority one on this
/// machine: the victim gets SIGTERM, keeps its resources during its grace period,
/// is recorded `evicted` (with the preemptor and the reason) and waits to be placed
/// again; the preemptor starts only after the victim's tree is gone. A victim that
/// ignores SIGTERM is killed when the grace runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_are_carried_out() {
    if !common::can_run_tasks("evictions_are_carried_out") {
        return;
    }
    for polite in [true, false] {
        let s = Server::start_with(|c| {
            c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        })
        .await;
        let a = s.tenant("alpha").await;
        queue(&a).await;
        let (_, nodes) = a.get("/v1/nodes").await;
        let cpu = nodes["items"][0]["allocatable"]["cpu_milli"]
            .as_u64()
            .unwrap();
        let big = cpu * 3 / 4;
        let victim_cmd = if polite {
            "trap 'echo got-term; sleep 0.3; exit 0' TERM; echo up; sleep 737300$TESSERA_ATTEMPT & wait; wait"
        } else {
            "trap '' TERM; echo up; while :; do sleep 0.05; done"
        };
        submit(
            &a,
            json!({"name": "low", "queue": "q", "priority": 1, "termination_grace_period_seconds": 1,
                   "tasks": [{"name": "t", "resources": {"cpu_milli": big, "memory": 67108864},
                              "command": ["sh", "-c", victim_cmd]}]}),
        )
        .await;
        a.wait_for("/v1/jobs/low", |v| {
            v["status"]["tasks"]["t"]["state"] == "running"
        })
        .await;
        for _ in 0..100 {
            if logs(&a, "low").await.contains("up") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        submit(
            &a,
            json!({"name": "urgent", "queue": "q", "priority": 100,
                   "tasks": [{"name": "t", "resources": {"cpu_milli": big, "memory": 67108864},
                              "command": ["sh", "-c", "echo preemptor-ran"]}]}),
        )
        .await;
        let v = a
            .wait_for("/v1/jobs/low", |v| {
                v["status"]["tasks"]["t"]["evictions"] == 1
            })
            .await;
        let t = &v["status"]["tasks"]["t"];
        assert_eq!(t["reason"], "Evicted", "{v}");
        assert_eq!(t["preemptor"], "urgent", "{v}");
        assert!(
            t["message"]
                .as_str()
                .unwrap()
                .contains("preempted by urgent"),
            "{v}"
        );
        let victim_end = t["finished_at"].as_u64().unwrap();
        let u = ended(&a, "urgent").await;
        assert_eq!(u["status"]["phase"], "succeeded", "{u}");
        let preemptor_start = u["status"]["tasks"]["t"]["started_at"].as_u64().unwrap();
        assert!(
            preemptor_start >= victim_end,
            "the preemptor started at {preemptor_start}, before the victim's tree was gone at {victim_end}"
        );
        let text = logs(&a, "low").await;
        if polite {
            assert!(text.contains("got-term"), "{text}");
            assert!(
                !t["message"].as_str().unwrap().contains("killed after"),
                "{v}"
            );
            // Attempt 1's background sleep is gone. (The name carries the
            // attempt, TESSERA_ATTEMPT = the status's `attempt`: attempt 2,
            // placed as soon as the preemptor ends, starts a sleep of its own.)
            assert!(no_process_with("7373001"));
        } else {
            assert!(
                t["message"]
                    .as_str()
                    .unwrap()
                    .contains("killed after the grace period"),
                "{v}"
            );
        }
        // The victim is placed again once there is room, and runs.
        a.wait_for("/v1/jobs/low", |v| {
            v["status"]["tasks"]["t"]["state"] == "running"
                && v["status"]["tasks"]["t"]["attempt"] == 2
        })
        .await;
        a.post_empty("/v1/jobs/low/cancel").await;
        ended(&a, "low").await;
    }
}

/// A driver view a test can change: fake GPUs.
#[derive(Debug, Default)]
struct Gpus(Mutex<Vec<RawGpu>>);
impl GpuSource for Gpus {
    fn name(&self) -> &str {
        "fake"
    }
    fn gpus(&self) -> Result<Vec<RawGpu>, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

fn fake_gpus(dir: &std::path::Path, n: u32, mig: bool) -> Vec<RawGpu> {
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    std::fs::write(dir.join("dev/nvidiactl"), b"").unwrap();
    (0..n)
        .map(|i| {
            std::fs::write(dir.join(format!("dev/nvidia{i}")), b"").unwrap();
            RawGpu {
                index: i,
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory: 80 << 30,
                bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
                uuid: format!("GPU-fake-{i}"),
                minor: Some(i),
                mig_enabled: mig,
                ..RawGpu::default()
            }
        })
        .collect()
}

/// With fake GPUs: a task given one GPU sees only its device node and its UUID;
/// when the driver loses that GPU, the next start is refused naming both views,
/// and the node is tainted and reports the condition until the views agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_tasks_are_fenced_and_checked() {
    if !common::can_run_tasks("gpu_tasks_are_fenced_and_checked") {
        return;
    }
    let fakes = tempfile::tempdir().unwrap();
    let raw = fake_gpus(fakes.path(), 2, false);
    let src = Arc::new(Gpus(Mutex::new(raw.clone())));
    let s = Server::start_with(|c| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.node.gpus = Some(src.clone() as Arc<dyn GpuSource>);
        c.node.devices = tessera_node::DeviceDirs {
            dev: fakes.path().join("dev"),
            caps: fakes.path().join("caps"),
        };
        c.node.heartbeat = Duration::from_millis(200);
    })
    .await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    let gpu_job = |name: &str| {
        json!({"name": name, "queue": "q", "tasks": [
            {"name": "t", "resources": {"cpu_milli": 100, "memory": 67108864},
             "gpu": {"whole": {"count": 1}},
             "command": ["sh", "-c", "ls /dev | grep nvidia; echo cuda=$CUDA_VISIBLE_DEVICES; \
                 i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 1"]}]})
    };
    submit(&a, gpu_job("g1")).await;
    let v = ended(&a, "g1").await;
    assert_eq!(v["status"]["phase"], "succeeded", "{v}");

    // The node metered the run itself (no client posted anything): GPU-seconds are
    // the one allocated GPU × the run's wall time, CPU-seconds and memory come from
    // the task's cgroup, read before the sandbox went.
    let t = &v["status"]["tasks"]["t"];
    let wall =
        (t["finished_at"].as_u64().unwrap() - t["started_at"].as_u64().unwrap()) as f64 / 1e3;
    let u = a
        .wait_for("/v1/usage?session=job.g1&records=true", |u| {
            u["records"].as_array().is_some_and(|r| r.len() == 3)
        })
        .await;
    let q = |kind: &str| {
        u["session_totals"]["quantities"][kind]
            .as_f64()
            .unwrap_or_else(|| panic!("no {kind}: {u}"))
    };
    assert!(
        (q("gpu_seconds") - wall).abs() < 0.5 && wall >= 1.0,
        "1 GPU for {wall} s: {u}"
    );
    let cpu = q("cpu_seconds");
    assert!(
        cpu > 0.05 && cpu < wall + 0.5,
        "the loop's CPU time, at most its wall: {u}"
    );
    assert!(q("memory_gb_seconds") > 0.0, "{u}");
    assert!(
        u["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["runtime"] == "jobs"
                && r["source_id"].as_str().unwrap().starts_with("job/g1/")),
        "{u}"
    );
    let gpu = v["status"]["tasks"]["t"]["gpus"][0].as_u64().unwrap();
    let text = logs(&a, "g1").await;
    let nodes: Vec<&str> = text.lines().filter(|l| l.starts_with("nvidia")).collect();
    assert_eq!(
        nodes,
        [format!("nvidia{gpu}").as_str(), "nvidiactl"],
        "{text}"
    );
    assert!(text.contains(&format!("cuda=GPU-fake-{gpu}\n")), "{text}");
    assert_eq!(
        v["status"]["tasks"]["t"]["devices"][0],
        format!("GPU-fake-{gpu}")
    );

    // The driver loses both GPUs: the scheduler's record still has them. Two
    // outcomes are right, and which one comes is a race between the heartbeat (every
    // 200 ms here) and the scheduler: the heartbeat sees the mismatch first and taints
    // the node, so g2 waits with the taint as its reason; or g2 is placed first and
    // the node runtime refuses its start, naming both views (that refusal alone is
    // tested deterministically in `node/tests/runtime.rs`
    // `a_device_view_mismatch_refuses_the_start`). Either way no GPU work starts.
    *src.0.lock().unwrap() = vec![];
    submit(&a, gpu_job("g2")).await;
    let v = a
        .wait_for("/v1/jobs/g2", |v| {
            let refused = v["status"]["phase"] == "failed"
                && v["status"]["tasks"]["t"]["state"] != "terminating";
            let held = v["status"]["pending_reason"]
                .as_str()
                .is_some_and(|r| r.contains("tessera.io/device-view-mismatch"));
            refused || held
        })
        .await;
    let refused = v["status"]["phase"] == "failed";
    if refused {
        let t = &v["status"]["tasks"]["t"];
        assert_eq!(t["reason"], "DeviceViewMismatch", "{v}");
        let m = t["message"].as_str().unwrap();
        assert!(
            m.contains("the scheduler allocated GPU") && m.contains("this node sees no GPUs"),
            "{m}"
        );
    }
    let (_, nodes) = a.get("/v1/nodes").await;
    let node = nodes["items"][0]["name"].as_str().unwrap().to_string();
    let n = a
        .wait_for(&format!("/v1/nodes/{node}"), |n| {
            n["taints"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["key"] == "tessera.io/device-view-mismatch")
            })
        })
        .await;
    assert!(
        n["status"]["conditions"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["kind"] == "DeviceViewMismatch" && c["status"] == true)),
        "{n}"
    );
    // The GPUs come back: the taint goes, and a job held by it runs.
    *src.0.lock().unwrap() = raw;
    a.wait_for(&format!("/v1/nodes/{node}"), |n| {
        n["taints"].as_array().is_none_or(|t| {
            t.iter()
                .all(|t| t["key"] != "tessera.io/device-view-mismatch")
        })
    })
    .await;
    if !refused {
        let v = ended(&a, "g2").await;
        assert_eq!(v["status"]["phase"], "succeeded", "{v}");
    }
}

/// A MIG re-partition step that dies half way (the backend failing after the
/// first destroy, as a crash there would leave it) is finished when the node
/// starts again, from its journal, without doing anything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_done_mig_step_is_finished_at_restart() {
    if !common::can_run_tasks("a_half_done_mig_step_is_finished_at_restart") {
        return;
    }
    let fakes = tempfile::tempdir().unwrap();
    let mut raw = fake_gpus(fakes.path(), 1, true);
    // Seven idle 1g.10gb instances: a 3g.40gb can only go where some of them are.
    raw[0].mig_instances = (0..7)
        .map(|s| RawMig::new("1g.10gb", s, 10 + u32::from(s)))
        .collect();
    let src = Arc::new(Gpus(Mutex::new(raw.clone())));
    let fake = tessera_node::mig::FakeMig::new();
    for s in 0..7 {
        fake.insert(0, "1g.10gb", s);
    }
    fake.crash_after(1);
    let config = |c: &mut tessera_server::ServerConfig| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.node.gpus = Some(src.clone() as Arc<dyn GpuSource>);
        c.node.mig = Some(fake.clone() as Arc<dyn tessera_node::mig::MigBackend>);
        c.node.devices = tessera_node::DeviceDirs {
            dev: fakes.path().join("dev"),
            caps: fakes.path().join("caps"),
        };
    };
    let s = Server::start_with(config).await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    submit(
        &a,
        json!({"name": "m", "queue": "q", "tasks": [
            {"name": "t", "resources": {"cpu_milli": 100, "memory": 67108864},
             "gpu": {"mig": {"profile": "3g.40gb"}},
             "command": ["sh", "-c", "echo cuda=$CUDA_VISIBLE_DEVICES"]}]}),
    )
    .await;
    let v = ended(&a, "m").await;
    assert_eq!(v["status"]["tasks"]["t"]["reason"], "StartError", "{v}");
    assert!(
        v["status"]["tasks"]["t"]["message"]
            .as_str()
            .unwrap()
            .contains("MIG step"),
        "{v}"
    );
    let step = &v["status"]["tasks"]["t"]["mig"];
    let start = step["start"].as_u64().unwrap();
    let destroy: Vec<String> = step["destroy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("destroy {}@{}", d["profile"].as_str().unwrap(), d["start"]))
        .collect();
    assert!(destroy.len() >= 2, "a re-partition step: {v}");
    assert_eq!(fake.log(), destroy[..1]);
    // The node's own files: the data folder's `node/` (here the harness's folder).
    let journal = s.dir().join("node/mig-journal.json");
    assert!(
        std::fs::read_to_string(&journal)
            .unwrap()
            .contains("3g.40gb")
    );
    // "Restart": a new server on the same store and data folder; the backend works.
    let dir = s.stop().await;
    fake.recover();
    let store = tessera_server::SqliteStore::open(dir.path().join("data")).unwrap();
    let mut cfg = common::test_config(dir.path());
    config(&mut cfg);
    let r = tessera_server::start(store.into(), cfg).await.unwrap();
    let want = format!("3g.40gb@{start}");
    let cleared = || {
        !std::fs::read_to_string(&journal)
            .unwrap_or_default()
            .contains("3g.40gb")
    };
    for _ in 0..100 {
        // Created, and the intent removed from the journal afterwards.
        if fake.layout(0).contains(&want) && cleared() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fake.layout(0).contains(&want), "{:?}", fake.layout(0));
    let mut expected = destroy.clone();
    expected.push(format!("create {want}"));
    assert_eq!(fake.log(), expected, "each change once");
    assert!(
        !std::fs::read_to_string(&journal)
            .unwrap()
            .contains("3g.40gb")
    );
    r.shutdown().await;
}

/// A node that stops reporting for longer than the grace period has its live tasks
/// recorded lost: with `Never` the job fails; with `OnFailure` the task, its restart
/// counted, waits to be placed again — not on the silent node, which is tainted
/// unreachable until it reports again. No sandbox needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_a_silent_node_are_lost() {
    use tessera_store::{Key, Store};
    let s = Server::start_with(|c| {
        c.register_local_node = false;
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
    })
    .await;
    let a = s.tenant("alpha").await;
    queue(&a).await;
    let store = s.running.plane.store().clone();
    let ghost = tessera_model::Node::new(
        "ghost",
        tessera_model::Resources {
            cpu_milli: 4000,
            memory: 8 << 30,
            pods: 110,
            ..Default::default()
        },
    );
    store
        .create(
            Key::new("node", "", "ghost"),
            serde_json::to_value(&ghost).unwrap(),
        )
        .await
        .unwrap();
    let now = tessera_server::plane::now_ms();
    store
        .create(
            Key::new(tessera_server::exec::NODESTATUS, "", "ghost"),
            json!({"node": "ghost", "heartbeat_ms": now - 60_000, "conditions": [], "running": 1, "device_cgroup": false}),
        )
        .await
        .unwrap();
    let small = json!({"cpu_milli": 100, "memory": 1 << 20});
    submit(
        &a,
        json!({"name": "far", "queue": "q", "tasks": [{"name": "t", "resources": small}]}),
    )
    .await;
    submit(
        &a,
        json!({"name": "again", "queue": "q", "restart_policy": "OnFailure", "backoff_limit": 3,
               "tasks": [{"name": "t", "resources": small}]}),
    )
    .await;
    // Both run on "ghost" (as its node agent would have written; it has none here).
    for job in ["far", "again"] {
        for _ in 0..50 {
            let o = store
                .get(&Key::new("job", "alpha", job))
                .await
                .unwrap()
                .unwrap();
            let mut b = o.body.clone();
            b["status"]["phase"] = json!("running");
            b["status"]["tasks"] =
                json!({"t": {"node": "ghost", "state": "running", "attempt": 1}});
            if store.update(o.key(), Some(o.version), b).await.is_ok() {
                break;
            }
        }
    }
    let v = a
        .wait_for("/v1/jobs/far", |v| v["status"]["phase"] == "failed")
        .await;
    assert_eq!(v["status"]["tasks"]["t"]["reason"], "Lost", "{v}");
    assert!(
        v["status"]["tasks"]["t"]["message"]
            .as_str()
            .unwrap()
            .contains("node ghost stopped reporting"),
        "{v}"
    );
    let v = a
        .wait_for("/v1/jobs/again", |v| {
            v["status"]["pending_reason"]
                .as_str()
                .is_some_and(|r| r.contains("tessera.io/unreachable"))
        })
        .await;
    let t = &v["status"]["tasks"]["t"];
    assert_eq!(
        (
            &t["reason"],
            &t["restarts"],
            &t["state"],
            &v["status"]["phase"]
        ),
        (
            &json!("Lost"),
            &json!(1),
            &json!("evicted"),
            &json!("pending")
        ),
        "{v}"
    );
    let (_, n) = a.get("/v1/nodes/ghost").await;
    assert!(
        n["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == "tessera.io/unreachable")),
        "{n}"
    );
}

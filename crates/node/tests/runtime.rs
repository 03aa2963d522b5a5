//! The node runtime on the real sandbox runtime: limits hold (OOM at the memory
//! limit, the CPU quota), the environment is clean, a stop is SIGTERM → grace →
//! SIGKILL and leaves no process (checked by cgroup and by a pid scan), a GPU task
//! sees only its (fake) devices, and a device-view mismatch refuses the start.
//!
//! Needs root (cgroups, the uid range) and `tessera-sandbox-init` built next to the
//! test binary (`cargo test --workspace` builds it); skips with a message otherwise,
//! fails when `CI` is set.

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_model::Resources;
use tessera_node::gpu::{FakeSource, GpuSource, RawGpu};
use tessera_node::{
    DeviceDirs, GpuAssignment, NodeConfig, NodeRuntime, Outcome, TaskExit, TaskKey, TaskLimits,
    TemplateRef, WorkloadSpec,
};
use tessera_sandbox::InitProgram;

const MIB: u64 = 1 << 20;

fn ready(test: &str) -> bool {
    let ci = std::env::var_os("CI").is_some();
    let why = if !nix::unistd::geteuid().is_root() {
        Some("needs root (cgroups, the sandbox uid range)")
    } else if InitProgram::locate().is_none() {
        Some("tessera-sandbox-init is not built next to the tests (cargo build -p tessera-sandbox)")
    } else {
        None
    };
    match why {
        None => true,
        Some(w) if ci => panic!("{test}: {w}"),
        Some(w) => {
            eprintln!("SKIPPED {test}: {w}");
            false
        }
    }
}

/// A GPU source whose answer a test can change.
#[derive(Debug, Default)]
struct Switch(Mutex<Vec<RawGpu>>);
impl GpuSource for Switch {
    fn name(&self) -> &str {
        "switch"
    }
    fn gpus(&self) -> Result<Vec<RawGpu>, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

fn node(cfg: impl FnOnce(&mut NodeConfig)) -> Arc<NodeRuntime> {
    let mut c = NodeConfig::new("test-node");
    c.gpus = Arc::new(FakeSource(vec![]));
    cfg(&mut c);
    NodeRuntime::new(c).expect("node runtime")
}

fn task(dir: &Path, name: &str, cmd: &str) -> WorkloadSpec {
    WorkloadSpec {
        key: TaskKey::new("acme", "job", name, 0),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        env: vec![],
        working_dir: None,
        template: TemplateRef::Host,
        requests: Resources::new(500, 64 * MIB),
        limits: TaskLimits::default(),
        gpus: GpuAssignment::None,
        record: vec![],
        log: dir.join(format!("{name}.log")),
        tier: tessera_sandbox::TierKind::Namespace,
        weights: Vec::new(),
    }
}

/// Starts `w` and returns a receiver of its end.
fn start(
    n: &Arc<NodeRuntime>,
    w: WorkloadSpec,
) -> (tessera_node::Started, mpsc::Receiver<TaskExit>) {
    let (tx, rx) = mpsc::channel();
    let s = n
        .start(
            w,
            Box::new(move |e| {
                let _ = tx.send(e);
            }),
        )
        .expect("start");
    (s, rx)
}

fn end(rx: &mpsc::Receiver<TaskExit>) -> TaskExit {
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the task ended")
}

fn log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// Waits (bounded) until `f` holds.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let st = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            st != Some("Z") && st != Some("X")
        })
        .unwrap_or(false)
}

#[test]
fn memory_limit_oom_kills() {
    if !ready("memory_limit_oom_kills") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let mut w = task(
        d.path(),
        "hog",
        "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived",
    );
    w.requests = Resources::new(500, 32 * MIB);
    let (_, rx) = start(&n, w);
    let e = end(&rx);
    assert!(matches!(e.outcome, Outcome::OomKilled(_)), "{e:?}");
    assert!(!log(d.path(), "hog").contains("survived"));
    assert!(e.usage.peak_memory.unwrap() <= 33 * MIB, "{:?}", e.usage);
    // A limit above the request is the cgroup's limit: the same hog under a 512 MiB
    // limit lives.
    let mut w = task(
        d.path(),
        "roomy",
        "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived",
    );
    w.requests = Resources::new(500, 32 * MIB);
    w.limits = TaskLimits {
        memory: Some(512 * MIB),
        ..TaskLimits::default()
    };
    let (_, rx) = start(&n, w);
    let e = end(&rx);
    assert_eq!(e.outcome, Outcome::Exited(0), "{}", log(d.path(), "roomy"));
    assert!(log(d.path(), "roomy").contains("survived"));
}

#[test]
fn cpu_quota_holds() {
    if !ready("cpu_quota_holds") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let mut w = task(
        d.path(),
        "spin",
        "timeout 1 sh -c 'while :; do :; done'; true",
    );
    w.requests = Resources::new(100, 64 * MIB);
    let (_, rx) = start(&n, w);
    let e = end(&rx);
    assert!(e.outcome.success(), "{e:?}");
    let cpu = e.usage.cpu_seconds.expect("cpu accounted");
    // 100m of a CPU over about a second: about 0.1 s, far from the 1 s an
    // unlimited spin takes (slack for the start and the kernel's accounting).
    assert!(cpu < 0.4, "{:?}", e.usage);
    assert!(e.usage.wall_seconds >= 1.0, "{:?}", e.usage);
}

#[test]
fn the_environment_is_clean() {
    if !ready("the_environment_is_clean") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let mut w = task(d.path(), "env", "env | sort");
    w.env = vec![("EPOCHS".into(), "3".into())];
    let (_, rx) = start(&n, w);
    assert!(end(&rx).outcome.success());
    let text = log(d.path(), "env");
    let names: Vec<&str> = text.lines().filter_map(|l| l.split('=').next()).collect();
    let allowed = [
        "PATH",
        "HOME",
        "USER",
        "LANG",
        "TERM",
        "PWD",
        "EPOCHS",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
    ];
    for n in &names {
        assert!(
            allowed.contains(n) || n.starts_with("TESSERA_"),
            "unexpected variable {n} in\n{text}"
        );
    }
    assert!(
        text.contains("TESSERA_TASK=env\n") && text.contains("EPOCHS=3\n"),
        "{text}"
    );
    // Nothing of this process's environment (cargo sets these for tests).
    for (k, _) in std::env::vars() {
        if !allowed.contains(&k.as_str()) && !k.starts_with("TESSERA_") {
            assert!(!names.contains(&k.as_str()), "{k} leaked into the task");
        }
    }
}

/// SIGTERM → grace → SIGKILL: a task that handles SIGTERM ends within the grace
/// period, on its own; one that ignores it is killed when the grace runs out, with
/// its whole tree (background children included): no process is left in its pid
/// namespace or its cgroup.
#[test]
fn stop_is_sigterm_grace_sigkill_and_leaves_nothing() {
    if !ready("stop_is_sigterm_grace_sigkill_and_leaves_nothing") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let polite = task(
        d.path(),
        "polite",
        "trap 'echo got-term; exit 0' TERM; echo up; while :; do sleep 0.05; done",
    );
    let key = polite.key.clone();
    let (_, rx) = start(&n, polite);
    until("polite up", || log(d.path(), "polite").contains("up"));
    assert!(n.stop(
        &key,
        Duration::from_secs(20),
        "Evicted: preempted by urgent"
    ));
    let e = end(&rx);
    assert_eq!(
        e.outcome,
        Outcome::Stopped {
            reason: "Evicted: preempted by urgent".into(),
            forced: false
        }
    );
    assert!(log(d.path(), "polite").contains("got-term"));
    assert!(e.leftovers.is_empty());

    // Ignores SIGTERM, and leaves children behind in the background.
    let stubborn = task(
        d.path(),
        "stubborn",
        "trap '' TERM; (trap '' TERM; sleep 1000) & (sleep 1000 &) ; echo up; while :; do sleep 0.05; done",
    );
    let key = stubborn.key.clone();
    let (started, rx) = start(&n, stubborn);
    until("stubborn up", || log(d.path(), "stubborn").contains("up"));
    until("its children", || n.workload_pids(&key).len() >= 3);
    let pids = n.workload_pids(&key);
    let ns = started.pid_namespace.unwrap();
    assert!(n.stop(&key, Duration::from_millis(300), "Evicted"));
    let e = end(&rx);
    assert_eq!(
        e.outcome,
        Outcome::Stopped {
            reason: "Evicted".into(),
            forced: true
        }
    );
    assert!(e.leftovers.is_empty(), "{:?}", e.leftovers);
    assert!(tessera_sandbox::pids_in_namespace(ns).is_empty());
    for p in pids {
        assert!(!alive(p), "pid {p} survived");
    }
    // The usage was read before the sandbox went.
    assert!(e.usage.cpu_seconds.is_some() && e.usage.peak_memory.is_some());
    assert!(n.running().is_empty());
}

/// A task whose main process exits leaves nothing either: the runner kills what it
/// left in the background, and the sandbox is removed.
#[test]
fn an_ended_task_leaves_no_process() {
    if !ready("an_ended_task_leaves_no_process") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let w = task(
        d.path(),
        "fail",
        "sleep 1000 & sleep 1000 & echo $! ; exit 3",
    );
    let (started, rx) = start(&n, w);
    let e = end(&rx);
    assert_eq!(e.outcome, Outcome::Exited(3));
    assert!(e.leftovers.is_empty());
    assert!(tessera_sandbox::pids_in_namespace(started.pid_namespace.unwrap()).is_empty());
    let cg = n.sandbox_runtime().cgroups().unwrap();
    assert!(
        !cg.list().iter().any(|p| p.ends_with(&started.sandbox)),
        "cgroup of {} left: {:?}",
        started.sandbox,
        cg.list()
    );
}

/// Fake GPUs: four device nodes in a folder, a driver view of four GPUs; a task bound
/// to GPUs 1 and 3 sees exactly those nodes (and the control node) and their UUIDs,
/// and the device cgroup allows exactly those devices.
#[test]
fn a_gpu_task_sees_only_its_devices() {
    if !ready("a_gpu_task_sees_only_its_devices") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let dev = d.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let mut raw = Vec::new();
    for i in 0..4u32 {
        // Real character nodes of the NVIDIA major (195): nothing answers them here,
        // but the device cgroup and the bind mounts treat them as the real thing.
        let p = dev.join(format!("nvidia{i}"));
        nix::sys::stat::mknod(
            &p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, u64::from(i)),
        )
        .unwrap();
        raw.push(RawGpu {
            index: i,
            name: "NVIDIA H100 80GB HBM3".into(),
            memory: 80 << 30,
            bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
            uuid: format!("GPU-fake-{i}"),
            minor: Some(i),
            ..RawGpu::default()
        });
    }
    std::fs::write(dev.join("nvidiactl"), b"").unwrap();
    let record = tessera_node::gpu::map_gpus(&raw);
    let n = node(|c| {
        c.gpus = Arc::new(FakeSource(raw.clone()));
        c.devices = DeviceDirs {
            dev: dev.clone(),
            caps: d.path().join("caps"),
        };
    });
    let mut w = task(
        d.path(),
        "gpu",
        "ls /dev | grep nvidia; echo cuda=$CUDA_VISIBLE_DEVICES; cat /proc/self/cgroup | grep devices",
    );
    w.gpus = GpuAssignment::Whole { gpus: vec![1, 3] };
    w.record = record;
    let (started, rx) = start(&n, w);
    assert_eq!(started.view.len(), 2);
    assert!(end(&rx).outcome.success());
    let text = log(d.path(), "gpu");
    let nodes: Vec<&str> = text.lines().filter(|l| l.starts_with("nvidia")).collect();
    assert_eq!(nodes, ["nvidia1", "nvidia3", "nvidiactl"], "{text}");
    assert!(text.contains("cuda=GPU-fake-1,GPU-fake-3\n"), "{text}");
    if n.sandbox_runtime().fences_devices() {
        // The device cgroup's list, seen from the host while a task holds it.
        let mut w = task(d.path(), "gpu2", "sleep 1000");
        w.gpus = GpuAssignment::Whole { gpus: vec![2] };
        w.record = tessera_node::gpu::map_gpus(&raw);
        let key = w.key.clone();
        let (started, rx) = start(&n, w);
        let pid = started.cgroup_procs.unwrap()[0];
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let path = cg
            .lines()
            .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
            .unwrap();
        let list =
            std::fs::read_to_string(format!("/sys/fs/cgroup/devices{path}/devices.list")).unwrap();
        assert!(list.contains("c 195:2 rwm"), "{list}");
        assert!(
            !list.contains("c 195:0 ") && !list.contains("c 195:1 "),
            "{list}"
        );
        assert!(!list.contains("a *:*"), "{list}");
        n.stop(&key, Duration::ZERO, "done");
        end(&rx);
    }
}

/// The driver lost a GPU since the scheduler placed the task: the start is refused,
/// naming both views, the node is marked, and the mark goes once the views agree.
#[test]
fn a_device_view_mismatch_refuses_the_start() {
    if !ready("a_device_view_mismatch_refuses_the_start") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let dev = d.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let mut raw = Vec::new();
    for i in 0..2u32 {
        std::fs::write(dev.join(format!("nvidia{i}")), b"").unwrap();
        raw.push(RawGpu {
            index: i,
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory: 80 << 30,
            uuid: format!("GPU-{i}"),
            minor: Some(i),
            ..RawGpu::default()
        });
    }
    let record = tessera_node::gpu::map_gpus(&raw);
    let source = Arc::new(Switch(Mutex::new(raw.clone())));
    let n = node(|c| {
        c.gpus = source.clone();
        c.devices = DeviceDirs {
            dev: dev.clone(),
            caps: d.path().join("caps"),
        };
    });
    assert!(n.check_devices(&record).is_ok());
    *source.0.lock().unwrap() = raw[..1].to_vec();
    let mut w = task(d.path(), "lost", "echo ran");
    w.gpus = GpuAssignment::Whole { gpus: vec![1] };
    w.record = record.clone();
    let e = n.start(w, Box::new(|_| {})).unwrap_err().to_string();
    assert!(
        e.contains("the scheduler allocated GPU 1 (A100-80GB"),
        "{e}"
    );
    assert!(e.contains("this node sees GPU 0"), "{e}");
    assert!(n.mismatch().is_some());
    assert!(log(d.path(), "lost").is_empty());
    *source.0.lock().unwrap() = raw.clone();
    n.refresh_devices().unwrap();
    assert!(n.check_devices(&record).is_ok());
    assert!(n.mismatch().is_none());
}

/// The guard checks a task's command as its tenant's, and the output is redacted.
#[test]
fn the_guard_checks_tasks_and_redacts_their_logs() {
    if !ready("the_guard_checks_tasks_and_redacts_their_logs") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let w = task(d.path(), "rm", "rm -rf --no-preserve-root /");
    let (_, rx) = start(&n, w);
    let e = end(&rx);
    assert!(
        matches!(&e.outcome, Outcome::Failed(m) if m.contains("guard")),
        "{e:?}"
    );
    let w = task(d.path(), "leak", "echo key=AKIAZ7Q3M2K9P4L6R8T1");
    let (_, rx) = start(&n, w);
    assert!(end(&rx).outcome.success());
    let text = log(d.path(), "leak");
    assert!(!text.contains("AKIAZ7Q3M2K9P4L6R8T1"), "{text}");
}

#[test]
fn a_micro_vm_task_on_a_node_without_the_tier_is_refused_by_name() {
    if !ready("a_micro_vm_task_on_a_node_without_the_tier_is_refused_by_name") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let n = node(|_| {});
    let mut w = task(dir.path(), "vm", "true");
    w.tier = tessera_sandbox::TierKind::Microvm;
    let e = n
        .start(w, Box::new(|_| {}))
        .expect_err("no micro-VM tier here")
        .to_string();
    assert!(
        e.contains("no micro-VM tier") && e.contains("--vm-kernel"),
        "{e}"
    );
    assert!(n.running().is_empty());
}

/// The micro-VM tier (with the shipped guard), or `None` with the reason: no root, no
/// QEMU or no guest kernel (`TESSERA_VM_KERNEL`, else `.ci/vm-kernel.sh`'s folder);
/// with `CI` set a missing one fails instead.
fn vm_tier(test: &str) -> Option<Arc<tessera_sandbox::vm::MicroVmTier>> {
    use tessera_sandbox::vm::{MicroVmConfig, MicroVmTier, image};
    if !ready(test) {
        return None;
    }
    let src = std::env::var_os("TESSERA_VM_KERNEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/tessera-ci/kernel/x".into());
    let why = if !src.exists() {
        Some(format!("no guest kernel at {}", src.display()))
    } else if tessera_sandbox::vm::find_qemu().is_none() {
        Some("qemu-system-x86_64 is not installed".to_string())
    } else {
        None
    };
    if let Some(w) = why {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: {w}, and CI is set: run .ci/vm-kernel.sh first"
        );
        eprintln!("SKIPPED {test}: {w}");
        return None;
    }
    let cache = std::env::temp_dir().join("tessera-vm-tests");
    let ktpl = image::cached_kernel_template(&src, &cache).expect("kernel template");
    let mut cfg = MicroVmConfig::new(&ktpl, &cache);
    cfg.init = InitProgram::locate();
    cfg.boot_timeout = Duration::from_secs(120);
    Some(MicroVmTier::new(cfg).expect("the micro-VM tier"))
}

/// A micro-VM task gets SIGTERM and its grace period too: the guest's agent signals
/// the workload inside the guest (before, a stop ended its commands at once).
#[test]
fn a_micro_vm_task_gets_sigterm_and_its_grace() {
    let Some(tier) = vm_tier("a_micro_vm_task_gets_sigterm_and_its_grace") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let n = node(|c| c.microvm = Some(tier));
    let mut polite = task(
        d.path(),
        "polite-vm",
        "trap 'echo got-term; exit 0' TERM; echo up; while :; do sleep 0.05; done",
    );
    polite.tier = tessera_sandbox::TierKind::Microvm;
    let key = polite.key.clone();
    let (_, rx) = start(&n, polite);
    // A boot under TCG takes seconds.
    for _ in 0..1200 {
        if log(d.path(), "polite-vm").contains("up") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        log(d.path(), "polite-vm").contains("up"),
        "{}",
        log(d.path(), "polite-vm")
    );
    assert!(n.stop(
        &key,
        Duration::from_secs(60),
        "Evicted: preempted by urgent"
    ));
    let e = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the task ended");
    assert_eq!(
        e.outcome,
        Outcome::Stopped {
            reason: "Evicted: preempted by urgent".into(),
            forced: false
        },
        "{}",
        log(d.path(), "polite-vm")
    );
    assert!(
        log(d.path(), "polite-vm").contains("got-term"),
        "{}",
        log(d.path(), "polite-vm")
    );
    assert!(n.running().is_empty());
}

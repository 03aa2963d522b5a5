//! GPU shares enforced through the node runtime: a fractional task runs in a real
//! sandbox with the CUDA interposer preloaded by its `/etc/ld.so.preload` and an
//! accounting region the runtime made, over the fake `libcuda.so.1` of
//! `crates/gpushare`. A child process (even one whose environment was wiped) that
//! allocates over the cap gets `CUDA_ERROR_OUT_OF_MEMORY`; two tasks on one GPU are
//! each held to their own cap; a task killed mid-run gives its share back. The
//! control: the same task with enforcement off (`EnvOnly`) takes what it asks for.
//!
//! Needs root, `tessera-sandbox-init` and a C compiler (for the fake driver); skips
//! with a message otherwise, fails when `CI` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use tessera_gpushare::fake::{self, FakeBuild};
use tessera_gpushare::share::ControllerConfig;
use tessera_model::Resources;
use tessera_node::compute::{MonitorClock, MonitorConfig, Utilisation, Watched};
use tessera_node::fence::{GpuShareHook, Share, ShareSetup};
use tessera_node::gpu::{FakeSource, RawGpu};
use tessera_node::gpushare::{Interposer, InterposerConfig};
use tessera_node::{
    DeviceDirs, GpuAssignment, NodeConfig, NodeRuntime, Outcome, TaskExit, TaskKey, TaskLimits,
    TemplateRef, WorkloadSpec,
};
use tessera_sandbox::InitProgram;

const MIB: u64 = 1 << 20;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OOM: i32 = 2;

fn skip(test: &str, why: &str) -> bool {
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    true
}

struct Rig {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    fake: FakeBuild,
    raw: Vec<RawGpu>,
    devices: DeviceDirs,
}

fn interposer() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for p in [
        deps.join("libtessera_cuda.so"),
        deps.parent().unwrap().join("libtessera_cuda.so"),
    ] {
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "libtessera_cuda.so not found next to {} (tessera-gpushare-cuda is a dev-dependency: cargo builds it)",
        exe.display()
    );
}

fn rig(test: &str) -> Option<Rig> {
    if !nix::unistd::geteuid().is_root() {
        skip(test, "needs root (cgroups, the sandbox uid range)");
        return None;
    }
    if InitProgram::locate().is_none() {
        skip(
            test,
            "tessera-sandbox-init is not built next to the tests (cargo build -p tessera-sandbox)",
        );
        return None;
    }
    let d = tempfile::Builder::new()
        .prefix("node-gpushare-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let dir = d.path().to_path_buf();
    let fake = match fake::build(&dir.join("fake"), &[]) {
        Ok(f) => f,
        Err(e @ fake::FakeError::NoCompiler(_)) => {
            skip(test, &e.to_string());
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("nvidia0"), b"").unwrap();
    std::fs::write(dev.join("nvidiactl"), b"").unwrap();
    let raw = vec![RawGpu {
        index: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        memory: 80 << 30,
        bus_id: "00000000:10:00.0".into(),
        uuid: "GPU-fake-0".into(),
        minor: Some(0),
        ..RawGpu::default()
    }];
    Some(Rig {
        _dir: d,
        devices: DeviceDirs {
            dev,
            caps: dir.join("caps"),
        },
        dir,
        fake,
        raw,
    })
}

impl Rig {
    fn node(&self, hook: Option<Arc<Interposer>>) -> Arc<NodeRuntime> {
        self.node_with(hook, |_| {})
    }

    fn node_with(
        &self,
        hook: Option<Arc<Interposer>>,
        more: impl FnOnce(&mut NodeConfig),
    ) -> Arc<NodeRuntime> {
        let mut c = NodeConfig::new("gpushare-node");
        c.gpus = Arc::new(FakeSource(self.raw.clone()));
        c.devices = self.devices.clone();
        c.gpu_libs = vec![self.fake.dir.clone()];
        c.gpushare = match hook {
            Some(h) => h,
            None => Arc::new(tessera_node::fence::EnvOnly),
        };
        more(&mut c);
        NodeRuntime::new(c).expect("node runtime")
    }

    fn hook(&self) -> Arc<Interposer> {
        Arc::new(
            Interposer::new(InterposerConfig::new(interposer(), self.dir.join("state")))
                .expect("interposer hook"),
        )
    }

    /// A task with a share of GPU 0 running `script` (`$P` is the CUDA probe).
    fn task(&self, name: &str, memory: u64, script: &str) -> WorkloadSpec {
        WorkloadSpec {
            key: TaskKey::new("acme", "job", name, 0),
            command: vec![
                "sh".into(),
                "-c".into(),
                format!("P={}; {script}", self.fake.probe.display()),
            ],
            env: vec![],
            working_dir: None,
            template: TemplateRef::Host,
            requests: Resources::new(200, 64 * MIB),
            limits: TaskLimits::default(),
            gpus: GpuAssignment::Shared {
                gpu: 0,
                milli: 400,
                memory,
            },
            record: tessera_node::gpu::map_gpus(&self.raw),
            log: self.dir.join(format!("{name}.log")),
            tier: tessera_sandbox::TierKind::Namespace,
            weights: Vec::new(),
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

fn start(n: &Arc<NodeRuntime>, w: WorkloadSpec) -> mpsc::Receiver<TaskExit> {
    let (tx, rx) = mpsc::channel();
    n.start(
        w,
        Box::new(move |e| {
            let _ = tx.send(e);
        }),
    )
    .expect("start");
    rx
}

fn end(rx: &mpsc::Receiver<TaskExit>) -> TaskExit {
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the task ended")
}

/// The `rc=` of each `alloc` line of a log.
fn allocs(log: &str) -> Vec<i32> {
    log.lines()
        .filter(|l| l.starts_with("alloc "))
        .map(|l| l.rsplit("rc=").next().unwrap().trim().parse().unwrap())
        .collect()
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

fn regions(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The probe runs as a child of the task's shell, once with its environment wiped
/// (`env -i`: no `LD_PRELOAD`, no region variable): the sandbox's
/// `/etc/ld.so.preload` still loads the interposer, which finds the region at its
/// default path. Over the 64 MiB cap the second 40 MiB fails with
/// `CUDA_ERROR_OUT_OF_MEMORY`; with enforcement off the same task takes both.
#[test]
fn a_child_over_its_cap_gets_out_of_memory_and_off_means_uncapped() {
    let Some(r) = rig("a_child_over_its_cap_gets_out_of_memory_and_off_means_uncapped") else {
        return;
    };
    let hook = r.hook();
    let n = r.node(Some(hook.clone()));
    let script = "cat /etc/ld.so.preload; $P init alloc 40M alloc 40M info; \
                  env -i $P init alloc 40M alloc 40M";
    let e = end(&start(&n, r.task("capped", 64 * MIB, script)));
    let log = r.log("capped");
    assert!(e.outcome.success(), "{e:?}\n{log}");
    assert!(
        log.contains("/run/tessera/gpushare/libtessera_cuda.so\n"),
        "{log}"
    );
    assert_eq!(allocs(&log), [0, OOM, 0, OOM], "{log}");
    // cuMemGetInfo reports the cap, not the device.
    assert!(log.contains("total=67108864"), "{log}");
    let u = e.gpushare.expect("the share's last usage");
    assert_eq!(u.devices[0].memory_limit_bytes, 64 * MIB);
    assert_eq!(u.devices[0].oom_events, 2);
    assert_eq!(u.devices[0].memory_peak_bytes, 40 * MIB);
    // The same figures go to the task's usage (its usage record and status).
    assert_eq!(e.usage.gpu_memory_limit, Some(64 * MIB));
    assert_eq!(e.usage.gpu_memory_peak, Some(40 * MIB));
    assert_eq!(e.usage.gpu_oom_events, Some(2));
    assert_eq!(e.usage.gpu_compute_milli, Some(400));
    assert!(hook.active().is_empty());
    assert!(regions(&r.dir.join("state")).is_empty(), "region released");

    // The control: enforcement off, the same task is not held to anything.
    let off = r.node(None);
    let e = end(&start(&off, r.task("uncapped", 64 * MIB, script)));
    let log = r.log("uncapped");
    assert!(e.outcome.success(), "{e:?}\n{log}");
    assert_eq!(allocs(&log), [0, 0, 0, 0], "{log}");
    assert!(e.gpushare.is_none());
}

/// Two tasks share GPU 0 with caps of 64 and 128 MiB, both running at once: each
/// is held to its own cap. Killed mid-run (holding memory), each gives its share
/// back: the region is gone and the last usage comes with the task's end.
#[test]
fn two_tasks_on_one_gpu_are_each_held_and_a_killed_task_releases_its_share() {
    let Some(r) = rig("two_tasks_on_one_gpu_are_each_held_and_a_killed_task_releases_its_share")
    else {
        return;
    };
    let hook = r.hook();
    let n = r.node(Some(hook.clone()));
    let hold = "sleep 1000 | $P init alloc 40M alloc 40M alloc 40M alloc 40M hold";
    let a = r.task("small", 64 * MIB, hold);
    let b = r.task("large", 128 * MIB, hold);
    let (ka, kb) = (a.key.clone(), b.key.clone());
    let ra = start(&n, a);
    let rb = start(&n, b);
    let used = |k: &TaskKey| {
        n.gpu_share_usage(k)
            .map(|u| (u.devices[0].memory_used_bytes, u.devices[0].oom_events))
    };
    until("both tasks allocated", || {
        used(&ka).is_some_and(|(_, o)| o == 3) && used(&kb).is_some_and(|(_, o)| o == 1)
    });
    assert_eq!(used(&ka), Some((40 * MIB, 3)));
    assert_eq!(used(&kb), Some((120 * MIB, 1)));
    assert_eq!(hook.active(), [kb.clone(), ka.clone()]);
    assert_eq!(
        regions(&r.dir.join("state")).len(),
        4,
        "two regions, two preload lists"
    );
    // Killed mid-run, holding memory: the share goes back with the tree.
    assert!(n.stop(&ka, Duration::ZERO, "evicted"));
    let e = end(&ra);
    assert!(matches!(e.outcome, Outcome::Stopped { .. }), "{e:?}");
    let u = e.gpushare.expect("the killed task's last usage");
    assert_eq!(u.devices[0].memory_peak_bytes, 40 * MIB);
    assert_eq!(hook.active(), std::slice::from_ref(&kb));
    assert!(n.gpu_share_usage(&ka).is_none());
    assert_eq!(regions(&r.dir.join("state")).len(), 2);
    // The other task still holds its own.
    assert_eq!(used(&kb), Some((120 * MIB, 1)));
    assert!(n.stop(&kb, Duration::from_millis(200), "done"));
    end(&rb);
    assert!(hook.active().is_empty());
    assert!(regions(&r.dir.join("state")).is_empty());
}

/// An Xid the driver does not confine to one task marks the GPU: the node's
/// condition names it and no new task starts on it; a task's own Xid does not.
#[test]
fn a_gpu_fault_marks_the_gpu_and_no_new_work_starts_there() {
    use tessera_node::faults::{FakeFaults, FaultKind, GpuFault};
    let Some(r) = rig("a_gpu_fault_marks_the_gpu_and_no_new_work_starts_there") else {
        return;
    };
    let faults = Arc::new(FakeFaults::default());
    let n = r.node_with(Some(r.hook()), |c| c.faults = Some(faults.clone()));
    let fault = |x| GpuFault {
        device_index: 0,
        uuid: Some("GPU-fake-0".into()),
        kind: FaultKind::Xid(Some(x)),
    };
    // The task's own page fault: the GPU stays healthy.
    faults.push(fault(31));
    assert_eq!(n.poll_faults().len(), 1);
    assert!(n.unhealthy_gpus().is_empty());
    let e = end(&start(&n, r.task("before", 64 * MIB, "$P init alloc 1M")));
    assert!(e.outcome.success(), "{e:?}");
    // Fallen off the bus: marked, reported, and the next start is refused.
    faults.push(fault(79));
    n.poll_faults();
    let u = n.unhealthy_gpus();
    assert!(u[&0].contains("Xid 79"), "{u:?}");
    let c = tessera_node::faults::condition(&u);
    assert!(c.status && c.message.contains("GPU 0"), "{c:?}");
    let err = n
        .start(r.task("after", 64 * MIB, "true"), Box::new(|_| {}))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("GPU 0 is unhealthy") && err.contains("Xid 79"),
        "{err}"
    );
    assert!(regions(&r.dir.join("state")).is_empty(), "nothing held");
}

/// The fake device's simulated clock: the node's compute monitor ticks on it (as
/// a participant of the simulation), so the shares measured do not depend on how
/// loaded the machine is.
struct FakeClock(fake::FakeDriver);

impl MonitorClock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.0.clock_ns()
    }
    fn sleep_until(&self, t: u64) {
        self.0.sleep_until(t)
    }
    fn idle(&self) {
        self.0.leave()
    }
}

/// Fake utilisation: each task's device time from the fake device's own
/// accounting, by the task's pid namespace (what NVML's pids are mapped by).
struct FakeUtilisation {
    fake: fake::FakeDriver,
    last: BTreeMap<String, u64>,
}

impl Utilisation for FakeUtilisation {
    fn busy(&mut self, _gpu: u32, tasks: &[Watched]) -> Result<BTreeMap<String, u64>, String> {
        let mut out = BTreeMap::new();
        for t in tasks {
            let Some(ns) = t.pidns else { continue };
            let total = self.fake.busy_in_pidns(ns);
            let last = self.last.insert(t.id.clone(), total).unwrap_or(0);
            out.insert(t.id.clone(), total.saturating_sub(last));
        }
        Ok(out)
    }
}

/// The interposer hook, with the fake device's state file bound into each task
/// (the tasks of one GPU share one simulated device, as on a real node).
#[derive(Debug)]
struct SharedDevice {
    inner: Arc<Interposer>,
    state: PathBuf,
}

const STATE_INSIDE: &str = "/run/tessera/fakecuda.state";

impl GpuShareHook for SharedDevice {
    fn prepare(&self, key: &TaskKey, share: &Share) -> Result<ShareSetup, String> {
        let mut s = self.inner.prepare(key, share)?;
        s.binds.push(tessera_sandbox::Bind {
            host: self.state.clone(),
            path: STATE_INSIDE.into(),
            writable: true,
        });
        Ok(s)
    }
    fn running(&self, key: &TaskKey, pidns: Option<u64>) {
        self.inner.running(key, pidns)
    }
    fn release(&self, key: &TaskKey) -> Option<tessera_gpushare::usage::TaskUsage> {
        self.inner.release(key)
    }
    fn usage(&self, key: &TaskKey) -> Option<tessera_gpushare::usage::TaskUsage> {
        self.inner.usage(key)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Two fractional tasks (300 and 700 milli-GPU) launch 200 µs kernels back to
/// back on one (simulated) GPU through the node runtime: the compute monitor that
/// runs under the interposer hook holds them to 30 % / 70 % of the device time
/// within ±5 points; the first, alone before the second starts, gets the whole
/// device (work-conserving). Measured on the fake clock. With the monitor off the
/// serial device splits about evenly, and this fails.
#[test]
fn two_tasks_get_their_compute_shares_and_one_alone_gets_the_whole_gpu() {
    let Some(r) = rig("two_tasks_get_their_compute_shares_and_one_alone_gets_the_whole_gpu") else {
        return;
    };
    let _one = fake::exclusive();
    let drv = fake::FakeDriver::load(&r.fake).unwrap();
    let state = r.dir.join("device.state");
    drv.attach(&state).unwrap();
    // The tasks run as the sandbox's unprivileged user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o666)).unwrap();
    let tick_ns = 2_000_000;
    let monitor = MonitorConfig {
        clock: Box::new(FakeClock(drv)),
        utilisation: Box::new(FakeUtilisation {
            fake: drv,
            last: BTreeMap::new(),
        }),
        controller: ControllerConfig {
            tick_ns,
            ..ControllerConfig::default()
        },
    };
    let inner = Arc::new(
        Interposer::with_monitor(
            InterposerConfig::new(interposer(), r.dir.join("state")),
            Ok(monitor),
        )
        .expect("interposer hook"),
    );
    let hook = Arc::new(SharedDevice {
        inner: inner.clone(),
        state: state.clone(),
    });
    let n = r.node_with(None, |c| c.gpushare = hook.clone());
    let task = |name: &str, milli: u32| {
        let mut w = r.task(
            name,
            64 * MIB,
            &format!("FAKECUDA_STATE={STATE_INSIDE} exec $P mode d init forever kernel 200000"),
        );
        w.gpus = GpuAssignment::Shared {
            gpu: 0,
            milli,
            memory: 64 * MIB,
        };
        w
    };
    let begin = |w: WorkloadSpec| {
        let (tx, rx) = mpsc::channel();
        let key = w.key.clone();
        let s = n
            .start(
                w,
                Box::new(move |e| {
                    let _ = tx.send(e);
                }),
            )
            .expect("start");
        (key, s.pid_namespace.expect("a pid namespace"), rx)
    };
    // Device time of each pid namespace over `ticks` ticks of the fake clock.
    let measure = |ns: &[u64], ticks: u64| -> (Vec<u64>, u64) {
        let b0: Vec<u64> = ns.iter().map(|&n| drv.busy_in_pidns(n)).collect();
        let c0 = drv.clock_ns();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while drv.clock_ns() < c0 + ticks * tick_ns {
            assert!(
                std::time::Instant::now() < deadline,
                "the fake clock did not move {ticks} ticks in 60 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let b1: Vec<u64> = ns.iter().map(|&n| drv.busy_in_pidns(n)).collect();
        let c1 = drv.clock_ns();
        (b1.iter().zip(&b0).map(|(a, b)| a - b).collect(), c1 - c0)
    };
    let log_of = |name: &str| r.log(name);

    let (ka, na, ra) = begin(task("small", 300));
    until("the 300m task to launch", || drv.busy_in_pidns(na) > 0);
    let (alone, el) = measure(&[na], 300);
    let whole = alone[0] as f64 / el as f64;
    assert!(
        whole > 0.95,
        "alone, the 300m task gets the whole device: {whole:.3}\n{}",
        log_of("small")
    );

    let (kb, nb, rb) = begin(task("large", 700));
    until("the 700m task to launch", || drv.busy_in_pidns(nb) > 0);
    measure(&[na, nb], 100); // the controller's window settles
    let (used, el) = measure(&[na, nb], 1000);
    let total = (used[0] + used[1]) as f64;
    let shares = [used[0] as f64 / total, used[1] as f64 / total];
    eprintln!(
        "alone: {whole:.4} of the device; shared: {:.4} / {:.4}, device busy {:.4}",
        shares[0],
        shares[1],
        total / el as f64
    );
    assert!(
        (shares[0] - 0.3).abs() <= 0.05 && (shares[1] - 0.7).abs() <= 0.05,
        "shares {shares:?} (want 0.3 / 0.7 ± 0.05)\n{}\n{}",
        log_of("small"),
        log_of("large")
    );
    assert!(
        total / el as f64 > 0.95,
        "work-conserving: the device stays busy ({:.3})",
        total / el as f64
    );
    let ticks = inner
        .compute_monitor()
        .expect("the monitor runs")
        .stats()
        .ticks;
    assert!(ticks >= 1400, "the monitor ticked ({ticks})");

    for (k, rx) in [(ka, ra), (kb, rb)] {
        assert!(n.stop(&k, Duration::ZERO, "done"));
        end(&rx);
    }
    assert!(inner.active().is_empty());
    // The runtime and the hook gone, the monitor thread has stopped: it left the
    // simulation.
    drop(n);
    drop(hook);
    drop(inner);
    // (A killed probe's slot is reaped once the kernel has dropped its lock,
    // which can trail the task's end by a few milliseconds.)
    for _ in 0..200 {
        if drv.participants() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(drv.participants(), 0, "the monitor left the fake device");
}

//! The node's compute monitor: one thread for the node that slices the compute
//! shares of fractional tasks while the interposer hook is on.
//!
//! The interposer (`libtessera_cuda.so`) holds each launch while the task's token
//! bucket on its GPU is in debt; this thread is what fills and debits the
//! buckets. Every tick it asks a [`Utilisation`] source how much device time each
//! attached task used since the last tick, runs each GPU's
//! [`DeviceMonitor`](tessera_gpushare::monitor::DeviceMonitor) (the weighted,
//! work-conserving controller of `tessera-gpushare`) and publishes the buckets
//! into the tasks' regions. A GPU is ticked only while it has fractional tasks:
//! [`ComputeMonitor::attach`] when the hook prepares a task's region,
//! [`ComputeMonitor::detach`] when it releases it. Dropping the monitor stops and
//! joins the thread.
//!
//! Time is a [`MonitorClock`] (CLOCK_MONOTONIC in production, the clock the
//! interposer reads; the fake driver's simulated clock in tests) and utilisation
//! a trait: [`NvmlUtilisation`] in production (NVML's per-process samples, host
//! pids mapped to tasks by pid namespace), a fake in tests. Nothing here changes
//! any device setting: NVML is only read.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use tessera_gpushare::monitor::DeviceMonitor;
use tessera_gpushare::region::Region;
use tessera_gpushare::share::ControllerConfig;

/// The clock the monitor ticks on. It must be the clock the interposer reads
/// (the region's heartbeat and next-tick times are in it).
pub trait MonitorClock: Send + 'static {
    fn now_ns(&self) -> u64;
    /// Returns once the clock reads `t` or later (or a little before, at most one
    /// tick: the loop re-reads the clock).
    fn sleep_until(&self, t: u64);
    /// The monitor has no task to tick (a simulated clock stops waiting on it).
    fn idle(&self) {}
}

/// CLOCK_MONOTONIC ([`tessera_gpushare::monotonic_ns`]), the interposer's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Monotonic;

impl MonitorClock for Monotonic {
    fn now_ns(&self) -> u64 {
        tessera_gpushare::monotonic_ns()
    }
    fn sleep_until(&self, t: u64) {
        let now = self.now_ns();
        if t > now {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
    }
}

/// A task the monitor slices, as its [`Utilisation`] source sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The region id (the monitor's name for the task).
    pub id: String,
    /// The task's pid namespace (inode of `/proc/<pid>/ns/pid`), once it runs.
    pub pidns: Option<u64>,
}

/// Device time used per task: for GPU `gpu` (the node's index, NVML's), each
/// task's device time in ns since the previous call, keyed by [`Watched::id`].
pub trait Utilisation: Send + 'static {
    fn busy(&mut self, gpu: u32, tasks: &[Watched]) -> Result<BTreeMap<String, u64>, String>;
}

/// NVML's per-process utilisation ([`tessera_gpushare::nvml::NvmlSampler`]): host
/// pids, each mapped to the task whose pid namespace it is in.
#[derive(Debug)]
pub struct NvmlUtilisation {
    sampler: tessera_gpushare::nvml::NvmlSampler,
}

impl NvmlUtilisation {
    /// The system's NVML (an error where there is none: no driver, no GPU).
    pub fn open() -> Result<Self, String> {
        tessera_gpushare::nvml::NvmlSampler::open()
            .map(|sampler| NvmlUtilisation { sampler })
            .map_err(|e| e.to_string())
    }
}

/// The pid namespace of host pid `pid`.
pub fn pid_namespace_of(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

impl Utilisation for NvmlUtilisation {
    fn busy(&mut self, gpu: u32, tasks: &[Watched]) -> Result<BTreeMap<String, u64>, String> {
        let by_pid = self.sampler.busy_by_pid(gpu).map_err(|e| e.to_string())?;
        let by_ns: BTreeMap<u64, &str> = tasks
            .iter()
            .filter_map(|t| t.pidns.map(|n| (n, t.id.as_str())))
            .collect();
        Ok(tessera_gpushare::nvml::busy_by_task(&by_pid, |pid| {
            pid_namespace_of(pid).and_then(|n| by_ns.get(&n).map(|s| s.to_string()))
        }))
    }
}

/// How the monitor runs.
pub struct MonitorConfig {
    pub clock: Box<dyn MonitorClock>,
    pub utilisation: Box<dyn Utilisation>,
    pub controller: ControllerConfig,
}

impl std::fmt::Debug for MonitorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MonitorConfig")
            .field("controller", &self.controller)
            .finish()
    }
}

enum Cmd {
    Attach {
        gpu: u32,
        id: String,
        region: Region,
    },
    Running {
        id: String,
        pidns: Option<u64>,
    },
    Detach {
        id: String,
    },
    Stop,
}

/// What the monitor thread reports (for status and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MonitorStats {
    pub ticks: u64,
    /// Utilisation queries that failed (the last error is kept).
    pub errors: u64,
    pub last_error: Option<String>,
}

/// The running monitor (see the module's text). Dropping it stops the thread.
pub struct ComputeMonitor {
    tx: mpsc::Sender<Cmd>,
    thread: Option<JoinHandle<()>>,
    stats: std::sync::Arc<std::sync::Mutex<MonitorStats>>,
}

impl std::fmt::Debug for ComputeMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputeMonitor")
            .field("stats", &self.stats())
            .finish()
    }
}

impl ComputeMonitor {
    /// Starts the thread (idle until a task is attached).
    pub fn start(cfg: MonitorConfig) -> std::io::Result<ComputeMonitor> {
        let (tx, rx) = mpsc::channel();
        let stats = std::sync::Arc::new(std::sync::Mutex::new(MonitorStats::default()));
        let s = stats.clone();
        let thread = std::thread::Builder::new()
            .name("tessera-compute-monitor".into())
            .spawn(move || run(cfg, rx, s))?;
        Ok(ComputeMonitor {
            tx,
            thread: Some(thread),
            stats,
        })
    }

    /// Starts slicing task `id` (its region's first device is node GPU `gpu`).
    pub fn attach(&self, gpu: u32, id: &str, region: Region) {
        let _ = self.tx.send(Cmd::Attach {
            gpu,
            id: id.to_string(),
            region,
        });
    }

    /// Task `id` runs, in pid namespace `pidns` (how its device time is found).
    pub fn running(&self, id: &str, pidns: Option<u64>) {
        let _ = self.tx.send(Cmd::Running {
            id: id.to_string(),
            pidns,
        });
    }

    /// Stops slicing task `id`; its share goes back to the others.
    pub fn detach(&self, id: &str) {
        let _ = self.tx.send(Cmd::Detach { id: id.to_string() });
    }

    pub fn stats(&self) -> MonitorStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for ComputeMonitor {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Gpu {
    monitor: DeviceMonitor,
    tasks: Vec<Watched>,
}

struct State {
    gpus: BTreeMap<u32, Gpu>,
    /// Task id → its GPU.
    of: BTreeMap<String, u32>,
    controller: ControllerConfig,
}

impl State {
    /// Applies one command; false on Stop.
    fn apply(&mut self, c: Cmd) -> bool {
        match c {
            Cmd::Attach { gpu, id, region } => {
                let controller = self.controller;
                let g = self.gpus.entry(gpu).or_insert_with(|| Gpu {
                    monitor: DeviceMonitor::new(controller),
                    tasks: Vec::new(),
                });
                g.monitor.attach(&id, region, 0);
                g.tasks.retain(|t| t.id != id);
                g.tasks.push(Watched {
                    id: id.clone(),
                    pidns: None,
                });
                self.of.insert(id, gpu);
            }
            Cmd::Running { id, pidns } => {
                if let Some(g) = self.of.get(&id).and_then(|g| self.gpus.get_mut(g)) {
                    for t in g.tasks.iter_mut().filter(|t| t.id == id) {
                        t.pidns = pidns;
                    }
                }
            }
            Cmd::Detach { id } => {
                if let Some(gpu) = self.of.remove(&id) {
                    let empty = match self.gpus.get_mut(&gpu) {
                        Some(g) => {
                            g.monitor.detach(&id);
                            g.tasks.retain(|t| t.id != id);
                            g.tasks.is_empty()
                        }
                        None => false,
                    };
                    if empty {
                        // A GPU without fractional tasks is not ticked; a new
                        // task there starts from a fresh controller.
                        self.gpus.remove(&gpu);
                    }
                }
            }
            Cmd::Stop => return false,
        }
        true
    }
}

fn run(
    cfg: MonitorConfig,
    rx: mpsc::Receiver<Cmd>,
    stats: std::sync::Arc<std::sync::Mutex<MonitorStats>>,
) {
    let MonitorConfig {
        clock,
        mut utilisation,
        controller,
    } = cfg;
    let tick = controller.tick_ns.max(1);
    let mut st = State {
        gpus: BTreeMap::new(),
        of: BTreeMap::new(),
        controller,
    };
    let mut next: Option<u64> = None;
    loop {
        // Commands first; with nothing to tick, wait for one.
        loop {
            let c = if st.gpus.is_empty() {
                next = None;
                clock.idle();
                match rx.recv() {
                    Ok(c) => c,
                    Err(_) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(c) => c,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            };
            if !st.apply(c) {
                clock.idle();
                return;
            }
        }
        let at = next.unwrap_or_else(|| clock.now_ns());
        clock.sleep_until(at);
        let now = clock.now_ns();
        next = Some(at.max(now.saturating_sub(tick)) + tick);
        let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
        s.ticks += 1;
        for (&gpu, g) in st.gpus.iter_mut() {
            let busy = match utilisation.busy(gpu, &g.tasks) {
                Ok(b) => b,
                Err(e) => {
                    // Ticked with nothing measured: the buckets refill (work
                    // conserving), launches are not held on a broken source.
                    s.errors += 1;
                    let msg = format!("GPU {gpu}: {e}");
                    if s.last_error.as_deref() != Some(msg.as_str()) {
                        // Said once per distinct error, not every tick.
                        eprintln!(
                            "tessera-node: compute monitor: {msg}; compute shares there are not enforced while this lasts"
                        );
                    }
                    s.last_error = Some(msg);
                    BTreeMap::new()
                }
            };
            g.monitor.tick(now, &busy);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tessera_gpushare::region::{ComputePolicy, DeviceConfig, RegionConfig};

    /// A clock that moves only when the monitor sleeps.
    #[derive(Clone, Default)]
    struct Sim(Arc<Mutex<u64>>);
    impl MonitorClock for Sim {
        fn now_ns(&self) -> u64 {
            *self.0.lock().unwrap()
        }
        fn sleep_until(&self, t: u64) {
            let mut n = self.0.lock().unwrap();
            *n = (*n).max(t);
            drop(n);
            std::thread::yield_now();
        }
    }

    /// Each task busy the whole tick; records what it was asked.
    type Asked = Vec<(u32, Vec<Watched>)>;
    #[derive(Clone, Default)]
    struct Busy(Arc<Mutex<Asked>>);
    impl Utilisation for Busy {
        fn busy(&mut self, gpu: u32, t: &[Watched]) -> Result<BTreeMap<String, u64>, String> {
            self.0.lock().unwrap().push((gpu, t.to_vec()));
            Ok(t.iter().map(|w| (w.id.clone(), 1_000_000)).collect())
        }
    }

    fn region(dir: &std::path::Path, id: &str, milli: u32) -> Region {
        Region::create(
            &dir.join(format!("{id}.region")),
            &RegionConfig {
                task: id.into(),
                devices: vec![DeviceConfig {
                    memory_limit: 1 << 30,
                    compute_milli: milli,
                }],
                memory_wait: Duration::ZERO,
                policy: ComputePolicy::WorkConserving,
            },
        )
        .unwrap()
    }

    #[test]
    fn ticks_only_gpus_with_tasks_and_stops_on_drop() {
        let d = tempfile::tempdir().unwrap();
        let util = Busy::default();
        let m = ComputeMonitor::start(MonitorConfig {
            clock: Box::new(Sim::default()),
            utilisation: Box::new(util.clone()),
            controller: ControllerConfig {
                tick_ns: 1_000_000,
                ..ControllerConfig::default()
            },
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(m.stats().ticks, 0, "idle without tasks");
        let r = region(d.path(), "a", 300);
        m.attach(1, "a", r.clone());
        m.running("a", Some(42));
        let until = |f: &dyn Fn() -> bool| {
            for _ in 0..500 {
                if f() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            panic!("timed out");
        };
        until(&|| m.stats().ticks > 10);
        // The region is ticked: its heartbeat moved.
        assert!(
            r.header()
                .heartbeat_ns
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
        m.detach("a");
        until(&|| {
            let before = m.stats().ticks;
            std::thread::sleep(Duration::from_millis(10));
            m.stats().ticks == before
        });
        let asked = util.0.lock().unwrap().clone();
        assert!(asked.iter().all(|(g, _)| *g == 1));
        assert!(asked.iter().any(|(_, t)| t
            == &[Watched {
                id: "a".into(),
                pidns: Some(42)
            }]));
        drop(m); // joins; a hang here fails the test by timeout
    }
}

//! cgroups v1 and v2 behind one trait, chosen at run time.
//!
//! v1 (this machine): one directory per controller (`memory`, `cpu`, `pids`, `freezer`),
//! nested under the calling process's own cgroup in each hierarchy, in `tessera/<id>`.
//! v2: one directory `/sys/fs/cgroup/tessera/<id>` with the controllers enabled above it.

use crate::error::CgroupError;
use crate::spec::{DeviceRule, Limits};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A backend that can make cgroups for sandboxes.
pub trait CgroupManager: Send + Sync + std::fmt::Debug {
    /// `v1` or `v2`.
    fn version(&self) -> &'static str;
    /// Creates the cgroup `id` with `limits`.
    fn create(&self, id: &str, limits: &Limits) -> Result<Box<dyn SandboxCgroup>, CgroupError>;
    /// Creates the cgroup `id` with `limits`, and with `devices` (when `Some`) as the
    /// only devices its processes may open beyond [`DeviceRule::BASE`]. A backend that
    /// cannot fence devices makes the cgroup without (the default; v2, where it takes
    /// an eBPF program); [`CgroupManager::fences_devices`] says which.
    fn create_fenced(
        &self,
        id: &str,
        limits: &Limits,
        devices: Option<&[DeviceRule]>,
    ) -> Result<Box<dyn SandboxCgroup>, CgroupError> {
        let _ = devices;
        self.create(id, limits)
    }
    /// Whether [`CgroupManager::create_fenced`] applies its device list.
    fn fences_devices(&self) -> bool {
        false
    }
    /// Paths of sandbox cgroups that exist now (for leak checks).
    fn list(&self) -> Vec<String>;

    /// Removes cgroups left by supervisors that died (their ids are `sb-<pid>-<n>` and
    /// `<pid>` is gone). Returns how many were removed.
    fn remove_stale(&self) -> usize {
        let stale: Vec<String> = self
            .list()
            .into_iter()
            .filter(|p| {
                supervisor_of(Path::new(p))
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            })
            .collect();
        stale.iter().for_each(|p| kill_and_thaw(Path::new(p)));
        stale
            .iter()
            .filter(|p| kill_and_remove(Path::new(p), Duration::from_secs(2)))
            .count()
    }

    /// Kills every process in the cgroups of supervisor `pid` (thawing frozen ones) and
    /// removes those cgroups: what the reaper does when a supervisor dies without
    /// destroying its sandboxes. Returns how many cgroup directories were removed.
    fn reap_supervisor(&self, pid: u32) -> usize {
        let mine: Vec<String> = self
            .list()
            .into_iter()
            .filter(|p| supervisor_of(Path::new(p)) == Some(pid))
            .collect();
        mine.iter().for_each(|p| kill_and_thaw(Path::new(p)));
        mine.iter()
            .filter(|p| kill_and_remove(Path::new(p), Duration::from_secs(120)))
            .count()
    }
}

/// The supervisor pid in a sandbox cgroup's name (`sb-<pid>-<n>`).
fn supervisor_of(path: &Path) -> Option<u32> {
    path.file_name()?
        .to_str()?
        .strip_prefix("sb-")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Sends SIGKILL to every process in the cgroup directory `dir` and thaws it (frozen
/// tasks die only once thawed; on v1 the freezer is another directory, so callers kill
/// and thaw all of a sandbox's directories before waiting on any).
fn kill_and_thaw(dir: &Path) {
    // v2 kills the whole subtree at once where the kernel has cgroup.kill.
    let _ = fs::write(dir.join("cgroup.kill"), "1");
    for p in read_pids(&dir.join("cgroup.procs")) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = fs::write(dir.join("freezer.state"), "THAWED");
    let _ = fs::write(dir.join("cgroup.freeze"), "0");
}

/// Kills what is in the cgroup directory `dir` (v1 or v2: whichever control files it
/// has), thaws it so that the kills land, waits for it to empty and removes it, trying
/// for at most `patience`.
pub fn kill_and_remove(dir: &Path, patience: Duration) -> bool {
    let deadline = std::time::Instant::now() + patience;
    loop {
        kill_and_thaw(dir);
        match fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return false,
        }
    }
}

/// One sandbox's cgroup.
pub trait SandboxCgroup: Send + Sync + std::fmt::Debug {
    /// Moves a process (host pid) into the cgroup.
    fn attach(&self, pid: i32) -> Result<(), CgroupError>;
    /// How many times the OOM killer has killed a process here.
    fn oom_kills(&self) -> u64;
    /// Current memory use in bytes.
    fn memory_current(&self) -> Option<u64>;
    /// Freezes (`true`) or thaws every process.
    fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError>;
    /// Host pids of the processes inside.
    fn procs(&self) -> Vec<i32>;
    /// Removes the cgroup; fails with `Busy` while processes remain.
    fn destroy(&self) -> Result<(), CgroupError>;
    /// CPU time its processes used so far (user + system), in nanoseconds, where the
    /// backend accounts it (v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`).
    fn cpu_usage_ns(&self) -> Option<u64> {
        None
    }
    /// The most memory in use at once since the cgroup was made, in bytes (v1
    /// `memory.max_usage_in_bytes`, v2 `memory.peak` on kernels that have it).
    fn memory_peak(&self) -> Option<u64> {
        None
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `usage_usec` from the text of a v2 `cpu.stat`, in nanoseconds.
pub fn parse_cpu_stat_ns(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us.saturating_mul(1000))
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(io_err("write", path))
}

fn rmdir_retry(path: &Path) -> Result<(), CgroupError> {
    // A cgroup whose last task just exited can answer EBUSY for a moment.
    let mut delay = Duration::from_micros(50);
    for _ in 0..40 {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(io_err("rmdir", path)(e)),
        }
    }
    Err(CgroupError::Busy {
        path: path.display().to_string(),
    })
}

fn read_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Picks the backend this host supports: v2 when the unified hierarchy has the memory
/// and pids controllers, else v1 when its memory, pids and freezer hierarchies exist.
/// Returns `None` when neither works (for instance when not root).
pub fn detect() -> Option<Box<dyn CgroupManager>> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    if let Some(v2) = CgroupV2::detect(&mounts) {
        return Some(Box::new(v2));
    }
    CgroupV1::detect(&mounts, &own).map(|v| Box::new(v) as Box<dyn CgroupManager>)
}

/// Mount points from mountinfo: (fstype, super options, mount point).
fn cgroup_mounts(mountinfo: &str) -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mp = left.split(' ').nth(4);
        let mut r = right.split(' ');
        let (Some(fstype), Some(_src), Some(opts)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        if let Some(mp) = mp
            && (fstype == "cgroup" || fstype == "cgroup2")
        {
            out.push((fstype.to_string(), opts.to_string(), PathBuf::from(mp)));
        }
    }
    out
}

// ---------------------------------------------------------------- v1

/// cgroup v1: a directory per controller.
#[derive(Debug, Clone)]
pub struct CgroupV1 {
    /// `<hierarchy mount>/<own cgroup>/tessera` for memory, cpu, pids, freezer.
    memory: PathBuf,
    cpu: Option<PathBuf>,
    pids: PathBuf,
    freezer: PathBuf,
    /// cpuacct when it is a hierarchy of its own (when it shares `cpu`'s, usage is
    /// read from the cpu folder).
    cpuacct: Option<PathBuf>,
    /// The devices controller, for sandboxes made with a device list.
    devices: Option<PathBuf>,
}

impl CgroupV1 {
    fn detect(mountinfo: &str, own: &str) -> Option<Self> {
        let mounts = cgroup_mounts(mountinfo);
        let find = |ctrl: &str| -> Option<PathBuf> {
            let (_, _, mp) = mounts
                .iter()
                .find(|(t, opts, _)| t == "cgroup" && opts.split(',').any(|o| o == ctrl))?;
            // Our own place in that hierarchy.
            let rel = own.lines().find_map(|l| {
                let mut it = l.splitn(3, ':');
                let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
                ctrls
                    .split(',')
                    .any(|c| c == ctrl)
                    .then(|| path.to_string())
            })?;
            let base = mp.join(rel.trim_start_matches('/')).join("tessera");
            Some(base)
        };
        let cpu = find("cpu");
        let mut v = CgroupV1 {
            memory: find("memory")?,
            cpuacct: find("cpuacct").filter(|a| Some(a) != cpu.as_ref()),
            cpu,
            pids: find("pids")?,
            freezer: find("freezer")?,
            devices: find("devices"),
        };
        for p in [&v.memory, &v.pids, &v.freezer]
            .into_iter()
            .chain(v.cpu.as_ref())
        {
            if fs::create_dir_all(p).is_err() {
                return None;
            }
        }
        // Optional controllers: without them, no CPU accounting or device fence.
        for opt in [&mut v.cpuacct, &mut v.devices] {
            if opt.as_ref().is_some_and(|p| fs::create_dir_all(p).is_err()) {
                *opt = None;
            }
        }
        Some(v)
    }
}

impl CgroupManager for CgroupV1 {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn create(&self, id: &str, limits: &Limits) -> Result<Box<dyn SandboxCgroup>, CgroupError> {
        self.create_fenced(id, limits, None)
    }

    fn fences_devices(&self) -> bool {
        self.devices.is_some()
    }

    fn create_fenced(
        &self,
        id: &str,
        limits: &Limits,
        devices: Option<&[DeviceRule]>,
    ) -> Result<Box<dyn SandboxCgroup>, CgroupError> {
        let mut cg = V1Cgroup {
            dirs: Vec::new(),
            memory: self.memory.join(id),
            freezer: self.freezer.join(id),
            cpuacct: self
                .cpuacct
                .as_ref()
                .or(self.cpu.as_ref())
                .map(|c| c.join(id)),
        };
        let mut dirs = vec![
            self.memory.join(id),
            self.pids.join(id),
            self.freezer.join(id),
        ];
        if let Some(c) = &self.cpu {
            dirs.push(c.join(id));
        }
        if let Some(c) = &self.cpuacct {
            dirs.push(c.join(id));
        }
        let fence = match (devices, &self.devices) {
            (Some(list), Some(d)) => {
                dirs.push(d.join(id));
                Some((list, d.join(id)))
            }
            _ => None,
        };
        for d in &dirs {
            match fs::create_dir(d) {
                Ok(()) => cg.dirs.push(d.clone()),
                Err(e) => {
                    let _ = cg.destroy();
                    return Err(io_err("mkdir", d)(e));
                }
            }
        }
        let r = (|| {
            if let Some(m) = limits.memory_bytes {
                write(&cg.memory.join("memory.limit_in_bytes"), &m.to_string())?;
                let sw = cg.memory.join("memory.memsw.limit_in_bytes");
                if sw.exists() {
                    write(&sw, &m.to_string())?;
                }
            }
            if let Some(p) = limits.pids {
                write(&self.pids.join(id).join("pids.max"), &p.to_string())?;
            }
            if let (Some(c), Some(cpu)) = (limits.cpu_millis, &self.cpu) {
                let d = cpu.join(id);
                write(&d.join("cpu.cfs_period_us"), "100000")?;
                write(
                    &d.join("cpu.cfs_quota_us"),
                    &(u64::from(c.max(1)) * 100).to_string(),
                )?;
            }
            if let Some((list, dir)) = &fence {
                write(&dir.join("devices.deny"), "a")?;
                for r in DeviceRule::BASE.iter().chain(list.iter()) {
                    write(&dir.join("devices.allow"), &r.allow_line())?;
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            let _ = cg.destroy();
            return Err(e);
        }
        Ok(Box::new(cg))
    }

    fn list(&self) -> Vec<String> {
        let mut out = Vec::new();
        for base in [&self.memory, &self.pids, &self.freezer]
            .into_iter()
            .chain(self.cpu.as_ref())
            .chain(self.cpuacct.as_ref())
            .chain(self.devices.as_ref())
        {
            if let Ok(rd) = fs::read_dir(base) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        out.push(format!("{}", e.path().display()));
                    }
                }
            }
        }
        out.sort();
        out
    }
}

#[derive(Debug)]
struct V1Cgroup {
    dirs: Vec<PathBuf>,
    memory: PathBuf,
    freezer: PathBuf,
    /// Where `cpuacct.usage` is (cpuacct's own folder, or cpu's when they share one).
    cpuacct: Option<PathBuf>,
}

impl SandboxCgroup for V1Cgroup {
    fn attach(&self, pid: i32) -> Result<(), CgroupError> {
        let s = pid.to_string();
        for d in &self.dirs {
            write(&d.join("cgroup.procs"), &s)?;
        }
        Ok(())
    }

    fn oom_kills(&self) -> u64 {
        parse_oom_kills(
            &fs::read_to_string(self.memory.join("memory.oom_control")).unwrap_or_default(),
        )
    }

    fn memory_current(&self) -> Option<u64> {
        fs::read_to_string(self.memory.join("memory.usage_in_bytes"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError> {
        let want = if frozen { "FROZEN" } else { "THAWED" };
        let state = self.freezer.join("freezer.state");
        write(&state, want)?;
        // v1 freezing is asynchronous (FREEZING -> FROZEN).
        for _ in 0..2000 {
            let now = fs::read_to_string(&state).map_err(io_err("read", &state))?;
            if now.trim() == want {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
            write(&state, want)?;
        }
        Err(CgroupError::Busy {
            path: state.display().to_string(),
        })
    }

    fn procs(&self) -> Vec<i32> {
        read_pids(&self.memory.join("cgroup.procs"))
    }

    fn cpu_usage_ns(&self) -> Option<u64> {
        read_u64(&self.cpuacct.as_ref()?.join("cpuacct.usage"))
    }

    fn memory_peak(&self) -> Option<u64> {
        read_u64(&self.memory.join("memory.max_usage_in_bytes"))
    }

    fn destroy(&self) -> Result<(), CgroupError> {
        let mut first = Ok(());
        for d in &self.dirs {
            if let Err(e) = rmdir_retry(d)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

// ---------------------------------------------------------------- v2

/// cgroup v2: one unified directory.
#[derive(Debug, Clone)]
pub struct CgroupV2 {
    base: PathBuf,
}

/// What the v2 backend writes into a new cgroup for `limits`, in order: `(file, value)`.
/// `swap`: the kernel has `memory.swap.max` (then swap is off, so the memory limit
/// covers everything); `cpu`: the cpu controller is enabled (`cpu.max`). Pure, so that
/// what v2 does can be checked on a v1 host.
pub fn v2_settings(limits: &Limits, swap: bool, cpu: bool) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(m) = limits.memory_bytes {
        out.push(("memory.max", m.to_string()));
        if swap {
            out.push(("memory.swap.max", "0".to_string()));
        }
    }
    if let Some(p) = limits.pids {
        out.push(("pids.max", p.to_string()));
    }
    if let (Some(c), true) = (limits.cpu_millis, cpu) {
        out.push(("cpu.max", format!("{} 100000", u64::from(c.max(1)) * 100)));
    }
    out
}

/// Reads the `oom_kill` count from the text of a v2 `memory.events` (or a v1
/// `memory.oom_control`, which has the same line).
pub fn parse_oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

impl CgroupV2 {
    /// A v2 backend whose sandbox cgroups are made in `base` (made if missing), a
    /// folder of a cgroup2 hierarchy, enabling there whichever of the memory, pids and
    /// cpu controllers its parent offers. For hierarchies mounted somewhere else than
    /// where [`detect`] looks, and for tests. Limits whose controller is missing fail
    /// at create (they are never silently dropped).
    pub fn at(base: PathBuf) -> Result<Self, CgroupError> {
        fs::create_dir_all(&base).map_err(io_err("mkdir", &base))?;
        let offered = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
        let want: Vec<String> = ["memory", "pids", "cpu"]
            .iter()
            .filter(|c| offered.split_whitespace().any(|o| o == **c))
            .map(|c| format!("+{c}"))
            .collect();
        if !want.is_empty() {
            write(&base.join("cgroup.subtree_control"), &want.join(" "))?;
        }
        Ok(CgroupV2 { base })
    }

    /// The folder sandbox cgroups are made in.
    pub fn base(&self) -> &Path {
        &self.base
    }

    fn detect(mountinfo: &str) -> Option<Self> {
        let mounts = cgroup_mounts(mountinfo);
        let (_, _, root) = mounts.iter().find(|(t, _, _)| t == "cgroup2")?;
        let ctrls = fs::read_to_string(root.join("cgroup.controllers")).ok()?;
        let have: Vec<&str> = ctrls.split_whitespace().collect();
        if !(have.contains(&"memory") && have.contains(&"pids")) {
            return None;
        }
        let base = root.join("tessera");
        // Enable controllers for children of the root and of `tessera`.
        let want: Vec<String> = ["memory", "pids", "cpu"]
            .iter()
            .filter(|c| have.contains(c))
            .map(|c| format!("+{c}"))
            .collect();
        let _ = fs::write(root.join("cgroup.subtree_control"), want.join(" "));
        fs::create_dir_all(&base).ok()?;
        fs::write(base.join("cgroup.subtree_control"), want.join(" ")).ok()?;
        Some(CgroupV2 { base })
    }
}

impl CgroupManager for CgroupV2 {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn create(&self, id: &str, limits: &Limits) -> Result<Box<dyn SandboxCgroup>, CgroupError> {
        let dir = self.base.join(id);
        fs::create_dir(&dir).map_err(io_err("mkdir", &dir))?;
        let cg = V2Cgroup { dir };
        let swap = cg.dir.join("memory.swap.max").exists();
        let cpu = cg.dir.join("cpu.max").exists();
        let r = v2_settings(limits, swap, cpu)
            .into_iter()
            .try_for_each(|(file, value)| write(&cg.dir.join(file), &value));
        if let Err(e) = r {
            let _ = cg.destroy();
            return Err(e);
        }
        Ok(Box::new(cg))
    }

    fn list(&self) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(&self.base)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.path().display().to_string())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }
}

#[derive(Debug)]
struct V2Cgroup {
    dir: PathBuf,
}

impl SandboxCgroup for V2Cgroup {
    fn attach(&self, pid: i32) -> Result<(), CgroupError> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    fn oom_kills(&self) -> u64 {
        parse_oom_kills(&fs::read_to_string(self.dir.join("memory.events")).unwrap_or_default())
    }

    fn memory_current(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join("memory.current"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError> {
        write(
            &self.dir.join("cgroup.freeze"),
            if frozen { "1" } else { "0" },
        )?;
        let events = self.dir.join("cgroup.events");
        let want = if frozen { "frozen 1" } else { "frozen 0" };
        for _ in 0..2000 {
            let s = fs::read_to_string(&events).map_err(io_err("read", &events))?;
            if s.lines().any(|l| l.trim() == want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Err(CgroupError::Busy {
            path: events.display().to_string(),
        })
    }

    fn procs(&self) -> Vec<i32> {
        read_pids(&self.dir.join("cgroup.procs"))
    }

    fn cpu_usage_ns(&self) -> Option<u64> {
        parse_cpu_stat_ns(&fs::read_to_string(self.dir.join("cpu.stat")).ok()?)
    }

    fn memory_peak(&self) -> Option<u64> {
        read_u64(&self.dir.join("memory.peak"))
    }

    fn destroy(&self) -> Result<(), CgroupError> {
        rmdir_retry(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing_finds_cgroup_mounts() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                  32 25 0:28 / /proc rw - proc proc rw\n";
        let m = cgroup_mounts(mi);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].2, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(m[1].0, "cgroup2");
    }

    /// What the v2 backend writes, for each kind of limit (the v1 host here cannot show
    /// it on a real hierarchy: its memory, cpu and pids controllers are bound to v1).
    #[test]
    fn v2_writes_memory_swap_pids_and_cpu() {
        let all = Limits {
            memory_bytes: Some(256 << 20),
            cpu_millis: Some(500),
            pids: Some(64),
            disk_bytes: 0,
        };
        let show = |v: Vec<(&str, String)>| {
            v.iter()
                .map(|(f, x)| format!("{f}={x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            show(v2_settings(&all, true, true)),
            "memory.max=268435456 memory.swap.max=0 pids.max=64 cpu.max=50000 100000"
        );
        // No swap accounting: only memory.max; no cpu controller: no cpu.max.
        assert_eq!(
            show(v2_settings(&all, false, false)),
            "memory.max=268435456 pids.max=64"
        );
        // A tiny CPU share is at least 0.1 % of a period, never 0 (which would be
        // refused by the kernel).
        let tiny = Limits {
            cpu_millis: Some(0),
            ..all
        };
        assert!(show(v2_settings(&tiny, false, true)).ends_with("cpu.max=100 100000"));
        let none = Limits {
            memory_bytes: None,
            cpu_millis: None,
            pids: None,
            disk_bytes: 0,
        };
        assert!(v2_settings(&none, true, true).is_empty());
    }

    #[test]
    fn cpu_usage_is_read_from_cpu_stat() {
        let stat = "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n";
        assert_eq!(parse_cpu_stat_ns(stat), Some(1_500_000_000));
        assert_eq!(parse_cpu_stat_ns("user_usec 3\n"), None);
        assert_eq!(
            DeviceRule {
                major: 195,
                minor: 255
            }
            .allow_line(),
            "c 195:255 rwm"
        );
    }

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(events), 2);
        assert_eq!(parse_oom_kills("oom_group_kill 5\n"), 0);
        assert_eq!(parse_oom_kills(""), 0);
        // v1's memory.oom_control has the same line.
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"),
            7
        );
    }

    /// The v2 backend against a fake cgroupfs (a plain folder): the files it writes and
    /// reads, end to end through the trait.
    #[test]
    fn v2_backend_on_a_fake_cgroupfs() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("cgroup");
        fs::create_dir(&root).unwrap();
        // detect: v2 only when memory and pids are offered.
        let mi = format!(
            "41 31 0:38 / {} rw,relatime - cgroup2 cgroup2 rw\n",
            root.display()
        );
        fs::write(root.join("cgroup.controllers"), "hugetlb\n").unwrap();
        assert!(CgroupV2::detect(&mi).is_none());
        fs::write(
            root.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        let m = CgroupV2::detect(&mi).expect("v2 with memory and pids");
        assert_eq!(m.base(), root.join("tessera"));
        for dir in [&root, &root.join("tessera")] {
            assert_eq!(
                fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
                "+memory +pids +cpu"
            );
        }
        // at: enables what the parent offers, nothing when it offers nothing.
        let base = root.join("other");
        fs::create_dir(&base).unwrap();
        fs::write(base.join("cgroup.controllers"), "pids\n").unwrap();
        CgroupV2::at(base.clone()).unwrap();
        assert_eq!(
            fs::read_to_string(base.join("cgroup.subtree_control")).unwrap(),
            "+pids"
        );

        let cg = m.create("sb-1-0", &Limits::default()).unwrap();
        let dir = root.join("tessera/sb-1-0");
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("memory.max"), (512u64 << 20).to_string());
        assert_eq!(read("pids.max"), "256");
        // A plain folder has no cpu.max or memory.swap.max: neither is written.
        assert!(!dir.join("cpu.max").exists() && !dir.join("memory.swap.max").exists());
        assert_eq!(m.list(), [dir.display().to_string()]);

        cg.attach(4242).unwrap();
        assert_eq!(read("cgroup.procs"), "4242");
        assert_eq!(cg.procs(), [4242]);

        fs::write(dir.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        assert_eq!(cg.oom_kills(), 1);
        fs::write(dir.join("memory.current"), "1048576\n").unwrap();
        assert_eq!(cg.memory_current(), Some(1 << 20));

        // Freezing writes cgroup.freeze and waits for cgroup.events to confirm.
        fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        cg.set_frozen(true).unwrap();
        assert_eq!(read("cgroup.freeze"), "1");
        let e = cg.set_frozen(false).unwrap_err();
        assert!(matches!(e, CgroupError::Busy { .. }), "{e}");
        assert_eq!(read("cgroup.freeze"), "0");
        fs::write(dir.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        cg.set_frozen(false).unwrap();

        // Kill writes cgroup.kill; remove (rmdir) fails on a plain folder with files in
        // it, and works once it is empty, as on cgroupfs once the processes are gone.
        kill_and_thaw(&dir);
        assert_eq!(read("cgroup.kill"), "1");
        assert!(cg.destroy().is_err());
        for e in fs::read_dir(&dir).unwrap().flatten() {
            fs::remove_file(e.path()).unwrap();
        }
        cg.destroy().unwrap();
        assert!(m.list().is_empty());
    }
}

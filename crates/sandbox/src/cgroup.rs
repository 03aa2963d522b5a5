//! cgroups v1 and v2 behind one trait, chosen at run time.
//!
//! v1 (this machine): one directory per controller (`memory`, `cpu`, `pids`, `freezer`),
//! nested under the calling process's own cgroup in each hierarchy, in `tessera/<id>`.
//! v2: one directory `/sys/fs/cgroup/tessera/<id>` with the controllers enabled above it.

use crate::error::CgroupError;
use crate::spec::Limits;
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
        let v = CgroupV1 {
            memory: find("memory")?,
            cpu: find("cpu"),
            pids: find("pids")?,
            freezer: find("freezer")?,
        };
        for p in [&v.memory, &v.pids, &v.freezer]
            .into_iter()
            .chain(v.cpu.as_ref())
        {
            if fs::create_dir_all(p).is_err() {
                return None;
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
        let mut cg = V1Cgroup {
            dirs: Vec::new(),
            memory: self.memory.join(id),
            freezer: self.freezer.join(id),
        };
        let mut dirs = vec![
            self.memory.join(id),
            self.pids.join(id),
            self.freezer.join(id),
        ];
        if let Some(c) = &self.cpu {
            dirs.push(c.join(id));
        }
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
        let s = fs::read_to_string(self.memory.join("memory.oom_control")).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
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

impl CgroupV2 {
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
        let r = (|| {
            if let Some(m) = limits.memory_bytes {
                write(&cg.dir.join("memory.max"), &m.to_string())?;
                let sw = cg.dir.join("memory.swap.max");
                if sw.exists() {
                    write(&sw, "0")?;
                }
            }
            if let Some(p) = limits.pids {
                write(&cg.dir.join("pids.max"), &p.to_string())?;
            }
            if let Some(c) = limits.cpu_millis {
                let f = cg.dir.join("cpu.max");
                if f.exists() {
                    write(&f, &format!("{} 100000", u64::from(c.max(1)) * 100))?;
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
        let s = fs::read_to_string(self.dir.join("memory.events")).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
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
}

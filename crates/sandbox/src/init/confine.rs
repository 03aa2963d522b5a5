//! The job process's confinement: the Landlock ruleset (built at setup), rlimits, the
//! unprivileged user, no capabilities, no_new_privs.

use crate::error::StepError;
use crate::proto::Job;
use crate::spec::{SandboxSpec, Template};
use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope,
};
use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::unistd::{Gid, Uid};
use std::fs;
use std::os::fd::OwnedFd;

use super::exec::run_job;
use super::job::exit_now;
use super::{RESERVED, State, se};

pub(super) fn landlock_ruleset(spec: &SandboxSpec) -> Result<Option<RulesetCreated>, StepError> {
    let abi = ABI::V6;
    let lerr = |what: &str| {
        let what = what.to_string();
        move |e: landlock::RulesetError| StepError::new("landlock", &what, e.to_string())
    };
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(lerr("handle_access"))?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(lerr("scope"))?
        .create()
        .map_err(lerr("create"))?;
    let rule = |rs: RulesetCreated,
                path: &str,
                access: landlock::BitFlags<AccessFs>|
     -> Result<RulesetCreated, StepError> {
        match PathFd::new(path) {
            Ok(fd) => rs
                .add_rule(PathBeneath::new(fd, access))
                .map_err(lerr(path)),
            Err(_) => Ok(rs), // absent in this template
        }
    };
    rs = rule(rs, "/", AccessFs::ReadDir.into())?;
    let mut ro: Vec<String> = vec!["/usr".into(), "/etc".into(), "/proc".into()];
    if let Template::Dir(p) = &spec.template
        && let Ok(rd) = fs::read_dir("/")
    {
        let _ = p;
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if !RESERVED.contains(&n.as_str()) && n != "root" {
                ro.push(format!("/{n}"));
            }
        }
    }
    for p in &ro {
        rs = rule(rs, p, read)?;
    }
    // Sealed folders: read, never execute (and read-only once sealed).
    for p in &spec.sealed {
        rs = rule(rs, p, AccessFs::ReadFile | AccessFs::ReadDir)?;
    }
    rs = rule(
        rs,
        "/dev",
        read | AccessFs::WriteFile | landlock::make_bitflags!(AccessFs::{IoctlDev}),
    )?;
    for p in ["/tmp", "/home/user", "/workspace", "/dev/shm"] {
        rs = rule(rs, p, all)?;
    }
    // What the runtime bound in is reachable as bound: read, and written when writable.
    for b in &spec.binds {
        let mut a = AccessFs::ReadFile | AccessFs::ReadDir;
        if b.writable {
            a |= AccessFs::WriteFile;
        }
        rs = rule(rs, &b.path, a)?;
    }
    for r in &spec.extra_rules {
        let mut a = landlock::BitFlags::<AccessFs>::empty();
        if r.read {
            a |= AccessFs::ReadFile | AccessFs::ReadDir;
        }
        if r.execute {
            a |= AccessFs::Execute;
        }
        if r.write {
            a |= all & !read;
        }
        if !a.is_empty() {
            rs = rule(rs, &r.path, a)?;
        }
    }
    Ok(Some(rs))
}

/// Drops into the confinement, then runs the job. Returns only on failure.
pub(super) fn confine_and_run(
    st: &mut State,
    job: &Job,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    give_listener: Option<OwnedFd>,
) -> StepError {
    match confine(st, job, stdin, stdout, stderr) {
        Err(e) => e,
        Ok(()) => match run_job(st, job, give_listener) {
            Ok(()) => exit_now(0),
            Err(e) => e,
        },
    }
}

fn confine(
    st: &mut State,
    job: &Job,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<(), StepError> {
    nix::unistd::dup2_stdin(&stdin).map_err(se("dup2", "stdin"))?;
    nix::unistd::dup2_stdout(&stdout).map_err(se("dup2", "stdout"))?;
    nix::unistd::dup2_stderr(&stderr).map_err(se("dup2", "stderr"))?;
    drop((stdin, stdout, stderr));
    // Signals: nothing blocked, nothing ignored (init's Rust runtime ignores SIGPIPE).
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(se("sigprocmask", ""))?;
    for sig in [
        Signal::SIGPIPE,
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        // SAFETY: restoring the default disposition installs no Rust handler.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
    }
    nix::unistd::setsid().map_err(se("setsid", ""))?;
    // Prefer the job's processes over init when the OOM killer picks a victim.
    let _ = fs::write("/proc/self/oom_score_adj", "500");
    let rl = &st.rlimits;
    use nix::sys::resource::{Resource, setrlimit};
    for (r, v, name) in [
        (Resource::RLIMIT_NOFILE, rl.nofile, "RLIMIT_NOFILE"),
        (Resource::RLIMIT_CORE, rl.core, "RLIMIT_CORE"),
        (Resource::RLIMIT_STACK, rl.stack, "RLIMIT_STACK"),
    ] {
        setrlimit(r, v, v).map_err(se("setrlimit", name))?;
    }
    if let Some(f) = rl.fsize {
        setrlimit(Resource::RLIMIT_FSIZE, f, f).map_err(se("setrlimit", "RLIMIT_FSIZE"))?;
    }
    // Capabilities: empty the bounding set, then become the unprivileged user (which
    // clears the permitted and effective sets), then clear whatever is left.
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r < 0 && Errno::last() == Errno::EINVAL {
            break;
        }
    }
    let _ = nix::unistd::setgroups(&[]);
    let (u, g) = (Uid::from_raw(st.uid), Gid::from_raw(st.gid));
    nix::unistd::setresgid(g, g, g).map_err(se("setresgid", st.gid.to_string()))?;
    nix::unistd::setresuid(u, u, u).map_err(se("setresuid", st.uid.to_string()))?;
    clear_caps()?;
    nix::sys::prctl::set_no_new_privs().map_err(se("prctl", "PR_SET_NO_NEW_PRIVS"))?;
    if let Some(rs) = st.landlock.take() {
        rs.restrict_self()
            .map_err(|e| StepError::new("landlock_restrict_self", "", e.to_string()))?;
    }
    nix::unistd::chdir(job.cwd.as_str()).map_err(se("chdir", &job.cwd))?;
    Ok(())
}

fn clear_caps() -> Result<(), StepError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let d = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a v3 header and two data structs, which we pass.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) };
    if r < 0 {
        return Err(StepError::new(
            "capset",
            "empty",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    Ok(())
}

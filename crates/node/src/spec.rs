//! What the node runs: one task of a job, as its binding says, and the pure
//! translation of its resources into sandbox limits and of its identity into a
//! clean environment.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tessera_model::Resources;

/// Names one attempt of one task: `tenant/job/task#attempt`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskKey {
    pub tenant: String,
    pub job: String,
    pub task: String,
    /// 0 for the first run; each restart in place counts one more.
    #[serde(default)]
    pub attempt: u32,
}

impl TaskKey {
    pub fn new(
        tenant: impl Into<String>,
        job: impl Into<String>,
        task: impl Into<String>,
        attempt: u32,
    ) -> Self {
        TaskKey {
            tenant: tenant.into(),
            job: job.into(),
            task: task.into(),
            attempt,
        }
    }
}

/// `TENANT/JOB/TASK (attempt N)`, N as the job status and `TESSERA_ATTEMPT` count it
/// (1 for the first run), for messages people read.
impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{} (attempt {})",
            self.tenant,
            self.job,
            self.task,
            self.attempt + 1
        )
    }
}

/// The root filesystem a task sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TemplateRef {
    /// The host's `/usr`, `/bin`, `/sbin`, `/lib*` read-only with a generated
    /// `/etc` (no `/etc/shadow`, no `/home`, `/root`, `/var` or data folder): the
    /// default for batch jobs.
    Host,
    /// A registered template's root folder, resolved by the server from a name
    /// (never a path a tenant gave).
    Dir(PathBuf),
}

/// Limits above the requests, Kubernetes-style (`resources.limits`): each `None`
/// takes the request (or the node's default where the request is zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskLimits {
    /// Milli-CPU the task's CPU quota allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_milli: Option<u64>,
    /// Bytes of memory (the cgroup's limit: above it the OOM killer acts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Processes and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// Bytes of each writable folder (`/tmp`, `/workspace`, `/home/user`; memory-backed
    /// and counted against the memory limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<u64>,
}

/// The node's defaults for a task that asks for nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defaults {
    /// Memory limit of a task that requests no memory and sets no limit.
    pub memory: u64,
    /// The smallest memory limit a task gets, whatever it asks: the sandbox's own
    /// init and the command's start need this much (a smaller limit could only fail).
    pub min_memory: u64,
    pub pids: u32,
    pub disk: u64,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            memory: 1 << 30,
            min_memory: 16 << 20,
            pids: 4096,
            disk: 512 << 20,
        }
    }
}

/// A limit below its request (refused, as Kubernetes does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "limits.{field}: {limit} is below the request {request}; a limit must be at least the request"
)]
pub struct LimitError {
    pub field: &'static str,
    pub limit: u64,
    pub request: u64,
}

/// The sandbox limits of a task: memory and CPU quota from the limit, else the
/// request, else (memory only) the node's default, and memory never below the
/// node's floor ([`Defaults::min_memory`]); pids and disk from the limit,
/// else the default. CPU without a request or a limit is not capped (it is
/// compressible; memory is not). Pure.
pub fn sandbox_limits(
    requests: &Resources,
    limits: &TaskLimits,
    defaults: &Defaults,
) -> Result<tessera_sandbox::Limits, LimitError> {
    let check = |field, limit: Option<u64>, request: u64| match limit {
        Some(l) if l < request => Err(LimitError {
            field,
            limit: l,
            request,
        }),
        _ => Ok(()),
    };
    check("cpu_milli", limits.cpu_milli, requests.cpu_milli)?;
    check("memory", limits.memory, requests.memory)?;
    let nonzero = |v: u64| (v > 0).then_some(v);
    let memory = limits
        .memory
        .or(nonzero(requests.memory))
        .unwrap_or(defaults.memory)
        .max(defaults.min_memory);
    let cpu = limits.cpu_milli.or(nonzero(requests.cpu_milli));
    Ok(tessera_sandbox::Limits {
        memory_bytes: Some(memory),
        cpu_millis: cpu.map(|c| c.min(u64::from(u32::MAX)) as u32),
        pids: Some(limits.pids.unwrap_or(defaults.pids)),
        disk_bytes: limits.disk.unwrap_or(defaults.disk),
    })
}

/// Environment variable names a task may not set: Tessera's own and the GPU
/// visibility the node decides.
pub fn reserved_env(name: &str) -> bool {
    name.starts_with("TESSERA_")
        || name == "CUDA_VISIBLE_DEVICES"
        || name == "NVIDIA_VISIBLE_DEVICES"
}

/// Checks a task's environment: names of `A-Z a-z 0-9 _` not starting with a digit,
/// none reserved, no NUL in values. Returns the first problem, naming the variable.
pub fn check_env(env: &[(String, String)]) -> Result<(), String> {
    for (k, v) in env {
        let ok = !k.is_empty()
            && k.len() <= 256
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(format!(
                "{k:?} is not a variable name: use A-Z, a-z, 0-9 and _, not starting with a digit"
            ));
        }
        if reserved_env(k) {
            return Err(format!(
                "{k} is set by Tessera (TESSERA_*, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES): choose another name"
            ));
        }
        if v.contains('\0') {
            return Err(format!("{k}: the value contains a NUL byte"));
        }
    }
    Ok(())
}

/// A task's environment: Tessera's variables, the GPU variables the fence chose,
/// then the task's own (already checked by [`check_env`]). The sandbox adds only
/// `PATH`, `HOME`, `USER`, `LANG` and `TERM`; nothing of the server's own
/// environment reaches a task.
pub fn task_env(
    key: &TaskKey,
    node: &str,
    gpu_env: &[(String, String)],
    own: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("TESSERA_TENANT".into(), key.tenant.clone()),
        ("TESSERA_JOB".into(), key.job.clone()),
        ("TESSERA_TASK".into(), key.task.clone()),
        // The job status's `attempt`: 1 on the first run (the key counts from 0).
        ("TESSERA_ATTEMPT".into(), (key.attempt + 1).to_string()),
        ("TESSERA_NODE".into(), node.to_string()),
    ];
    env.extend(gpu_env.iter().cloned());
    env.extend(own.iter().filter(|(k, _)| !reserved_env(k)).cloned());
    env
}

/// A host name for the task's UTS namespace: `job-task`, reduced to a valid label.
pub fn hostname(key: &TaskKey) -> String {
    let raw = format!("{}-{}", key.job, key.task);
    let mut s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(63);
    let s = s.trim_matches('-').to_string();
    if s.is_empty() { "task".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn limits_follow_requests_unless_set_higher() {
        let d = Defaults::default();
        let req = Resources::new(500, 64 * MIB);
        let l = sandbox_limits(&req, &TaskLimits::default(), &d).unwrap();
        assert_eq!(l.memory_bytes, Some(64 * MIB));
        assert_eq!(l.cpu_millis, Some(500));
        assert_eq!(l.pids, Some(4096));
        let up = TaskLimits {
            memory: Some(128 * MIB),
            cpu_milli: Some(2000),
            pids: Some(64),
            disk: Some(8 * MIB),
        };
        let l = sandbox_limits(&req, &up, &d).unwrap();
        assert_eq!(
            (l.memory_bytes, l.cpu_millis, l.pids, l.disk_bytes),
            (Some(128 * MIB), Some(2000), Some(64), 8 * MIB)
        );
        // Nothing asked: the default memory, no CPU cap.
        let l = sandbox_limits(&Resources::default(), &TaskLimits::default(), &d).unwrap();
        assert_eq!((l.memory_bytes, l.cpu_millis), (Some(d.memory), None));
        // A limit below the request is refused, naming it.
        let low = TaskLimits {
            memory: Some(MIB),
            ..TaskLimits::default()
        };
        let e = sandbox_limits(&req, &low, &d).unwrap_err();
        assert_eq!(e.field, "memory");
        assert!(e.to_string().contains("limits.memory"), "{e}");
    }

    proptest! {
        /// The memory limit is never below the request and never absent; the CPU
        /// quota is never below the request.
        #[test]
        fn limits_never_below_requests(cpu in 0u64..100_000, mem in 0u64..(64 << 30),
                                       lc in proptest::option::of(0u64..200_000),
                                       lm in proptest::option::of(0u64..(128u64 << 30))) {
            let req = Resources::new(cpu, mem);
            let lim = TaskLimits { cpu_milli: lc, memory: lm, ..TaskLimits::default() };
            match sandbox_limits(&req, &lim, &Defaults::default()) {
                Ok(l) => {
                    prop_assert!(l.memory_bytes.unwrap() >= mem);
                    if cpu > 0 { prop_assert!(u64::from(l.cpu_millis.unwrap()) >= cpu.min(u64::from(u32::MAX))); }
                }
                Err(e) => prop_assert!(lc.is_some_and(|c| c < cpu) || lm.is_some_and(|m| m < mem), "{e}"),
            }
        }
    }

    #[test]
    fn the_environment_is_tesseras_and_the_tasks_only() {
        let key = TaskKey::new("acme", "train", "worker-0", 2);
        let env = task_env(
            &key,
            "node-1",
            &[("CUDA_VISIBLE_DEVICES".into(), "GPU-1".into())],
            &[
                ("EPOCHS".into(), "3".into()),
                ("TESSERA_TENANT".into(), "other".into()),
            ],
        );
        let get = |k: &str| {
            env.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("TESSERA_TENANT"), ["acme"]);
        // Key attempt 2 is the third run, as the job status counts it.
        assert_eq!(get("TESSERA_ATTEMPT"), ["3"]);
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), ["GPU-1"]);
        assert_eq!(get("EPOCHS"), ["3"]);
        assert!(
            !env.iter()
                .any(|(k, _)| k == "TESSERA_API_KEY" || k == "HOME")
        );
        assert!(check_env(&[("EPOCHS".into(), "3".into())]).is_ok());
        for bad in ["TESSERA_X", "CUDA_VISIBLE_DEVICES", "1A", "A-B", ""] {
            assert!(check_env(&[(bad.into(), "v".into())]).is_err(), "{bad}");
        }
        assert_eq!(hostname(&key), "train-worker-0");
    }
}

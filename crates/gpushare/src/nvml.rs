//! Measured device time per process, from NVML's per-process utilisation
//! samples (`nvmlDeviceGetProcessUtilization`). NVML reports host pids, which
//! is why this runs on the node side: the node runtime maps pids to tasks
//! through the tasks' cgroups; inside a sandbox's pid namespace the pids would
//! not match.

use std::collections::BTreeMap;
use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("NVML: {0}")]
    Nvml(#[from] NvmlError),
}

/// One NVML sample: `sm_util` percent of the device's SM time for `pid` over
/// the period ending at `timestamp_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    pub timestamp_us: u64,
    pub sm_util: u32,
}

/// Device time per pid from the samples newer than `last_seen_us`, and the new
/// `last_seen_us`. A sample covers the time since the pid's previous sample in
/// this batch, or since `last_seen_us`. With `last_seen_us == 0` (the first
/// query) the samples only set the baseline: their periods are unknown.
pub fn busy_from_samples(samples: &[Sample], last_seen_us: u64) -> (BTreeMap<u32, u64>, u64) {
    let mut s: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|x| x.timestamp_us > last_seen_us)
        .collect();
    s.sort_by_key(|x| (x.pid, x.timestamp_us));
    let newest = s
        .iter()
        .map(|x| x.timestamp_us)
        .max()
        .unwrap_or(last_seen_us);
    let mut out = BTreeMap::new();
    if last_seen_us == 0 {
        return (out, newest);
    }
    let mut prev: Option<(u32, u64)> = None;
    for x in s {
        let from = match prev {
            Some((p, t)) if p == x.pid => t,
            _ => last_seen_us,
        };
        let ns = (x.timestamp_us - from)
            .saturating_mul(1000)
            .saturating_mul(x.sm_util.min(100) as u64)
            / 100;
        *out.entry(x.pid).or_insert(0) += ns;
        prev = Some((x.pid, x.timestamp_us));
    }
    (out, newest)
}

/// NVML, opened once, with the last sample time seen per device.
pub struct NvmlSampler {
    nvml: Nvml,
    last_seen: BTreeMap<u32, u64>,
}

impl std::fmt::Debug for NvmlSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSampler")
            .field("last_seen", &self.last_seen)
            .finish()
    }
}

impl NvmlSampler {
    /// The system's `libnvidia-ml.so`.
    pub fn open() -> Result<Self, UsageError> {
        Ok(NvmlSampler {
            nvml: Nvml::init()?,
            last_seen: BTreeMap::new(),
        })
    }

    /// A given NVML library (the CI fake).
    pub fn open_library(path: &Path) -> Result<Self, UsageError> {
        Ok(NvmlSampler {
            nvml: Nvml::builder().lib_path(path.as_os_str()).init()?,
            last_seen: BTreeMap::new(),
        })
    }

    /// Device time per host pid on device `index` since the previous call.
    pub fn busy_by_pid(&mut self, index: u32) -> Result<BTreeMap<u32, u64>, UsageError> {
        let dev = self.nvml.device_by_index(index)?;
        let last = self.last_seen.get(&index).copied().unwrap_or(0);
        let samples = match dev.process_utilization_stats(last) {
            Ok(v) => v,
            // No process ran since `last`.
            Err(NvmlError::NotFound) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let samples: Vec<Sample> = samples
            .iter()
            .map(|s| Sample {
                pid: s.pid,
                timestamp_us: s.timestamp,
                sm_util: s.sm_util,
            })
            .collect();
        let (busy, newest) = busy_from_samples(&samples, last);
        self.last_seen.insert(index, newest);
        Ok(busy)
    }
}

/// Sums per-pid device time into per-task device time; `task_of` maps a host pid
/// to its task (the node runtime reads the task's cgroup), pids of no task are
/// dropped.
pub fn busy_by_task(
    by_pid: &BTreeMap<u32, u64>,
    task_of: impl Fn(u32) -> Option<String>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (&pid, &ns) in by_pid {
        if let Some(t) = task_of(pid) {
            *out.entry(t).or_insert(0) += ns;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pid: u32, t: u64, u: u32) -> Sample {
        Sample {
            pid,
            timestamp_us: t,
            sm_util: u,
        }
    }

    #[test]
    fn samples_become_device_time() {
        // First query: baseline only.
        let (b, last) = busy_from_samples(&[s(1, 500, 90)], 0);
        assert!(b.is_empty());
        assert_eq!(last, 500);
        // pid 1: 50% of (500, 1500] then 100% of (1500, 2000]; pid 2: 25% of (500, 2000].
        let (b, last) = busy_from_samples(
            &[
                s(1, 1500, 50),
                s(2, 2000, 25),
                s(1, 2000, 100),
                s(1, 400, 100),
            ],
            500,
        );
        assert_eq!(last, 2000);
        assert_eq!(b[&1], 500_000 + 500_000);
        assert_eq!(b[&2], 375_000);
        // Nothing new: nothing measured, last seen kept.
        let (b, last) = busy_from_samples(&[s(1, 2000, 100)], 2000);
        assert!(b.is_empty() && last == 2000);
    }

    #[test]
    fn pids_fold_into_tasks() {
        let by_pid = BTreeMap::from([(10, 5), (11, 7), (99, 100)]);
        let t = busy_by_task(&by_pid, |p| (p < 50).then(|| "a".to_string()));
        assert_eq!(t, BTreeMap::from([("a".to_string(), 12)]));
    }
}

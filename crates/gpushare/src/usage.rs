//! Per-task usage read from the region: memory used against the cap, compute
//! share used, and the events worth alerting on. For metrics (gauges) and
//! metering (`compute_busy_ns` is the task's GPU time on the device).

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::region::Region;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskUsage {
    pub task: String,
    pub devices: Vec<DeviceUsage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceUsage {
    /// Index of the device among the task's (CUDA ordinal inside the task).
    pub device: usize,
    pub memory_used_bytes: u64,
    pub memory_limit_bytes: u64,
    pub memory_peak_bytes: u64,
    /// Allocations refused over the cap; allocations that waited for memory.
    pub oom_events: u64,
    pub memory_wait_events: u64,
    /// The task's share (milli-GPU; 1000: not sliced).
    pub compute_milli: u32,
    /// What the monitor allows it now, and what it used recently (milli-GPU).
    pub compute_allowance_milli: u32,
    pub compute_used_milli: u32,
    /// Device time used since the task started (ns), as the monitor measured it.
    pub compute_busy_ns: u64,
    /// Launches that waited for the task's compute bucket.
    pub throttle_events: u64,
    /// Times the share could not be enforced and the interposer said so.
    pub unenforced_events: u64,
}

impl Region {
    /// A consistent-enough snapshot (each field is read atomically; fields are
    /// not read together).
    pub fn usage(&self) -> TaskUsage {
        let cfg = self.config();
        let devices = (0..self.device_count())
            .map(|i| {
                let d = &self.header().devices[i];
                let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                DeviceUsage {
                    device: i,
                    memory_used_bytes: l(&d.memory_used),
                    memory_limit_bytes: l(&d.memory_limit),
                    memory_peak_bytes: l(&d.memory_peak),
                    oom_events: l(&d.oom_events),
                    memory_wait_events: l(&d.wait_events),
                    compute_milli: d.compute_milli.load(Ordering::Relaxed),
                    compute_allowance_milli: d.allowance_ppm.load(Ordering::Relaxed) / 1000,
                    compute_used_milli: d.rate_ppm.load(Ordering::Relaxed) / 1000,
                    compute_busy_ns: l(&d.busy_ns),
                    throttle_events: l(&d.throttle_events),
                    unenforced_events: l(&d.unenforced_events),
                }
            })
            .collect();
        TaskUsage {
            task: cfg.task,
            devices,
        }
    }
}

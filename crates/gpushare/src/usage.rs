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

impl TaskUsage {
    /// Device time used, in GPU-seconds (whole-GPU seconds), summed over the
    /// task's devices: the quantity metering prices.
    pub fn gpu_seconds(&self) -> f64 {
        self.devices
            .iter()
            .map(|d| d.compute_busy_ns as f64 / 1e9)
            .sum()
    }

    /// Prometheus text exposition (without HELP/TYPE headers, which the
    /// exporter writes once): one sample per metric, device and task.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let task = self.task.replace('\\', "\\\\").replace('"', "\\\"");
        for d in &self.devices {
            let l = format!("task=\"{task}\",device=\"{}\"", d.device);
            for (name, v) in [
                (
                    "tessera_gpushare_memory_used_bytes",
                    d.memory_used_bytes as f64,
                ),
                (
                    "tessera_gpushare_memory_limit_bytes",
                    d.memory_limit_bytes as f64,
                ),
                (
                    "tessera_gpushare_memory_peak_bytes",
                    d.memory_peak_bytes as f64,
                ),
                ("tessera_gpushare_oom_total", d.oom_events as f64),
                (
                    "tessera_gpushare_memory_waits_total",
                    d.memory_wait_events as f64,
                ),
                (
                    "tessera_gpushare_compute_share_milli",
                    d.compute_milli as f64,
                ),
                (
                    "tessera_gpushare_compute_allowance_milli",
                    d.compute_allowance_milli as f64,
                ),
                (
                    "tessera_gpushare_compute_used_milli",
                    d.compute_used_milli as f64,
                ),
                (
                    "tessera_gpushare_compute_busy_seconds_total",
                    d.compute_busy_ns as f64 / 1e9,
                ),
                (
                    "tessera_gpushare_throttled_launches_total",
                    d.throttle_events as f64,
                ),
                (
                    "tessera_gpushare_unenforced_total",
                    d.unenforced_events as f64,
                ),
            ] {
                out.push_str(&format!("{name}{{{l}}} {v}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::{ComputePolicy, DeviceConfig, RegionConfig};

    #[test]
    fn usage_renders_for_metrics_and_metering() {
        let dir = tempfile::tempdir().unwrap();
        let r = Region::create(
            &dir.path().join("r"),
            &RegionConfig {
                task: "job\"7".into(),
                devices: vec![DeviceConfig {
                    memory_limit: 1 << 30,
                    compute_milli: 400,
                }],
                memory_wait: std::time::Duration::ZERO,
                policy: ComputePolicy::WorkConserving,
            },
        )
        .unwrap();
        r.publish_compute(
            0,
            &crate::region::ComputePublish {
                tokens_ns: 0,
                allowance_ppm: 600_000,
                rate_ppm: 350_000,
                busy_ns: 2_500_000_000,
            },
        );
        let u = r.usage();
        assert_eq!(u.devices[0].compute_used_milli, 350);
        assert!((u.gpu_seconds() - 2.5).abs() < 1e-9);
        let p = u.prometheus();
        assert!(
            p.contains(
                "tessera_gpushare_memory_limit_bytes{task=\"job\\\"7\",device=\"0\"} 1073741824\n"
            ),
            "{p}"
        );
        assert!(
            p.contains(
                "tessera_gpushare_compute_allowance_milli{task=\"job\\\"7\",device=\"0\"} 600\n"
            ),
            "{p}"
        );
        assert_eq!(p.lines().count(), 11);
    }
}

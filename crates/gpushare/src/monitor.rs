//! The compute monitor of one physical GPU, for the node runtime: every tick it
//! takes each fractional task's measured device time (from [`crate::nvml`]),
//! runs the controller ([`crate::share`]) and publishes each task's bucket into
//! its region, waking launches that wait for it.
//!
//! Drive it from one thread per GPU: `tick(now, busy)` every `tick_ns` of the
//! same clock the interposer reads (CLOCK_MONOTONIC, [`crate::monotonic_ns`]).
//! If it stops, throttled launches stop waiting after 100 tick periods and the
//! interposer reports the share as not enforced (loudly, and counted).

use std::collections::BTreeMap;

use crate::region::{ComputePublish, Region};
use crate::share::{Controller, ControllerConfig, Decision};

#[derive(Debug)]
struct Attached {
    region: Region,
    device: usize,
}

#[derive(Debug)]
pub struct DeviceMonitor {
    ctl: Controller,
    tasks: BTreeMap<String, Attached>,
    last_tick: Option<u64>,
}

impl DeviceMonitor {
    pub fn new(cfg: ControllerConfig) -> Self {
        DeviceMonitor {
            ctl: Controller::new(cfg),
            tasks: BTreeMap::new(),
            last_tick: None,
        }
    }

    pub fn tick_ns(&self) -> u64 {
        self.ctl.config().tick_ns
    }

    /// Starts slicing `task`'s share of this GPU, which is device `device` of the
    /// region (its weight and policy are read from the region). A task whose share
    /// is the whole device (1000 milli) is not sliced and needs no monitor.
    pub fn attach(&mut self, task: &str, region: Region, device: usize) {
        let cfg = region.config();
        let milli = cfg
            .devices
            .get(device)
            .map(|d| d.compute_milli)
            .unwrap_or(1000);
        self.ctl.add(task, milli, cfg.policy);
        self.tasks
            .insert(task.to_string(), Attached { region, device });
    }

    /// Stops slicing `task` (it ended; its share goes back to the others).
    pub fn detach(&mut self, task: &str) {
        self.ctl.remove(task);
        self.tasks.remove(task);
    }

    /// One tick at `now_ns`: `busy` is each task's device time since the last
    /// tick. Returns what was decided (for metrics).
    pub fn tick(&mut self, now_ns: u64, busy: &BTreeMap<String, u64>) -> Vec<Decision> {
        let tick = self.tick_ns();
        let dt = match self.last_tick {
            Some(t) => now_ns.saturating_sub(t).max(1),
            None => tick,
        };
        self.last_tick = Some(now_ns);
        let decisions = self.ctl.step(dt, busy);
        for d in &decisions {
            if let Some(a) = self.tasks.get(&d.task) {
                a.region.publish_compute(
                    a.device,
                    &ComputePublish {
                        tokens_ns: d.tokens_ns,
                        allowance_ppm: (d.allowance * 1e6).round().clamp(0.0, 1e6) as u32,
                        rate_ppm: (d.rate * 1e6).round().clamp(0.0, 1e6) as u32,
                        busy_ns: d.busy_total_ns,
                    },
                );
            }
        }
        for a in self.tasks.values() {
            a.region.tick(now_ns, now_ns + tick, tick);
        }
        decisions
    }
}

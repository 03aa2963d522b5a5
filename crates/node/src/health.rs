//! Node health: the heartbeat and the conditions a node reports (Kubernetes' node
//! conditions: a kind, true or false, a reason and a message, since when).

use serde::{Deserialize, Serialize};
use tessera_model::GpuDevice;

use crate::gpu::{RawGpu, model_name};

/// What a condition is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConditionKind {
    /// The runtime can make sandboxes and starts tasks.
    Ready,
    /// A GPU of the node record is missing from the driver's view.
    GpuLost,
    /// A start was refused because the driver's view did not match the allocation.
    DeviceViewMismatch,
    /// The data folder's disk is nearly full.
    DiskPressure,
    /// No cgroups: tasks run in namespaces but their limits are not enforced.
    LimitsNotEnforced,
    /// A GPU had a fault not confined to one task (Xid / ECC, [`crate::faults`]):
    /// no new work goes there.
    GpuUnhealthy,
}

/// One condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub kind: ConditionKind,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// What the node runtime reports with each heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    /// Milliseconds since the Unix epoch.
    pub heartbeat_ms: u64,
    pub conditions: Vec<Condition>,
    /// Tasks running on the node now.
    pub running: usize,
    /// The cgroup backend (`v1`, `v2`) or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroups: Option<String>,
    /// Whether the device cgroup fences devices (v1 with the devices controller).
    pub device_cgroup: bool,
}

impl NodeStatus {
    /// Is `kind` true?
    pub fn has(&self, kind: ConditionKind) -> bool {
        self.conditions.iter().any(|c| c.kind == kind && c.status)
    }
}

/// Free space below which the node reports disk pressure: 5 % or 1 GiB, the smaller.
pub fn disk_pressure(free: u64, total: u64) -> bool {
    free < (total / 20).min(1 << 30)
}

/// Free and total bytes of the file system holding `path`.
pub fn disk_space(path: &std::path::Path) -> Option<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let f = s.fragment_size();
    Some((s.blocks_available() * f, s.blocks() * f))
}

/// The conditions from what the node knows. Pure.
pub fn conditions(
    record: &[GpuDevice],
    live: &Result<Vec<RawGpu>, String>,
    mismatch: Option<&crate::fence::Mismatch>,
    disk: Option<(u64, u64)>,
    cgroups: bool,
) -> Vec<Condition> {
    let mut out = Vec::new();
    let cond = |kind, status, reason: &str, message: String| Condition {
        kind,
        status,
        reason: reason.into(),
        message,
    };
    out.push(cond(
        ConditionKind::Ready,
        true,
        "RuntimeReady",
        "the node runtime makes sandboxes".into(),
    ));
    let lost: Vec<String> = record
        .iter()
        .filter(|r| {
            !live.as_ref().is_ok_and(|l| {
                l.iter()
                    .any(|g| g.index == r.index && model_name(&g.name) == r.model)
            })
        })
        .map(|r| format!("GPU {} ({})", r.index, r.model))
        .collect();
    out.push(if lost.is_empty() {
        cond(
            ConditionKind::GpuLost,
            false,
            "AllGpusPresent",
            String::new(),
        )
    } else {
        let why = match live {
            Err(e) => format!("; the driver says: {e}"),
            Ok(_) => String::new(),
        };
        cond(
            ConditionKind::GpuLost,
            true,
            "GpuMissing",
            format!("{} missing from the driver's view{why}", lost.join(", ")),
        )
    });
    out.push(match mismatch {
        Some(m) => cond(
            ConditionKind::DeviceViewMismatch,
            true,
            "StartRefused",
            m.to_string(),
        ),
        None => cond(
            ConditionKind::DeviceViewMismatch,
            false,
            "ViewsAgree",
            String::new(),
        ),
    });
    if let Some((free, total)) = disk {
        out.push(if disk_pressure(free, total) {
            cond(
                ConditionKind::DiskPressure,
                true,
                "LowDisk",
                format!("{} MiB free of {} MiB", free >> 20, total >> 20),
            )
        } else {
            cond(
                ConditionKind::DiskPressure,
                false,
                "EnoughDisk",
                String::new(),
            )
        });
    }
    out.push(if cgroups {
        cond(
            ConditionKind::LimitsNotEnforced,
            false,
            "Cgroups",
            String::new(),
        )
    } else {
        cond(
            ConditionKind::LimitsNotEnforced,
            true,
            "NoCgroups",
            "not root: tasks run in namespaces, but CPU, memory and pids limits are not enforced"
                .into(),
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_gpus_and_pressure_are_reported() {
        let raw = vec![RawGpu {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            memory: 80 << 30,
            ..RawGpu::default()
        }];
        let mut two = raw.clone();
        two.push(RawGpu {
            index: 1,
            ..raw[0].clone()
        });
        let record = crate::gpu::map_gpus(&two);
        let c = conditions(&record, &Ok(raw), None, Some((10 << 20, 100 << 30)), true);
        let get = |k| c.iter().find(|c| c.kind == k).unwrap();
        assert!(get(ConditionKind::GpuLost).status);
        assert!(get(ConditionKind::GpuLost).message.contains("GPU 1"));
        assert!(get(ConditionKind::DiskPressure).status);
        assert!(!get(ConditionKind::DeviceViewMismatch).status);
        assert!(!get(ConditionKind::LimitsNotEnforced).status);
        let c = conditions(&record, &Ok(two), None, Some((50 << 30, 100 << 30)), false);
        let get = |k| c.iter().find(|c| c.kind == k).unwrap();
        assert!(!get(ConditionKind::GpuLost).status);
        assert!(!get(ConditionKind::DiskPressure).status);
        assert!(get(ConditionKind::LimitsNotEnforced).status);
        let c = conditions(&record, &Err("no driver".into()), None, None, true);
        assert!(
            c.iter()
                .any(|c| c.kind == ConditionKind::GpuLost && c.message.contains("no driver"))
        );
    }
}

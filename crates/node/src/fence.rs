//! GPU fencing and the device-view check.
//!
//! A task sees only the GPUs of its binding: the sandbox's `/dev` gets the device
//! nodes of those GPUs (plus the driver's control nodes, and for a MIG task the
//! capability nodes of its instance), the device cgroup allows only those devices,
//! and `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` name them by UUID (the MIG
//! device's UUID for a MIG task). A fractional task gets its GPU and its share in
//! `TESSERA_GPU_MEMORY_LIMIT` / `TESSERA_GPU_COMPUTE_MILLI`, which the CUDA
//! interposer (`crates/gpushare`) enforces through a [`GpuShareHook`]
//! ([`crate::gpushare`]).
//!
//! Before every start the runtime compares what the sandbox will actually see (the
//! driver's live view: UUIDs, PCI bus ids, MIG instances, the device nodes present)
//! with what the scheduler allocated (the node record it placed against), and
//! refuses on a mismatch with a reason that names both views (seed 001 §3.2).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_model::{GpuDevice, GpuRequest};
use tessera_sandbox::{Bind, DeviceRule};

use crate::gpu::{RawGpu, model_name};
use crate::spec::TaskKey;

/// Where the node finds device nodes and the driver's MIG capability files (the
/// real `/dev` and `/proc/driver/nvidia/capabilities`; folders of fakes in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceDirs {
    pub dev: PathBuf,
    pub caps: PathBuf,
}

impl Default for DeviceDirs {
    fn default() -> Self {
        DeviceDirs {
            dev: "/dev".into(),
            caps: "/proc/driver/nvidia/capabilities".into(),
        }
    }
}

/// The driver's control nodes every GPU task needs (those present are bound).
pub const CONTROL_NODES: &[&str] = &[
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
];

/// What a binding gives a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuAssignment {
    None,
    /// Whole GPUs, by index on the node.
    Whole {
        gpus: Vec<u32>,
    },
    /// A share of one GPU.
    Shared {
        gpu: u32,
        milli: u32,
        memory: u64,
    },
    /// One MIG instance: its profile and first memory slice on `gpu`.
    Mig {
        gpu: u32,
        profile: String,
        start: u8,
    },
}

impl GpuAssignment {
    /// The assignment of a binding: the task's request, the GPU indices the scheduler
    /// chose and, for MIG, the instance's first slice.
    pub fn from_binding(
        request: &GpuRequest,
        gpus: &[u32],
        mig_start: Option<u8>,
    ) -> Result<GpuAssignment, String> {
        match request {
            GpuRequest::None => Ok(GpuAssignment::None),
            GpuRequest::Whole { count, .. } => {
                if gpus.len() != *count as usize {
                    return Err(format!(
                        "the binding holds {} GPU(s) for a request of {count}",
                        gpus.len()
                    ));
                }
                Ok(GpuAssignment::Whole {
                    gpus: gpus.to_vec(),
                })
            }
            GpuRequest::Shared { milli, memory, .. } => match gpus {
                [g] => Ok(GpuAssignment::Shared {
                    gpu: *g,
                    milli: *milli,
                    memory: *memory,
                }),
                _ => Err(format!(
                    "a share of one GPU was bound to {} GPU(s)",
                    gpus.len()
                )),
            },
            GpuRequest::Mig { profile, .. } => match (gpus, mig_start) {
                ([g], Some(start)) => Ok(GpuAssignment::Mig {
                    gpu: *g,
                    profile: profile.clone(),
                    start,
                }),
                _ => Err(format!(
                    "a MIG {profile} request was bound without its GPU and instance (gpus {gpus:?}, start {mig_start:?})"
                )),
            },
        }
    }

    /// GPU indices it touches.
    pub fn gpus(&self) -> Vec<u32> {
        match self {
            GpuAssignment::None => vec![],
            GpuAssignment::Whole { gpus } => gpus.clone(),
            GpuAssignment::Shared { gpu, .. } | GpuAssignment::Mig { gpu, .. } => vec![*gpu],
        }
    }

    /// GPUs' worth of allocation, for GPU-seconds: whole GPUs count 1 each, a share
    /// its fraction, a MIG instance its compute slices over the GPU's.
    pub fn fraction(&self, record: &[GpuDevice]) -> f64 {
        match self {
            GpuAssignment::None => 0.0,
            GpuAssignment::Whole { gpus } => gpus.len() as f64,
            GpuAssignment::Shared { milli, .. } => f64::from(*milli) / 1000.0,
            GpuAssignment::Mig { gpu, profile, .. } => {
                let models: Vec<String> = record
                    .iter()
                    .find(|g| g.index == *gpu)
                    .map(|g| vec![g.model.clone()])
                    .unwrap_or_default();
                tessera_model::mig::profile_milli(profile, &models) as f64 / 1000.0
            }
        }
    }
}

/// One device as the sandbox will see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenDevice {
    pub index: u32,
    pub uuid: String,
    pub bus_id: String,
    /// The device node bound in (path inside the sandbox).
    pub node: String,
    /// For a MIG task: the MIG device's UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
}

/// What fencing a task's GPUs adds to its sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fence {
    pub binds: Vec<Bind>,
    /// The char devices the device cgroup allows beyond the base set.
    pub rules: Vec<DeviceRule>,
    pub env: Vec<(String, String)>,
    /// What the task will see (recorded on the task).
    pub view: Vec<SeenDevice>,
}

/// The scheduler's allocation and the node's view disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device view mismatch: the scheduler allocated {scheduler}; this node sees {node}")]
pub struct Mismatch {
    /// The allocation, as the scheduler's node record describes it.
    pub scheduler: String,
    /// What the driver and the device nodes show now.
    pub node: String,
}

fn describe_record(assign: &GpuAssignment, record: &[GpuDevice]) -> String {
    let one = |i: u32| match record.iter().find(|g| g.index == i) {
        Some(g) => format!("GPU {i} ({}, {} MiB)", g.model, g.memory >> 20),
        None => format!("GPU {i} (not in the node record)"),
    };
    match assign {
        GpuAssignment::None => "no GPU".into(),
        GpuAssignment::Whole { gpus } => {
            gpus.iter().map(|&i| one(i)).collect::<Vec<_>>().join(", ")
        }
        GpuAssignment::Shared { gpu, milli, memory } => {
            format!("{} share {milli}m, {} MiB", one(*gpu), memory >> 20)
        }
        GpuAssignment::Mig {
            gpu,
            profile,
            start,
        } => {
            format!("{} MIG {profile}@{start}", one(*gpu))
        }
    }
}

fn describe_live(live: &[RawGpu], dirs: &DeviceDirs) -> String {
    if live.is_empty() {
        return "no GPUs".into();
    }
    live.iter()
        .map(|g| {
            let node = dirs
                .dev
                .join(format!("nvidia{}", g.minor.unwrap_or(g.index)));
            let mut s = format!(
                "GPU {} ({}, {} MiB, uuid {}, bus {}, node {}{})",
                g.index,
                model_name(&g.name),
                g.memory >> 20,
                if g.uuid.is_empty() { "?" } else { &g.uuid },
                g.bus_id,
                node.display(),
                if node.exists() { "" } else { " missing" }
            );
            if g.mig_enabled {
                let m: Vec<String> = g
                    .mig_instances
                    .iter()
                    .map(|m| format!("{}@{}", m.profile, m.start))
                    .collect();
                s.push_str(&format!(" MIG [{}]", m.join(", ")));
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks the binding against the driver's live view and the device nodes, and
/// plans the fence. `record` is the node record the scheduler placed against.
pub fn plan(
    assign: &GpuAssignment,
    record: &[GpuDevice],
    live: &[RawGpu],
    dirs: &DeviceDirs,
) -> Result<Fence, Mismatch> {
    let mut f = Fence::default();
    let mismatch = || Mismatch {
        scheduler: describe_record(assign, record),
        node: describe_live(live, dirs),
    };
    let visible = |f: &mut Fence, v: String| {
        f.env.push(("CUDA_VISIBLE_DEVICES".into(), v.clone()));
        f.env.push((
            "NVIDIA_VISIBLE_DEVICES".into(),
            if v.is_empty() { "void".into() } else { v },
        ));
    };
    if *assign == GpuAssignment::None {
        visible(&mut f, String::new());
        return Ok(f);
    }
    let mut uuids = Vec::new();
    for i in assign.gpus() {
        let rec = record.iter().find(|g| g.index == i).ok_or_else(mismatch)?;
        let g = live.iter().find(|g| g.index == i).ok_or_else(mismatch)?;
        if model_name(&g.name) != rec.model || g.memory != rec.memory {
            return Err(mismatch());
        }
        let minor = g.minor.unwrap_or(g.index);
        let node = dirs.dev.join(format!("nvidia{minor}"));
        if !node.exists() {
            return Err(mismatch());
        }
        let inside = format!("/dev/nvidia{minor}");
        bind_node(&mut f, &node, &inside);
        let mut seen = SeenDevice {
            index: i,
            uuid: g.uuid.clone(),
            bus_id: g.bus_id.clone(),
            node: inside,
            mig_uuid: None,
        };
        if let GpuAssignment::Mig { profile, start, .. } = assign {
            if !g.mig_enabled {
                return Err(mismatch());
            }
            let m = g
                .mig_instances
                .iter()
                .find(|m| &m.profile == profile && m.start == *start)
                .ok_or_else(mismatch)?;
            // Without a reported MIG UUID, the driver's older `MIG-<GPU uuid>/<gi>/<ci>`.
            let id = match (&m.uuid, m.ci) {
                (Some(u), _) => u.clone(),
                (None, Some(ci)) if !g.uuid.is_empty() => format!("MIG-{}/{}/{ci}", g.uuid, m.gi),
                _ => return Err(mismatch()),
            };
            for cap in mig_caps(dirs, minor, m.gi, m.ci) {
                let inside = format!(
                    "/dev/nvidia-caps/{}",
                    cap.file_name().and_then(|n| n.to_str()).unwrap_or("cap")
                );
                bind_node(&mut f, &cap, &inside);
            }
            seen.mig_uuid = Some(id.clone());
            uuids.push(id);
        } else {
            uuids.push(if g.uuid.is_empty() {
                i.to_string()
            } else {
                g.uuid.clone()
            });
        }
        f.view.push(seen);
    }
    for c in CONTROL_NODES {
        let p = dirs.dev.join(c);
        if p.exists() {
            bind_node(&mut f, &p, &format!("/dev/{c}"));
        }
    }
    visible(&mut f, uuids.join(","));
    if let GpuAssignment::Shared { milli, memory, .. } = assign {
        f.env
            .push(("TESSERA_GPU_COMPUTE_MILLI".into(), milli.to_string()));
        if *memory > 0 {
            f.env
                .push(("TESSERA_GPU_MEMORY_LIMIT".into(), memory.to_string()));
        }
    }
    Ok(f)
}

fn bind_node(f: &mut Fence, host: &Path, inside: &str) {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    if f.binds.iter().any(|b| b.path == inside) {
        return;
    }
    if let Ok(md) = std::fs::metadata(host)
        && md.file_type().is_char_device()
    {
        let rdev = md.rdev();
        f.rules.push(DeviceRule {
            major: nix::sys::stat::major(rdev) as u32,
            minor: nix::sys::stat::minor(rdev) as u32,
        });
    }
    f.binds.push(Bind {
        host: host.to_path_buf(),
        path: inside.to_string(),
        writable: true,
    });
}

/// The capability device nodes of a MIG instance: the driver lists their minors in
/// `<caps>/gpu<minor>/mig/gi<gi>/access` and `…/gi<gi>/ci<ci>/access`
/// (`DeviceFileMinor: N`), and the nodes are `/dev/nvidia-caps/nvidia-cap<N>`.
pub fn mig_caps(dirs: &DeviceDirs, gpu_minor: u32, gi: u32, ci: Option<u32>) -> Vec<PathBuf> {
    let base = dirs.caps.join(format!("gpu{gpu_minor}/mig/gi{gi}"));
    let mut files = vec![base.join("access")];
    if let Some(ci) = ci {
        files.push(base.join(format!("ci{ci}/access")));
    }
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("DeviceFileMinor:"))
                .and_then(|m| m.trim().parse::<u32>().ok())
        })
        .map(|m| dirs.dev.join(format!("nvidia-caps/nvidia-cap{m}")))
        .filter(|p| p.exists())
        .collect()
}

/// What a fractional task is: its GPU and its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub gpu: u32,
    pub uuid: String,
    pub milli: u32,
    /// Bytes of GPU memory; 0: the request named none.
    pub memory: u64,
    /// The GPU's memory (the cap when the request named none).
    pub device_memory: u64,
}

/// What a [`GpuShareHook`] adds to a fractional task's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareSetup {
    pub env: Vec<(String, String)>,
    pub binds: Vec<Bind>,
}

/// The hook for GPU-share enforcement (the CUDA interposer of `crates/gpushare`,
/// [`crate::gpushare::Interposer`]): called before a fractional task starts (what
/// to add: the interposer and its `/etc/ld.so.preload`, its accounting region
/// bound in, …) and after its tree is gone, however it ended. The fence has
/// already set `TESSERA_GPU_MEMORY_LIMIT` / `TESSERA_GPU_COMPUTE_MILLI`; the
/// hook's variables replace them.
pub trait GpuShareHook: Send + Sync + std::fmt::Debug {
    /// Sets the task's share up, or refuses it (the reason is the task's).
    fn prepare(&self, key: &TaskKey, share: &Share) -> Result<ShareSetup, String>;
    /// The task's sandbox runs, its processes in pid namespace `pidns` (how its
    /// device time is told from others').
    fn running(&self, _key: &TaskKey, _pidns: Option<u64>) {}
    /// The task has ended: releases its share; returns its last usage.
    fn release(&self, key: &TaskKey) -> Option<tessera_gpushare::usage::TaskUsage>;
    /// A running task's usage (memory used against the cap, compute share).
    fn usage(&self, _key: &TaskKey) -> Option<tessera_gpushare::usage::TaskUsage> {
        None
    }
    /// One line for the node's start-up message and status.
    fn describe(&self) -> String;
}

/// No enforcement beyond the two variables: only where an operator turned it off
/// (`tessera up --gpu-share-enforcement off`).
#[derive(Debug, Clone, Copy, Default)]
pub struct EnvOnly;

impl GpuShareHook for EnvOnly {
    fn prepare(&self, _: &TaskKey, _: &Share) -> Result<ShareSetup, String> {
        Ok(ShareSetup::default())
    }
    fn release(&self, _: &TaskKey) -> Option<tessera_gpushare::usage::TaskUsage> {
        None
    }
    fn describe(&self) -> String {
        "off: fractional tasks see their share in TESSERA_GPU_MEMORY_LIMIT / TESSERA_GPU_COMPUTE_MILLI only; nothing holds them to it".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::RawMig;

    const GIB: u64 = 1 << 30;

    fn fake(n: u32) -> (tempfile::TempDir, DeviceDirs, Vec<RawGpu>, Vec<GpuDevice>) {
        let d = tempfile::tempdir().unwrap();
        let dirs = DeviceDirs {
            dev: d.path().join("dev"),
            caps: d.path().join("caps"),
        };
        std::fs::create_dir_all(dirs.dev.join("nvidia-caps")).unwrap();
        std::fs::write(dirs.dev.join("nvidiactl"), b"").unwrap();
        let mut live = Vec::new();
        for i in 0..n {
            std::fs::write(dirs.dev.join(format!("nvidia{i}")), b"").unwrap();
            live.push(RawGpu {
                index: i,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory: 80 * GIB,
                bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
                uuid: format!("GPU-{i:08x}"),
                minor: Some(i),
                ..RawGpu::default()
            });
        }
        let record = crate::gpu::map_gpus(&live);
        (d, dirs, live, record)
    }

    #[test]
    fn whole_gpus_are_fenced_by_uuid() {
        let (_d, dirs, live, record) = fake(4);
        let a = GpuAssignment::Whole { gpus: vec![1, 3] };
        let f = plan(&a, &record, &live, &dirs).unwrap();
        let paths: Vec<&str> = f.binds.iter().map(|b| b.path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl"]);
        assert!(f.env.contains(&(
            "CUDA_VISIBLE_DEVICES".into(),
            "GPU-00000001,GPU-00000003".into()
        )));
        assert_eq!(f.view.len(), 2);
        // Regular files (fakes) are not char devices: no cgroup rules.
        assert!(f.rules.is_empty());
    }

    #[test]
    fn no_gpu_means_none_visible() {
        let (_d, dirs, live, record) = fake(2);
        let f = plan(&GpuAssignment::None, &record, &live, &dirs).unwrap();
        assert!(f.binds.is_empty());
        assert!(
            f.env
                .contains(&("CUDA_VISIBLE_DEVICES".into(), String::new()))
        );
        assert!(
            f.env
                .contains(&("NVIDIA_VISIBLE_DEVICES".into(), "void".into()))
        );
    }

    #[test]
    fn shares_carry_their_limits() {
        let (_d, dirs, live, record) = fake(1);
        let a = GpuAssignment::Shared {
            gpu: 0,
            milli: 250,
            memory: 10 * GIB,
        };
        let f = plan(&a, &record, &live, &dirs).unwrap();
        assert!(
            f.env
                .contains(&("TESSERA_GPU_COMPUTE_MILLI".into(), "250".into()))
        );
        assert!(
            f.env
                .contains(&("TESSERA_GPU_MEMORY_LIMIT".into(), (10 * GIB).to_string()))
        );
        assert!((a.fraction(&record) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn mig_tasks_see_their_instance() {
        let (_d, dirs, mut live, _) = fake(1);
        live[0].name = "NVIDIA A100-SXM4-80GB".into();
        live[0].mig_enabled = true;
        live[0].mig_instances = vec![RawMig {
            uuid: Some("MIG-abcd".into()),
            ..RawMig::new("3g.40gb", 4, 2)
        }];
        std::fs::create_dir_all(dirs.caps.join("gpu0/mig/gi2/ci0")).unwrap();
        std::fs::write(
            dirs.caps.join("gpu0/mig/gi2/access"),
            "DeviceFileMinor: 21\n",
        )
        .unwrap();
        std::fs::write(
            dirs.caps.join("gpu0/mig/gi2/ci0/access"),
            "DeviceFileMinor: 22\nDeviceFileMode: 292\n",
        )
        .unwrap();
        for m in [21, 22] {
            std::fs::write(dirs.dev.join(format!("nvidia-caps/nvidia-cap{m}")), b"").unwrap();
        }
        let record = crate::gpu::map_gpus(&live);
        let a = GpuAssignment::Mig {
            gpu: 0,
            profile: "3g.40gb".into(),
            start: 4,
        };
        let f = plan(&a, &record, &live, &dirs).unwrap();
        assert!(
            f.env
                .contains(&("CUDA_VISIBLE_DEVICES".into(), "MIG-abcd".into()))
        );
        let paths: Vec<&str> = f.binds.iter().map(|b| b.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22",
                "/dev/nvidiactl"
            ]
        );
        // The instance is not there: refused, both views named.
        let other = GpuAssignment::Mig {
            gpu: 0,
            profile: "3g.40gb".into(),
            start: 0,
        };
        let e = plan(&other, &record, &live, &dirs).unwrap_err().to_string();
        assert!(
            e.contains("MIG 3g.40gb@0") && e.contains("MIG [3g.40gb@4]"),
            "{e}"
        );
    }

    #[test]
    fn mismatches_name_both_views() {
        let (_d, dirs, live, record) = fake(2);
        // The driver lost GPU 1.
        let e = plan(
            &GpuAssignment::Whole { gpus: vec![1] },
            &record,
            &live[..1],
            &dirs,
        )
        .unwrap_err();
        assert!(e.scheduler.contains("GPU 1 (H100-80GB"), "{e}");
        assert!(e.node.contains("GPU 0") && !e.node.contains("GPU 1"), "{e}");
        // A different model behind the same index.
        let mut swapped = live.clone();
        swapped[1].name = "NVIDIA A100-SXM4-80GB".into();
        assert!(
            plan(
                &GpuAssignment::Whole { gpus: vec![1] },
                &record,
                &swapped,
                &dirs
            )
            .is_err()
        );
        // The device node is gone.
        std::fs::remove_file(dirs.dev.join("nvidia1")).unwrap();
        let e = plan(
            &GpuAssignment::Whole { gpus: vec![1] },
            &record,
            &live,
            &dirs,
        )
        .unwrap_err();
        assert!(e.node.contains("nvidia1 missing"), "{e}");
        // GPU 0 still fine.
        assert!(
            plan(
                &GpuAssignment::Whole { gpus: vec![0] },
                &record,
                &live,
                &dirs
            )
            .is_ok()
        );
    }

    #[test]
    fn assignments_come_from_bindings() {
        let whole = GpuRequest::Whole {
            count: 2,
            models: vec![],
        };
        assert_eq!(
            GpuAssignment::from_binding(&whole, &[0, 1], None).unwrap(),
            GpuAssignment::Whole { gpus: vec![0, 1] }
        );
        assert!(GpuAssignment::from_binding(&whole, &[0], None).is_err());
        let mig = GpuRequest::Mig {
            profile: "1g.10gb".into(),
            models: vec![],
        };
        assert!(GpuAssignment::from_binding(&mig, &[0], None).is_err());
        assert!(GpuAssignment::from_binding(&mig, &[0], Some(6)).is_ok());
    }
}

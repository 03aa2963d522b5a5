//! GPU discovery for the node (moved here from the server: the node runtime owns
//! what the machine's driver says, and the server registers the node from it).
//!
//! A [`GpuSource`] reports the machine's GPUs as [`RawGpu`]s (what the driver
//! says: product name, memory, PCI bus id, NVLink peers, MIG state); [`map_gpus`]
//! turns them into the model's [`GpuDevice`]s (canonical model name, NVLink
//! domain, PCIe root, NUMA node, MIG layout). The mapping is pure and tested with
//! fake device lists; [`NvmlSource`] is the real source.
//!
//! [`NvmlSource`] loads `libnvidia-ml.so.1` at run time (through `nvml-wrapper`),
//! so the binary runs on machines without a driver: there, [`discover`] logs one
//! line and reports no GPUs. What NVML does not say through the wrapper's safe
//! API comes from sysfs (PCIe root complex, NUMA node) and, for MIG instances,
//! from `nvidia-smi mig -lgi` (profile and placement of each GPU instance).

use std::collections::BTreeMap;

use tessera_model::mig::{MigInstance, MigLayout, geometry};
use tessera_model::{GpuDevice, Node};

/// One GPU as its driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawGpu {
    /// Index as `CUDA_VISIBLE_DEVICES` counts (NVML's index).
    pub index: u32,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Bytes of device memory.
    pub memory: u64,
    /// PCI bus id, e.g. `00000000:3B:00.0`.
    pub bus_id: String,
    /// The PCIe root complex above the device, e.g. `pci0000:3a`.
    pub pcie_root: Option<String>,
    /// The NUMA node the device is attached to.
    pub numa: Option<u32>,
    /// PCI bus ids at the far end of each active NVLink (other GPUs or NVSwitches).
    pub nvlink_remotes: Vec<String>,
    /// Whether MIG mode is on now.
    pub mig_enabled: bool,
    /// The GPU instances (profile, first memory slice, ids, the MIG device's UUID).
    pub mig_instances: Vec<RawMig>,
    /// The device's UUID (`GPU-…`), empty when the source does not say.
    pub uuid: String,
    /// The minor number of its device node (`/dev/nvidia<minor>`), when known.
    pub minor: Option<u32>,
}

/// One MIG instance as the driver reports it: a GPU instance and (usually one)
/// compute instance in it, which CUDA sees as one MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawMig {
    /// Profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// First memory slice of its placement.
    pub start: u8,
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id in it, when one exists.
    pub ci: Option<u32>,
    /// The MIG device's UUID (`MIG-…`), when known.
    pub uuid: Option<String>,
}

impl RawMig {
    /// A GPU instance of `profile` at `start` with compute instance 0 and no UUID.
    pub fn new(profile: impl Into<String>, start: u8, gi: u32) -> Self {
        RawMig {
            profile: profile.into(),
            start,
            gi,
            ci: Some(0),
            uuid: None,
        }
    }
}

/// Where GPUs come from: NVML on a real machine, a fixed list in tests.
pub trait GpuSource: Send + Sync {
    /// A short name for logs (`NVML`).
    fn name(&self) -> &str;
    /// The GPUs, or why they could not be read (no driver, no permission…).
    fn gpus(&self) -> Result<Vec<RawGpu>, String>;
}

/// A fixed list (tests, and `--cluster` style fakes).
#[derive(Debug, Clone, Default)]
pub struct FakeSource(pub Vec<RawGpu>);

impl GpuSource for FakeSource {
    fn name(&self) -> &str {
        "fake"
    }
    fn gpus(&self) -> Result<Vec<RawGpu>, String> {
        Ok(self.0.clone())
    }
}

/// The GPUs of `source` as devices; when the source fails (no driver), one log
/// line on stderr and no GPUs.
pub fn discover(source: &dyn GpuSource) -> Vec<GpuDevice> {
    match source.gpus() {
        Ok(raw) => {
            let gpus = map_gpus(&raw);
            if gpus.is_empty() {
                eprintln!("tessera: {} reports no GPUs on this machine", source.name());
            } else {
                let models: Vec<&str> = gpus.iter().map(|g| g.model.as_str()).collect();
                eprintln!(
                    "tessera: {} found {} GPU(s): {}",
                    source.name(),
                    gpus.len(),
                    models.join(", ")
                );
            }
            gpus
        }
        Err(e) => {
            eprintln!(
                "tessera: no GPUs: {} is not available here ({e}); the local node offers CPU and memory only",
                source.name()
            );
            Vec::new()
        }
    }
}

/// Adds `gpus` to a node: its devices, and their count and memory in
/// `allocatable` (the model requires the two to agree), plus the usual labels.
pub fn attach(node: &mut Node, gpus: Vec<GpuDevice>) {
    if gpus.is_empty() {
        return;
    }
    node.allocatable.gpu_milli = 1000 * gpus.len() as u64;
    node.allocatable.gpu_memory = gpus.iter().map(|g| g.memory).sum();
    node.labels
        .insert("nvidia.com/gpu.product".into(), gpus[0].model.clone());
    node.labels
        .insert("nvidia.com/gpu.count".into(), gpus.len().to_string());
    node.labels.insert(
        "nvidia.com/gpu.memory".into(),
        (gpus[0].memory >> 20).to_string(),
    );
    node.gpus = gpus;
}

/// Maps what a source reported to the model's devices, sorted by index.
///
/// - model: the product name without its vendor prefix, spaces as dashes, and
///   the canonical name when the MIG tables know it (`NVIDIA A100-SXM4-80GB` ->
///   `A100-80GB`);
/// - NVLink domain: GPUs joined by active NVLinks, directly or through NVSwitches,
///   share one; domains are numbered from 0 in order of their lowest GPU index; a
///   GPU without active links has none;
/// - PCIe root and NUMA node as reported;
/// - MIG: a layout (possibly empty) when MIG mode is on, instances sorted by start.
pub fn map_gpus(raw: &[RawGpu]) -> Vec<GpuDevice> {
    let mut raw: Vec<&RawGpu> = raw.iter().collect();
    raw.sort_by_key(|g| g.index);
    // Union-find over PCI bus ids: GPUs and whatever their links reach.
    let mut parent: BTreeMap<String, String> = BTreeMap::new();
    fn find(p: &mut BTreeMap<String, String>, x: &str) -> String {
        let mut cur = x.to_string();
        loop {
            let next = p.entry(cur.clone()).or_insert_with(|| cur.clone()).clone();
            if next == cur {
                return cur;
            }
            cur = next;
        }
    }
    for g in &raw {
        let a = norm_bus(&g.bus_id);
        for r in &g.nvlink_remotes {
            let ra = find(&mut parent, &a);
            let rb = find(&mut parent, &norm_bus(r));
            if ra != rb {
                let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
                parent.insert(hi, lo);
            }
        }
    }
    let mut domains: BTreeMap<String, u32> = BTreeMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for g in raw {
        let model = model_name(&g.name);
        let mut d = GpuDevice::new(g.index, model.clone(), g.memory);
        if !g.nvlink_remotes.is_empty() {
            let root = find(&mut parent, &norm_bus(&g.bus_id));
            let next = domains.len() as u32;
            d.nvlink_domain = Some(*domains.entry(root).or_insert(next));
        }
        d.pcie_root = g.pcie_root.clone();
        d.numa = g.numa;
        if g.mig_enabled {
            let mut instances: Vec<MigInstance> = g
                .mig_instances
                .iter()
                .map(|m| MigInstance {
                    profile: m.profile.clone(),
                    start: m.start,
                    in_use: false,
                })
                .collect();
            instances.sort_by(|a, b| (a.start, &a.profile).cmp(&(b.start, &b.profile)));
            d.mig = Some(MigLayout { instances });
        }
        out.push(d);
    }
    out
}

/// `00000000:3B:00.0` and `0000:3b:00.0` name the same device.
fn norm_bus(b: &str) -> String {
    let b = b.trim().to_ascii_lowercase();
    match b.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => b,
    }
}

/// A product name as the scheduler's model names read: vendor prefix dropped,
/// spaces as dashes, the canonical name where the MIG tables know the product.
pub fn model_name(product: &str) -> String {
    let dashed: String = product.split_whitespace().collect::<Vec<_>>().join("-");
    if let Some(g) = geometry(&dashed) {
        return g.model.to_string();
    }
    let mut short = dashed.as_str();
    for prefix in ["NVIDIA-", "Tesla-", "GeForce-"] {
        if let Some(s) = short.strip_prefix(prefix) {
            short = s;
        }
    }
    match geometry(short) {
        Some(g) => g.model.to_string(),
        None => short.to_string(),
    }
}

/// Parses `nvidia-smi mig -lgi` output into (GPU index, profile, start) rows.
///
/// ```text
/// |   0  MIG 1g.10gb          19        9          2:1     |
/// ```
pub fn parse_mig_lgi(text: &str) -> Vec<(u32, String, u8)> {
    parse_mig_lgi_ids(text)
        .into_iter()
        .map(|(g, p, s, _)| (g, p, s))
        .collect()
}

/// Like [`parse_mig_lgi`], with the GPU instance id: (GPU, profile, start, GI id).
pub fn parse_mig_lgi_ids(text: &str) -> Vec<(u32, String, u8, u32)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line
            .trim_matches(|c: char| c == '|' || c.is_whitespace())
            .split_whitespace()
            .collect();
        // GPU, "MIG", profile, profile id, instance id, start:size
        if cells.len() < 6 || cells[1] != "MIG" {
            continue;
        }
        let (Ok(gpu), Ok(gi), Some((start, _))) = (
            cells[0].parse::<u32>(),
            cells[4].parse::<u32>(),
            cells[5].split_once(':'),
        ) else {
            continue;
        };
        if let Ok(start) = start.parse::<u8>() {
            out.push((gpu, cells[2].to_string(), start, gi));
        }
    }
    out
}

/// Parses the MIG lines of `nvidia-smi -L` into (GPU index, profile, MIG UUID):
///
/// ```text
/// GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-…)
///   MIG 3g.20gb     Device  0: (UUID: MIG-a6b0b5d5-…)
/// ```
pub fn parse_smi_list_mig(text: &str) -> Vec<(u32, String, String)> {
    let mut out = Vec::new();
    let mut gpu = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("GPU ") {
            gpu = rest
                .split(':')
                .next()
                .and_then(|n| n.trim().parse::<u32>().ok());
        } else if let (Some(rest), Some(g)) = (t.strip_prefix("MIG "), gpu) {
            let profile = rest.split_whitespace().next().unwrap_or("").to_string();
            if let Some(u) = rest.split("UUID: ").nth(1) {
                let uuid = u.trim_end_matches(')').trim().to_string();
                if !profile.is_empty() && uuid.starts_with("MIG-") {
                    out.push((g, profile, uuid));
                }
            }
        }
    }
    out
}

/// NVML's `NVML_NVLINK_MAX_LINKS`: links per GPU to ask about.
const NVLINK_MAX_LINKS: u32 = 18;

/// NVML through `nvml-wrapper`, with sysfs for topology the wrapper lacks.
#[derive(Debug, Clone, Default)]
pub struct NvmlSource;

impl GpuSource for NvmlSource {
    fn name(&self) -> &str {
        "NVML"
    }

    fn gpus(&self) -> Result<Vec<RawGpu>, String> {
        use nvml_wrapper::Nvml;
        let nvml = Nvml::init().map_err(|e| e.to_string())?;
        let n = nvml.device_count().map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(n as usize);
        let mut any_mig = false;
        for i in 0..n {
            let d = nvml
                .device_by_index(i)
                .map_err(|e| format!("GPU {i}: {e}"))?;
            let bus_id = d
                .pci_info()
                .map(|p| p.bus_id)
                .map_err(|e| format!("GPU {i}: PCI info: {e}"))?;
            let sys = sysfs_path(&bus_id);
            let mut remotes = Vec::new();
            for l in 0..NVLINK_MAX_LINKS {
                let link = d.link_wrapper_for(l);
                if link.is_active().unwrap_or(false)
                    && let Ok(p) = link.remote_pci_info()
                {
                    remotes.push(p.bus_id);
                }
            }
            let mig_enabled = d.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            any_mig |= mig_enabled;
            out.push(RawGpu {
                index: d.index().unwrap_or(i),
                uuid: d.uuid().unwrap_or_default(),
                minor: d.minor_number().ok(),
                name: d.name().map_err(|e| format!("GPU {i}: name: {e}"))?,
                memory: d.memory_info().map(|m| m.total).unwrap_or(0),
                pcie_root: sys.as_deref().and_then(pcie_root_of),
                numa: sys.as_deref().and_then(numa_of),
                bus_id,
                nvlink_remotes: remotes,
                mig_enabled,
                mig_instances: Vec::new(),
            });
        }
        if any_mig {
            match std::process::Command::new("nvidia-smi")
                .args(["mig", "-lgi"])
                .output()
            {
                Ok(o) => {
                    for (gpu, profile, start, gi) in
                        parse_mig_lgi_ids(&String::from_utf8_lossy(&o.stdout))
                    {
                        if let Some(g) = out.iter_mut().find(|g| g.index == gpu) {
                            g.mig_instances.push(RawMig::new(profile, start, gi));
                        }
                    }
                    // MIG device UUIDs, in the driver's order per GPU (`nvidia-smi -L`):
                    // matched to GPU instances by profile, lowest instance id first.
                    if let Ok(l) = std::process::Command::new("nvidia-smi").arg("-L").output() {
                        for (gpu, profile, uuid) in
                            parse_smi_list_mig(&String::from_utf8_lossy(&l.stdout))
                        {
                            if let Some(g) = out.iter_mut().find(|g| g.index == gpu) {
                                let mut cands: Vec<&mut RawMig> = g
                                    .mig_instances
                                    .iter_mut()
                                    .filter(|m| m.profile == profile && m.uuid.is_none())
                                    .collect();
                                cands.sort_by_key(|m| m.gi);
                                if let Some(m) = cands.into_iter().next() {
                                    m.uuid = Some(uuid);
                                }
                            }
                        }
                    }
                }
                Err(e) => eprintln!(
                    "tessera: MIG is on but `nvidia-smi mig -lgi` did not run ({e}); MIG instances unknown"
                ),
            }
        }
        Ok(out)
    }
}

/// `/sys/bus/pci/devices/<bus id>` resolved to its real path under
/// `/sys/devices/pci<domain>:<bus>/…`.
fn sysfs_path(bus_id: &str) -> Option<std::path::PathBuf> {
    std::fs::canonicalize(format!("/sys/bus/pci/devices/{}", norm_bus(bus_id))).ok()
}

/// The root complex of a sysfs device path: its `pciDDDD:BB` component.
pub fn pcie_root_of(path: &std::path::Path) -> Option<String> {
    path.components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| c.starts_with("pci") && c.contains(':'))
        .map(str::to_string)
}

fn numa_of(path: &std::path::Path) -> Option<u32> {
    let s = std::fs::read_to_string(path.join("numa_node")).ok()?;
    s.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, name: &str, bus: &str, remotes: &[&str]) -> RawGpu {
        RawGpu {
            index,
            name: name.into(),
            memory: 80 * GIB,
            bus_id: bus.into(),
            pcie_root: Some(format!("pci0000:{}", &bus[bus.len() - 7..bus.len() - 5])),
            numa: Some(index / 4),
            nvlink_remotes: remotes.iter().map(|s| s.to_string()).collect(),
            ..RawGpu::default()
        }
    }

    #[test]
    fn model_names_are_canonical_where_known() {
        for (product, model) in [
            ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
            ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
            ("NVIDIA H100 80GB HBM3", "H100-80GB"),
            ("NVIDIA H200", "H200-141GB"),
            ("NVIDIA A30", "A30-24GB"),
            ("Tesla T4", "T4"),
            ("NVIDIA L40S", "L40S"),
            ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ] {
            assert_eq!(model_name(product), model, "{product}");
        }
    }

    /// An HGX board: 8 GPUs on NVSwitches (remote ends are switches, not GPUs),
    /// and a separate pair joined by a direct NVLink bridge, and one loner.
    #[test]
    fn nvlink_domains_follow_links_and_switches() {
        let sw = ["00000000:C1:00.0", "00000000:C2:00.0"];
        let mut raw: Vec<RawGpu> = (0..8)
            .map(|i| {
                gpu(
                    i,
                    "NVIDIA H100 80GB HBM3",
                    &format!("00000000:{:02X}:00.0", 0x10 + i),
                    &sw,
                )
            })
            .collect();
        raw.push(gpu(
            9,
            "NVIDIA A100-PCIE-80GB",
            "0000:a1:00.0",
            &["00000000:A2:00.0"],
        ));
        raw.push(gpu(
            8,
            "NVIDIA A100-PCIE-80GB",
            "00000000:A2:00.0",
            &["0000:a1:00.0"],
        ));
        raw.push(gpu(10, "Tesla T4", "00000000:B0:00.0", &[]));
        // Reported out of order: the mapping sorts by index.
        raw.reverse();
        let d = map_gpus(&raw);
        let idx: Vec<u32> = d.iter().map(|g| g.index).collect();
        assert_eq!(idx, (0..=10).collect::<Vec<_>>());
        for g in &d[..8] {
            assert_eq!(g.nvlink_domain, Some(0), "{g:?}");
            assert_eq!(g.model, "H100-80GB");
        }
        assert_eq!(d[8].nvlink_domain, Some(1));
        assert_eq!(d[9].nvlink_domain, Some(1));
        assert_eq!(d[10].nvlink_domain, None);
        assert_eq!(d[3].numa, Some(0));
        assert_eq!(d[5].numa, Some(1));
        assert_eq!(d[0].pcie_root.as_deref(), Some("pci0000:10"));
        assert!(d.iter().all(|g| g.mig.is_none()));
    }

    #[test]
    fn mig_layouts_are_mapped_and_legal() {
        let mut g = gpu(0, "NVIDIA A100-SXM4-80GB", "00000000:07:00.0", &[]);
        g.mig_enabled = true;
        g.mig_instances = vec![
            RawMig::new("1g.10gb", 6, 13),
            RawMig::new("3g.40gb", 0, 2),
            RawMig::new("2g.20gb", 4, 5),
        ];
        let mut off = gpu(1, "NVIDIA A100-SXM4-80GB", "00000000:0F:00.0", &[]);
        off.mig_instances = vec![RawMig::new("7g.80gb", 0, 0)]; // ignored: MIG is off
        let mut empty = gpu(2, "NVIDIA A100-SXM4-80GB", "00000000:47:00.0", &[]);
        empty.mig_enabled = true;
        let d = map_gpus(&[g, off, empty]);
        let layout = d[0].mig.as_ref().unwrap();
        let starts: Vec<(&str, u8)> = layout
            .instances
            .iter()
            .map(|i| (i.profile.as_str(), i.start))
            .collect();
        assert_eq!(starts, [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]);
        // The model's MIG tables accept the layout.
        geometry(&d[0].model).unwrap().check(layout).unwrap();
        assert_eq!(d[1].mig, None);
        assert_eq!(d[2].mig, Some(MigLayout::default()));
    }

    #[test]
    fn nvidia_smi_gpu_instances_parse() {
        let text = "\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        2          0:4     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        9          6:1     |
+-------------------------------------------------------+
|   3  MIG 7g.80gb          0        0          0:8     |
+-------------------------------------------------------+
No MIG-enabled devices found.
";
        assert_eq!(
            parse_mig_lgi(text),
            [
                (0, "3g.40gb".to_string(), 0),
                (0, "1g.10gb".to_string(), 6),
                (3, "7g.80gb".to_string(), 0)
            ]
        );
    }

    #[test]
    fn nvidia_smi_list_gives_mig_uuids() {
        let text = "\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: MIG-a6b0b5d5-0000-1111-2222-333344445555)
  MIG 1g.5gb      Device  1: (UUID: MIG-b6b0b5d5-0000-1111-2222-333344445555)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-6d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
";
        let l = parse_smi_list_mig(text);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].0, 0);
        assert_eq!(l[0].1, "3g.20gb");
        assert!(l[1].2.starts_with("MIG-b6b0"));
        assert_eq!(
            parse_mig_lgi_ids("|   0  MIG 3g.40gb          9        2          0:4     |"),
            [(0, "3g.40gb".to_string(), 0, 2)]
        );
    }

    #[test]
    fn a_failing_source_means_no_gpus() {
        struct NoDriver;
        impl GpuSource for NoDriver {
            fn name(&self) -> &str {
                "NVML"
            }
            fn gpus(&self) -> Result<Vec<RawGpu>, String> {
                Err("libnvidia-ml.so.1: cannot open shared object file".into())
            }
        }
        assert!(discover(&NoDriver).is_empty());
        // And the real NVML on a machine without a driver behaves the same: no
        // panic, no error, whatever it finds (GPUs on a GPU machine).
        let _ = discover(&NvmlSource);
    }

    #[test]
    fn attach_keeps_allocatable_and_devices_in_agreement() {
        let mut n = Node::new("n", tessera_model::Resources::new(8000, 64 * GIB));
        let d = map_gpus(&[
            gpu(0, "NVIDIA H100 80GB HBM3", "00000000:10:00.0", &[]),
            gpu(1, "NVIDIA H100 80GB HBM3", "00000000:11:00.0", &[]),
        ]);
        attach(&mut n, d);
        assert_eq!(n.allocatable.gpu_milli, 2000);
        assert_eq!(n.allocatable.gpu_memory, 160 * GIB);
        assert_eq!(n.labels["nvidia.com/gpu.product"], "H100-80GB");
        assert_eq!(
            pcie_root_of(std::path::Path::new(
                "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
            )),
            Some("pci0000:3a".into())
        );
    }
}

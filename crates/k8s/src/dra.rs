//! Dynamic Resource Allocation (`resource.k8s.io/v1`): GPUs published as
//! ResourceSlices (NVIDIA's DRA driver, `gpu.nvidia.com`), pods that ask for them
//! through ResourceClaims, and the allocation result Tessera writes on a claim
//! itself (as kube-scheduler's DRA plugin would), so that a DRA pod costs what a
//! plain pod costs: one placement decision, one status write, one binding.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as res;
use serde_json::json;
use tessera_model::{GpuDevice, parse_bytes};

use crate::translate::{TranslateError, gpu_model};

/// NVIDIA's DRA driver name (also the name of its GPU DeviceClass).
pub const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// One GPU a ResourceSlice publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// Device name in the slice (`gpu-0`).
    pub name: String,
    pub index: u32,
    pub model: String,
    pub memory: u64,
    pub pcie_root: Option<String>,
}

/// The GPUs of one node's slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub node: String,
    pub driver: String,
    pub pool: String,
    pub devices: Vec<DraDevice>,
}

fn attr<'a>(d: &'a res::Device, k: &str) -> Option<&'a res::DeviceAttribute> {
    let a = d.attributes.as_ref()?;
    a.get(k).or_else(|| a.get(&format!("{NVIDIA_DRIVER}/{k}")))
}

/// Translates a ResourceSlice of NVIDIA's driver into the GPUs of its node.
/// Slices of other drivers, or not tied to one node, give `None`; MIG devices
/// (`type: mig`) are left to the device plugin path (extended resources).
pub fn slice(s: &res::ResourceSlice) -> Result<Option<SliceInfo>, TranslateError> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let object = format!("resourceslice {name}");
    let spec = &s.spec;
    if spec.driver != NVIDIA_DRIVER {
        return Ok(None);
    }
    let Some(node) = spec.node_name.clone() else {
        return Ok(None);
    };
    let mut devices = Vec::new();
    for (i, d) in spec.devices.iter().flatten().enumerate() {
        let ty = attr(d, "type").and_then(|a| a.string.as_deref());
        if ty.is_some_and(|t| t != "gpu") {
            continue;
        }
        let index = match attr(d, "index").and_then(|a| a.int) {
            Some(x) if (0..=1024).contains(&x) => x as u32,
            Some(x) => {
                return Err(TranslateError {
                    object,
                    field: format!("spec.devices[{i}].attributes.index"),
                    value: x.to_string(),
                    problem: "not a GPU index (0..1024)".into(),
                });
            }
            None => i as u32,
        };
        let memory = match d.capacity.as_ref().and_then(|c| c.get("memory")) {
            Some(c) => parse_bytes(&c.value.0).map_err(|e| TranslateError {
                object: object.clone(),
                field: format!("spec.devices[{i}].capacity.memory"),
                value: c.value.0.clone(),
                problem: e.to_string(),
            })?,
            None => 0,
        };
        devices.push(DraDevice {
            name: d.name.clone(),
            index,
            model: attr(d, "productName")
                .and_then(|a| a.string.as_deref())
                .map(gpu_model)
                .unwrap_or_else(|| "nvidia-gpu".into()),
            memory,
            pcie_root: attr(d, PCIE_ROOT).and_then(|a| a.string.clone()),
        });
    }
    devices.sort_by_key(|d| d.index);
    Ok(Some(SliceInfo {
        node,
        driver: spec.driver.clone(),
        pool: spec.pool.name.clone(),
        devices,
    }))
}

/// Puts a node's DRA GPUs into its model node (replacing count-only GPUs).
pub fn apply_to_node(node: &mut tessera_model::Node, slices: &[&SliceInfo]) {
    let mut devs: Vec<&DraDevice> = slices.iter().flat_map(|s| s.devices.iter()).collect();
    if devs.is_empty() {
        return;
    }
    devs.sort_by_key(|d| d.index);
    node.gpus = devs
        .iter()
        .map(|d| {
            let mut g = GpuDevice::new(d.index, d.model.clone(), d.memory);
            g.pcie_root = d.pcie_root.clone();
            g
        })
        .collect();
    node.allocatable.gpu_milli = node.gpus.len() as u64 * 1000;
    node.allocatable.gpu_memory = node.gpus.iter().map(|g| g.memory).sum();
}

/// What Tessera needs of a ResourceClaim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimInfo {
    pub namespace: String,
    pub name: String,
    /// `(request name, count)` of the GPU requests, in order.
    pub gpu_requests: Vec<(String, u32)>,
    /// Already allocated (by Tessera or another scheduler).
    pub allocated: bool,
    /// The node the allocation pins the claim to, when allocated.
    pub allocated_node: Option<String>,
}

impl ClaimInfo {
    pub fn gpus(&self) -> u32 {
        self.gpu_requests.iter().map(|(_, c)| c).sum()
    }
}

/// Translates a ResourceClaim. Requests of a GPU device class
/// (`gpu.nvidia.com`) count; `allocationMode: All` is refused (the count must be
/// known to place the pod).
pub fn claim(c: &res::ResourceClaim) -> Result<ClaimInfo, TranslateError> {
    let namespace = c.metadata.namespace.clone().unwrap_or_default();
    let name = c.metadata.name.clone().unwrap_or_default();
    let object = format!("resourceclaim {namespace}/{name}");
    let mut gpu_requests = Vec::new();
    for (i, r) in c
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(e) = &r.exactly else { continue };
        if e.device_class_name != NVIDIA_DRIVER {
            continue;
        }
        if e.allocation_mode.as_deref() == Some("All") {
            return Err(TranslateError {
                object,
                field: format!("spec.devices.requests[{i}].exactly.allocationMode"),
                value: "All".into(),
                problem:
                    "Tessera places GPU claims with an exact count; use allocationMode ExactCount"
                        .into(),
            });
        }
        let count = e.count.unwrap_or(1);
        let count = u32::try_from(count).map_err(|_| TranslateError {
            object: object.clone(),
            field: format!("spec.devices.requests[{i}].exactly.count"),
            value: count.to_string(),
            problem: "not a device count".into(),
        })?;
        gpu_requests.push((r.name.clone(), count));
    }
    let alloc = c.status.as_ref().and_then(|s| s.allocation.as_ref());
    let allocated_node = alloc
        .and_then(|a| a.node_selector.as_ref())
        .and_then(|s| s.node_selector_terms.first())
        .and_then(|t| t.match_fields.as_ref())
        .and_then(|f| f.iter().find(|r| r.key == "metadata.name"))
        .and_then(|r| r.values.as_ref()?.first().cloned());
    Ok(ClaimInfo {
        namespace,
        name,
        gpu_requests,
        allocated: alloc.is_some(),
        allocated_node,
    })
}

/// The status merge patch that allocates `claim` on `node` with the GPUs
/// `indices` (taken in order by the claim's requests), reserved for the pod.
/// Returns the patch and how many of `indices` it used.
pub fn allocation_patch(
    claim: &ClaimInfo,
    node: &str,
    slices: &[&SliceInfo],
    indices: &[u32],
    pod_name: &str,
    pod_uid: &str,
) -> Option<(serde_json::Value, usize)> {
    let by_index: BTreeMap<u32, (&SliceInfo, &DraDevice)> = slices
        .iter()
        .flat_map(|s| s.devices.iter().map(move |d| (d.index, (*s, d))))
        .collect();
    let mut results = Vec::new();
    let mut used = 0;
    for (req, count) in &claim.gpu_requests {
        for _ in 0..*count {
            let idx = *indices.get(used)?;
            let (s, d) = by_index.get(&idx)?;
            results.push(json!({
                "request": req, "driver": s.driver, "pool": s.pool, "device": d.name
            }));
            used += 1;
        }
    }
    Some((
        json!({"status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]
        }}),
        used,
    ))
}

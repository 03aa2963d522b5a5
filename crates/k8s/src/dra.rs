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
    /// A request with `firstAvailable` GPU subrequests (DRA's prioritized
    /// list): `(request/subrequest, count)` in order of preference. The pod's
    /// task takes the first count as its `gpu` and the others as
    /// alternatives; the allocation names the subrequest the plan chose.
    pub first_available: Vec<(String, u32)>,
    /// Already allocated (by Tessera or another scheduler).
    pub allocated: bool,
    /// The node the allocation pins the claim to, when allocated.
    pub allocated_node: Option<String>,
    /// GPUs the allocation holds, when allocated.
    pub allocated_gpus: Option<u32>,
}

impl ClaimInfo {
    /// GPUs of the exact requests, plus the first choice of a prioritized list.
    pub fn gpus(&self) -> u32 {
        self.gpu_requests.iter().map(|(_, c)| c).sum::<u32>()
            + self.first_available.first().map_or(0, |x| x.1)
    }

    /// GPUs the claim holds once allocated: what the allocation lists (the
    /// choice taken of a prioritized list), else [`ClaimInfo::gpus`].
    pub fn held_gpus(&self) -> u32 {
        self.allocated_gpus.unwrap_or_else(|| self.gpus())
    }

    /// The GPU counts the claim accepts beyond [`ClaimInfo::gpus`], in order
    /// (the other choices of its prioritized list, with the exact requests).
    pub fn gpu_alternatives(&self) -> Vec<u32> {
        let exact: u32 = self.gpu_requests.iter().map(|(_, c)| c).sum();
        self.first_available
            .iter()
            .skip(1)
            .map(|x| exact + x.1)
            .collect()
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
    let mut first_available = Vec::new();
    for (i, r) in c
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(subs) = r.first_available.as_ref().filter(|_| r.exactly.is_none()) {
            // One prioritized list is read; GPU subrequests only, in order.
            if !first_available.is_empty() {
                continue;
            }
            for (k, sub) in subs.iter().enumerate() {
                if sub.device_class_name != NVIDIA_DRIVER {
                    continue;
                }
                if sub.allocation_mode.as_deref() == Some("All") {
                    return Err(TranslateError {
                        object,
                        field: format!("spec.devices.requests[{i}].firstAvailable[{k}].allocationMode"),
                        value: "All".into(),
                        problem: "Tessera places GPU claims with an exact count; use allocationMode ExactCount".into(),
                    });
                }
                let count = sub.count.unwrap_or(1);
                let count = u32::try_from(count).map_err(|_| TranslateError {
                    object: object.clone(),
                    field: format!("spec.devices.requests[{i}].firstAvailable[{k}].count"),
                    value: count.to_string(),
                    problem: "not a device count".into(),
                })?;
                first_available.push((format!("{}/{}", r.name, sub.name), count));
            }
            continue;
        }
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
    let allocated_gpus = alloc.and_then(|a| a.devices.as_ref()).map(|d| {
        d.results.as_ref().map_or(0, |r| {
            r.iter().filter(|x| x.driver == NVIDIA_DRIVER).count() as u32
        })
    });
    Ok(ClaimInfo {
        allocated_gpus,
        namespace,
        name,
        gpu_requests,
        first_available,
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
    // Of a prioritized list, the choice the GPUs given make: the first whose
    // count, with the exact requests, is what is left; else the first that fits.
    let exact: usize = claim.gpu_requests.iter().map(|x| x.1 as usize).sum();
    let left = indices.len().saturating_sub(exact);
    let chosen = claim
        .first_available
        .iter()
        .find(|x| x.1 as usize == left)
        .or_else(|| {
            claim
                .first_available
                .iter()
                .find(|x| (x.1 as usize) <= left)
        });
    let requests: Vec<(String, u32)> = claim
        .gpu_requests
        .iter()
        .cloned()
        .chain(chosen.cloned())
        .collect();
    for (req, count) in &requests {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prioritized_list_is_read_and_the_allocation_names_the_choice() {
        let c: res::ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpus", "firstAvailable": [
                {"name": "four", "deviceClassName": NVIDIA_DRIVER, "count": 4},
                {"name": "two", "deviceClassName": NVIDIA_DRIVER, "count": 2}
            ]}]}}
        }))
        .unwrap();
        let ci = claim(&c).unwrap();
        assert_eq!(
            ci.first_available,
            vec![("gpus/four".into(), 4), ("gpus/two".into(), 2)]
        );
        assert_eq!(ci.gpus(), 4);
        assert_eq!(ci.gpu_alternatives(), vec![2]);
        let slice = SliceInfo {
            node: "n".into(),
            driver: NVIDIA_DRIVER.into(),
            pool: "p".into(),
            devices: (0..4)
                .map(|i| DraDevice {
                    name: format!("gpu-{i}"),
                    index: i,
                    model: String::new(),
                    memory: 0,
                    pcie_root: None,
                })
                .collect(),
        };
        let (patch, used) = allocation_patch(&ci, "n", &[&slice], &[1, 3], "pod", "uid").unwrap();
        assert_eq!(used, 2);
        let results = &patch["status"]["allocation"]["devices"]["results"];
        assert_eq!(results[0]["request"], "gpus/two");
        assert_eq!(results[1]["device"], "gpu-3");
    }
}

//! `tessera up --cluster FILE`: the simulated nodes to register, from a scenario
//! file (its `nodes`, the `tessera sched plan` format) or the Alibaba GPU
//! trace's node list (`sn,cpu_milli,memory_mib,gpu,model`, a `.csv` file).

use std::path::Path;

use tessera_model::{GpuDevice, Node, Resources};
use tessera_sim::trace::NodeRow;

/// GPU memory of the Alibaba trace's models, in GiB. The trace does not give
/// it; `G2` and `G3` are anonymised and taken as 16 GiB.
const TRACE_GPU_GIB: &[(&str, u64)] = &[
    ("A10", 24),
    ("P100", 16),
    ("T4", 16),
    ("V100M16", 16),
    ("V100M32", 32),
    ("G2", 16),
    ("G3", 16),
];

/// Reads the nodes of `path`: a `.csv` is the Alibaba node list, anything else
/// a scenario file. Errors name the file (and line or field).
pub fn load(path: &Path) -> Result<Vec<Node>, String> {
    let csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let nodes = if csv {
        let rows = tessera_sim::trace::load_nodes(path).map_err(|e| e.to_string())?;
        rows.iter()
            .map(from_trace)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        tessera_sim::scenario::load(path)
            .map_err(|e| e.to_string())?
            .snapshot
            .nodes
    };
    if nodes.is_empty() {
        return Err(format!(
            "{}: no nodes in the file; give a scenario with `nodes:` or an Alibaba node list",
            path.display()
        ));
    }
    Ok(nodes)
}

/// One node of the trace as a model node (110 pods, like a Kubernetes node).
pub fn from_trace(r: &NodeRow) -> Result<Node, String> {
    let (Ok(cpu), Ok(mem)) = (u64::try_from(r.cpu_milli), u64::try_from(r.memory_mib)) else {
        return Err(format!(
            "node {}: negative cpu_milli {} or memory_mib {}",
            r.name, r.cpu_milli, r.memory_mib
        ));
    };
    let mut alloc = Resources::new(cpu, mem << 20);
    alloc.pods = 110;
    let name: String = r
        .name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut n = Node::new(name, alloc);
    if r.gpus > 0 {
        let gib = TRACE_GPU_GIB
            .iter()
            .find(|(m, _)| m.eq_ignore_ascii_case(&r.model))
            .map_or(16, |(_, g)| *g);
        n.gpus = (0..r.gpus)
            .map(|i| GpuDevice::new(i, r.model.clone(), gib << 30))
            .collect();
        n.allocatable.gpu_milli = 1000 * u64::from(r.gpus);
        n.allocatable.gpu_memory = u64::from(r.gpus) * (gib << 30);
        n.labels
            .insert("nvidia.com/gpu.product".into(), r.model.clone());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibaba_nodes_and_scenarios_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let nodes =
            load(&root.join("data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv")).unwrap();
        assert_eq!(nodes.len(), 1213);
        let n = &nodes[0];
        assert_eq!(n.name, "openb-node-0000");
        assert_eq!(n.allocatable.cpu_milli, 64_000);
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.allocatable.gpu_memory, 2 * (16 << 30));
        assert_eq!(n.gpus[1].model, "P100");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.csv");
        std::fs::write(&empty, "sn,cpu_milli,memory_mib,gpu,model\n").unwrap();
        assert!(load(&empty).unwrap_err().contains("no nodes"));
        let bad = dir.path().join("bad.csv");
        std::fs::write(&bad, "sn,cpu_milli,memory_mib,gpu,model\nx,lots,1,0,\n").unwrap();
        let e = load(&bad).unwrap_err();
        assert!(e.contains("bad.csv"), "{e}");
    }
}

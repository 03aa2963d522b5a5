//! The local machine as a node: CPU count and memory from the OS, GPUs through
//! NVML where a driver is present (see [`crate::gpu`]), else none.

use tessera_model::{Node, Resources};

/// The hostname, lowercased and reduced to a valid node name.
pub fn local_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_else(|_| "local".into());
    let mut s: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.truncate(63);
    let s = s.trim_matches('-').to_string();
    if s.is_empty() { "local".into() } else { s }
}

/// Total memory in bytes, from `/proc/meminfo`.
fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// This machine as a node, with the GPUs NVML reports.
pub fn local_node() -> Node {
    local_node_with(&crate::gpu::NvmlSource)
}

/// This machine as a node, with the GPUs of `gpus`.
pub fn local_node_with(gpus: &dyn crate::gpu::GpuSource) -> Node {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1);
    let mut r = Resources::new(cpus * 1000, mem_total());
    r.pods = 110;
    let mut n = Node::new(local_name(), r);
    n.labels.insert("tessera.io/local".into(), "true".into());
    crate::gpu::attach(&mut n, crate::gpu::discover(gpus));
    n
}

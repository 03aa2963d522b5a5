//! Annotations and labels Tessera reads and writes, and what the GPU Feature
//! Discovery product label's value names.

/// Volcano's pod annotation naming the pod's PodGroup.
pub const VOLCANO_GROUP: &str = "scheduling.k8s.io/group-name";
/// scheduler-plugins' pod label naming the pod's PodGroup.
pub const X_K8S_GROUP: &str = "scheduling.x-k8s.io/pod-group";
/// Tessera's pod label naming the pod's PodGroup.
pub const TESSERA_GROUP: &str = "scheduling.tessera.dev/pod-group";
/// Queue of a pod without a PodGroup (Volcano's annotation, and Tessera's).
pub const VOLCANO_QUEUE: &str = "scheduling.volcano.sh/queue-name";
pub const TESSERA_QUEUE: &str = "scheduling.tessera.dev/queue";
/// `training`, `inference`, `batch` or `agent` (pod annotation or label).
pub const KIND: &str = "scheduling.tessera.dev/kind";
/// A fraction of one GPU: compute share in milli-GPU (1..999) and memory.
pub const GPU_MILLI: &str = "scheduling.tessera.dev/gpu-milli";
pub const GPU_MEMORY: &str = "scheduling.tessera.dev/gpu-memory";
/// Allowed GPU models, comma-separated.
pub const GPU_MODELS: &str = "scheduling.tessera.dev/gpu-models";
/// Written by Tessera at binding: the GPU indices the pod holds on its node.
pub const GPU_INDICES: &str = "scheduling.tessera.dev/gpu-indices";
/// Volcano's annotation: `"false"` keeps the pod from being preempted.
pub const PREEMPTABLE: &str = "volcano.sh/preemptable";
/// The extended resource of whole NVIDIA GPUs.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// GPU Feature Discovery labels.
pub const GFD_PRODUCT: &str = "nvidia.com/gpu.product";
pub const GFD_COUNT: &str = "nvidia.com/gpu.count";
pub const GFD_MEMORY: &str = "nvidia.com/gpu.memory";
pub const GFD_CLIQUE: &str = "nvidia.com/gpu.clique";
/// GFD's MIG labels (see [`super::mig`]): `single` or `mixed`; `true` or
/// `false`; compute slices of one instance (single strategy).
pub const GFD_MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
pub const GFD_MIG_CAPABLE: &str = "nvidia.com/mig.capable";
pub const GFD_SLICES_GI: &str = "nvidia.com/gpu.slices.gi";
pub const GFD_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// NVIDIA mig-manager's progress: `pending`, `rebooting`, `success`, `failed`.
pub const MIG_CONFIG_STATE: &str = "nvidia.com/mig.config.state";
/// Written by Tessera at binding: the MIG instance the pod holds,
/// `gpu=2,profile=3g.40gb,start=4` (read back so occupancy survives a restart).
pub const MIG_INSTANCE: &str = "scheduling.tessera.dev/mig-instance";
/// Prefix of the synthetic node labels that carry required node affinity
/// into the model's node selectors (snapshot only; never written).
pub const AFFINITY_PREFIX: &str = "affinity.scheduling.tessera.dev/";

/// The GPU model name from a GFD product label: `NVIDIA-H100-80GB-HBM3` ->
/// `H100-80GB-HBM3`, `Tesla-T4` -> `T4`.
pub fn gpu_model(product: &str) -> String {
    let p = product.trim();
    for prefix in ["NVIDIA-", "NVIDIA ", "Tesla-", "Tesla "] {
        if let Some(rest) = p.strip_prefix(prefix) {
            return rest.replace(' ', "-");
        }
    }
    p.replace(' ', "-")
}

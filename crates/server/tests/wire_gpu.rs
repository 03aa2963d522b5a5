//! The job wire format carries MIG requests and topology constraints through to
//! the model (`tessera-model` types, serde-compatible on both sides).

use serde_json::json;
use tessera_model::{GpuRequest, GpuScope, Strength};
use tessera_server::wire::JobSpec;

#[test]
fn job_spec_accepts_mig_and_topology() {
    let spec: JobSpec = serde_json::from_value(json!({
        "name": "j", "queue": "q",
        "network_topology": {"tier": 1, "strength": "soft"},
        "tasks": [
            {"name": "a", "gpu": {"mig": {"profile": "3g.40gb"}}},
            {"name": "b", "gpu": {"whole": {"count": 4}}, "topology": {"scope": "nvlink_domain"}}
        ]
    }))
    .unwrap();
    assert_eq!(spec.network_topology.unwrap().tier, 1);
    assert_eq!(spec.network_topology.unwrap().strength, Strength::Soft);
    assert_eq!(
        spec.tasks[0].gpu,
        GpuRequest::Mig {
            profile: "3g.40gb".into(),
            models: vec![]
        }
    );
    let t = spec.tasks[1].topology.unwrap();
    assert_eq!(
        (t.scope, t.strength),
        (GpuScope::NvlinkDomain, Strength::Hard)
    );
    // Old bodies still read, and unknown fields are still rejected.
    let old: JobSpec =
        serde_json::from_value(json!({"name": "j", "queue": "q", "tasks": [{"name": "a"}]}))
            .unwrap();
    assert!(old.network_topology.is_none() && old.tasks[0].topology.is_none());
    assert!(
        serde_json::from_value::<JobSpec>(
            json!({"name": "j", "queue": "q", "tasks": [{"name": "a", "topo": 1}]})
        )
        .is_err()
    );
}

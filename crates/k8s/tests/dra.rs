//! DRA (`resource.k8s.io/v1`) against recorded responses shaped like NVIDIA's DRA
//! driver's, through a mock service under `kube::Client` (the v1.20 apiserver of
//! the integration tests serves no DRA): ResourceSlices become the node's GPUs, a
//! pod's ResourceClaim becomes a GPU request, and binding writes the claim's
//! allocation (devices, node selector, reservedFor) before the binding itself.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::resource::v1 as res;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::client::Body;
use serde_json::{Value, json};
use tessera_k8s::state::State;

const SLICES: &str = include_str!("dra/resourceslices.json");
const CLAIMS: &str = include_str!("dra/resourceclaims.json");

type Log = Arc<Mutex<Vec<(String, String, Value)>>>;

/// A mock apiserver: answers the recorded lists, records writes.
fn mock(log: Log) -> Client {
    let svc = tower::service_fn(move |req: Request<Body>| {
        let log = log.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let body = req.into_body().collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            log.lock()
                .unwrap()
                .push((method.clone(), path.clone(), body.clone()));
            let (code, answer) = match (method.as_str(), path.as_str()) {
                ("GET", "/apis/resource.k8s.io/v1/resourceslices") => (200, SLICES.to_string()),
                ("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims") => {
                    (200, CLAIMS.to_string())
                }
                ("PATCH", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/trainer-gpus-5xk9p/status") => {
                    let claims: Value = serde_json::from_str(CLAIMS).unwrap();
                    let mut c = claims["items"][0].clone();
                    c["status"] = body["status"].clone();
                    (200, c.to_string())
                }
                ("POST", "/api/v1/namespaces/ml/pods/trainer/binding") => (
                    201,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
                        .to_string(),
                ),
                _ => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "reason": "NotFound", "code": 404, "message": format!("{method} {path}")})
                    .to_string(),
                ),
            };
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(answer.into_bytes()))
                    .unwrap(),
            )
        }
    });
    Client::new(svc, "default")
}

fn node() -> core::Node {
    serde_json::from_value(json!({
        "metadata": {"name": "dgx-1", "labels": {"kubernetes.io/hostname": "dgx-1"}},
        "status": {"allocatable": {"cpu": "112", "memory": "2Ti", "pods": "110"}}
    }))
    .unwrap()
}

fn pod() -> core::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "trainer", "namespace": "ml", "uid": "0f7c1e2d-aaaa-4bbb-8ccc-1d2e3f4a5b6c"},
        "spec": {"schedulerName": "tessera",
            "containers": [{"name": "main", "image": "x",
                "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]},
        "status": {"phase": "Pending",
            "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "trainer-gpus-5xk9p"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn dra_claim_is_allocated_and_the_pod_bound() {
    let log: Log = Arc::default();
    let client = mock(log.clone());
    let slices: Api<res::ResourceSlice> = Api::all(client.clone());
    let claims: Api<res::ResourceClaim> = Api::namespaced(client.clone(), "ml");

    let mut st = State::new("tessera");
    st.apply_node(&node());
    for s in slices.list(&ListParams::default()).await.unwrap().items {
        st.apply_slice(&s);
    }
    for c in claims.list(&ListParams::default()).await.unwrap().items {
        st.apply_claim(&c);
    }
    st.apply_pod(&pod());
    assert!(st.errors.is_empty(), "{:?}", st.errors);

    // The slice's full GPUs (not the MIG device, not the other driver) on the node.
    let built = st.build();
    let n = &built.snapshot.nodes[0];
    assert_eq!(n.gpus.len(), 3, "{:?}", n.gpus);
    assert_eq!(n.gpus[0].model, "H100-80GB-HBM3");
    assert_eq!(n.gpus[0].memory, 81559 << 20);
    assert_eq!(n.gpus[2].pcie_root.as_deref(), Some("pci0000:9a"));
    assert_eq!(n.allocatable.gpu_milli, 3000);

    // The claim asks for two GPUs: one decision places the pod with two of them.
    let plan = tessera_sched::schedule(&built.snapshot, &tessera_sched::Config::default());
    assert_eq!(plan.bindings.len(), 1, "{plan}");
    let b = &plan.bindings[0];
    assert_eq!(b.node, "dgx-1");
    assert_eq!(b.gpus.len(), 2);

    let key = built.pod_of(&b.task.group, &b.task.task).unwrap();
    tessera_k8s::controller::bind_once(&client, &st, key, b.node.clone(), b.gpus.clone())
        .await
        .unwrap();

    let log = log.lock().unwrap();
    let writes: Vec<&(String, String, Value)> = log.iter().filter(|(m, _, _)| m != "GET").collect();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    // First the claim's allocation, then the binding.
    let (m, path, patch) = writes[0];
    assert_eq!(m, "PATCH");
    assert!(path.ends_with("/resourceclaims/trainer-gpus-5xk9p/status"));
    let results = patch["status"]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap();
    let devices: Vec<String> = b.gpus.iter().map(|i| format!("gpu-{i}")).collect();
    assert_eq!(results.len(), 2);
    for (r, d) in results.iter().zip(&devices) {
        assert_eq!(r["request"], "gpus");
        assert_eq!(r["driver"], "gpu.nvidia.com");
        assert_eq!(r["pool"], "dgx-1");
        assert_eq!(&r["device"], d);
    }
    assert_eq!(
        patch["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"]
            [0],
        "dgx-1"
    );
    assert_eq!(patch["status"]["reservedFor"][0]["name"], "trainer");
    assert_eq!(
        patch["status"]["reservedFor"][0]["uid"],
        "0f7c1e2d-aaaa-4bbb-8ccc-1d2e3f4a5b6c"
    );
    let (m, path, binding) = writes[1];
    assert_eq!(
        (m.as_str(), path.as_str()),
        ("POST", "/api/v1/namespaces/ml/pods/trainer/binding")
    );
    assert_eq!(binding["target"]["name"], "dgx-1");
    // DRA pods carry their devices in the claim, not in an annotation.
    assert!(
        !log.iter()
            .any(|(m, p, _)| m == "PATCH" && p.ends_with("/pods/trainer"))
    );
}

#[test]
fn pod_waits_for_its_claim() {
    let mut st = State::new("tessera");
    st.apply_node(&node());
    let mut p = pod();
    p.status = None;
    st.apply_pod(&p);
    let b = st.build();
    assert!(b.snapshot.groups.is_empty());
    assert!(b.waiting[0].1.contains("ResourceClaim"), "{:?}", b.waiting);
}

//! The controller starts when an optional API is announced but cannot be
//! listed (a CRD whose lists are forbidden by RBAC, or removed after
//! discovery): it treats those kinds as empty instead of waiting for them. A
//! mock service under `kube::Client` plays the apiserver: it announces
//! Volcano's groups (scheduling and HyperNode topology), answers 403 to their
//! lists, 404 to every other optional kind, and empty lists for Nodes and Pods.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::json;
use tessera_k8s::{Metrics, RunConfig};

fn status(code: u16, reason: &str) -> String {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "reason": reason, "code": code, "message": reason})
    .to_string()
}

fn mock(log: Arc<Mutex<Vec<String>>>) -> Client {
    mock_with(log, Arc::new(AtomicBool::new(false)))
}

/// The mock; once `x_k8s` is set it also serves scheduler-plugins' API (a CRD
/// installed after the controller started).
fn mock_with(log: Arc<Mutex<Vec<String>>>, x_k8s: Arc<AtomicBool>) -> Client {
    let svc = tower::service_fn(move |req: Request<Body>| {
        let log = log.clone();
        let x_k8s = x_k8s.load(Relaxed);
        async move {
            let path = req.uri().path().to_string();
            let watch = req.uri().query().unwrap_or("").contains("watch=true");
            log.lock().unwrap().push(format!("{path} watch={watch}"));
            let list = |kind: &str| {
                json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": []})
                    .to_string()
            };
            let (code, answer) = match path.as_str() {
                "/apis/scheduling.volcano.sh/v1beta1" => (
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "scheduling.volcano.sh/v1beta1",
                           "resources": [
                               {"name": "podgroups", "singularName": "podgroup", "namespaced": true, "kind": "PodGroup", "verbs": ["list", "watch"]},
                               {"name": "queues", "singularName": "queue", "namespaced": false, "kind": "Queue", "verbs": ["list", "watch"]}]})
                    .to_string(),
                ),
                "/apis/topology.volcano.sh/v1alpha1" => (
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "topology.volcano.sh/v1alpha1",
                           "resources": [
                               {"name": "hypernodes", "singularName": "hypernode", "namespaced": false, "kind": "HyperNode", "verbs": ["list", "watch"]}]})
                    .to_string(),
                ),
                "/apis/scheduling.x-k8s.io/v1alpha1" if x_k8s => (
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "scheduling.x-k8s.io/v1alpha1",
                           "resources": [
                               {"name": "podgroups", "singularName": "podgroup", "namespaced": true, "kind": "PodGroup", "verbs": ["list", "watch"]}]})
                    .to_string(),
                ),
                p if p.starts_with("/apis/scheduling.volcano.sh/")
                    || p.starts_with("/apis/topology.volcano.sh/") =>
                {
                    (403, status(403, "Forbidden"))
                }
                // Watches fail (and back off); the first lists are what count.
                "/api/v1/nodes" | "/api/v1/pods" if watch => (500, status(500, "InternalError")),
                "/api/v1/nodes" => (200, list("NodeList")),
                "/api/v1/pods" => (200, list("PodList")),
                _ => (404, status(404, "NotFound")),
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

#[tokio::test]
async fn starts_without_an_optional_api_it_cannot_list() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let client = mock(log.clone());
    let metrics = Arc::new(Metrics::default());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let cfg = RunConfig {
        period: Duration::from_millis(100),
        ..RunConfig::default()
    };
    let h = tokio::spawn(tessera_k8s::run(client, cfg, metrics.clone(), rx));
    let start = Instant::now();
    while !metrics.ready.load(Relaxed) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the controller waited for lists it cannot get; requests: {:#?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = log.lock().unwrap().clone();
    for p in [
        "/apis/scheduling.volcano.sh/v1beta1/podgroups watch=false",
        "/apis/scheduling.volcano.sh/v1beta1/queues watch=false",
        "/apis/topology.volcano.sh/v1alpha1/hypernodes watch=false",
    ] {
        assert!(seen.iter().any(|s| s == p), "never listed {p}: {seen:#?}");
    }
    let _ = stop.send(true);
    let r = tokio::time::timeout(Duration::from_secs(10), h).await;
    assert!(
        matches!(r, Ok(Ok(Ok(())))),
        "the controller did not stop cleanly: {r:?}"
    );
}

#[tokio::test]
async fn an_api_that_appears_later_makes_the_controller_start_again() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let x_k8s = Arc::new(AtomicBool::new(false));
    let client = mock_with(log.clone(), x_k8s.clone());
    let metrics = Arc::new(Metrics::default());
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let cfg = RunConfig {
        period: Duration::from_millis(100),
        rediscover: Duration::from_millis(100),
        ..RunConfig::default()
    };
    let h = tokio::spawn(tessera_k8s::run(client, cfg, metrics.clone(), rx));
    let start = Instant::now();
    while !metrics.ready.load(Relaxed) {
        assert!(start.elapsed() < Duration::from_secs(30), "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing new: it keeps running through several rediscoveries.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!h.is_finished(), "stopped with nothing new served");
    // scheduler-plugins' CRD is installed.
    x_k8s.store(true, Relaxed);
    let r = tokio::time::timeout(Duration::from_secs(10), h).await;
    match r {
        Ok(Ok(Err(tessera_k8s::RunError::ApisChanged(apis)))) => {
            assert_eq!(apis, "scheduling.x-k8s.io/v1alpha1")
        }
        other => panic!("expected ApisChanged, got {other:?}"),
    }
}

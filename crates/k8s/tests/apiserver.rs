//! Tessera against a real kube-apiserver and etcd on loopback, with node
//! objects only (as KWOK does). One server for the whole file: the scenarios run
//! in turn, each on its own nodes (the previous ones are deleted), namespace and
//! controller.
//!
//! Needs `TESSERA_KUBE_APISERVER` (and `TESSERA_ETCD`, default `/usr/bin/etcd`);
//! skips with a printed reason when they are absent and `CI` is unset.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_k8s::gang::Flavour;
use tessera_k8s::testenv::{TestEnv, binaries_or_skip, fake_kubelet, fake_node, fake_pod};
use tessera_k8s::{LeaseConfig, Metrics, RunConfig, RunError};

type Handle = tokio::task::JoinHandle<Result<(), RunError>>;
type Scenario = std::pin::Pin<Box<dyn Future<Output = ()>>>;

struct Ctl {
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Sender<bool>,
    handle: Handle,
}

impl Ctl {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.handle).await;
    }
}

fn start(client: &Client, scheduler: &str, lease: Option<LeaseConfig>) -> Ctl {
    let metrics = Arc::new(Metrics::default());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let cfg = RunConfig {
        scheduler_name: scheduler.into(),
        lease,
        period: Duration::from_millis(500),
        concurrency: 16,
        ..RunConfig::default()
    };
    let handle = tokio::spawn(tessera_k8s::run(client.clone(), cfg, metrics.clone(), rx));
    Ctl {
        metrics,
        stop,
        handle,
    }
}

/// A controller without leader election, once its first lists are in.
async fn start_ready(client: &Client, scheduler: &str) -> Ctl {
    let ctl = start(client, scheduler, None);
    wait_for(
        "the controller's first lists (see its log above)",
        Duration::from_secs(30),
        || async { ctl.metrics.ready.load(Relaxed).then_some(()) },
    )
    .await;
    ctl
}

/// Polls `f` until it returns `Some`, or fails with `what` after `limit`.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn apply_json<K>(api: &Api<K>, v: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{v}: {e}"));
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {v}: {e}"));
}

/// A clean cluster for the next scenario: the earlier scenarios' pods (which
/// would use capacity on same-named nodes) and nodes go, then `nodes` come.
async fn fresh_nodes(client: &Client, nodes: Vec<core::Node>) {
    let all: Api<core::Pod> = Api::all(client.clone());
    let namespaces: std::collections::BTreeSet<String> = all
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().filter_map(|p| p.namespace()).collect())
        .unwrap_or_default();
    for ns in namespaces {
        let _ = Api::<core::Pod>::namespaced(client.clone(), &ns)
            .delete_collection(
                &DeleteParams::default().grace_period(0),
                &ListParams::default(),
            )
            .await;
    }
    wait_for("old pods to go", Duration::from_secs(30), || {
        let all = all.clone();
        async move {
            all.list(&ListParams::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
        }
    })
    .await;
    let api: Api<core::Node> = Api::all(client.clone());
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    wait_for("old nodes to go", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
        }
    })
    .await;
    for n in nodes {
        api.create(&PostParams::default(), &n).await.unwrap();
    }
}

async fn namespace(client: &Client, ns: &str) -> Api<core::Pod> {
    let api: Api<core::Namespace> = Api::all(client.clone());
    apply_json(&api, json!({"metadata": {"name": ns}})).await;
    Api::namespaced(client.clone(), ns)
}

async fn pods_by_name(pods: &Api<core::Pod>) -> BTreeMap<String, core::Pod> {
    match pods.list(&ListParams::default()).await {
        Ok(l) => l.items.into_iter().map(|p| (p.name_any(), p)).collect(),
        Err(e) => panic!("listing pods: {e}"),
    }
}

fn node_of(p: &core::Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

async fn bound_count(pods: &Api<core::Pod>) -> usize {
    pods_by_name(pods)
        .await
        .values()
        .filter(|p| node_of(p).is_some())
        .count()
}

/// Waits until `n` pods of the namespace are bound; on time-out, fails with
/// each pod's node or pending reason.
async fn wait_bound(pods: &Api<core::Pod>, n: usize, what: &str) {
    let limit = Duration::from_secs(60);
    let start = Instant::now();
    loop {
        if bound_count(pods).await >= n {
            return;
        }
        if start.elapsed() > limit {
            let seen: Vec<String> = pods_by_name(pods)
                .await
                .values()
                .map(|p| {
                    format!(
                        "{}: {}",
                        p.name_any(),
                        node_of(p)
                            .or_else(|| condition_message(p))
                            .unwrap_or_else(|| "unbound, no reason".into())
                    )
                })
                .collect();
            panic!("timed out after {limit:?} waiting for {what}; pods: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pod_with(ns: &str, name: &str, sched: &str, cpu: &str, extra: serde_json::Value) -> core::Pod {
    let mut v = serde_json::to_value(fake_pod(ns, name, sched, cpu, "64Mi")).unwrap();
    json_merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

async fn install_crds(client: Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crds = tessera_k8s::crd::tessera_crds();
    crds.extend(tessera_k8s::crd::foreign_crds());
    for c in crds {
        api.create(&PostParams::default(), &c)
            .await
            .unwrap_or_else(|e| panic!("the apiserver refused CRD {}: {e}", c.name_any()));
    }
    for gv in [
        "scheduling.tessera.dev/v1alpha1",
        "scheduling.volcano.sh/v1beta1",
        "scheduling.x-k8s.io/v1alpha1",
        "topology.volcano.sh/v1alpha1",
    ] {
        wait_for(gv, Duration::from_secs(30), || async {
            client
                .list_api_group_resources(gv)
                .await
                .ok()
                .filter(|l| !l.resources.is_empty())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn against_a_real_apiserver() {
    let Some(bins) = binaries_or_skip("against_a_real_apiserver") else {
        return;
    };
    let env = match TestEnv::start(&bins).await {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    };
    let client = env.client().unwrap();
    let kubelet = fake_kubelet(client.clone());
    let scenarios: Vec<(&str, Scenario)> = vec![
        // First, on a cluster that has none of the scheduling CRDs (as most
        // have no Volcano): the controller must start without them.
        (
            "pods bound, GPUs recorded (no scheduling CRDs installed)",
            Box::pin(pods_bound(client.clone())),
        ),
        (
            "CRDs installed (Tessera's, Volcano's, scheduler-plugins')",
            Box::pin(install_crds(client.clone())),
        ),
        (
            "gang all or nothing (Volcano PodGroup), reasons, status",
            Box::pin(gang(client.clone())),
        ),
        (
            "queue capability",
            Box::pin(queue_capability(client.clone())),
        ),
        (
            "preemption through eviction, PDB honoured",
            Box::pin(preemption(client.clone())),
        ),
        (
            "scheduler-plugins PodGroup with node affinity",
            Box::pin(gang_with_affinity(client.clone(), Flavour::XK8s)),
        ),
        (
            "Tessera PodGroup with node affinity",
            Box::pin(gang_with_affinity(client.clone(), Flavour::Tessera)),
        ),
        (
            "network topology: HyperNodes, hard gang in one rack, soft gang spans",
            Box::pin(network_topology(client.clone())),
        ),
        (
            "agent pods on the agent shard",
            Box::pin(agent_shard(client.clone())),
        ),
        (
            "MIG instances from GFD labels, recorded, surviving a restart",
            Box::pin(mig_instances(client.clone())),
        ),
        (
            "runtime classes: RuntimeClass node selectors honoured, reasons name the label",
            Box::pin(runtime_classes(client.clone())),
        ),
        (
            "two replicas, one killed",
            Box::pin(two_replicas(client.clone())),
        ),
    ];
    for (name, s) in scenarios {
        eprintln!("scenario: {name}");
        let t = Instant::now();
        s.await;
        eprintln!("scenario: {name}: ok in {:.1}s", t.elapsed().as_secs_f64());
    }
    kubelet.abort();
    drop(env);
}

/// Issue 18 on a cluster: the RuntimeClass `tessera k8s manifests --runtime-class
/// isolated=kata-qemu` prints, applied; the apiserver's RuntimeClass admission gives a
/// pod that names it the class's node selector, and Tessera places it only on the node
/// labelled for the class. Past that node's room it waits, and its reason names the
/// label; a pod naming a class the cluster does not have is refused at creation.
async fn runtime_classes(client: Client) {
    use k8s_openapi::api::node::v1::RuntimeClass;
    let label = "runtime-class.tessera.io/isolated";
    fresh_nodes(
        &client,
        vec![
            fake_node("plain-1", "8", "16Gi", 0, &[]),
            fake_node("plain-2", "8", "16Gi", 0, &[]),
            fake_node("vm-1", "4", "16Gi", 0, &[(label, "true")]),
        ],
    )
    .await;
    let opts = tessera_k8s::manifests::ManifestOptions {
        runtime_classes: vec![tessera_k8s::manifests::RuntimeClassManifest {
            name: "isolated".into(),
            handler: "kata-qemu".into(),
            node_selector: [(label.to_string(), "true".to_string())].into(),
        }],
        ..Default::default()
    };
    let rcs: Api<RuntimeClass> = Api::all(client.clone());
    for o in tessera_k8s::manifests::objects(&opts) {
        if o["kind"] == "RuntimeClass" {
            apply_json(&rcs, o).await;
        }
    }
    let pods = namespace(&client, "rc").await;
    let ctl = start_ready(&client, "tessera").await;
    let isolated = |name: &str, cpu: &str| {
        pod_with(
            "rc",
            name,
            "tessera",
            cpu,
            json!({"spec": {"runtimeClassName": "isolated"}}),
        )
    };
    for (name, cpu) in [("iso-1", "2"), ("iso-2", "2"), ("plain", "6")] {
        let p = if name == "plain" {
            pod_with("rc", name, "tessera", cpu, json!({}))
        } else {
            isolated(name, cpu)
        };
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_bound(&pods, 3, "two isolated pods and a plain one").await;
    let placed = pods_by_name(&pods).await;
    for name in ["iso-1", "iso-2"] {
        let p = &placed[name];
        assert_eq!(
            p.spec
                .as_ref()
                .and_then(|s| s.node_selector.as_ref())
                .and_then(|m| m.get(label)),
            Some(&"true".to_string()),
            "the admission plugin gave {name} the class's node selector"
        );
        assert_eq!(node_of(p).as_deref(), Some("vm-1"), "{name}");
    }
    // vm-1 is full: the next isolated pod waits, though plain nodes have room.
    pods.create(&PostParams::default(), &isolated("iso-3", "2"))
        .await
        .unwrap();
    let why = wait_for("iso-3's reason", Duration::from_secs(30), || async {
        pods.get("iso-3")
            .await
            .ok()
            .filter(|p| node_of(p).is_none())
            .and_then(|p| condition_message(&p))
    })
    .await;
    assert!(why.contains(label), "{why}");
    // A class the cluster does not have: the apiserver refuses the pod.
    let mut missing = isolated("nowhere", "1");
    missing.spec.as_mut().unwrap().runtime_class_name = Some("gvisor".into());
    let err = pods
        .create(&PostParams::default(), &missing)
        .await
        .expect_err("a pod of an unknown RuntimeClass was admitted");
    assert!(err.to_string().contains("gvisor"), "{err}");
    ctl.stop().await;
}

async fn pods_bound(client: Client) {
    fresh_nodes(
        &client,
        vec![
            fake_node("n1", "4", "16Gi", 0, &[]),
            fake_node("n2", "4", "16Gi", 0, &[]),
            fake_node(
                "g1",
                "16",
                "64Gi",
                4,
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                    ("nvidia.com/gpu.memory", "81559"),
                ],
            ),
        ],
    )
    .await;
    let pods = namespace(&client, "s1").await;
    // A pod of another scheduler, bound by hand, uses capacity on n1.
    let mut other = fake_pod("s1", "other", "default-scheduler", "3", "64Mi");
    other.spec.as_mut().unwrap().node_name = Some("n1".into());
    pods.create(&PostParams::default(), &other).await.unwrap();
    let ctl = start_ready(&client, "tessera").await;
    for i in 0..6 {
        let p = fake_pod("s1", &format!("p{i}"), "tessera", "1", "64Mi");
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let gpu = pod_with(
        "s1",
        "trainer",
        "tessera",
        "1",
        json!({"spec": {"containers": [{"name": "main", "image": "x",
            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"},
                          "limits": {"nvidia.com/gpu": "2"}}}]}}),
    );
    pods.create(&PostParams::default(), &gpu).await.unwrap();
    wait_bound(&pods, 8, "7 pods bound (plus the other scheduler's)").await;
    let all = pods_by_name(&pods).await;
    let mut cpu: BTreeMap<String, u32> = BTreeMap::new();
    for p in all.values() {
        let n = node_of(p).unwrap();
        let c = if p.name_any() == "other" { 3 } else { 1 };
        *cpu.entry(n).or_default() += c;
    }
    assert!(
        cpu.get("n1").copied().unwrap_or(0) <= 4,
        "n1 overcommitted: {cpu:?}"
    );
    assert!(
        cpu.get("n2").copied().unwrap_or(0) <= 4,
        "n2 overcommitted: {cpu:?}"
    );
    let t = &all["trainer"];
    assert_eq!(node_of(t).as_deref(), Some("g1"));
    let idx = t
        .annotations()
        .get("scheduling.tessera.dev/gpu-indices")
        .cloned()
        .unwrap_or_default();
    assert_eq!(idx.split(',').count(), 2, "GPU indices recorded: {idx:?}");
    assert_eq!(ctl.metrics.bind_conflicts.load(Relaxed), 0);
    ctl.stop().await;
}

fn condition_message(p: &core::Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone())
}

async fn gang(client: Client) {
    fresh_nodes(
        &client,
        vec![
            // 10 cores in all, enough for the gang's 9, but one 3-core pod per node.
            fake_node("n1", "5", "16Gi", 0, &[]),
            fake_node("n2", "5", "16Gi", 0, &[]),
        ],
    )
    .await;
    let pods = namespace(&client, "s2").await;
    let pgs: Api<tessera_k8s::crd::volcano::PodGroup> = Api::namespaced(client.clone(), "s2");
    apply_json(
        &pgs,
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
               "metadata": {"name": "job", "namespace": "s2"},
               "spec": {"minMember": 3, "queue": "default"}}),
    )
    .await;
    for i in 0..3 {
        let p = pod_with(
            "s2",
            &format!("job-{i}"),
            "tessera",
            "3",
            json!({"metadata": {"annotations": {"scheduling.k8s.io/group-name": "job"}}}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    // Started once the whole gang exists, so that the first reason is about
    // room (while the pods arrive, it would be about the missing members).
    let ctl = start_ready(&client, "tessera").await;
    // Two nodes hold two of the three: none may be bound, and each says why.
    let msg = wait_for(
        "a pending reason on job-0",
        Duration::from_secs(30),
        || async {
            pods.get("job-0")
                .await
                .ok()
                .and_then(|p| condition_message(&p))
        },
    )
    .await;
    assert!(
        msg.contains("gang") || msg.contains("fit") || msg.contains("placed"),
        "reason: {msg}"
    );
    assert_eq!(bound_count(&pods).await, 0, "a partial gang was bound");
    let events: Api<core::Event> = Api::namespaced(client.clone(), "s2");
    let evs = wait_for(
        "a FailedScheduling event",
        Duration::from_secs(10),
        || async {
            events.list(&ListParams::default()).await.ok().filter(|l| {
                l.items
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("FailedScheduling"))
            })
        },
    )
    .await;
    assert!(
        evs.items
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("job-0"))
    );
    // A third node: all three at once.
    let nodes: Api<core::Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &fake_node("n3", "5", "16Gi", 0, &[]),
        )
        .await
        .unwrap();
    wait_bound(&pods, 3, "the gang of 3 bound").await;
    let st = wait_for(
        "PodGroup status Running",
        Duration::from_secs(30),
        || async {
            pgs.get("job")
                .await
                .ok()
                .and_then(|g| g.status)
                .filter(|s| s.phase.as_deref() == Some("Running"))
        },
    )
    .await;
    assert_eq!(st.running, Some(3));
    ctl.stop().await;
}

async fn queue_capability(client: Client) {
    fresh_nodes(&client, vec![fake_node("n1", "16", "64Gi", 0, &[])]).await;
    let pods = namespace(&client, "s3").await;
    let queues: Api<tessera_k8s::crd::Queue> = Api::all(client.clone());
    apply_json(
        &queues,
        json!({"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
               "metadata": {"name": "small"}, "spec": {"capability": {"cpu": "2"}}}),
    )
    .await;
    let ctl = start_ready(&client, "tessera").await;
    for i in 0..4 {
        let p = pod_with(
            "s3",
            &format!("q{i}"),
            "tessera",
            "1",
            json!({"metadata": {"annotations": {"scheduling.tessera.dev/queue": "small"}}}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_bound(&pods, 2, "two pods within the queue's capability").await;
    // The other two wait, saying so.
    let all = wait_for(
        "reasons on the two waiting pods",
        Duration::from_secs(30),
        || async {
            let all = pods_by_name(&pods).await;
            let waiting: Vec<String> = all
                .values()
                .filter(|p| node_of(p).is_none())
                .filter_map(condition_message)
                .collect();
            (waiting.len() == 2).then_some(waiting)
        },
    )
    .await;
    assert_eq!(bound_count(&pods).await, 2, "capability exceeded");
    assert!(
        all.iter()
            .all(|m| m.contains("small") || m.contains("capab") || m.contains("quota")),
        "reasons: {all:?}"
    );
    ctl.stop().await;
    queues
        .delete("small", &DeleteParams::default())
        .await
        .unwrap();
}

async fn preemption(client: Client) {
    fresh_nodes(&client, vec![fake_node("n1", "4", "16Gi", 0, &[])]).await;
    let pods = namespace(&client, "s4").await;
    let pcs: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    apply_json(&pcs, json!({"metadata": {"name": "low"}, "value": 10})).await;
    apply_json(&pcs, json!({"metadata": {"name": "high"}, "value": 1000})).await;
    // A PDB that allows no disruption of the low pods (policy/v1beta1: this
    // server is v1.20), there before the controller starts so that its first
    // list holds it.
    let pdb_api = kube::api::ApiResource {
        group: "policy".into(),
        version: "v1beta1".into(),
        api_version: "policy/v1beta1".into(),
        kind: "PodDisruptionBudget".into(),
        plural: "poddisruptionbudgets".into(),
    };
    let pdb_dyn: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), "s4", &pdb_api);
    let pdb: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-low", "namespace": "s4"},
        "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "low"}}}
    }))
    .unwrap();
    pdb_dyn.create(&PostParams::default(), &pdb).await.unwrap();
    let ctl = start_ready(&client, "tessera").await;
    for i in 0..4 {
        let p = pod_with(
            "s4",
            &format!("low{i}"),
            "tessera",
            "1",
            json!({"metadata": {"labels": {"app": "low"}}, "spec": {"priorityClassName": "low"}}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_bound(&pods, 4, "four low-priority pods").await;
    let high = pod_with(
        "s4",
        "high",
        "tessera",
        "2",
        json!({"spec": {"priorityClassName": "high"}}),
    );
    pods.create(&PostParams::default(), &high).await.unwrap();
    // Every low pod is covered by a PDB that allows no disruption, so none is
    // a victim: the high pod waits and says why. (Had the cycle evicted, its
    // reason would be the wait for the victims instead.)
    let reason = wait_for(
        "a reason on the high pod",
        Duration::from_secs(30),
        || async {
            pods.get("high")
                .await
                .ok()
                .and_then(|p| condition_message(&p))
        },
    )
    .await;
    assert!(!reason.contains("preempted"), "reason: {reason}");
    eprintln!("  high waits: {reason}");
    assert_eq!(
        ctl.metrics.evicted.load(Relaxed),
        0,
        "evicted despite the PDB"
    );
    assert_eq!(bound_count(&pods).await, 4);
    // Without it, two low pods are evicted and the high pod runs.
    pdb_dyn
        .delete("keep-low", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the high pod bound", Duration::from_secs(60), || async {
        pods.get("high").await.ok().and_then(|p| node_of(&p))
    })
    .await;
    let left = pods_by_name(&pods)
        .await
        .keys()
        .filter(|k| k.starts_with("low"))
        .count();
    assert_eq!(left, 2, "exactly two victims");
    assert_eq!(ctl.metrics.evicted.load(Relaxed), 2);
    ctl.stop().await;
}

/// A gang of four pods with required node affinity, as a PodGroup of
/// `flavour` (Tessera's or scheduler-plugins'), each pod naming it with that
/// flavour's label: bound in the zone, and the PodGroup's status written in
/// that flavour's words.
async fn gang_with_affinity(client: Client, flavour: Flavour) {
    let (ns, group_label, phase) = match flavour {
        Flavour::XK8s => ("s5", "scheduling.x-k8s.io/pod-group", "Scheduled"),
        _ => ("s5t", "scheduling.tessera.dev/pod-group", "Running"),
    };
    fresh_nodes(
        &client,
        vec![
            fake_node("a1", "8", "16Gi", 0, &[("zone", "a")]),
            fake_node("b1", "8", "16Gi", 0, &[("zone", "b")]),
            fake_node("b2", "8", "16Gi", 0, &[("zone", "b")]),
        ],
    )
    .await;
    let pods = namespace(&client, ns).await;
    let ar = flavour.podgroups();
    let pgs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    apply_json(
        &pgs,
        json!({"apiVersion": ar.api_version, "kind": ar.kind,
               "metadata": {"name": "cg", "namespace": ns}, "spec": {"minMember": 4}}),
    )
    .await;
    let ctl = start_ready(&client, "tessera").await;
    for i in 0..4 {
        let p = pod_with(
            ns,
            &format!("cg-{i}"),
            "tessera",
            "3",
            json!({"metadata": {"labels": {group_label: "cg"}},
                   "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                       {"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "zone", "operator": "In", "values": ["b"]}]}]}}}}}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_bound(&pods, 4, "the gang").await;
    for p in pods_by_name(&pods).await.values() {
        let n = node_of(p).unwrap();
        assert!(
            n.starts_with('b'),
            "{} on {n}, outside zone b",
            p.name_any()
        );
    }
    wait_for(
        &format!("{flavour:?} PodGroup status {phase}"),
        Duration::from_secs(30),
        || async {
            pgs.get("cg")
                .await
                .ok()
                .filter(|g| g.data["status"]["phase"] == phase)
        },
    )
    .await;
    ctl.stop().await;
}

/// Racks as Volcano HyperNodes: `rack-a` (nodes by name pattern), `rack-b`
/// (nodes by label), both under `spine` (tier 2). Each node has 4 cores; rack
/// a holds 2 nodes, rack b 3.
async fn network_topology(client: Client) {
    use tessera_k8s::crd::topology::HyperNode;
    let racks = || {
        vec![
            fake_node("a1", "4", "16Gi", 0, &[]),
            fake_node("a2", "4", "16Gi", 0, &[]),
            fake_node("b1", "4", "16Gi", 0, &[("rack", "b")]),
            fake_node("b2", "4", "16Gi", 0, &[("rack", "b")]),
            fake_node("b3", "4", "16Gi", 0, &[("rack", "b")]),
        ]
    };
    let hns: Api<HyperNode> = Api::all(client.clone());
    for h in [
        json!({"metadata": {"name": "rack-a"}, "spec": {"tier": 1, "members": [
            {"type": "Node", "selector": {"regexMatch": {"pattern": "^a[0-9]+$"}}}]}}),
        json!({"metadata": {"name": "rack-b"}, "spec": {"tier": 1, "members": [
            {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "b"}}}}]}}),
        json!({"metadata": {"name": "spine"}, "spec": {"tier": 2, "members": [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-a"}}},
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "rack-b"}}}]}}),
    ] {
        let mut h = h;
        json_merge(
            &mut h,
            json!({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode"}),
        );
        apply_json(&hns, h).await;
    }
    let gang = |ns: &str, name: &str, n: usize, mode: &str| {
        let pods: Vec<core::Pod> = (0..n)
            .map(|i| {
                pod_with(
                    ns,
                    &format!("{name}-{i}"),
                    "tessera",
                    "3",
                    json!({"metadata": {"annotations": {"scheduling.k8s.io/group-name": name}}}),
                )
            })
            .collect();
        let pg = json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"minMember": n, "networkTopology": {"mode": mode, "highestTierAllowed": 1}}});
        (pg, pods)
    };

    // 1. A hard tier-1 gang of three 3-core pods: only rack b has room for it
    // in one rack. Another scheduler's pods fill a1 and a2 a little, so that
    // binpack alone would start on them and span both racks.
    fresh_nodes(&client, racks()).await;
    let others = namespace(&client, "s9-others").await;
    for n in ["a1", "a2"] {
        let mut p = fake_pod(
            "s9-others",
            &format!("on-{n}"),
            "default-scheduler",
            "1",
            "64Mi",
        );
        p.spec.as_mut().unwrap().node_name = Some(n.into());
        others.create(&PostParams::default(), &p).await.unwrap();
    }
    let pods = namespace(&client, "s9").await;
    let pgs: Api<tessera_k8s::crd::volcano::PodGroup> = Api::namespaced(client.clone(), "s9");
    let (pg, members) = gang("s9", "hard", 3, "hard");
    apply_json(&pgs, pg).await;
    for p in &members {
        pods.create(&PostParams::default(), p).await.unwrap();
    }
    let ctl = start_ready(&client, "tessera").await;
    wait_bound(&pods, 3, "the hard tier-1 gang").await;
    let nodes: Vec<String> = pods_by_name(&pods)
        .await
        .values()
        .filter_map(node_of)
        .collect();
    assert!(
        nodes.iter().all(|n| n.starts_with('b')),
        "a hard tier-1 gang spans racks: {nodes:?}"
    );
    ctl.stop().await;

    // 2. Gangs of four 3-core pods: no rack holds one. The hard one waits and
    // says why; the soft one spans both racks.
    fresh_nodes(&client, racks()).await;
    let pods = namespace(&client, "s10").await;
    let pgs: Api<tessera_k8s::crd::volcano::PodGroup> = Api::namespaced(client.clone(), "s10");
    let ctl = start_ready(&client, "tessera").await;
    let (pg, members) = gang("s10", "hard", 4, "hard");
    apply_json(&pgs, pg).await;
    for p in &members {
        pods.create(&PostParams::default(), p).await.unwrap();
    }
    let msg = wait_for(
        "a pending reason on hard-0",
        Duration::from_secs(30),
        || async {
            pods.get("hard-0")
                .await
                .ok()
                .and_then(|p| condition_message(&p))
                .filter(|m| m.contains("tier-1"))
        },
    )
    .await;
    assert!(msg.contains("network domain"), "reason: {msg}");
    let (pg, members) = gang("s10", "soft", 4, "soft");
    apply_json(&pgs, pg).await;
    for p in &members {
        pods.create(&PostParams::default(), p).await.unwrap();
    }
    wait_bound(&pods, 4, "the soft tier-1 gang").await;
    let all = pods_by_name(&pods).await;
    let soft: Vec<String> = all
        .values()
        .filter(|p| p.name_any().starts_with("soft-"))
        .filter_map(node_of)
        .collect();
    assert_eq!(soft.len(), 4, "{soft:?}");
    assert!(
        soft.iter().any(|n| n.starts_with('a')) && soft.iter().any(|n| n.starts_with('b')),
        "the soft gang spans both racks: {soft:?}"
    );
    assert!(
        all.values()
            .filter(|p| p.name_any().starts_with("hard-"))
            .all(|p| node_of(p).is_none()),
        "no pod of the hard gang is bound"
    );
    ctl.stop().await;
    let _ = hns
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}

async fn agent_shard(client: Client) {
    fresh_nodes(
        &client,
        vec![
            fake_node("ag1", "2", "8Gi", 0, &[]),
            fake_node("bt1", "8", "16Gi", 0, &[]),
        ],
    )
    .await;
    let pods = namespace(&client, "s6").await;
    let shards: Api<tessera_k8s::crd::NodeShard> = Api::all(client.clone());
    apply_json(
        &shards,
        json!({"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "NodeShard",
               "metadata": {"name": "agent"}, "spec": {"nodesDesired": ["ag1"]}}),
    )
    .await;
    let ctl = start_ready(&client, "tessera").await;
    for i in 0..3 {
        let p = pod_with(
            "s6",
            &format!("sbx{i}"),
            "tessera",
            "500m",
            json!({"metadata": {"annotations": {"scheduling.tessera.dev/kind": "agent"}}}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let batch = fake_pod("s6", "batch", "tessera", "1", "64Mi");
    pods.create(&PostParams::default(), &batch).await.unwrap();
    wait_bound(&pods, 4, "three agent pods and one batch pod").await;
    for p in pods_by_name(&pods).await.values() {
        let n = node_of(p).unwrap();
        if p.name_any().starts_with("sbx") {
            assert_eq!(n, "ag1", "agent pod off the agent shard");
        } else {
            assert_eq!(n, "bt1", "batch pod on the agent shard");
        }
    }
    wait_for("NodeShard status", Duration::from_secs(30), || async {
        shards
            .get("agent")
            .await
            .ok()
            .and_then(|s| s.status)
            .filter(|s| s.nodes_in_use == vec!["ag1".to_string()])
    })
    .await;
    ctl.stop().await;
    shards
        .delete("agent", &DeleteParams::default())
        .await
        .unwrap();
}

/// A node as GFD and NVIDIA's device plugin publish it under the mixed MIG
/// strategy: one A100-SXM4-40GB with MIG on, `instances` per profile.
fn mig_node(name: &str, instances: &[(&str, u32)]) -> core::Node {
    let mut labels = vec![
        (
            "nvidia.com/gpu.product".to_string(),
            "NVIDIA-A100-SXM4-40GB".to_string(),
        ),
        ("nvidia.com/gpu.count".into(), "1".into()),
        ("nvidia.com/gpu.memory".into(), "40960".into()),
        ("nvidia.com/mig.capable".into(), "true".into()),
        ("nvidia.com/mig.strategy".into(), "mixed".into()),
    ];
    for (p, c) in instances {
        labels.push((format!("nvidia.com/mig-{p}.count"), c.to_string()));
        let gi = p.split('g').next().unwrap_or("1").to_string();
        labels.push((format!("nvidia.com/mig-{p}.slices.gi"), gi));
    }
    let l: Vec<(&str, &str)> = labels
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let mut n = fake_node(name, "16", "64Gi", 0, &l);
    let status = n.status.as_mut().unwrap();
    for list in [status.allocatable.as_mut(), status.capacity.as_mut()]
        .into_iter()
        .flatten()
    {
        for (p, c) in instances {
            list.insert(
                format!("nvidia.com/mig-{p}"),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(c.to_string()),
            );
        }
    }
    n
}

fn mig_pod(ns: &str, name: &str, profile: &str) -> core::Pod {
    let r = format!("nvidia.com/mig-{profile}");
    pod_with(
        ns,
        name,
        "tessera",
        "1",
        json!({"spec": {"containers": [{"name": "main", "image": "x",
            "resources": {"requests": {"cpu": "1", &r: "1"}, "limits": {&r: "1"}}}]}}),
    )
}

/// (node, GPU, start) of each bound pod's recorded MIG instance.
async fn mig_instances_of(pods: &Api<core::Pod>) -> BTreeMap<String, (String, String)> {
    pods_by_name(pods)
        .await
        .into_iter()
        .filter_map(|(name, p)| {
            let node = node_of(&p)?;
            let inst = p
                .annotations()
                .get("scheduling.tessera.dev/mig-instance")
                .cloned()
                .unwrap_or_default();
            Some((name, (node, inst)))
        })
        .collect()
}

async fn mig_instances(client: Client) {
    fresh_nodes(
        &client,
        vec![
            mig_node("m1", &[("1g.5gb", 2), ("3g.20gb", 1)]),
            mig_node("m2", &[("3g.20gb", 2)]),
        ],
    )
    .await;
    let pods = namespace(&client, "s8").await;
    let ctl = start_ready(&client, "tessera").await;
    for i in 0..3 {
        pods.create(
            &PostParams::default(),
            &mig_pod("s8", &format!("small{i}"), "1g.5gb"),
        )
        .await
        .unwrap();
    }
    for i in 0..2 {
        pods.create(
            &PostParams::default(),
            &mig_pod("s8", &format!("half{i}"), "3g.20gb"),
        )
        .await
        .unwrap();
    }
    wait_bound(&pods, 4, "two 1g.5gb and two 3g.20gb pods bound").await;
    // The third 1g.5gb pod has no instance anywhere: it waits, and says why.
    let why = wait_for("small2's pending reason", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            let all = pods_by_name(&pods).await;
            let p = all.values().find(|p| node_of(p).is_none())?;
            condition_message(p).map(|m| (p.name_any(), m))
        }
    })
    .await;
    assert!(why.0.starts_with("small"), "{why:?}");
    assert!(why.1.contains("1g.5gb"), "{why:?}");
    ctl.stop().await;

    // A new controller reads the recorded instances back and gives the last
    // 3g.20gb instance to a new pod.
    let ctl = start_ready(&client, "tessera").await;
    pods.create(&PostParams::default(), &mig_pod("s8", "half2", "3g.20gb"))
        .await
        .unwrap();
    wait_bound(&pods, 5, "the third 3g.20gb pod bound after a restart").await;
    let got = mig_instances_of(&pods).await;
    assert_eq!(got.len(), 5, "{got:#?}");
    let mut seen = std::collections::BTreeSet::new();
    for (name, (node, inst)) in &got {
        let profile = if name.starts_with("small") {
            "1g.5gb"
        } else {
            "3g.20gb"
        };
        assert!(
            inst.starts_with("gpu=0,") && inst.contains(&format!(",profile={profile},start=")),
            "{name} on {node}: {inst:?}"
        );
        if name.starts_with("small") {
            assert_eq!(node, "m1", "{name}");
        }
        assert!(
            seen.insert((node.clone(), inst.clone())),
            "instance given twice: {got:#?}"
        );
    }
    assert_eq!(ctl.metrics.bind_conflicts.load(Relaxed), 0);
    ctl.stop().await;
}

async fn two_replicas(client: Client) {
    fresh_nodes(
        &client,
        vec![
            fake_node("n1", "64", "64Gi", 0, &[]),
            fake_node("n2", "64", "64Gi", 0, &[]),
        ],
    )
    .await;
    let pods = namespace(&client, "s7").await;
    let lease = |id: &str| LeaseConfig {
        namespace: "default".into(),
        name: "tessera-ha".into(),
        identity: id.into(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_millis(2500),
        retry_period: Duration::from_millis(500),
    };
    let r1 = start(&client, "tessera-ha", Some(lease("r1")));
    wait_for("r1 leads", Duration::from_secs(30), || async {
        r1.metrics.ready.load(Relaxed).then_some(())
    })
    .await;
    let r2 = start(&client, "tessera-ha", Some(lease("r2")));
    for i in 0..20 {
        let p = fake_pod("s7", &format!("a{i:02}"), "tessera-ha", "100m", "64Mi");
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_bound(&pods, 20, "20 pods bound by r1").await;
    assert!(
        !r2.metrics.ready.load(Relaxed),
        "r2 leads while r1 holds the lease"
    );
    // r1 dies without giving the lease up.
    r1.handle.abort();
    let _ = r1.handle.await;
    for i in 0..20 {
        let p = fake_pod("s7", &format!("b{i:02}"), "tessera-ha", "100m", "64Mi");
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    wait_bound(&pods, 40, "20 more pods bound by r2 after the takeover").await;
    let (b1, b2) = (
        r1.metrics.bound.load(Relaxed),
        r2.metrics.bound.load(Relaxed),
    );
    assert_eq!(b1 + b2, 40, "pods bound: r1 {b1}, r2 {b2}");
    assert_eq!(b2, 20, "r2 bound only the new pods");
    assert_eq!(
        r1.metrics.bind_conflicts.load(Relaxed) + r2.metrics.bind_conflicts.load(Relaxed),
        0,
        "a pod was bound twice"
    );
    let _ = r1.stop.send(true);
    Ctl {
        metrics: r2.metrics,
        stop: r2.stop,
        handle: r2.handle,
    }
    .stop()
    .await;
}

//! The writer every write goes through (leadership checked first, a
//! timeout), and the bindings: DRA claim allocations, GPU and MIG annotations,
//! the binding subresource, pipelined across cycles.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;

use super::{Metrics, Msg};
use crate::dra;
use crate::leader::Leadership;
use crate::state::{PodKey, State};
use crate::translate::{keys, mig};

/// The controller's writer: one client, the leadership, the counters.
#[derive(Clone)]
pub(super) struct Writer {
    pub(super) client: Client,
    pub(super) leadership: Leadership,
    pub(super) timeout: Duration,
    pub(super) metrics: Arc<Metrics>,
    pub(super) scheduler: String,
}

pub(super) enum WriteError {
    NotLeader,
    Timeout,
    Api(kube::Error),
}

impl Writer {
    pub(super) async fn write<T, F>(&self, f: F) -> Result<T, WriteError>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        if !self.leadership.is_leader() {
            return Err(WriteError::NotLeader);
        }
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(WriteError::Api(e)),
            Err(_) => Err(WriteError::Timeout),
        }
    }

    pub(super) fn pods(&self, ns: &str) -> Api<core::Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Binds one pod: DRA claims first, GPU indices and MIG instance, then the binding.
    async fn bind(&self, job: BindJob) -> BindOutcome {
        let (ns, name) = &job.key;
        for (claim, patch) in &job.claims {
            let api: Api<res::ResourceClaim> = Api::namespaced(self.client.clone(), ns);
            match self
                .write(api.patch_status(claim, &PatchParams::default(), &Patch::Merge(patch)))
                .await
            {
                Ok(_) => {
                    self.metrics.claims_allocated.fetch_add(1, Relaxed);
                }
                Err(e) => return BindOutcome::Failed(format!("allocating claim {claim}: {e:?}")),
            }
        }
        let annotations = bind_annotations(&job);
        if !annotations.is_empty() {
            let patch = json!({"metadata": {"annotations": annotations}});
            if let Err(e) = self
                .write(
                    self.pods(ns)
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await
            {
                return BindOutcome::Failed(format!("recording GPUs: {e:?}"));
            }
        }
        let binding = core::Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            target: core::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(job.node.clone()),
                ..core::ObjectReference::default()
            },
        };
        // The binding subresource answers with a Status, not a Binding.
        match self
            .write(self.pods(ns).create_subresource::<_, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            ))
            .await
        {
            Ok(_) => BindOutcome::Bound,
            Err(WriteError::Api(kube::Error::Api(s))) if s.code == 409 => BindOutcome::Conflict,
            Err(WriteError::Api(kube::Error::Api(s))) if s.code == 404 => BindOutcome::Gone,
            Err(WriteError::NotLeader) => BindOutcome::NotLeader,
            Err(e) => BindOutcome::Failed(format!("{e:?}")),
        }
    }

    /// `PodScheduled=False` with the reason, and an event.
    pub(super) async fn pending(
        &self,
        key: PodKey,
        uid: String,
        message: String,
        events: bool,
    ) -> bool {
        let (ns, name) = &key;
        let now = k8s_openapi::jiff::Timestamp::now();
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": now.to_string()
        }]}});
        let ok = self
            .write(self.pods(ns).patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            ))
            .await
            .is_ok();
        if events {
            let ev = core::Event {
                metadata: ObjectMeta {
                    name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                    namespace: Some(ns.clone()),
                    ..ObjectMeta::default()
                },
                involved_object: core::ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    uid: Some(uid),
                    ..core::ObjectReference::default()
                },
                reason: Some("FailedScheduling".into()),
                message: Some(message),
                type_: Some("Warning".into()),
                count: Some(1),
                first_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                last_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                source: Some(core::EventSource {
                    component: Some(self.scheduler.clone()),
                    ..core::EventSource::default()
                }),
                reporting_component: Some(self.scheduler.clone()),
                ..core::Event::default()
            };
            let api: Api<core::Event> = Api::namespaced(self.client.clone(), ns);
            let _ = self.write(api.create(&PostParams::default(), &ev)).await;
        }
        ok
    }
}

impl std::fmt::Debug for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotLeader => f.write_str("not the leader"),
            WriteError::Timeout => f.write_str("timed out"),
            WriteError::Api(e) => write!(f, "{e}"),
        }
    }
}

pub(super) struct BindJob {
    pub(super) key: PodKey,
    pub(super) node: String,
    pub(super) gpus: Vec<u32>,
    /// `(claim name, status patch)`.
    pub(super) claims: Vec<(String, serde_json::Value)>,
    /// The MIG instance the pod gets (an existing one: see [`mig::hold_reconfigurations`]).
    pub(super) mig: Option<mig::Instance>,
}

/// The annotations recording what a binding gives the pod: its GPUs, or its
/// MIG instance. Not both: a MIG pod's GPU index is Tessera's bookkeeping (see
/// [`crate::translate::mig`]), which a device plugin reading `gpu-indices` would take
/// for a physical GPU.
fn bind_annotations(job: &BindJob) -> serde_json::Map<String, serde_json::Value> {
    let mut annotations = serde_json::Map::new();
    if let Some(m) = &job.mig {
        annotations.insert(keys::MIG_INSTANCE.into(), m.to_string().into());
    } else if !job.gpus.is_empty() && job.claims.is_empty() {
        let list: Vec<String> = job.gpus.iter().map(u32::to_string).collect();
        annotations.insert(keys::GPU_INDICES.into(), list.join(",").into());
    }
    annotations
}

enum BindOutcome {
    Bound,
    Conflict,
    Gone,
    NotLeader,
    Failed(String),
}

pub(super) fn bind_job(state: &State, key: PodKey, node: String, gpus: Vec<u32>) -> BindJob {
    let mut claims = Vec::new();
    if let Some(p) = state.pod(&key)
        && !p.claims.is_empty()
    {
        let slices = state.slices_of(&node);
        let mut used = 0;
        for c in &p.claims {
            let Some(ci) = state.claim(&p.namespace, c) else {
                continue;
            };
            if ci.allocated || ci.gpus() == 0 {
                continue;
            }
            if let Some((patch, n)) = dra::allocation_patch(
                ci,
                &node,
                &slices,
                gpus.get(used..).unwrap_or(&[]),
                &p.name,
                &p.uid,
            ) {
                used += n;
                claims.push((c.clone(), patch));
            }
        }
    }
    BindJob {
        key,
        node,
        gpus,
        claims,
        mig: None,
    }
}

/// Writes one binding of a cycle in the background, once one of the
/// `concurrency` permits is free. The pod was assumed on its node when the cycle
/// planned it; unless it is bound now, it is forgotten and planned again.
pub(super) async fn bind_pipelined(
    w: Writer,
    tx: mpsc::UnboundedSender<Msg>,
    permits: Arc<tokio::sync::Semaphore>,
    j: BindJob,
) {
    let Ok(_permit) = permits.acquire().await else {
        return;
    };
    let key = j.key.clone();
    match w.bind(j).await {
        BindOutcome::Bound => {
            w.metrics.bound.fetch_add(1, Relaxed);
            return;
        }
        BindOutcome::Conflict => {
            w.metrics.bind_conflicts.fetch_add(1, Relaxed);
        }
        BindOutcome::Gone | BindOutcome::NotLeader => {}
        BindOutcome::Failed(e) => {
            if w.metrics.bind_errors.fetch_add(1, Relaxed) < 5 {
                eprintln!("tessera-k8s: binding {}/{}: {e}", key.0, key.1);
            }
        }
    }
    let _ = tx.send(Msg::Change(Box::new(move |st| st.forget(&key))));
}

/// Binds one pod as a cycle would (DRA claim allocations, GPU annotation, the
/// binding), without leader election. For tests and tools.
pub async fn bind_once(
    client: &Client,
    state: &State,
    key: PodKey,
    node: String,
    gpus: Vec<u32>,
) -> Result<(), String> {
    let w = Writer {
        client: client.clone(),
        leadership: Leadership::always(),
        timeout: Duration::from_secs(30),
        metrics: Arc::new(Metrics::default()),
        scheduler: state.scheduler_name.clone(),
    };
    match w.bind(bind_job(state, key, node, gpus)).await {
        BindOutcome::Bound => Ok(()),
        BindOutcome::Conflict => Err("already bound".into()),
        BindOutcome::Gone => Err("the pod is gone".into()),
        BindOutcome::NotLeader => Err("not the leader".into()),
        BindOutcome::Failed(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_pods_get_their_instance_recorded_not_gpu_indices() {
        let job = |mig: Option<mig::Instance>| BindJob {
            key: ("ns".into(), "p".into()),
            node: "a1".into(),
            gpus: vec![3],
            claims: Vec::new(),
            mig,
        };
        let a = bind_annotations(&job(Some(mig::Instance {
            gpu: 3,
            profile: "3g.20gb".into(),
            start: 4,
        })));
        assert_eq!(
            a.get(keys::MIG_INSTANCE).and_then(|v| v.as_str()),
            Some("gpu=3,profile=3g.20gb,start=4")
        );
        assert!(a.get(keys::GPU_INDICES).is_none(), "{a:?}");
        let a = bind_annotations(&job(None));
        assert_eq!(a.get(keys::GPU_INDICES).and_then(|v| v.as_str()), Some("3"));
        assert!(a.get(keys::MIG_INSTANCE).is_none(), "{a:?}");
    }
}

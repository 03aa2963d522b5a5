//! The local node's heartbeat: its status (conditions, tasks running, cgroups)
//! written under [`NODESTATUS`] every period, and the node record kept in step
//! with what the node knows: the device-view mismatch taint while the views
//! disagree, the unreachable taint (put on by the lost-node sweep) gone once it
//! reports again, and a GPU marked `unhealthy` (never placed on again until an operator
//! clears it) after a fault event not confined to one task.

use std::sync::Arc;

use tessera_model::Node;
use tessera_node::NodeRuntime;
use tessera_store::{AnyStore, Key, Store, StoreError};

use crate::exec::NodeRunner;
use crate::plane::{kind, now_ms};

/// The store kind of node heartbeats (cluster-scoped, named by node).
pub const NODESTATUS: &str = "nodestatus";
/// The taint a node carries while its device view does not match its record.
pub const MISMATCH_TAINT: &str = "tessera.io/device-view-mismatch";
/// The taint a node carries once its heartbeat stopped for longer than
/// [`NODE_LOST_AFTER`](crate::jobs::NODE_LOST_AFTER) (its live tasks were lost); its
/// next heartbeat takes it off.
pub const UNREACHABLE_TAINT: &str = "tessera.io/unreachable";

/// Reports the node's heartbeat and conditions every `n.heartbeat`; keeps the
/// mismatch taint on the node record while its device view and record disagree.
pub(crate) async fn heartbeat(
    store: AnyStore,
    node: Arc<NodeRuntime>,
    name: String,
    n: NodeRunner,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let record: Option<(u64, Node)> = match store.get(&Key::new(kind::NODE, "", &name)).await {
            Ok(Some(o)) => serde_json::from_value::<Node>(o.body)
                .ok()
                .map(|b| (o.version, b)),
            _ => None,
        };
        let gpus = record
            .as_ref()
            .map(|(_, r)| r.gpus.clone())
            .unwrap_or_default();
        let nd = node.clone();
        let data = n.data_dir.clone();
        let status = tokio::task::spawn_blocking(move || {
            let live = if gpus.is_empty() {
                Ok(vec![])
            } else {
                nd.refresh_devices()
            };
            let mismatch = nd.check_devices(&gpus).err();
            let disk = data.as_deref().and_then(tessera_node::health::disk_space);
            for (f, v) in nd.poll_faults() {
                tracing::warn!(
                    "node {}: GPU {} fault {:?}: {v:?}",
                    nd.config().name,
                    f.device_index,
                    f.kind
                );
            }
            let unhealthy = nd.unhealthy_gpus();
            let mut conditions = tessera_node::health::conditions(
                &gpus,
                &live,
                mismatch.as_ref(),
                disk,
                nd.enforces_limits(),
            );
            conditions.push(tessera_node::faults::condition(&unhealthy));
            let status = tessera_node::health::NodeStatus {
                node: nd.config().name.clone(),
                heartbeat_ms: now_ms(),
                conditions,
                running: nd.running().len(),
                cgroups: nd
                    .sandbox_runtime()
                    .cgroups()
                    .map(|c| c.version().to_string()),
                device_cgroup: nd.sandbox_runtime().fences_devices(),
            };
            (status, unhealthy)
        })
        .await;
        if let Ok((status, unhealthy)) = status {
            let mismatch = status.has(tessera_node::health::ConditionKind::DeviceViewMismatch);
            if let Ok(body) = serde_json::to_value(&status) {
                let key = Key::new(NODESTATUS, "", &name);
                let r = match store.get(&key).await {
                    Ok(Some(o)) => store.update(key, Some(o.version), body).await.map(drop),
                    Ok(None) => store.create(key, body).await.map(drop),
                    Err(e) => Err(e),
                };
                if let Err(e) = r
                    && !matches!(
                        e,
                        StoreError::Conflict { .. } | StoreError::AlreadyExists(_)
                    )
                {
                    tracing::warn!("node {name}: heartbeat not written: {e}");
                }
            }
            if let Some((v, mut rec)) = record {
                // A GPU the node found unhealthy is marked in the record the
                // scheduler reads (never unmarked here: an operator clears it).
                let mut marked = false;
                for g in rec.gpus.iter_mut() {
                    if let (None, Some(why)) = (&g.unhealthy, unhealthy.get(&g.index)) {
                        g.unhealthy = Some(why.clone());
                        marked = true;
                    }
                }
                let has = rec.taints.iter().any(|t| t.key == MISMATCH_TAINT);
                let unreachable = rec.taints.iter().any(|t| t.key == UNREACHABLE_TAINT);
                if has != mismatch || marked || unreachable {
                    rec.taints
                        .retain(|t| t.key != MISMATCH_TAINT && t.key != UNREACHABLE_TAINT);
                    if mismatch {
                        rec.taints.push(tessera_model::Taint {
                            key: MISMATCH_TAINT.into(),
                            value: "true".into(),
                            effect: tessera_model::TaintEffect::NoSchedule,
                        });
                    }
                    if let Ok(b) = serde_json::to_value(&rec) {
                        let _ = store
                            .update(Key::new(kind::NODE, "", &name), Some(v), b)
                            .await;
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(n.heartbeat) => {}
            _ = stop.changed() => return,
        }
    }
}

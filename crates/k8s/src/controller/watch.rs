//! The watch stage: one watcher per kind the server serves, each turning its
//! events into changes to [`State`] sent to the loop.

use std::collections::BTreeSet;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::{Change, Msg, Served, Tasks};
use crate::crd;
use crate::gang::{self, Flavour, GangSource, QueueSource};
use crate::state::State;

/// Whether the controller may start without a watcher's first list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Nodes and pods: nothing can be scheduled without them.
    Required,
    /// Everything else: when its first list fails (the API is absent, or RBAC
    /// forbids it), the controller logs that once and goes on as if the list
    /// were empty; the watcher keeps retrying and takes objects in when the
    /// list succeeds.
    Optional,
}

/// Runs one watcher, turning its events into changes. `reset` receives the
/// full list after every (re)list, so objects deleted while disconnected go.
#[allow(clippy::too_many_arguments)]
fn spawn_watch<K>(
    name: String,
    need: Need,
    api: Api<K>,
    cfg: watcher::Config,
    tx: mpsc::UnboundedSender<Msg>,
    apply: fn(&mut State, &K),
    delete: fn(&mut State, &K),
    reset: Option<fn(&mut State, Vec<K>)>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut buf: Vec<K> = Vec::new();
        let mut synced = false;
        let mut errors = 0u64;
        // Whether a list ever succeeded (an absent optional API stays quiet).
        let mut listed = false;
        while let Some(ev) = s.next().await {
            let msg: Option<Change> = match ev {
                Ok(Event::Apply(o)) => Some(Box::new(move |st| apply(st, &o))),
                Ok(Event::Delete(o)) => Some(Box::new(move |st| delete(st, &o))),
                Ok(Event::Init) => {
                    buf.clear();
                    None
                }
                Ok(Event::InitApply(o)) => {
                    if reset.is_some() {
                        buf.push(o);
                        None
                    } else {
                        Some(Box::new(move |st| apply(st, &o)))
                    }
                }
                Ok(Event::InitDone) => {
                    listed = true;
                    let objs = std::mem::take(&mut buf);
                    let r = reset;
                    let m: Change = Box::new(move |st| {
                        if let Some(r) = r {
                            r(st, objs)
                        }
                    });
                    if tx.send(Msg::Change(m)).is_err() {
                        return;
                    }
                    if !synced {
                        synced = true;
                        if tx.send(Msg::Synced(name.clone())).is_err() {
                            return;
                        }
                    }
                    None
                }
                Err(e) => {
                    errors += 1;
                    if !synced && need == Need::Optional {
                        synced = true;
                        eprintln!(
                            "tessera-k8s: {name} not available ({e}); going on without them, retrying in the background"
                        );
                        if tx.send(Msg::Synced(name.clone())).is_err() {
                            return;
                        }
                    } else if (need == Need::Required || listed) && errors.is_power_of_two() {
                        // 1st, 2nd, 4th, 8th, ... error: visible, not a flood.
                        eprintln!("tessera-k8s: watching {name} (error {errors}): {e}");
                    }
                    None
                }
            };
            if let Some(m) = msg
                && tx.send(Msg::Change(m)).is_err()
            {
                return;
            }
        }
    })
}

/// An object's name (empty if it has none).
fn name_of(m: &ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

fn meta_key(m: &ObjectMeta) -> (String, String) {
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

fn to_typed<K: DeserializeOwned>(o: &DynamicObject) -> Option<K> {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// The watchers of one run, and the names of those whose first list the
/// controller still waits for.
pub(super) struct Watchers {
    client: Client,
    tx: mpsc::UnboundedSender<Msg>,
    tasks: Tasks,
    need: BTreeSet<String>,
}

impl Watchers {
    /// Starts a watcher for every kind the controller reads that the server
    /// serves; returns them with the names of the first lists to wait for.
    pub(super) fn start(
        client: Client,
        tx: mpsc::UnboundedSender<Msg>,
        served: &Served,
    ) -> (Tasks, BTreeSet<String>) {
        let mut w = Watchers {
            client,
            tx,
            tasks: Tasks::default(),
            need: BTreeSet::new(),
        };
        w.spawn_all(served);
        (w.tasks, w.need)
    }

    /// Starts one watcher (see [`spawn_watch`]).
    #[allow(clippy::too_many_arguments)]
    fn watch<K>(
        &mut self,
        name: impl Into<String>,
        need: Need,
        api: Api<K>,
        cfg: watcher::Config,
        apply: fn(&mut State, &K),
        delete: fn(&mut State, &K),
        reset: Option<fn(&mut State, Vec<K>)>,
    ) where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let name = name.into();
        self.need.insert(name.clone());
        let h = spawn_watch(name, need, api, cfg, self.tx.clone(), apply, delete, reset);
        self.tasks.0.push(h);
    }

    /// An optional kind, listed whole, without a reset on a re-list.
    fn optional<K>(
        &mut self,
        name: impl Into<String>,
        apply: fn(&mut State, &K),
        delete: fn(&mut State, &K),
    ) where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let api = Api::<K>::all(self.client.clone());
        let cfg = watcher::Config::default();
        self.watch(name, Need::Optional, api, cfg, apply, delete, None);
    }

    /// The PodGroups of one flavour.
    fn gangs<G: GangSource>(&mut self) {
        self.optional::<G>(
            gang::watch_name(&ApiResource::erase::<G>(&())),
            |s, g| s.apply_gang(g),
            |s, g| {
                let (ns, n) = meta_key(g.meta());
                s.delete_group(G::FLAVOUR, &ns, &n)
            },
        );
    }

    /// The Queues of one flavour.
    fn queues<Q: QueueSource>(&mut self) {
        self.optional::<Q>(
            gang::watch_name(&ApiResource::erase::<Q>(&())),
            |s, q| s.apply_queue(q),
            |s, q| s.delete_queue(Q::FLAVOUR, name_of(q.meta())),
        );
    }

    /// Every kind this controller reads that the server serves.
    fn spawn_all(&mut self, served: &Served) {
        let c = self.client.clone();
        self.watch(
            "nodes",
            Need::Required,
            Api::<core::Node>::all(c.clone()),
            watcher::Config::default(),
            |s, n| s.apply_node(n),
            |s, n| s.delete_node(name_of(&n.metadata)),
            Some(|s, all: Vec<core::Node>| s.reset_nodes(&all)),
        );
        self.watch(
            "pods",
            Need::Required,
            Api::<core::Pod>::all(c.clone()),
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
            |s, p| s.apply_pod(p),
            |s, p| s.delete_pod(&meta_key(&p.metadata)),
            Some(|s, all: Vec<core::Pod>| s.reset_pods(&all)),
        );
        self.optional::<PriorityClass>(
            "priorityclasses",
            |s, p| s.apply_priority_class(name_of(&p.metadata), p.value),
            |s, p| s.delete_priority_class(name_of(&p.metadata)),
        );
        let pdb_ar = if served.pdb_v1 {
            ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&())
        } else {
            ApiResource {
                group: "policy".into(),
                version: "v1beta1".into(),
                api_version: "policy/v1beta1".into(),
                kind: "PodDisruptionBudget".into(),
                plural: "poddisruptionbudgets".into(),
            }
        };
        self.watch(
            "poddisruptionbudgets",
            Need::Optional,
            Api::<DynamicObject>::all_with(c.clone(), &pdb_ar),
            watcher::Config::default(),
            |s, o| {
                if let Some(p) = to_typed(o) {
                    s.apply_pdb(&p)
                }
            },
            |s, o| {
                let (ns, n) = meta_key(&o.metadata);
                s.delete_pdb(&ns, &n)
            },
            None,
        );
        if served.serves(Flavour::Tessera) {
            self.gangs::<crd::PodGroup>();
            self.queues::<crd::Queue>();
            self.optional::<crd::NodeShard>(
                "nodeshards.scheduling.tessera.dev",
                |s, n| s.apply_shard(n),
                |s, n| s.delete_shard(name_of(&n.metadata)),
            );
        }
        if served.serves(Flavour::Volcano) {
            self.gangs::<crd::volcano::PodGroup>();
            self.queues::<crd::volcano::Queue>();
        }
        if served.serves(Flavour::XK8s) {
            self.gangs::<crd::x_k8s::PodGroup>();
        }
        if served.hypernodes {
            self.watch(
                "hypernodes.topology.volcano.sh",
                Need::Optional,
                Api::<crd::topology::HyperNode>::all(c),
                watcher::Config::default(),
                |s, h| s.apply_hypernode(h),
                |s, h| s.delete_hypernode(name_of(&h.metadata)),
                Some(|s, all: Vec<crd::topology::HyperNode>| s.reset_hypernodes(&all)),
            );
        }
        if served.dra {
            self.optional::<res::ResourceSlice>(
                "resourceslices",
                |s, r| s.apply_slice(r),
                |s, r| s.delete_slice(name_of(&r.metadata)),
            );
            self.optional::<res::ResourceClaim>(
                "resourceclaims",
                |s, r| s.apply_claim(r),
                |s, r| {
                    let (ns, n) = meta_key(&r.metadata);
                    s.delete_claim(&ns, &n)
                },
            );
        }
    }
}

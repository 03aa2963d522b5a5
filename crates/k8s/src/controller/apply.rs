//! The apply stage of a cycle: evictions (PDBs checked first), bindings,
//! pending reasons, PodGroup and NodeShard status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;

use futures_util::{StreamExt, stream};
use kube::Api;
use kube::api::{DynamicObject, EvictParams, Patch, PatchParams};
use serde_json::json;

use super::Loop;
use super::write::{WriteError, bind_job, bind_pipelined};
use crate::crd;
use crate::gang::Flavour;
use crate::state::{AgentPod, Built, PodKey};
use crate::translate::mig;

impl Loop {
    pub(super) async fn apply(
        &mut self,
        built: &Built,
        plan: tessera_model::Plan,
        agent: Vec<(PodKey, String)>,
        agent_pods: &[AgentPod],
    ) {
        let w = self.writer.clone();
        let conc = self.cfg.concurrency.max(1);
        // MIG instances are used as the node has them, never made here.
        let mut plan = plan;
        mig::hold_reconfigurations(&mut plan);

        // 1. Evictions, PDBs checked first.
        let mut allowed = built.pdb_allowed.clone();
        let mut evict_jobs = Vec::new();
        for e in &plan.evictions {
            let Some(key) = built.pod_of(&e.task.group, &e.task.task) else {
                continue;
            };
            let pdbs = built.pdb_of_pod.get(&key).cloned().unwrap_or_default();
            if pdbs.iter().any(|k| allowed.get(k) == Some(&0)) {
                w.metrics.evictions_blocked.fetch_add(1, Relaxed);
                continue;
            }
            for k in &pdbs {
                if let Some(a) = allowed.get_mut(k) {
                    *a -= 1;
                }
            }
            evict_jobs.push(key);
        }
        let evicted: Vec<(PodKey, bool)> = stream::iter(evict_jobs)
            .map(|key| {
                let w = w.clone();
                async move {
                    let ok = match w
                        .write(w.pods(&key.0).evict(&key.1, &EvictParams::default()))
                        .await
                    {
                        Ok(_) => true,
                        Err(WriteError::Api(kube::Error::Api(s))) if s.code == 429 => {
                            w.metrics.evictions_blocked.fetch_add(1, Relaxed);
                            false
                        }
                        Err(WriteError::Api(kube::Error::Api(s))) if s.code == 404 => true,
                        Err(e) => {
                            eprintln!("tessera-k8s: evicting {}/{}: {e:?}", key.0, key.1);
                            false
                        }
                    };
                    (key, ok)
                }
            })
            .buffer_unordered(conc)
            .collect()
            .await;
        let victims: BTreeSet<PodKey> = evicted
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(k, _)| k.clone())
            .collect();
        w.metrics.evicted.fetch_add(victims.len() as u64, Relaxed);

        // 2. Bindings (those that wait for victims are held until they are gone).
        let mut jobs = Vec::new();
        for b in &plan.bindings {
            let Some(key) = built.pod_of(&b.task.group, &b.task.task) else {
                continue;
            };
            if b.after_evictions {
                self.state
                    .await_victims(b.task.group.clone(), victims.clone());
                continue;
            }
            let mut job = bind_job(&self.state, key, b.node.clone(), b.gpus.clone());
            job.mig = match (&b.mig, b.gpus.first()) {
                (Some(m), Some(&gpu)) => Some(mig::Instance {
                    gpu,
                    profile: m.profile.clone(),
                    start: m.start,
                }),
                _ => None,
            };
            jobs.push(job);
        }
        for (key, node) in &agent {
            jobs.push(bind_job(&self.state, key.clone(), node.clone(), Vec::new()));
        }
        // Pipelined: each planned pod is assumed on its node now, so that the
        // next cycle plans around it while the writes are still in flight (at
        // most `concurrency` at once, across cycles). A write that does not
        // bind forgets the pod, and the next cycle plans it again.
        let mut bound: BTreeSet<PodKey> = BTreeSet::new();
        for j in &jobs {
            self.state.assume(
                j.key.clone(),
                j.node.clone(),
                j.gpus.clone(),
                j.mig.as_ref().map(|m| m.start),
            );
            self.written.remove(&j.key);
            bound.insert(j.key.clone());
        }
        if !jobs.is_empty() {
            let (tx, permits, w) = (self.tx.clone(), self.permits.clone(), w.clone());
            self.binds.0.retain(|h| !h.is_finished());
            self.binds.0.push(tokio::spawn(
                stream::iter(jobs).for_each_concurrent(None, move |j| {
                    bind_pipelined(w.clone(), tx.clone(), permits.clone(), j)
                }),
            ));
        }

        // 3. Pending reasons.
        let mut reasons: Vec<(PodKey, String)> = Vec::new();
        for p in &plan.pending {
            for key in built.pending.get(&p.group).into_iter().flatten() {
                if !bound.contains(key) {
                    reasons.push((key.clone(), p.reason.clone()));
                }
            }
        }
        reasons.extend(built.waiting.iter().cloned());
        let placed: BTreeSet<&PodKey> = agent.iter().map(|(k, _)| k).collect();
        for a in agent_pods {
            if !placed.contains(&a.key) {
                reasons.push((
                    a.key.clone(),
                    "no room in the agent shard: no agent node has the free CPU, memory and pod slots"
                        .into(),
                ));
            }
        }
        let mut writes = Vec::new();
        for (key, reason) in reasons {
            let Some(p) = self.state.pod(&key) else {
                continue;
            };
            if p.scheduled_message.as_deref() == Some(reason.as_str())
                || self.written.get(&key) == Some(&reason)
            {
                continue;
            }
            self.written.insert(key.clone(), reason.clone());
            writes.push((key, p.uid.clone(), reason));
        }
        let events = self.cfg.events;
        let n: usize = stream::iter(writes)
            .map(|(k, uid, r)| {
                let w = w.clone();
                async move { w.pending(k, uid, r, events).await as usize }
            })
            .buffer_unordered(conc)
            .fold(0, |a, b| async move { a + b })
            .await;
        w.metrics.pending_written.fetch_add(n as u64, Relaxed);

        // 4. PodGroup status.
        self.write_group_status(built, &plan).await;
        // 5. NodeShard status.
        self.write_shard_status().await;
    }

    async fn write_group_status(&mut self, built: &Built, plan: &tessera_model::Plan) {
        let pending: BTreeMap<&str, &tessera_model::Pending> =
            plan.pending.iter().map(|p| (p.group.as_str(), p)).collect();
        let mut running: BTreeMap<&str, i32> = BTreeMap::new();
        let mut min: BTreeMap<&str, u32> = BTreeMap::new();
        for g in &built.snapshot.groups {
            min.insert(g.name.as_str(), g.min_member);
            let r = g.tasks.iter().filter(|t| t.node.is_some()).count() as i32;
            running.insert(g.name.as_str(), r);
        }
        for b in &plan.bindings {
            if !b.after_evictions {
                *running.entry(b.task.group.as_str()).or_default() += 1;
            }
        }
        let mut writes = Vec::new();
        for (gname, meta) in &built.meta {
            let Some((api, name)) = &meta.podgroup else {
                continue;
            };
            let r = running.get(gname.as_str()).copied().unwrap_or(0);
            let enough = r as u32 >= min.get(gname.as_str()).copied().unwrap_or(1).max(1);
            let waiting = pending.get(gname.as_str());
            let phase = api.phase(enough, waiting.map(|p| p.admitted));
            let k = (*api, meta.namespace.clone(), name.clone());
            let now = (phase.to_string(), r);
            if self.group_written.get(&k) == Some(&now) {
                continue;
            }
            let seen = self
                .state
                .groups()
                .find(|g| g.api == *api && g.namespace == meta.namespace && &g.name == name)
                .map(|g| (g.status_phase.clone(), g.status_running));
            if seen == Some((Some(now.0.clone()), Some(r))) {
                self.group_written.insert(k, now);
                continue;
            }
            self.group_written.insert(k.clone(), now);
            let status = api.status_patch(phase, r, waiting.map(|p| p.reason.as_str()));
            writes.push((k, status));
        }
        let w = self.writer.clone();
        let n: usize = stream::iter(writes)
            .map(|((api, ns, name), status)| {
                let w = w.clone();
                async move {
                    let podgroups: Api<DynamicObject> =
                        Api::namespaced_with(w.client.clone(), &ns, &api.podgroups());
                    let (pp, patch) = (PatchParams::default(), Patch::Merge(&status));
                    let write = podgroups.patch_status(&name, &pp, &patch);
                    w.write(write).await.is_ok() as usize
                }
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .fold(0, |a, b| async move { a + b })
            .await;
        self.writer
            .metrics
            .group_status_written
            .fetch_add(n as u64, Relaxed);
    }

    async fn write_shard_status(&mut self) {
        if !self.served.serves(Flavour::Tessera) {
            return;
        }
        let mut writes = Vec::new();
        for (name, s) in self.state.shards() {
            let in_use: Vec<String> = s
                .nodes
                .iter()
                .filter(|n| self.state.has_node(n))
                .cloned()
                .collect();
            if in_use != s.status_in_use {
                writes.push((name.clone(), in_use));
            }
        }
        for (name, in_use) in writes {
            let api: Api<crd::NodeShard> = Api::all(self.writer.client.clone());
            let patch =
                json!({"status": {"nodesInUse": in_use, "nodesToAdd": [], "nodesToRemove": []}});
            let _ = self
                .writer
                .write(api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)))
                .await;
        }
    }
}

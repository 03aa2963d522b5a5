//! Which optional APIs the server serves: asked at the start, and again
//! every [`super::RunConfig::rediscover`].

use std::collections::BTreeSet;

use kube::Client;

use crate::gang::Flavour;

/// Which optional APIs the server serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// The scheduling APIs whose PodGroups are served (Tessera's Queues and
    /// NodeShards, and Volcano's Queues, are watched with them).
    pub scheduling: BTreeSet<Flavour>,
    pub dra: bool,
    /// `policy/v1` PodDisruptionBudgets (else `policy/v1beta1`, before 1.21).
    pub pdb_v1: bool,
    /// Volcano's `topology.volcano.sh/v1alpha1` HyperNodes (Volcano 1.11+).
    pub hypernodes: bool,
}

impl Served {
    /// Whether the PodGroups of `f` are served.
    pub fn serves(&self, f: Flavour) -> bool {
        self.scheduling.contains(&f)
    }

    /// The optional APIs `now` serves that `self` did not.
    pub fn appeared(&self, now: &Served) -> Vec<String> {
        let mut new: Vec<String> = now
            .scheduling
            .difference(&self.scheduling)
            .map(|f| f.podgroups().api_version)
            .collect();
        let pairs = [
            (self.dra, now.dra, "resource.k8s.io/v1"),
            (self.pdb_v1, now.pdb_v1, "policy/v1"),
            (
                self.hypernodes,
                now.hypernodes,
                "topology.volcano.sh/v1alpha1",
            ),
        ];
        new.extend(
            pairs
                .into_iter()
                .filter(|(was, is, _)| !was && *is)
                .map(|(_, _, api)| api.to_string()),
        );
        new
    }
}

/// Asks the server which optional APIs it serves.
pub async fn discover(client: &Client) -> Served {
    let mut scheduling = BTreeSet::new();
    for f in Flavour::ALL {
        let r = f.podgroups();
        if serves(client, &r.api_version, &r.kind).await {
            scheduling.insert(f);
        }
    }
    Served {
        scheduling,
        dra: serves(client, "resource.k8s.io/v1", "ResourceSlice").await,
        pdb_v1: serves(client, "policy/v1", "PodDisruptionBudget").await,
        hypernodes: serves(client, "topology.volcano.sh/v1alpha1", "HyperNode").await,
    }
}

async fn serves(client: &Client, gv: &str, kind: &str) -> bool {
    client
        .list_api_group_resources(gv)
        .await
        .map(|l| l.resources.iter().any(|r| r.kind == kind))
        .unwrap_or(false)
}

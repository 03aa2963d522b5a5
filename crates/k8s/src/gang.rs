//! The three flavours of gang Tessera accepts — its own PodGroup
//! (`scheduling.tessera.dev/v1alpha1`), Volcano's (`scheduling.volcano.sh/v1beta1`)
//! and scheduler-plugins' (`scheduling.x-k8s.io/v1alpha1`) — and the two flavours
//! of Queue (Tessera's, Volcano's), behind one trait each, so that translation
//! ([`crate::translate::group`]), the cache ([`crate::state::State::apply_gang`])
//! and the controller (one watcher and one status writer for all) have one copy.
//!
//! What differs between the flavours is said here once:
//!
//! * **which API** ([`Flavour`]): group, version, kind and plural come from the
//!   Rust types of [`crate::crd`] ([`Flavour::podgroups`]), never spelled again;
//! * **which fields** a flavour has ([`GangSource::fields`]): scheduler-plugins'
//!   PodGroup has no queue, priority class or network topology, only Tessera's
//!   has `kind`;
//! * **which status** it is written ([`Flavour::phase`], [`Flavour::status_patch`]):
//!   scheduler-plugins' phases are `Pending`, `Scheduling`, `Scheduled` and it
//!   counts `scheduled`; the others' are `Pending`, `Inqueue`, `Running` with a
//!   `message`.
//!
//! Pure: no I/O.

use std::borrow::Cow;

use kube::Resource;
use kube::api::ApiResource;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::crd::{self, NetworkTopologySpec, ResourceList};

/// Which scheduling API an object came from. Ordered by precedence: when two
/// APIs define a PodGroup (or Queue) of one name, the first one's is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Flavour {
    /// `scheduling.tessera.dev/v1alpha1`.
    Tessera,
    /// `scheduling.volcano.sh/v1beta1`.
    Volcano,
    /// scheduler-plugins' (coscheduling) `scheduling.x-k8s.io/v1alpha1`.
    XK8s,
}

impl Flavour {
    /// Every flavour, in order of precedence.
    pub const ALL: [Flavour; 3] = [Flavour::Tessera, Flavour::Volcano, Flavour::XK8s];

    /// The PodGroup resource of this flavour: group, version, kind, plural.
    pub fn podgroups(self) -> ApiResource {
        match self {
            Flavour::Tessera => ApiResource::erase::<crd::PodGroup>(&()),
            Flavour::Volcano => ApiResource::erase::<crd::volcano::PodGroup>(&()),
            Flavour::XK8s => ApiResource::erase::<crd::x_k8s::PodGroup>(&()),
        }
    }

    /// The phase written on a PodGroup of this flavour: whether `enough` pods
    /// are bound (`minMember`), else whether the scheduler admitted the waiting
    /// group (`None`: it has no reason to wait recorded this cycle).
    pub fn phase(self, enough: bool, admitted: Option<bool>) -> &'static str {
        match (self, enough, admitted) {
            (Flavour::XK8s, true, _) => "Scheduled",
            (Flavour::XK8s, false, Some(true)) => "Scheduling",
            (Flavour::XK8s, false, _) => "Pending",
            (_, true, _) => "Running",
            (_, false, Some(true) | None) => "Inqueue",
            (_, false, Some(false)) => "Pending",
        }
    }

    /// The merge patch of a PodGroup's status: its phase, the pods bound, and
    /// why it waits (scheduler-plugins' status has no message; it counts the
    /// pods scheduled instead).
    pub fn status_patch(
        self,
        phase: &str,
        running: i32,
        message: Option<&str>,
    ) -> serde_json::Value {
        match self {
            Flavour::XK8s => {
                json!({"status": {"phase": phase, "running": running, "scheduled": running}})
            }
            Flavour::Tessera | Flavour::Volcano => {
                json!({"status": {"phase": phase, "running": running, "message": message}})
            }
        }
    }
}

/// How an object of `r` is named in errors and logs:
/// `podgroup.scheduling.volcano.sh ns/job`, or `queue.scheduling.tessera.dev q`
/// for a cluster-scoped one (`ns` `None`).
pub fn object(r: &ApiResource, ns: Option<&str>, name: &str) -> String {
    let kind = r.kind.to_lowercase();
    match ns {
        Some(ns) => format!("{kind}.{} {ns}/{name}", r.group),
        None => format!("{kind}.{} {name}", r.group),
    }
}

/// The name of a watcher of `r`: `podgroups.scheduling.volcano.sh`.
pub fn watch_name(r: &ApiResource) -> String {
    format!("{}.{}", r.plural, r.group)
}

/// What Tessera reads of a PodGroup, in one shape: a field the flavour does not
/// have is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GangFields<'a> {
    pub min_member: Option<i32>,
    pub min_resources: Option<&'a ResourceList>,
    pub queue: Option<&'a str>,
    pub priority_class: Option<&'a str>,
    /// Tessera's `kind` (`training`, `inference`, `batch`, `agent`).
    pub kind: Option<&'a str>,
    pub network_topology: Option<&'a NetworkTopologySpec>,
    /// The status Tessera last saw on the object (so that only changes are written).
    pub phase: Option<&'a str>,
    pub running: Option<i32>,
}

/// A PodGroup of one flavour, as its watch delivers it.
pub trait GangSource:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
    /// Its API (the one `Self`'s [`Resource`] impl names: a test checks).
    const FLAVOUR: Flavour;
    /// The fields Tessera reads.
    fn fields(&self) -> GangFields<'_>;
}

/// The fields of Volcano's PodGroup, which Tessera's has too under the same
/// names (and types), status included: one mapping for both types.
macro_rules! volcano_fields {
    ($pg:expr) => {{
        let (s, status) = (&$pg.spec, $pg.status.as_ref());
        GangFields {
            min_member: s.min_member,
            min_resources: s.min_resources.as_ref(),
            queue: s.queue.as_deref(),
            priority_class: s.priority_class_name.as_deref(),
            network_topology: s.network_topology.as_ref(),
            phase: status.and_then(|s| s.phase.as_deref()),
            running: status.and_then(|s| s.running),
            kind: None,
        }
    }};
}

impl GangSource for crd::PodGroup {
    const FLAVOUR: Flavour = Flavour::Tessera;
    fn fields(&self) -> GangFields<'_> {
        GangFields {
            kind: self.spec.kind.as_deref(),
            ..volcano_fields!(self)
        }
    }
}

impl GangSource for crd::volcano::PodGroup {
    const FLAVOUR: Flavour = Flavour::Volcano;
    fn fields(&self) -> GangFields<'_> {
        volcano_fields!(self)
    }
}

impl GangSource for crd::x_k8s::PodGroup {
    const FLAVOUR: Flavour = Flavour::XK8s;
    fn fields(&self) -> GangFields<'_> {
        let status = self.status.as_ref();
        GangFields {
            min_member: self.spec.min_member,
            min_resources: self.spec.min_resources.as_ref(),
            phase: status.and_then(|s| s.phase.as_deref()),
            running: status.and_then(|s| s.running),
            ..GangFields::default()
        }
    }
}

/// A Queue of one flavour: Tessera's and Volcano's have the same fields.
pub trait QueueSource:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
    /// Its API (the one `Self`'s [`Resource`] impl names).
    const FLAVOUR: Flavour;
    /// Its spec, in Tessera's type.
    fn spec(&self) -> Cow<'_, crd::QueueSpec>;
}

impl QueueSource for crd::Queue {
    const FLAVOUR: Flavour = Flavour::Tessera;
    fn spec(&self) -> Cow<'_, crd::QueueSpec> {
        Cow::Borrowed(&self.spec)
    }
}

impl QueueSource for crd::volcano::Queue {
    const FLAVOUR: Flavour = Flavour::Volcano;
    fn spec(&self) -> Cow<'_, crd::QueueSpec> {
        let s = &self.spec;
        Cow::Owned(crd::QueueSpec {
            weight: s.weight,
            capability: s.capability.clone(),
            guarantee: s.guarantee.clone(),
            deserved: s.deserved.clone(),
            reclaimable: s.reclaimable,
            parent: s.parent.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each type's flavour names the API its `Resource` impl has.
    #[test]
    fn flavours_match_their_types() {
        fn check<G: GangSource>() {
            assert_eq!(G::FLAVOUR.podgroups(), ApiResource::erase::<G>(&()));
        }
        check::<crd::PodGroup>();
        check::<crd::volcano::PodGroup>();
        check::<crd::x_k8s::PodGroup>();
        fn group_of<Q: QueueSource>() -> String {
            Q::group(&()).to_string()
        }
        assert_eq!(group_of::<crd::Queue>(), Flavour::Tessera.podgroups().group);
        assert_eq!(
            group_of::<crd::volcano::Queue>(),
            Flavour::Volcano.podgroups().group
        );
        assert_eq!(
            object(&Flavour::XK8s.podgroups(), Some("ns"), "job"),
            "podgroup.scheduling.x-k8s.io ns/job"
        );
        assert_eq!(
            watch_name(&Flavour::Volcano.podgroups()),
            "podgroups.scheduling.volcano.sh"
        );
    }

    #[test]
    fn phases_by_flavour() {
        let all = |f: Flavour| {
            [
                f.phase(true, None),
                f.phase(false, Some(true)),
                f.phase(false, Some(false)),
                f.phase(false, None),
            ]
        };
        assert_eq!(
            all(Flavour::Volcano),
            ["Running", "Inqueue", "Pending", "Inqueue"]
        );
        assert_eq!(all(Flavour::Tessera), all(Flavour::Volcano));
        assert_eq!(
            all(Flavour::XK8s),
            ["Scheduled", "Scheduling", "Pending", "Pending"]
        );
    }
}

//! Scheduler configuration: which actions run, in which order, and which plugins
//! are enabled in which tier, in the spirit of Volcano's scheduler configuration.
//!
//! ```yaml
//! actions: [enqueue, allocate, preempt, reclaim, backfill]
//! tiers:
//!   - plugins: [priority, gang]
//!   - plugins: [drf, predicates, proportion, binpack]
//! ```
//!
//! Tiers order the plugins: when two plugins disagree on which job or queue goes
//! first, the one in the earlier tier wins.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tessera_model::GroupKind;
use thiserror::Error;

/// A scheduling action, run in the order the configuration lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Admit pending groups whose minimum resources fit their queue.
    Enqueue,
    /// Place admitted groups, gang by gang, in fair-share order.
    Allocate,
    /// Place best-effort tasks (no resource request) wherever predicates allow.
    Backfill,
    /// Within a queue, evict lower-priority tasks for a starving higher-priority group.
    Preempt,
    /// Between queues, take back what queues hold above their deserved share.
    Reclaim,
}

impl Action {
    pub const ALL: [Action; 5] = [
        Action::Enqueue,
        Action::Allocate,
        Action::Backfill,
        Action::Preempt,
        Action::Reclaim,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::Enqueue => "enqueue",
            Action::Allocate => "allocate",
            Action::Backfill => "backfill",
            Action::Preempt => "preempt",
            Action::Reclaim => "reclaim",
        }
    }
}

/// A plugin that actions consult.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginName {
    /// Job order by priority; preemption only of lower priority.
    Priority,
    /// All-or-nothing placement of `min_member` tasks; partially running gangs first.
    Gang,
    /// Dominant resource fairness between jobs of a queue.
    Drf,
    /// Hierarchical queue shares: weights, guarantee, capability; queue order and reclaim.
    Proportion,
    /// Node feasibility: resources, node selectors, taints and tolerations, GPU models.
    Predicates,
    /// Node scoring that fills nodes up (training default).
    Binpack,
    /// Node scoring that spreads load (inference default).
    Spread,
    /// A queued high-priority training gang that does not fit holds the
    /// NVLink domains or nodes it waits for: lower-priority tasks are kept off.
    Reservation,
}

impl PluginName {
    pub const ALL: [PluginName; 8] = [
        PluginName::Priority,
        PluginName::Gang,
        PluginName::Drf,
        PluginName::Proportion,
        PluginName::Predicates,
        PluginName::Binpack,
        PluginName::Spread,
        PluginName::Reservation,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PluginName::Priority => "priority",
            PluginName::Gang => "gang",
            PluginName::Drf => "drf",
            PluginName::Proportion => "proportion",
            PluginName::Predicates => "predicates",
            PluginName::Binpack => "binpack",
            PluginName::Spread => "spread",
            PluginName::Reservation => "reservation",
        }
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A word in a configuration that is not an action or plugin.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("unknown action `{0}`; known actions: enqueue, allocate, backfill, preempt, reclaim")]
    UnknownAction(String),
    #[error(
        "unknown plugin `{0}`; known plugins: priority, gang, drf, proportion, predicates, binpack, spread, reservation"
    )]
    UnknownPlugin(String),
    #[error("`{0}` is listed twice")]
    Duplicate(String),
    #[error("plugins `binpack` and `spread` pull in opposite directions; enable one of them")]
    Conflicting,
}

impl FromStr for Action {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Action::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| ConfigError::UnknownAction(s.to_string()))
    }
}

impl FromStr for PluginName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PluginName::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ConfigError::UnknownPlugin(s.to_string()))
    }
}

/// How nodes (and GPUs) are chosen for a workload kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Fill the fullest node that fits.
    Binpack,
    /// Use the emptiest node.
    Spread,
}

/// How a task asking for a fraction of one GPU is placed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SharePolicy {
    /// By the workload kind's profile (binpack or spread), on the fullest GPU
    /// that fits.
    #[default]
    Profile,
    /// Tessera's fragmentation-aware policy (`tessera sim --policy tessera`):
    /// among the first feasible nodes in binpack order, the node and GPU that
    /// FGD's fragmentation, the lookahead on shares, stranding and model
    /// pressure score best (see `gpu::outlook`).
    Tessera,
}

impl FromStr for SharePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "profile" => Ok(SharePolicy::Profile),
            "tessera" => Ok(SharePolicy::Tessera),
            _ => Err(format!(
                "unknown share policy `{s}`; known: profile, tessera"
            )),
        }
    }
}

/// The placement profile per workload kind, by default training binpacks and
/// inference spreads; kinds not listed follow the `binpack` / `spread` plugin.
pub fn default_profiles() -> BTreeMap<GroupKind, Profile> {
    BTreeMap::from([
        (GroupKind::Training, Profile::Binpack),
        (GroupKind::Inference, Profile::Spread),
    ])
}

/// A validated scheduler configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Actions in the order they run.
    pub actions: Vec<Action>,
    /// Plugin tiers; earlier tiers take precedence.
    pub tiers: Vec<Vec<PluginName>>,
    /// Placement profile per workload kind (see [`default_profiles`]); a kind
    /// not listed follows the `binpack` / `spread` plugin.
    pub profiles: BTreeMap<GroupKind, Profile>,
    /// How fractions of a GPU are placed.
    pub share_policy: SharePolicy,
}

impl Default for Config {
    /// Volcano's usual configuration: enqueue, allocate, preempt, reclaim, backfill;
    /// tier 1 priority and gang; tier 2 drf, predicates, proportion, binpack.
    fn default() -> Self {
        Config {
            actions: vec![
                Action::Enqueue,
                Action::Allocate,
                Action::Preempt,
                Action::Reclaim,
                Action::Backfill,
            ],
            tiers: vec![
                vec![PluginName::Priority, PluginName::Gang],
                vec![
                    PluginName::Drf,
                    PluginName::Predicates,
                    PluginName::Proportion,
                    PluginName::Binpack,
                ],
            ],
            profiles: default_profiles(),
            share_policy: SharePolicy::Profile,
        }
    }
}

impl Config {
    /// Builds a configuration from names, checking each.
    pub fn from_names<A: AsRef<str>, P: AsRef<str>>(
        actions: &[A],
        tiers: &[Vec<P>],
    ) -> Result<Config, ConfigError> {
        let mut acts = Vec::new();
        for a in actions {
            let a: Action = a.as_ref().parse()?;
            if acts.contains(&a) {
                return Err(ConfigError::Duplicate(a.name().into()));
            }
            acts.push(a);
        }
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for tier in tiers {
            let mut t = Vec::new();
            for p in tier {
                let p: PluginName = p.as_ref().parse()?;
                if seen.contains(&p) {
                    return Err(ConfigError::Duplicate(p.name().into()));
                }
                seen.push(p);
                t.push(p);
            }
            out.push(t);
        }
        let c = Config {
            actions: acts,
            tiers: out,
            profiles: default_profiles(),
            share_policy: SharePolicy::Profile,
        };
        if c.enabled(PluginName::Binpack) && c.enabled(PluginName::Spread) {
            return Err(ConfigError::Conflicting);
        }
        Ok(c)
    }

    pub fn enabled(&self, p: PluginName) -> bool {
        self.tiers.iter().any(|t| t.contains(&p))
    }

    /// The placement profile of a workload kind.
    pub fn profile(&self, kind: GroupKind) -> Profile {
        match self.profiles.get(&kind) {
            Some(p) => *p,
            None if self.enabled(PluginName::Spread) => Profile::Spread,
            None => Profile::Binpack,
        }
    }

    pub fn runs(&self, a: Action) -> bool {
        self.actions.contains(&a)
    }

    /// Enabled plugins in precedence order.
    pub fn plugins(&self) -> impl Iterator<Item = PluginName> + '_ {
        self.tiers.iter().flatten().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let c = Config::from_names(&["allocate"], &[vec!["gang", "drf"]]).unwrap();
        assert!(c.enabled(PluginName::Gang));
        assert!(!c.enabled(PluginName::Priority));
        assert_eq!(
            Config::from_names(&["allocat"], &[Vec::<&str>::new()]),
            Err(ConfigError::UnknownAction("allocat".into()))
        );
        assert_eq!(
            Config::from_names(&["allocate"], &[vec!["gnag"]]),
            Err(ConfigError::UnknownPlugin("gnag".into()))
        );
        assert_eq!(
            Config::from_names(&["allocate"], &[vec!["binpack"], vec!["spread"]]),
            Err(ConfigError::Conflicting)
        );
    }
}

//! The network tiers above nodes: for each node, its domain (rack, spine, …) at
//! each tier, bottom up — the model's [`tessera_model::Node::network`], which
//! the scheduler reads for gangs with a `networkTopology`. Pure: objects and
//! node labels in, domains and problems (as text) out.
//!
//! Two sources, never mixed:
//!
//! * **Volcano's HyperNodes** (`topology.volcano.sh/v1alpha1`, see
//!   [`crate::crd::topology`]), when the cluster has at least one. A node's
//!   tier-`t` domain is the name of the tier-`t` HyperNode that holds it, directly
//!   (a `Node` member) or through lower-tier HyperNodes (`HyperNode` members,
//!   resolved recursively, as Volcano's `BuildHyperNodeCache` does).
//! * **Node labels** otherwise: a list of label keys, bottom up (default
//!   [`DEFAULT_LABEL_KEYS`]); the value of the `t`-th key is the node's tier-`t`
//!   domain. Values must be unique in their tier across the cluster (rack `r1`
//!   under two spines is one rack). `topology.kubernetes.io/zone` is not a default:
//!   its tier number would depend on how many fabric tiers a cluster labels, so
//!   the same `highestTierAllowed` would mean different things in different
//!   clusters; add it at the end of the list where zones are a tier.
//!
//! What a tier number means, as in Volcano (`allocateResourceForTasksWithTopology`
//! tries the HyperNodes of every tier from the lowest up to `highestTierAllowed`):
//! `highestTierAllowed: t` is "all pods within one domain of a tier ≤ t". So a
//! node's list has one entry per tier up to the topology's top tier
//! ([`Topology::max_tier`]: the highest HyperNode tier, or the number of label
//! keys), and the entry at tier `t` is the node's domain at the highest tier
//! ≤ `t` that has one for it:
//!
//! * A rack with no parent spine is the node's domain at tier 2 and above too; a
//!   node in racks (tier 1) under zones (tier 3) with no tier 2 counts in its rack
//!   at tier 2. With HyperNodes, names are unique across tiers, so an inherited
//!   name never collides; with labels, an inherited value is written
//!   `~t<tier>/<value>` (`~t1/r1`), which no label value can be, so a rack `r1`
//!   is never merged with a spine `r1`.
//! * A node with no domain at any tier ≤ `t` but one above gets a domain of its
//!   own at `t` (`~node/<name>`, a name no HyperNode or label value can have): a
//!   node alone is always within one domain, so this never breaks a constraint
//!   (Volcano would not use the node for such a gang at all).
//! * A node in no domain at any tier (no HyperNode holds it, no label) has an
//!   empty list: a gang with a *hard* constraint does not use it (as in Volcano,
//!   which schedules such gangs inside HyperNodes only); a soft one may.
//! * A gang's tier above the top tier is clamped to the top tier by
//!   [`crate::state::State::build`]: Volcano then tries every HyperNode (never
//!   the nodes outside all of them), which is "within one domain of the top
//!   tier" here.
//! * A node that two HyperNodes of one tier hold (overlapping selectors, or a
//!   HyperNode listed by two parents) is ambiguous at that tier: Volcano refuses a
//!   HyperNode with two parents. Here the tier counts as one where the node has
//!   no domain (it inherits its unambiguous domain of a lower tier, else its own),
//!   so no gang counts it in a rack it may not be in; the problem is reported.
//! * A `HyperNode` member must have a lower tier than its parent; a link that does
//!   not go down a tier is ignored and reported. So membership cycles (`a` holds
//!   `b` holds `a`), which are reported as such, can never loop the resolution.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::crd::topology as crd;
use crate::translate::{self, TranslateError};

/// Tessera's node labels for network tiers, bottom up.
pub const DEFAULT_LABEL_KEYS: [&str; 3] = [
    "scheduling.tessera.dev/network-tier-1",
    "scheduling.tessera.dev/network-tier-2",
    "scheduling.tessera.dev/network-tier-3",
];

/// The default label keys as owned strings.
pub fn default_label_keys() -> Vec<String> {
    DEFAULT_LABEL_KEYS.iter().map(|k| k.to_string()).collect()
}

/// The domain of a node alone at a tier where it has none (or an ambiguous one).
pub fn own_domain(node: &str) -> String {
    format!("~node/{node}")
}

/// How a HyperNode chooses nodes.
#[derive(Debug, Clone)]
pub enum NodeMatch {
    Exact(String),
    /// Unanchored, as Go's `regexp.MatchString` in Volcano.
    Regex(regex::Regex),
    /// A label selector; an empty one chooses no node (as in Volcano).
    Labels(LabelSelector),
}

impl PartialEq for NodeMatch {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (NodeMatch::Exact(a), NodeMatch::Exact(b)) => a == b,
            (NodeMatch::Regex(a), NodeMatch::Regex(b)) => a.as_str() == b.as_str(),
            (NodeMatch::Labels(a), NodeMatch::Labels(b)) => a == b,
            _ => false,
        }
    }
}

impl NodeMatch {
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            NodeMatch::Exact(n) => n == name,
            NodeMatch::Regex(r) => r.is_match(name),
            NodeMatch::Labels(sel) => {
                let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                    && sel.match_expressions.as_ref().is_none_or(|m| m.is_empty());
                !empty && translate::selector_matches(sel, labels)
            }
        }
    }
}

/// A HyperNode, translated.
#[derive(Debug, Clone, PartialEq)]
pub struct HyperNode {
    pub name: String,
    pub tier: u8,
    pub nodes: Vec<NodeMatch>,
    /// Member HyperNodes by name, with the index of their member entry.
    pub hypernodes: Vec<(usize, String)>,
}

/// Translates a HyperNode; an error names the object, field and value.
pub fn hypernode(h: &crd::HyperNode) -> Result<HyperNode, TranslateError> {
    let name = h.metadata.name.clone().unwrap_or_default();
    let object = format!("hypernode.topology.volcano.sh {name}");
    let err = |field: &str, value: &str, problem: &str| TranslateError {
        object: object.clone(),
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
    };
    let tier = u8::try_from(h.spec.tier)
        .ok()
        .filter(|t| *t >= 1)
        .ok_or_else(|| {
            err(
                "spec.tier",
                &h.spec.tier.to_string(),
                "must be a tier from 1 to 255",
            )
        })?;
    let mut out = HyperNode {
        name: name.clone(),
        tier,
        nodes: Vec::new(),
        hypernodes: Vec::new(),
    };
    for (i, m) in h.spec.members.iter().enumerate() {
        let s = &m.selector;
        let field = format!("spec.members[{i}].selector");
        let given = usize::from(s.exact_match.is_some())
            + usize::from(s.regex_match.is_some())
            + usize::from(s.label_match.is_some());
        if given != 1 {
            return Err(err(
                &field,
                &given.to_string(),
                "give exactly one of exactMatch, regexMatch, labelMatch",
            ));
        }
        let exact = s
            .exact_match
            .as_ref()
            .map(|e| e.name.as_deref().unwrap_or_default());
        match m.type_.as_deref().unwrap_or_default() {
            "Node" => {
                if let Some(name) = exact {
                    if name.is_empty() {
                        return Err(err(&format!("{field}.exactMatch.name"), "", "empty"));
                    }
                    out.nodes.push(NodeMatch::Exact(name.to_string()));
                } else if let Some(r) = &s.regex_match {
                    let f = format!("{field}.regexMatch.pattern");
                    let pattern = r.pattern.as_deref().unwrap_or_default();
                    if pattern.is_empty() {
                        return Err(err(&f, "", "empty"));
                    }
                    let re = regex::RegexBuilder::new(pattern)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| err(&f, pattern, &format!("not a regular expression: {e}")))?;
                    out.nodes.push(NodeMatch::Regex(re));
                } else if let Some(l) = &s.label_match {
                    out.nodes.push(NodeMatch::Labels(l.clone()));
                }
            }
            "HyperNode" => match exact {
                Some(name) if !name.is_empty() => out.hypernodes.push((i, name.to_string())),
                Some(_) => return Err(err(&format!("{field}.exactMatch.name"), "", "empty")),
                None => {
                    return Err(err(
                        &field,
                        if s.regex_match.is_some() {
                            "regexMatch"
                        } else {
                            "labelMatch"
                        },
                        "a HyperNode member is chosen by exactMatch only (as in Volcano)",
                    ));
                }
            },
            t => {
                return Err(err(
                    &format!("spec.members[{i}].type"),
                    t,
                    "not a member type (Node, HyperNode)",
                ));
            }
        }
    }
    Ok(out)
}

/// The network as the controller knows it: the HyperNodes, the label keys of
/// the fallback, and what follows from them.
#[derive(Debug, Default)]
pub struct Topology {
    hypernodes: BTreeMap<String, HyperNode>,
    /// HyperNodes that could not be translated, with the error (so that the
    /// same bad object arriving again is not reported again).
    rejected: BTreeMap<String, String>,
    label_keys: Vec<String>,
    /// For each HyperNode: itself and every HyperNode above it, by tier.
    above: BTreeMap<String, BTreeMap<u8, BTreeSet<String>>>,
    /// HyperNodes by the node names their `exactMatch` members give.
    exact: BTreeMap<String, Vec<String>>,
    /// HyperNodes with a regex or label member (tried against every node).
    inexact: Vec<String>,
    /// The highest HyperNode tier (0 without HyperNodes).
    top: u8,
}

impl Topology {
    pub fn new(label_keys: Vec<String>) -> Self {
        Topology {
            label_keys,
            ..Topology::default()
        }
    }

    pub fn label_keys(&self) -> &[String] {
        &self.label_keys
    }

    /// Sets the label keys; false when they are the ones in use.
    pub fn set_label_keys(&mut self, keys: Vec<String>) -> bool {
        if self.label_keys == keys {
            return false;
        }
        self.label_keys = keys;
        true
    }

    pub fn hypernode_count(&self) -> usize {
        self.hypernodes.len()
    }

    /// HyperNodes known, translated or not.
    pub fn known_count(&self) -> usize {
        self.hypernodes.len() + self.rejected.len()
    }

    /// The top tier: every node's list, when not empty, has this many entries;
    /// 0 when there are no tiers at all.
    pub fn max_tier(&self) -> u8 {
        if self.hypernodes.is_empty() {
            u8::try_from(self.label_keys.len()).unwrap_or(u8::MAX)
        } else {
            self.top
        }
    }

    /// Adds or replaces a HyperNode (call [`Topology::rebuild`] after).
    pub fn insert(&mut self, h: HyperNode) {
        self.rejected.remove(&h.name);
        self.hypernodes.insert(h.name.clone(), h);
    }

    /// Records a HyperNode that could not be translated: it holds nothing.
    pub fn reject(&mut self, name: &str, error: String) {
        self.hypernodes.remove(name);
        self.rejected.insert(name.to_string(), error);
    }

    /// Whether applying this translation of HyperNode `name` would change
    /// nothing (the same spec, or the same error, as before).
    pub fn unchanged(&self, name: &str, h: &Result<HyperNode, String>) -> bool {
        match h {
            Ok(h) => self.hypernodes.get(name) == Some(h),
            Err(e) => !self.hypernodes.contains_key(name) && self.rejected.get(name) == Some(e),
        }
    }

    /// Removes a HyperNode; false when there was none of that name.
    pub fn remove(&mut self, name: &str) -> bool {
        let rejected = self.rejected.remove(name).is_some();
        self.hypernodes.remove(name).is_some() || rejected
    }

    pub fn clear(&mut self) {
        self.hypernodes.clear();
        self.rejected.clear();
    }

    /// Recomputes which HyperNodes sit above which; returns the problems found
    /// (membership cycles, links that do not go down a tier).
    pub fn rebuild(&mut self) -> Vec<String> {
        let mut problems = cycles(&self.hypernodes);
        let mut parents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (pname, p) in &self.hypernodes {
            for (i, cname) in &p.hypernodes {
                // A member not (yet) there holds no nodes: nothing to link.
                let Some(c) = self.hypernodes.get(cname) else {
                    continue;
                };
                if c.tier >= p.tier {
                    problems.push(format!(
                        "hypernode.topology.volcano.sh {pname}: spec.members[{i}].selector.exactMatch.name = {cname:?}: a member HyperNode must have a lower tier than its parent ({cname} is tier {}, {pname} tier {}); link ignored",
                        c.tier, p.tier
                    ));
                    continue;
                }
                parents
                    .entry(cname.as_str())
                    .or_default()
                    .push(pname.as_str());
            }
        }
        // Parents have higher tiers: highest tiers first, each HyperNode's
        // parents are done before it.
        let mut order: Vec<&HyperNode> = self.hypernodes.values().collect();
        order.sort_by(|a, b| b.tier.cmp(&a.tier).then_with(|| a.name.cmp(&b.name)));
        let mut above: BTreeMap<String, BTreeMap<u8, BTreeSet<String>>> = BTreeMap::new();
        for h in order {
            let mut m: BTreeMap<u8, BTreeSet<String>> = BTreeMap::new();
            m.entry(h.tier).or_default().insert(h.name.clone());
            for p in parents.get(h.name.as_str()).into_iter().flatten() {
                for (t, names) in above.get(*p).into_iter().flatten() {
                    m.entry(*t).or_default().extend(names.iter().cloned());
                }
            }
            above.insert(h.name.clone(), m);
        }
        self.above = above;
        self.exact.clear();
        self.inexact.clear();
        for h in self.hypernodes.values() {
            for m in &h.nodes {
                if let NodeMatch::Exact(n) = m {
                    let hs = self.exact.entry(n.clone()).or_default();
                    if hs.last() != Some(&h.name) {
                        hs.push(h.name.clone());
                    }
                }
            }
            if h.nodes.iter().any(|m| !matches!(m, NodeMatch::Exact(_))) {
                self.inexact.push(h.name.clone());
            }
        }
        self.top = self.hypernodes.values().map(|h| h.tier).max().unwrap_or(0);
        problems
    }

    /// A node's domains, bottom up, and a problem to report, if any.
    pub fn network_of(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> (Vec<String>, Option<String>) {
        if self.hypernodes.is_empty() {
            let tiers: Vec<Option<&str>> = self
                .label_keys
                .iter()
                .map(|k| labels.get(k).map(String::as_str).filter(|v| !v.is_empty()))
                .collect();
            if tiers.iter().all(Option::is_none) {
                return (Vec::new(), None);
            }
            let net = (0..tiers.len())
                .map(
                    |t| match (0..=t).rev().find_map(|u| tiers[u].map(|d| (u, d))) {
                        Some((u, d)) if u == t => d.to_string(),
                        // Inherited: marked with its tier, never equal to a value
                        // of this tier.
                        Some((u, d)) => format!("~t{}/{d}", u + 1),
                        None => own_domain(node),
                    },
                )
                .collect();
            return (net, None);
        }
        let mut by_tier: BTreeMap<u8, BTreeSet<&str>> = BTreeMap::new();
        let holders = self
            .exact
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|h| self.hypernodes.get(h))
            .chain(
                self.inexact
                    .iter()
                    .filter_map(|h| self.hypernodes.get(h))
                    .filter(|h| h.nodes.iter().any(|m| m.matches(node, labels))),
            );
        for h in holders {
            for (t, names) in self.above.get(&h.name).into_iter().flatten() {
                by_tier
                    .entry(*t)
                    .or_default()
                    .extend(names.iter().map(String::as_str));
            }
        }
        if by_tier.is_empty() {
            return (Vec::new(), None);
        }
        let mut problem = Vec::new();
        let mut net = Vec::with_capacity(usize::from(self.top));
        // The domain of the highest tier so far that has exactly one.
        let mut current: Option<&str> = None;
        for t in 1..=self.top {
            match by_tier.get(&t) {
                Some(s) if s.len() == 1 => current = s.first().copied(),
                Some(s) if s.len() > 1 => {
                    let names: Vec<&str> = s.iter().copied().collect();
                    problem.push(format!("tier {t} ({})", names.join(", ")));
                }
                _ => {}
            }
            net.push(current.map_or_else(|| own_domain(node), str::to_string));
        }
        let problem = (!problem.is_empty()).then(|| {
            format!(
                "node {node}: held by more than one HyperNode of one tier: {}; at that tier it counts in its domain of a lower tier, else as a domain of its own",
                problem.join("; ")
            )
        });
        (net, problem)
    }
}

/// Membership cycles among HyperNodes (`a -> b -> a`), each reported once.
fn cycles(hs: &BTreeMap<String, HyperNode>) -> Vec<String> {
    // 0: not seen, 1: on the current path, 2: done.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    let mut out = Vec::new();
    for start in hs.keys() {
        if state.get(start.as_str()).copied().unwrap_or(0) != 0 {
            continue;
        }
        // Iterative depth-first search: (node, next member index).
        let mut path: Vec<(&str, usize)> = vec![(start.as_str(), 0)];
        state.insert(start.as_str(), 1);
        while let Some((cur, i)) = path.last().copied() {
            let members = hs.get(cur).map(|h| &h.hypernodes[..]).unwrap_or(&[]);
            if i >= members.len() {
                state.insert(cur, 2);
                path.pop();
                continue;
            }
            if let Some(last) = path.last_mut() {
                last.1 += 1;
            }
            let next = members[i].1.as_str();
            if !hs.contains_key(next) {
                continue;
            }
            match state.get(next).copied().unwrap_or(0) {
                0 => {
                    state.insert(next, 1);
                    path.push((next, 0));
                }
                1 => {
                    let from = path.iter().position(|(n, _)| *n == next).unwrap_or(0);
                    let mut names: Vec<&str> = path[from..].iter().map(|(n, _)| *n).collect();
                    names.push(next);
                    out.push(format!(
                        "hypernode.topology.volcano.sh {next}: spec.members: membership cycle {}; the links that do not go down a tier are ignored",
                        names.join(" -> ")
                    ));
                }
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hn(name: &str, tier: i64, members: serde_json::Value) -> crd::HyperNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": name},
            "spec": {"tier": tier, "members": members}
        }))
        .unwrap()
    }

    fn node(name: &str) -> serde_json::Value {
        serde_json::json!({"type": "Node", "selector": {"exactMatch": {"name": name}}})
    }

    fn child(name: &str) -> serde_json::Value {
        serde_json::json!({"type": "HyperNode", "selector": {"exactMatch": {"name": name}}})
    }

    fn topo(hs: &[crd::HyperNode]) -> (Topology, Vec<String>) {
        let mut t = Topology::new(default_label_keys());
        for h in hs {
            t.insert(hypernode(h).unwrap());
        }
        let p = t.rebuild();
        (t, p)
    }

    fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn two_tiers_recursively() {
        let (t, p) = topo(&[
            hn(
                "rack-a",
                1,
                serde_json::json!([node("n1"), {"type": "Node",
                    "selector": {"regexMatch": {"pattern": "^a-[0-9]+$"}}}]),
            ),
            hn(
                "rack-b",
                1,
                serde_json::json!([{"type": "Node",
                "selector": {"labelMatch": {"matchLabels": {"rack": "b"}}}}]),
            ),
            hn(
                "spine",
                2,
                serde_json::json!([child("rack-a"), child("rack-b")]),
            ),
        ]);
        assert!(p.is_empty(), "{p:?}");
        let none = labels(&[]);
        assert_eq!(t.network_of("n1", &none).0, ["rack-a", "spine"]);
        assert_eq!(t.network_of("a-17", &none).0, ["rack-a", "spine"]);
        // The pattern anchors itself; matching is unanchored otherwise.
        assert_eq!(t.network_of("xa-1", &none).0, Vec::<String>::new());
        let (t2, _) = topo(&[hn(
            "gpu",
            1,
            serde_json::json!([{"type": "Node", "selector": {"regexMatch": {"pattern": "gpu"}}}]),
        )]);
        assert_eq!(t2.network_of("node-gpu-1", &none).0, ["gpu"]);
        assert_eq!(
            t.network_of("n9", &labels(&[("rack", "b")])).0,
            ["rack-b", "spine"]
        );
        // Labels are not read while HyperNodes exist.
        assert_eq!(
            t.network_of("n9", &labels(&[(DEFAULT_LABEL_KEYS[0], "r1")]))
                .0,
            Vec::<String>::new()
        );
    }

    #[test]
    fn gaps_and_direct_upper_members() {
        // n2 hangs directly off a tier-3 HyperNode: tiers 1 and 2 are its own.
        let (t, _) = topo(&[hn("zone", 3, serde_json::json!([node("n2")]))]);
        assert_eq!(
            t.network_of("n2", &labels(&[])).0,
            [own_domain("n2"), own_domain("n2"), "zone".to_string()]
        );
    }

    #[test]
    fn a_node_in_two_racks_is_its_own_rack() {
        let (t, _) = topo(&[
            hn("rack-a", 1, serde_json::json!([node("n1")])),
            hn("rack-b", 1, serde_json::json!([node("n1")])),
            hn(
                "spine",
                2,
                serde_json::json!([child("rack-a"), child("rack-b")]),
            ),
        ]);
        let (net, problem) = t.network_of("n1", &labels(&[]));
        assert_eq!(net, [own_domain("n1"), "spine".to_string()]);
        let problem = problem.unwrap();
        assert!(problem.contains("tier 1 (rack-a, rack-b)"), "{problem}");
        // A rack listed by two spines: its nodes are ambiguous at tier 2 only.
        let (t, _) = topo(&[
            hn("rack-a", 1, serde_json::json!([node("n1")])),
            hn("s1", 2, serde_json::json!([child("rack-a")])),
            hn("s2", 2, serde_json::json!([child("rack-a")])),
        ]);
        // There it counts in its rack, which is within one tier-2 domain
        // whichever spine holds it.
        let (net, problem) = t.network_of("n1", &labels(&[]));
        assert_eq!(net, ["rack-a", "rack-a"]);
        assert!(problem.unwrap().contains("tier 2 (s1, s2)"));
    }

    #[test]
    fn cycles_and_upward_links_are_reported_and_ignored() {
        let (t, p) = topo(&[
            hn("a", 2, serde_json::json!([child("b")])),
            hn("b", 1, serde_json::json!([child("a"), node("n1")])),
            hn("self", 1, serde_json::json!([child("self")])),
        ]);
        assert!(
            p.iter().any(|m| m.contains("membership cycle a -> b -> a")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|m| m.contains("membership cycle self -> self"))
        );
        assert!(
            p.iter().any(
                |m| m.contains("hypernode.topology.volcano.sh b: spec.members[0]")
                    && m.contains("lower tier")
            ),
            "{p:?}"
        );
        // The downward link stands: n1 is in b (tier 1) under a (tier 2).
        assert_eq!(t.network_of("n1", &labels(&[])).0, ["b", "a"]);
    }

    #[test]
    fn label_fallback() {
        let t = Topology::new(default_label_keys());
        let k = DEFAULT_LABEL_KEYS;
        assert_eq!(t.max_tier(), 3);
        // Up to the top tier (the number of keys), a missing tier inheriting
        // the one below, marked so that it never equals a value of its tier.
        assert_eq!(
            t.network_of("n1", &labels(&[(k[0], "r1"), (k[1], "s1")])).0,
            ["r1", "s1", "~t2/s1"]
        );
        assert_eq!(
            t.network_of("n1", &labels(&[(k[1], "s1")])).0,
            [own_domain("n1"), "s1".to_string(), "~t2/s1".to_string()]
        );
        assert_eq!(
            t.network_of("n1", &labels(&[(k[0], "r1"), (k[2], "z")])).0,
            ["r1", "~t1/r1", "z"]
        );
        assert_eq!(
            t.network_of("n1", &labels(&[(k[0], "")])).0,
            Vec::<String>::new()
        );
        // A rack "x" without a spine and a spine "x" elsewhere: two domains
        // at tier 2.
        let a = t.network_of("a", &labels(&[(k[0], "x")])).0;
        let b = t.network_of("b", &labels(&[(k[0], "y"), (k[1], "x")])).0;
        assert_ne!(a[1], b[1]);
        let t = Topology::new(vec!["rack".into(), "topology.kubernetes.io/zone".into()]);
        assert_eq!(
            t.network_of(
                "n1",
                &labels(&[("rack", "r1"), ("topology.kubernetes.io/zone", "z")])
            )
            .0,
            ["r1", "z"]
        );
    }

    /// Volcano tries the HyperNodes of every tier up to `highestTierAllowed`:
    /// a rack without a spine above it is a tier-2 domain too.
    #[test]
    fn a_rack_without_a_spine_is_its_tier_2_domain() {
        let (t, _) = topo(&[
            hn("rack-a", 1, serde_json::json!([node("a1"), node("a2")])),
            hn("rack-b", 1, serde_json::json!([node("b1")])),
            hn("spine", 2, serde_json::json!([child("rack-b")])),
        ]);
        assert_eq!(t.max_tier(), 2);
        let none = labels(&[]);
        assert_eq!(t.network_of("a1", &none).0, ["rack-a", "rack-a"]);
        assert_eq!(t.network_of("a2", &none).0, ["rack-a", "rack-a"]);
        assert_eq!(t.network_of("b1", &none).0, ["rack-b", "spine"]);
        assert!(t.network_of("elsewhere", &none).0.is_empty());
    }

    /// Tiers 1 and 3 only: at tier 2 a node counts in its rack, not alone.
    #[test]
    fn tiers_1_and_3_only() {
        let (t, _) = topo(&[
            hn("rack-a", 1, serde_json::json!([node("a1"), node("a2")])),
            hn("rack-b", 1, serde_json::json!([node("b1")])),
            hn(
                "zone",
                3,
                serde_json::json!([child("rack-a"), child("rack-b"), node("z1")]),
            ),
        ]);
        assert_eq!(t.max_tier(), 3);
        let none = labels(&[]);
        assert_eq!(t.network_of("a1", &none).0, ["rack-a", "rack-a", "zone"]);
        assert_eq!(t.network_of("b1", &none).0, ["rack-b", "rack-b", "zone"]);
        // Directly in the zone: alone below it.
        assert_eq!(
            t.network_of("z1", &none).0,
            [own_domain("z1"), own_domain("z1"), "zone".to_string()]
        );
    }

    /// Every node's list reaches the top tier, whichever tier its own
    /// HyperNodes stop at.
    #[test]
    fn lists_reach_the_top_tier() {
        let (t, _) = topo(&[
            hn("rack-a", 1, serde_json::json!([node("a1")])),
            hn("big", 4, serde_json::json!([node("x1")])),
        ]);
        let none = labels(&[]);
        assert_eq!(t.max_tier(), 4);
        assert_eq!(t.network_of("a1", &none).0, ["rack-a"; 4]);
        assert_eq!(t.network_of("x1", &none).0.len(), 4);
        assert_eq!(t.network_of("x1", &none).0[3], "big");
    }

    #[test]
    fn bad_hypernodes_name_field_and_value() {
        let e = hypernode(&hn("h", 0, serde_json::json!([]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "hypernode.topology.volcano.sh h: spec.tier = \"0\": must be a tier from 1 to 255"
        );
        let e = hypernode(&hn(
            "h",
            1,
            serde_json::json!([{"type": "Node", "selector": {"regexMatch": {"pattern": "(["}}}]),
        ))
        .unwrap_err();
        assert_eq!(e.field, "spec.members[0].selector.regexMatch.pattern");
        assert_eq!(e.value, "([");
        let e = hypernode(&hn(
            "h",
            2,
            serde_json::json!([node("n1"), {"type": "HyperNode",
                "selector": {"regexMatch": {"pattern": "rack-.*"}}}]),
        ))
        .unwrap_err();
        assert_eq!(e.field, "spec.members[1].selector");
        assert!(e.problem.contains("exactMatch only"));
        let e = hypernode(&hn(
            "h",
            1,
            serde_json::json!([{"type": "Switch", "selector": {"exactMatch": {"name": "x"}}}]),
        ))
        .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("spec.members[0].type", "Switch")
        );
        let e = hypernode(&hn(
            "h",
            1,
            serde_json::json!([{"type": "Node", "selector": {}}]),
        ))
        .unwrap_err();
        assert!(e.problem.contains("exactly one"), "{e}");
        // An empty label selector chooses no node.
        let (t, _) = topo(&[hn(
            "h",
            1,
            serde_json::json!([{"type": "Node", "selector": {"labelMatch": {}}}]),
        )]);
        assert!(t.network_of("n1", &labels(&[("a", "b")])).0.is_empty());
    }

    /// Random HyperNode graphs (any tiers, any links, cycles included) over a
    /// few nodes.
    fn arb_graph() -> impl Strategy<Value = Vec<(u8, Vec<usize>, Vec<usize>)>> {
        prop::collection::vec(
            (
                1u8..5,
                prop::collection::vec(0usize..6, 0..3),
                prop::collection::vec(0usize..6, 0..3),
            ),
            0..6,
        )
    }

    proptest! {
        /// The specification of [`Topology::network_of`]: a node that some
        /// HyperNode holds (directly or through members that go down a tier)
        /// has one entry per tier up to the highest HyperNode tier; at tier
        /// `t`, the one HyperNode holding it at the highest tier `u <= t`
        /// where exactly one does (none, or several: a lower tier), else the
        /// node's own domain. A node nothing holds has none. Hence soundness:
        /// two nodes with one domain at tier `t` are both held by one
        /// HyperNode of tier `<= t`.
        #[test]
        fn resolution_is_sound(g in arb_graph()) {
            let hs: Vec<crd::HyperNode> = g.iter().enumerate().map(|(i, (tier, nodes, kids))| {
                let mut m: Vec<serde_json::Value> =
                    nodes.iter().map(|n| node(&format!("n{n}"))).collect();
                m.extend(kids.iter().map(|k| child(&format!("h{k}"))));
                hn(&format!("h{i}"), i64::from(*tier), serde_json::Value::Array(m))
            }).collect();
            let (t, _) = topo(&hs);
            // Which HyperNodes hold a node, following links down a tier only.
            let holds = |h: usize, n: usize| -> bool {
                let mut stack = vec![h];
                let mut seen = BTreeSet::new();
                while let Some(x) = stack.pop() {
                    if !seen.insert(x) { continue; }
                    if g[x].1.contains(&n) { return true; }
                    for &k in &g[x].2 {
                        if k < g.len() && g[k].0 < g[x].0 { stack.push(k); }
                    }
                }
                false
            };
            let top = g.iter().map(|h| h.0).max().unwrap_or(0);
            if !g.is_empty() {
                prop_assert_eq!(t.max_tier(), top);
            }
            for n in 0..6 {
                let name = format!("n{n}");
                let (net, _) = t.network_of(&name, &BTreeMap::new());
                let holders = |tier: u8| -> Vec<usize> {
                    (0..g.len()).filter(|&h| g[h].0 == tier && holds(h, n)).collect()
                };
                if (1..=top).all(|t| holders(t).is_empty()) {
                    prop_assert!(net.is_empty(), "{:?}", net);
                    continue;
                }
                prop_assert_eq!(net.len(), usize::from(top), "{:?}", net);
                for tier in 1..=top {
                    let want = (1..=tier)
                        .rev()
                        .find_map(|u| match holders(u)[..] {
                            [h] => Some(format!("h{h}")),
                            _ => None,
                        })
                        .unwrap_or_else(|| own_domain(&name));
                    prop_assert_eq!(&net[usize::from(tier) - 1], &want);
                }
            }
        }

        /// With labels, two nodes share a domain at tier `t` only when they
        /// have the same value for one key of a tier `<= t` (never a rack
        /// value taken for a spine value), and every labelled node's list
        /// reaches the top tier.
        #[test]
        fn label_domains_are_sound(
            nodes in prop::collection::vec(
                prop::collection::vec(prop::option::of(0u8..3), 3), 2..6)
        ) {
            let t = Topology::new(default_label_keys());
            let nets: Vec<Vec<String>> = nodes.iter().enumerate().map(|(i, vals)| {
                let l: BTreeMap<String, String> = vals.iter().enumerate()
                    .filter_map(|(k, v)| v.map(|v| (DEFAULT_LABEL_KEYS[k].to_string(), format!("v{v}"))))
                    .collect();
                t.network_of(&format!("n{i}"), &l).0
            }).collect();
            for (i, a) in nets.iter().enumerate() {
                let labelled = nodes[i].iter().any(Option::is_some);
                prop_assert_eq!(a.len(), if labelled { 3 } else { 0 });
                for (j, b) in nets.iter().enumerate().skip(i + 1) {
                    for tier in 0..a.len().min(b.len()) {
                        if a[tier] == b[tier] {
                            prop_assert!(
                                (0..=tier).any(|u| nodes[i][u].is_some() && nodes[i][u] == nodes[j][u]),
                                "n{} {:?} and n{} {:?} at tier {}", i, &nodes[i], j, &nodes[j], tier + 1
                            );
                        }
                    }
                }
            }
        }
    }
}

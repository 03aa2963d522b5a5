//! Runtime classes on this server: the operator's class table, each tenant's minimum
//! class, and the one decision every workload goes through ([`ClassPolicy::decide`]):
//! which class and tier a job task or an API sandbox gets. Jobs carry the class's node
//! selector to the scheduler ([`selector`]); the node runtime and the sandboxes
//! module make the sandbox in the class's tier.

use std::collections::BTreeMap;

use tessera_sandbox::class::DEFAULT_CLASS;
use tessera_sandbox::{RuntimeClasses, TierKind};

use crate::problem::ApiError;

/// The class table and the tenants' minimum classes.
#[derive(Debug, Clone, Default)]
pub struct ClassPolicy {
    pub classes: RuntimeClasses,
    /// Tenant -> the weakest class its workloads may have (`*`: every tenant without
    /// its own entry). A workload that names no class gets this one.
    pub min_class: BTreeMap<String, String>,
}

/// What [`ClassPolicy::decide`] gives a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub class: String,
    pub tier: TierKind,
}

impl ClassPolicy {
    /// Checks the table against itself: every tenant's minimum is a known class.
    pub fn check(&self) -> Result<(), String> {
        for (tenant, c) in &self.min_class {
            self.classes
                .resolve(Some(c))
                .map_err(|e| format!("minimum runtime class of tenant {tenant:?}: {e}"))?;
        }
        Ok(())
    }

    fn minimum(&self, tenant: &str) -> Option<&str> {
        self.min_class
            .get(tenant)
            .or_else(|| self.min_class.get("*"))
            .map(String::as_str)
    }

    /// The class and tier of a workload of `tenant` that asks for `asked` (at field
    /// `field`): the tenant's minimum when it asks for none, else what it asked for,
    /// refused when unknown or weaker than the minimum, and refused for GPUs in a
    /// tier that cannot give them.
    pub fn decide(
        &self,
        tenant: &str,
        field: &str,
        asked: Option<&str>,
        wants_gpus: bool,
    ) -> Result<Decided, ApiError> {
        let min = self.minimum(tenant);
        let class = asked.or(min).unwrap_or(DEFAULT_CLASS);
        let tier = self
            .classes
            .resolve(Some(class))
            .map_err(|e| ApiError::invalid(field, format!("{field}: {e}")))?;
        if let Some(m) = min {
            let floor = self
                .classes
                .resolve(Some(m))
                .map_err(|e| ApiError::internal(format!("the minimum class: {e}")))?;
            if tier < floor {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "{field}: tenant {tenant:?} runs at least runtime class `{m}` ({floor}); `{class}` ({tier}) is weaker: ask for `{m}` or name no class"
                    ),
                ));
            }
        }
        if wants_gpus && tier == TierKind::Microvm {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{field}: runtime class `{class}` runs in a micro-VM, which cannot hold GPUs yet (vfio pass-through is not built; see docs/sandbox.md): use a namespace class for GPU work"
                ),
            ));
        }
        Ok(Decided {
            class: class.to_string(),
            tier,
        })
    }

    /// For work that runs only in the namespace tier so far (agent sessions): refused
    /// for a tenant whose minimum class needs a stronger tier, so that no path runs a
    /// tenant's code weaker than its policy says.
    pub fn namespace_only(&self, tenant: &str, what: &str) -> Result<(), ApiError> {
        // What a workload of the tenant naming no class gets: its minimum, else
        // the default.
        let d = self.decide(tenant, "runtime_class", None, false)?;
        if d.tier > TierKind::Namespace {
            return Err(ApiError::new(
                crate::problem::Code::Conflict,
                format!(
                    "tenant {tenant:?} runs at least runtime class `{}` ({}), and {what} run only in the namespace tier for now: ask the operator to lower the tenant's --min-runtime-class, or use jobs and sandboxes",
                    d.class, d.tier
                ),
            ));
        }
        Ok(())
    }

    /// The tier of a class already decided (a stored job's); the default class for
    /// none or an unknown one (a class the operator has since removed runs nowhere
    /// new: the scheduler keeps it off every node, by its selector).
    pub fn tier_of(&self, class: Option<&str>) -> TierKind {
        self.classes.resolve(class).unwrap_or_default()
    }
}

/// The node selector a decided class adds to a job task: none for the default class
/// (every node runs it, including nodes that do not advertise classes: a
/// simulated cluster's, a Kubernetes node without the labels).
pub fn selector(class: Option<&str>) -> Option<(String, String)> {
    match class {
        None => None,
        Some(c) if c == DEFAULT_CLASS => None,
        Some(c) => Some((tessera_model::runtime_class_label(c), "true".into())),
    }
}

/// The `--runtime-class NAME=TIER` and `--min-runtime-class TENANT=CLASS` words.
pub fn parse_pair(flag: &str, s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{flag} {s:?}: write KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: &[(&str, &str)]) -> ClassPolicy {
        ClassPolicy {
            classes: RuntimeClasses::default(),
            min_class: min
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_label_prefix_is_the_sandbox_crates() {
        assert_eq!(
            tessera_model::RUNTIME_CLASS_LABEL_PREFIX,
            tessera_sandbox::class::LABEL_PREFIX
        );
    }

    #[test]
    fn no_class_is_standard_and_adds_no_selector() {
        let d = policy(&[]).decide("t", "f", None, true).unwrap();
        assert_eq!(
            (d.class.as_str(), d.tier),
            ("standard", TierKind::Namespace)
        );
        assert_eq!(selector(Some("standard")), None);
        assert_eq!(
            selector(Some("isolated")),
            Some(("runtime-class.tessera.io/isolated".into(), "true".into()))
        );
    }

    #[test]
    fn a_tenant_minimum_upgrades_the_default_and_refuses_weaker() {
        let p = policy(&[("untrusted", "isolated")]);
        let d = p.decide("untrusted", "f", None, false).unwrap();
        assert_eq!(d.tier, TierKind::Microvm);
        let e = p
            .decide(
                "untrusted",
                "tasks[0].runtime_class",
                Some("standard"),
                false,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least runtime class `isolated`"), "{e}");
        // Other tenants are not touched.
        assert_eq!(
            p.decide("other", "f", None, false).unwrap().tier,
            TierKind::Namespace
        );
        let all = policy(&[("*", "isolated")]);
        assert_eq!(
            all.decide("x", "f", None, false).unwrap().tier,
            TierKind::Microvm
        );
    }

    #[test]
    fn unknown_classes_and_gpus_in_a_vm_are_refused_by_field() {
        let p = policy(&[]);
        let e = p
            .decide("t", "runtime_class", Some("gvisor"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtime_class") && e.contains("gvisor"), "{e}");
        let e = p
            .decide("t", "tasks[1].runtime_class", Some("isolated"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot hold GPUs"), "{e}");
        assert!(policy(&[("t", "nope")]).check().is_err());
    }

    #[test]
    fn agent_sessions_are_refused_where_the_minimum_is_a_vm() {
        let p = policy(&[("untrusted", "isolated"), ("plain", "standard")]);
        let e = p
            .namespace_only("untrusted", "agent sessions")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agent sessions") && e.contains("`isolated`"),
            "{e}"
        );
        assert!(p.namespace_only("plain", "agent sessions").is_ok());
        assert!(p.namespace_only("other", "agent sessions").is_ok());
    }

    #[test]
    fn pairs_parse() {
        assert_eq!(
            parse_pair("--x", "a=b").unwrap(),
            ("a".to_string(), "b".to_string())
        );
        assert!(parse_pair("--x", "a").is_err());
        assert!(parse_pair("--x", "=b").is_err());
    }
}

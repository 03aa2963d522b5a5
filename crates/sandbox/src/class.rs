//! Runtime classes: operator-named isolation levels (like Kubernetes RuntimeClass) that
//! map to a tier. Workloads ask for a class by name; a node advertises the classes whose
//! tier it can run, as one node label per class ([`RuntimeClasses::node_labels`]), so
//! that the scheduler's ordinary node-selector predicate keeps a workload of class
//! `isolated` off nodes without it (and names the missing label in the pending reason).
//! Pure data: which tiers a node can run is measured by [`node_tiers`] and passed in.

use crate::tier::TierKind;
use std::collections::BTreeMap;
use std::path::Path;

/// The node label a node carries, set to `"true"`, when it runs class `name`.
pub const LABEL_PREFIX: &str = "runtime-class.tessera.io/";

/// The class of a workload that names none.
pub const DEFAULT_CLASS: &str = "standard";

/// A class name or the class table was refused; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassError {
    #[error("unknown runtime class {name:?}: the classes here are {known}")]
    Unknown { name: String, known: String },
    #[error(
        "runtime class name {0:?} is not valid: 1 to 63 of a-z, 0-9 and '-', starting with a letter"
    )]
    BadName(String),
}

/// The operator's class table: name -> tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeClasses {
    map: BTreeMap<String, TierKind>,
}

impl Default for RuntimeClasses {
    /// `standard` -> namespace, `isolated` -> microvm.
    fn default() -> Self {
        let mut map = BTreeMap::new();
        map.insert("standard".to_string(), TierKind::Namespace);
        map.insert("isolated".to_string(), TierKind::Microvm);
        RuntimeClasses { map }
    }
}

/// Checks that `name` can be a class name (1 to 63 of a-z, 0-9, '-', starting with a
/// letter: also a Kubernetes object name and a label key's name part).
pub fn check_name(name: &str) -> Result<(), ClassError> {
    if valid(name) {
        Ok(())
    } else {
        Err(ClassError::BadName(name.to_string()))
    }
}

fn valid(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl RuntimeClasses {
    /// Adds (or remaps) a class.
    pub fn insert(&mut self, name: &str, tier: TierKind) -> Result<(), ClassError> {
        if !valid(name) {
            return Err(ClassError::BadName(name.to_string()));
        }
        self.map.insert(name.to_string(), tier);
        Ok(())
    }

    /// The tier of class `name` (`None`: [`DEFAULT_CLASS`]).
    pub fn resolve(&self, name: Option<&str>) -> Result<TierKind, ClassError> {
        let name = name.unwrap_or(DEFAULT_CLASS);
        self.map
            .get(name)
            .copied()
            .ok_or_else(|| ClassError::Unknown {
                name: name.to_string(),
                known: self
                    .map
                    .iter()
                    .map(|(n, t)| format!("`{n}` ({t})"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, TierKind)> {
        self.map.iter().map(|(n, t)| (n.as_str(), *t))
    }

    /// The classes a node that can run `tiers` runs, by name.
    pub fn advertised(&self, tiers: &[TierKind]) -> Vec<String> {
        self.iter()
            .filter(|(_, t)| tiers.contains(t))
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// The labels such a node carries: one `runtime-class.tessera.io/NAME: "true"` each.
    pub fn node_labels(&self, tiers: &[TierKind]) -> BTreeMap<String, String> {
        self.advertised(tiers)
            .into_iter()
            .map(|n| (label(&n), "true".to_string()))
            .collect()
    }

    /// The node selector a workload of class `name` carries.
    pub fn selector(&self, name: Option<&str>) -> Result<(String, String), ClassError> {
        let name = name.unwrap_or(DEFAULT_CLASS);
        self.resolve(Some(name))?;
        Ok((label(name), "true".to_string()))
    }
}

/// The node label of class `name`.
pub fn label(name: &str) -> String {
    format!("{LABEL_PREFIX}{name}")
}

/// The tiers this host can run: the namespace tier always (Linux), the micro-VM tier
/// when QEMU is installed and a kernel template is at `kernel`. (This reads the file
/// system; it is not called by the pure parts.)
pub fn node_tiers(qemu_installed: bool, kernel: Option<&Path>) -> Vec<TierKind> {
    let mut v = vec![TierKind::Namespace];
    if qemu_installed && kernel.is_some_and(|k| k.join("kernel.json").is_file()) {
        v.push(TierKind::Microvm);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_classes_map_to_their_tiers() {
        let c = RuntimeClasses::default();
        assert_eq!(c.resolve(None), Ok(TierKind::Namespace));
        assert_eq!(c.resolve(Some("isolated")), Ok(TierKind::Microvm));
        let e = c.resolve(Some("gvisor")).unwrap_err().to_string();
        assert!(
            e.contains("\"gvisor\"") && e.contains("`isolated` (microvm)"),
            "{e}"
        );
    }

    #[test]
    fn a_node_advertises_only_what_it_can_run() {
        let mut c = RuntimeClasses::default();
        c.insert("gpu-isolated", TierKind::Microvm).unwrap();
        assert!(c.insert("Bad_Name", TierKind::Microvm).is_err());
        let ns_only = c.node_labels(&[TierKind::Namespace]);
        assert_eq!(
            ns_only.keys().collect::<Vec<_>>(),
            ["runtime-class.tessera.io/standard"]
        );
        let both = c.advertised(&[TierKind::Namespace, TierKind::Microvm]);
        assert_eq!(both, ["gpu-isolated", "isolated", "standard"]);
        let (k, v) = c.selector(Some("isolated")).unwrap();
        assert!(!ns_only.contains_key(&k) && v == "true");
    }

    #[test]
    fn microvm_needs_qemu_and_a_kernel_template() {
        assert_eq!(node_tiers(false, None), [TierKind::Namespace]);
        assert_eq!(
            node_tiers(true, Some(Path::new("/nonexistent"))),
            [TierKind::Namespace]
        );
    }
}

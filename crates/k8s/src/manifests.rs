//! `tessera k8s manifests`: the CRDs (from the Rust types), RBAC and a
//! Deployment of two replicas with leader election, as one YAML stream.

use serde_json::{Value, json};

/// What to put in the manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestOptions {
    pub namespace: String,
    pub image: String,
    pub replicas: u32,
    pub scheduler_name: String,
    /// Also print Volcano's (HyperNode included) and scheduler-plugins' CRDs (for
    /// clusters that do not run those projects but have jobs written for them).
    pub foreign_crds: bool,
    /// Kubernetes RuntimeClasses for Tessera's runtime classes.
    pub runtime_classes: Vec<RuntimeClassManifest>,
}

/// A Kubernetes `RuntimeClass` for one of Tessera's runtime classes. A pod that names
/// it (`runtimeClassName: NAME`) runs with `handler` (the node's CRI runtime handler:
/// `runc`, Kata Containers' `kata-qemu`, gVisor's `runsc`) and gets `node_selector`
/// from the apiserver's RuntimeClass admission plugin, so that any scheduler, Tessera's
/// included, places it only on nodes labelled for the class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeClassManifest {
    pub name: String,
    pub handler: String,
    pub node_selector: std::collections::BTreeMap<String, String>,
}

impl Default for ManifestOptions {
    fn default() -> Self {
        ManifestOptions {
            namespace: "tessera-system".into(),
            image: "ghcr.io/tessera/tessera:latest".into(),
            replicas: 2,
            scheduler_name: "tessera".into(),
            foreign_crds: false,
            runtime_classes: Vec::new(),
        }
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

/// The RBAC rules the controller needs, and nothing more.
pub fn cluster_role_rules() -> Vec<Value> {
    let read = ["get", "list", "watch"];
    vec![
        rule(&[""], &["pods", "nodes"], &read),
        rule(&[""], &["pods"], &["patch"]),
        rule(&[""], &["pods/binding", "pods/eviction"], &["create"]),
        rule(&[""], &["pods/status"], &["patch", "update"]),
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        rule(&["scheduling.k8s.io"], &["priorityclasses"], &read),
        rule(&["policy"], &["poddisruptionbudgets"], &read),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "update"],
        ),
        rule(
            &[
                "scheduling.tessera.dev",
                "scheduling.volcano.sh",
                "scheduling.x-k8s.io",
            ],
            &["podgroups", "queues", "nodeshards"],
            &read,
        ),
        rule(
            &[
                "scheduling.tessera.dev",
                "scheduling.volcano.sh",
                "scheduling.x-k8s.io",
            ],
            &["podgroups/status", "queues/status", "nodeshards/status"],
            &["patch", "update"],
        ),
        // Volcano's network topology (read only; Volcano or an admin writes it).
        rule(&["topology.volcano.sh"], &["hypernodes"], &read),
        rule(
            &["resource.k8s.io"],
            &["resourceslices", "resourceclaims", "deviceclasses"],
            &read,
        ),
        rule(
            &["resource.k8s.io"],
            &["resourceclaims/status"],
            &["patch", "update"],
        ),
    ]
}

/// Every object, in the order `kubectl apply -f` should create them.
pub fn objects(o: &ManifestOptions) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut crds = crate::crd::tessera_crds();
    if o.foreign_crds {
        crds.extend(crate::crd::foreign_crds());
    }
    for c in crds {
        out.push(serde_json::to_value(c).unwrap_or(Value::Null));
    }
    let ns = &o.namespace;
    out.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    out.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "tessera", "namespace": ns}}));
    out.push(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "tessera-scheduler"}, "rules": cluster_role_rules()}),
    );
    out.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "tessera-scheduler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-scheduler"},
        "subjects": [{"kind": "ServiceAccount", "name": "tessera", "namespace": ns}]}));
    out.push(
        json!({"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
        "metadata": {"name": "default"}, "spec": {"weight": 1}}),
    );
    for rc in &o.runtime_classes {
        out.push(runtime_class(rc));
    }
    out.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "tessera-scheduler", "namespace": ns, "labels": {"app": "tessera-scheduler"}},
        "spec": {
            "replicas": o.replicas,
            "selector": {"matchLabels": {"app": "tessera-scheduler"}},
            "template": {
                "metadata": {"labels": {"app": "tessera-scheduler"}},
                "spec": {
                    "serviceAccountName": "tessera",
                    "priorityClassName": "system-cluster-critical",
                    "containers": [{
                        "name": "tessera",
                        "image": o.image,
                        "args": ["k8s", "run", "--scheduler-name", o.scheduler_name,
                                 "--lease-namespace", ns],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                        "securityContext": {"runAsNonRoot": true, "readOnlyRootFilesystem": true,
                                            "allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}}
                    }]
                }
            }
        }}));
    out
}

/// The `node.k8s.io/v1` RuntimeClass object of `rc`.
pub fn runtime_class(rc: &RuntimeClassManifest) -> Value {
    json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": rc.name, "labels": {"app.kubernetes.io/managed-by": "tessera"}},
        "handler": rc.handler,
        "scheduling": {"nodeSelector": rc.node_selector}})
}

/// The manifests as one YAML stream.
pub fn render(o: &ManifestOptions) -> String {
    let mut s = String::new();
    for v in objects(o) {
        s.push_str("---\n");
        s.push_str(&serde_norway::to_string(&v).unwrap_or_default());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_carry_schemas_and_status() {
        let objs = objects(&ManifestOptions::default());
        let crds: Vec<&Value> = objs
            .iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .collect();
        assert_eq!(crds.len(), 3);
        for c in &crds {
            assert_eq!(c["spec"]["group"], "scheduling.tessera.dev");
            let v = &c["spec"]["versions"][0];
            assert!(v["schema"]["openAPIV3Schema"]["properties"]["spec"].is_object());
            assert!(v["subresources"]["status"].is_object());
        }
        let pg = crds
            .iter()
            .find(|c| c["spec"]["names"]["kind"] == "PodGroup")
            .unwrap();
        let props = &pg["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for f in [
            "minMember",
            "minResources",
            "queue",
            "priorityClassName",
            "networkTopology",
        ] {
            assert!(props[f].is_object(), "PodGroup spec lacks {f}");
        }
        assert_eq!(props["minMember"]["minimum"].as_f64(), Some(1.0));
        let yaml = render(&ManifestOptions::default());
        assert!(yaml.contains("kind: Deployment"));
        assert!(yaml.contains("pods/binding"));
        assert!(cluster_role_rules().iter().any(|r| {
            r["apiGroups"] == json!(["topology.volcano.sh"])
                && r["resources"] == json!(["hypernodes"])
                && r["verbs"] == json!(["get", "list", "watch"])
        }));
        // With the foreign CRDs: Volcano's HyperNode, cluster-scoped.
        let objs = objects(&ManifestOptions {
            foreign_crds: true,
            ..ManifestOptions::default()
        });
        let hn = objs
            .iter()
            .find(|o| {
                o["kind"] == "CustomResourceDefinition" && o["spec"]["names"]["kind"] == "HyperNode"
            })
            .expect("HyperNode CRD");
        assert_eq!(hn["metadata"]["name"], "hypernodes.topology.volcano.sh");
        assert_eq!(hn["spec"]["scope"], "Cluster");
        let spec = &hn["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for f in ["tier", "members"] {
            assert!(spec[f].is_object(), "HyperNode spec lacks {f}");
        }
    }
}

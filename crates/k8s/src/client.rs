//! A client of the cluster, for callers that do not know `kube`: the CLI asks
//! for one with a kubeconfig file or none, and hands it back to [`crate::run`]
//! or [`crate::bench::run`] without naming its type.

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

/// Why there is no client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file given could not be read or used.
    #[error("{}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    /// None given, and none found: not in a pod, no `$KUBECONFIG`, no
    /// `~/.kube/config`.
    #[error("no cluster found ({0})")]
    NoCluster(#[source] InferConfigError),
    /// A configuration was found, but no client could be made of it.
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// A client from the kubeconfig file `kubeconfig`, or else inferred as kubectl
/// does: the pod's service account, then `$KUBECONFIG`, then `~/.kube/config`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let cfg = match kubeconfig {
        Some(p) => {
            let bad = |source| ClientError::Kubeconfig {
                path: p.to_path_buf(),
                source,
            };
            let kc = Kubeconfig::read_from(p).map_err(bad)?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(bad)?
        }
        None => Config::infer().await.map_err(ClientError::NoCluster)?,
    };
    Client::try_from(cfg).map_err(ClientError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kubeconfig_that_cannot_be_read_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.yaml");
        let Err(e) = client(Some(&missing)).await else {
            panic!("a kubeconfig that is not there gave a client");
        };
        assert!(matches!(e, ClientError::Kubeconfig { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("{}: ", missing.display())),
            "{e}"
        );
    }
}

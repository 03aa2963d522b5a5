//! The control plane's events, audit log and watches.

use super::*;

impl ControlPlane {
    pub async fn list_events(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store.list(kind::EVENT, Some(&c.tenant)).await?;
        Ok(l.objects.iter().map(render).collect())
    }

    pub async fn list_audit(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Admin)?;
        let l = self.store.list(kind::AUDIT, Some(&c.tenant)).await?;
        Ok(l.objects.iter().map(render).collect())
    }

    /// A watcher over the caller's tenant, for one watchable kind.
    pub async fn watch(
        &self,
        c: &Caller,
        after: Option<u64>,
        kind: &str,
    ) -> Result<Watcher<AnyStore>, ApiError> {
        c.require(Role::Viewer)?;
        if !WATCHABLE.contains(&kind) {
            return Err(ApiError::invalid(
                "kind",
                format!(
                    "{kind:?} cannot be watched: use one of {}, sandbox, pool",
                    WATCHABLE.join(", ")
                ),
            ));
        }
        let after = match after {
            Some(a) => {
                // Refused up front (410), not after the stream has begun.
                let compacted = self.store.compacted().await?;
                if a < compacted {
                    return Err(tessera_store::StoreError::Compacted {
                        requested: a,
                        compacted,
                    }
                    .into());
                }
                a
            }
            None => self.store.revision().await?,
        };
        Ok(self.store.watch(
            after,
            WatchFilter {
                kind: Some(kind.into()),
                tenant: Some(c.tenant.clone()),
            },
        ))
    }
}

//! The control plane's nodes: cluster-scoped, readable by all, written by system
//! operators.

use super::*;

impl ControlPlane {
    /// Creates or replaces a node record (used by the local node agent too).
    pub async fn upsert_node(&self, node: &Node) -> Result<Object, ApiError> {
        check_name("name", &node.name)?;
        let key = Key::new(kind::NODE, "", &node.name);
        let body = to_value(node)?;
        Ok(match self.store.get(&key).await? {
            Some(o) => self.store.update(key, Some(o.version), body).await?,
            None => self.store.create(key, body).await?,
        })
    }

    pub async fn put_node(
        &self,
        c: &Caller,
        name: &str,
        mut node: Node,
    ) -> Result<Value, ApiError> {
        c.require_system(Role::Operator)?;
        if node.name != name {
            return Err(ApiError::invalid(
                "name",
                format!("the body names node {:?} but the path {name:?}", node.name),
            ));
        }
        // Only the verifier sets the attested label: the body's is replaced by the
        // stored one (an operator cannot declare a node attested).
        node.labels.remove(tessera_model::ATTESTED_LABEL);
        if let Some(o) = self.store.get(&Key::new(kind::NODE, "", name)).await?
            && let Ok(old) = serde_json::from_value::<Node>(o.body)
            && let Some(v) = old.labels.get(tessera_model::ATTESTED_LABEL)
        {
            node.labels
                .insert(tessera_model::ATTESTED_LABEL.into(), v.clone());
        }
        Ok(render(&self.upsert_node(&node).await?))
    }

    pub async fn list_nodes(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store.list(kind::NODE, Some("")).await?;
        let st = self.store.list(crate::exec::NODESTATUS, Some("")).await?;
        let by: std::collections::BTreeMap<&str, &Value> = st
            .objects
            .iter()
            .map(|o| (o.name.as_str(), &o.body))
            .collect();
        Ok(l.objects
            .iter()
            .map(|o| with_status(render(o), by.get(o.name.as_str()).copied()))
            .collect())
    }

    pub async fn get_node(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let o = self
            .store
            .get(&Key::new(kind::NODE, "", name))
            .await?
            .ok_or_else(|| ApiError::not_found(format!("node {name:?}")))?;
        let st = self
            .store
            .get(&Key::new(crate::exec::NODESTATUS, "", name))
            .await?;
        Ok(with_status(render(&o), st.as_ref().map(|s| &s.body)))
    }
}

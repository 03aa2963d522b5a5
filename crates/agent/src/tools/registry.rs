//! The registry: tools, their grants, and which tools a caller may call or browse.

use serde_json::Value;
use tessera_store::{Key, Object, Op, Store, StoreError};

use super::{
    AdminError, CallError, CompiledTool, Grant, Grants, SpecError, ToolCaller, ToolGateway,
    ToolSpec, check_session_caller, kind, secrets, to_value,
};

impl<S: Store> ToolGateway<S> {
    pub(super) fn forget_tools(&self) {
        self.inner.tool_cache.lock().unwrap().clear();
    }

    /// Checks and registers a new tool. Secret header values are stored apart
    /// from it (see [`secrets`]).
    pub async fn register(&self, tenant: &str, spec: ToolSpec) -> Result<Object, AdminError> {
        self.write_tool(tenant, spec, secrets::Write::Create).await
    }

    /// Replaces (or creates) a tool; with `expected`, only if still at that version.
    /// A header sent back as [`SECRET_MARK`](super::SECRET_MARK) keeps its stored secret.
    pub async fn put(
        &self,
        tenant: &str,
        name: &str,
        spec: ToolSpec,
        expected: Option<u64>,
    ) -> Result<Object, AdminError> {
        if spec.name != name {
            return Err(SpecError {
                field: "name".into(),
                message: format!("the body names {:?} but the path {name:?}", spec.name),
            }
            .into());
        }
        self.write_tool(tenant, spec, secrets::Write::Replace(expected))
            .await
    }

    pub async fn get_tool(&self, tenant: &str, name: &str) -> Result<Option<Object>, StoreError> {
        self.inner
            .store
            .get(&Key::new(kind::TOOL, tenant, name))
            .await
    }

    pub async fn list_tools(&self, tenant: &str) -> Result<Vec<Object>, StoreError> {
        Ok(self
            .inner
            .store
            .list(kind::TOOL, Some(tenant))
            .await?
            .objects)
    }

    /// Deletes a tool with its grants and secrets.
    pub async fn delete_tool(&self, tenant: &str, name: &str) -> Result<Object, AdminError> {
        let key = Key::new(kind::TOOL, tenant, name);
        let mut ops = vec![Op::Delete {
            key: key.clone(),
            expected: None,
        }];
        for k in [kind::GRANT, kind::SECRET] {
            let k = Key::new(k, tenant, name);
            if self.inner.store.get(&k).await?.is_some() {
                ops.push(Op::Delete {
                    key: k,
                    expected: None,
                });
            }
        }
        let r = self.inner.store.commit(ops).await;
        self.forget_tools();
        match r {
            Ok(mut v) => Ok(v.remove(0)),
            Err(StoreError::NotFound(_)) => Err(AdminError::NotFound(format!("tool {name:?}"))),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn grants(&self, tenant: &str, tool: &str) -> Result<Grants, StoreError> {
        let o = self
            .inner
            .store
            .get(&Key::new(kind::GRANT, tenant, tool))
            .await?;
        Ok(o.and_then(|o| serde_json::from_value(o.body).ok())
            .unwrap_or_default())
    }

    /// Adds (`add`) or removes a grant of a tool.
    pub async fn set_grant(
        &self,
        tenant: &str,
        tool: &str,
        grant: Grant,
        add: bool,
    ) -> Result<Grants, AdminError> {
        grant.check()?;
        if self.get_tool(tenant, tool).await?.is_none() {
            return Err(AdminError::NotFound(format!("tool {tool:?}")));
        }
        let key = Key::new(kind::GRANT, tenant, tool);
        for _ in 0..16 {
            let cur = self.inner.store.get(&key).await?;
            let mut g: Grants = cur
                .as_ref()
                .and_then(|o| serde_json::from_value(o.body.clone()).ok())
                .unwrap_or_default();
            if add {
                if !g.grants.contains(&grant) {
                    g.grants.push(grant.clone());
                    g.grants.sort();
                }
            } else {
                g.grants.retain(|x| x != &grant);
            }
            let r = match &cur {
                Some(o) => {
                    self.inner
                        .store
                        .update(key.clone(), Some(o.version), to_value(&g))
                        .await
                }
                None => self.inner.store.create(key.clone(), to_value(&g)).await,
            };
            self.forget_tools();
            match r {
                Ok(_) => return Ok(g),
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(AdminError::Conflict(
            "the grants changed under us 16 times: retry".into(),
        ))
    }

    pub(super) fn compiled(&self, tenant: &str, o: &Object) -> Result<CompiledTool, StoreError> {
        let ck = (tenant.to_string(), o.name.clone());
        if let Some(c) = self.inner.compiled.lock().unwrap().get(&ck) {
            if c.version == o.version {
                return Ok(c.clone());
            }
        }
        let spec: ToolSpec = serde_json::from_value(o.body.clone())
            .map_err(|e| StoreError::Backend(format!("stored {} is unreadable: {e}", o.key())))?;
        let c = CompiledTool::compile(spec, o.version)
            .map_err(|e| StoreError::Backend(format!("stored {} is invalid: {e}", o.key())))?;
        self.inner.compiled.lock().unwrap().insert(ck, c.clone());
        Ok(c)
    }

    /// The session's runtime, checking that it may still call tools.
    pub(super) async fn session_runtime(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<String>, CallError> {
        let o = self
            .inner
            .store
            .get(&Key::new(kind::SESSION, tenant, session))
            .await?
            .ok_or_else(|| CallError::SessionNotFound(session.into()))?;
        if let Some(state) = o.body.get("state").and_then(Value::as_str) {
            if matches!(state, "ended" | "failed" | "killed") {
                return Err(CallError::SessionOver {
                    session: session.into(),
                    state: state.into(),
                });
            }
        }
        Ok(o.body
            .get("runtime")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// The tools `caller` may call for `session_id`, sorted by name.
    pub async fn granted_tools(
        &self,
        caller: &ToolCaller,
        session_id: &str,
    ) -> Result<Vec<CompiledTool>, CallError> {
        check_session_caller(caller, session_id)?;
        let runtime = self.session_runtime(&caller.tenant, session_id).await?;
        self.tools_where(&caller.tenant, |g| {
            g.admits(runtime.as_deref(), &caller.role)
        })
        .await
    }

    /// The tools a key without a session may browse (an IDE-style MCP client): every
    /// tool of its tenant one of whose grants admits the key's role, whatever runtime
    /// the grant names, sorted by name. Calling one still needs a session it is
    /// granted to. Session keys get [`ToolGateway::granted_tools`] instead.
    pub async fn browsable_tools(
        &self,
        caller: &ToolCaller,
    ) -> Result<Vec<CompiledTool>, CallError> {
        self.tools_where(&caller.tenant, |g| {
            g.grants.iter().any(|one| {
                let mut any_runtime = one.clone();
                any_runtime.runtime = None;
                any_runtime.admits(None, &caller.role)
            })
        })
        .await
    }

    async fn tools_where(
        &self,
        tenant: &str,
        admit: impl Fn(&Grants) -> bool,
    ) -> Result<Vec<CompiledTool>, CallError> {
        let tools = self.list_tools(tenant).await?;
        let grants = self.inner.store.list(kind::GRANT, Some(tenant)).await?;
        let mut out = Vec::new();
        for t in &tools {
            let g: Grants = grants
                .objects
                .iter()
                .find(|g| g.name == t.name)
                .and_then(|g| serde_json::from_value(g.body.clone()).ok())
                .unwrap_or_default();
            if admit(&g) {
                if let Ok(c) = self.compiled(tenant, t) {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }
}

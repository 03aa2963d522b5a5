//! The control plane's tenants, API keys and role bindings.

use super::*;

impl ControlPlane {
    /// Creates a tenant and an admin key for it (shown once).
    pub async fn create_tenant(&self, c: &Caller, t: NewTenant) -> Result<Value, ApiError> {
        c.require_system(Role::Admin)?;
        check_name("name", &t.name)?;
        let now = now_ms();
        let (mut ops, text) = self.tenant_ops(&t.name, false, "admin", now)?;
        ops.push(self.audit(c, "create", format!("tenant/{}", t.name), now)?);
        let out = self.store.commit(ops).await?;
        let mut v = render(&out[0]);
        v["admin_key"] = Value::String(text);
        Ok(v)
    }

    pub async fn list_tenants(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        let l = self.store.list(kind::TENANT, Some("")).await?;
        Ok(l.objects
            .iter()
            .filter(|o| c.tenant == SYSTEM_TENANT || o.name == c.tenant)
            .map(render)
            .collect())
    }

    pub async fn get_tenant(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        if c.tenant != SYSTEM_TENANT && c.tenant != name {
            return Err(ApiError::not_found(format!("tenant {name:?}")));
        }
        let o = self.store.get(&Key::new(kind::TENANT, "", name)).await?;
        o.map(|o| render(&o))
            .ok_or_else(|| ApiError::not_found(format!("tenant {name:?}")))
    }

    // ---- API keys ----

    pub async fn create_key(&self, c: &Caller, req: NewApiKey) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        check_subject("subject", &req.subject)?;
        let now = now_ms();
        let expires = req.expires_in_seconds.map(|s| now / 1000 + s);
        let k = auth::new_key(&c.tenant, &req.subject, now / 1000, expires);
        let mut ops = vec![Op::Create {
            key: Key::new(kind::APIKEY, "", &k.id),
            body: to_value(&k.record)?,
        }];
        // The subject becomes a user if it is not one (or a service account) yet.
        ops.extend(self.subject_ops(&c.tenant, &req.subject, now).await?);
        if let Some(role) = req.role {
            let key = Key::new(kind::ROLEBINDING, &c.tenant, &req.subject);
            let body = to_value(&RoleBinding {
                subject: req.subject.clone(),
                role,
            })?;
            ops.push(match self.store.get(&key).await? {
                Some(o) => Op::Update {
                    key,
                    expected: Some(o.version),
                    body,
                },
                None => Op::Create { key, body },
            });
        }
        ops.push(self.audit(c, "create", format!("apikey/{}", k.id), now)?);
        let out = self.store.commit(ops).await?;
        self.forget_credentials();
        let mut v = render_key(&out[0]);
        v["key"] = Value::String(k.text);
        Ok(v)
    }

    async fn tenant_key(&self, c: &Caller, id: &str) -> Result<Object, ApiError> {
        let o = self.store.get(&Key::new(kind::APIKEY, "", id)).await?;
        match o {
            Some(o) if from_value::<KeyRecord>(&o)?.tenant == c.tenant => Ok(o),
            _ => Err(ApiError::not_found(format!("API key {id:?}"))),
        }
    }

    pub async fn list_keys(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Admin)?;
        let l = self.store.list(kind::APIKEY, Some("")).await?;
        let mut out = Vec::new();
        for o in &l.objects {
            if from_value::<KeyRecord>(o)?.tenant == c.tenant {
                out.push(render_key(o));
            }
        }
        Ok(out)
    }

    pub async fn revoke_key(&self, c: &Caller, id: &str) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let o = self.tenant_key(c, id).await?;
        let mut rec: KeyRecord = from_value(&o)?;
        rec.revoked = true;
        let now = now_ms();
        let out = self
            .store
            .commit(vec![
                Op::Update {
                    key: o.key(),
                    expected: Some(o.version),
                    body: to_value(&rec)?,
                },
                self.audit(c, "revoke", format!("apikey/{id}"), now)?,
            ])
            .await?;
        self.forget_credentials();
        Ok(render_key(&out[0]))
    }

    // ---- role bindings ----

    pub async fn put_binding(
        &self,
        c: &Caller,
        subject: &str,
        spec: RoleBindingSpec,
    ) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        check_subject("subject", subject)?;
        let key = Key::new(kind::ROLEBINDING, &c.tenant, subject);
        let body = to_value(&RoleBinding {
            subject: subject.into(),
            role: spec.role,
        })?;
        let op = match self.store.get(&key).await? {
            Some(o) => Op::Update {
                key,
                expected: Some(o.version),
                body,
            },
            None => Op::Create { key, body },
        };
        let now = now_ms();
        let mut ops = vec![
            op,
            self.audit(c, "bind", format!("rolebinding/{subject}"), now)?,
        ];
        ops.extend(self.subject_ops(&c.tenant, subject, now).await?);
        let out = self.store.commit(ops).await?;
        self.forget_credentials();
        Ok(render(&out[0]))
    }

    pub async fn list_bindings(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store.list(kind::ROLEBINDING, Some(&c.tenant)).await?;
        Ok(l.objects.iter().map(render).collect())
    }

    pub async fn delete_binding(&self, c: &Caller, subject: &str) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let key = Key::new(kind::ROLEBINDING, &c.tenant, subject);
        let now = now_ms();
        let out = self
            .store
            .commit(vec![
                Op::Delete {
                    key,
                    expected: None,
                },
                self.audit(c, "unbind", format!("rolebinding/{subject}"), now)?,
            ])
            .await?;
        self.forget_credentials();
        Ok(render(&out[0]))
    }
}

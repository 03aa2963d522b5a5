//! The control plane's queues: create, read, compare-and-swap updates, delete,
//! within the tenant's caps.

use super::*;

impl ControlPlane {
    fn queue_body(spec: &QueueSpec) -> Result<Value, ApiError> {
        check_name("name", &spec.name)?;
        if let Some(p) = &spec.parent {
            check_name("parent", p)?;
        }
        to_value(&Queue {
            name: spec.name.clone(),
            parent: spec.parent.clone(),
            weight: spec.weight,
            guarantee: spec.guarantee.clone(),
            capability: spec.capability.clone(),
            reclaimable: spec.reclaimable,
        })
    }

    /// Sets the caps on `tenant`'s top-level queues (system operators only).
    pub async fn put_queue_caps(
        &self,
        c: &Caller,
        tenant: &str,
        caps: QueueCaps,
    ) -> Result<Value, ApiError> {
        c.require_system(Role::Operator)?;
        check_name("tenant", tenant)?;
        let key = Key::new(kind::QUEUECAPS, tenant, "caps");
        let body = to_value(&caps)?;
        let now = now_ms();
        let op = match self.store.get(&key).await? {
            Some(o) => Op::Update {
                key,
                expected: Some(o.version),
                body,
            },
            None => Op::Create { key, body },
        };
        let out = self
            .store
            .commit(vec![
                op,
                self.audit(c, "update", format!("queuecaps/{tenant}"), now)?,
            ])
            .await?;
        Ok(render(&out[0]))
    }

    /// The caps on `tenant`'s top-level queues (its own viewers, or system
    /// operators); `None` when the operator set none.
    pub async fn get_queue_caps(
        &self,
        c: &Caller,
        tenant: &str,
    ) -> Result<Option<QueueCaps>, ApiError> {
        if c.tenant != tenant {
            c.require_system(Role::Operator)?;
        } else {
            c.require(Role::Viewer)?;
        }
        self.queue_caps(tenant).await
    }

    async fn queue_caps(&self, tenant: &str) -> Result<Option<QueueCaps>, ApiError> {
        match self
            .store
            .get(&Key::new(kind::QUEUECAPS, tenant, "caps"))
            .await?
        {
            Some(o) => Ok(Some(from_value(&o)?)),
            None => Ok(None),
        }
    }

    /// Checks a top-level queue against the operator's caps for the caller's
    /// tenant, summed with the tenant's other top-level queues.
    async fn check_caps(&self, c: &Caller, spec: &QueueSpec) -> Result<(), ApiError> {
        if spec.parent.is_some() {
            return Ok(());
        }
        let Some(caps) = self.queue_caps(&c.tenant).await? else {
            return Ok(());
        };
        let mut weight = u64::from(spec.weight);
        let mut guarantee = spec.guarantee.clone();
        let mut capability = spec.capability.clone();
        let others = self.store.list(kind::QUEUE, Some(&c.tenant)).await?;
        for o in &others.objects {
            let q: Queue = from_value(o)?;
            if q.name == spec.name || q.parent.is_some() {
                continue;
            }
            weight += u64::from(q.weight);
            guarantee.add_assign_saturating(&q.guarantee);
            capability = match (capability, q.capability) {
                (Some(mut a), Some(b)) => {
                    a.add_assign_saturating(&b);
                    Some(a)
                }
                _ => None,
            };
        }
        let what = |field: &str| {
            format!(
                "the operator caps the {field} of tenant {:?}'s top-level queues",
                c.tenant
            )
        };
        if let Some(max) = caps.weight {
            if weight > max {
                return Err(ApiError::forbidden(format!(
                    "{} at {max} in all; with queue {:?} they would be {weight}",
                    what("weight"),
                    spec.name
                )));
            }
        }
        if let Some(max) = &caps.guarantee {
            if let Some(d) = guarantee.exceeding(max).first() {
                return Err(ApiError::forbidden(format!(
                    "{} at {d} {} in all; with queue {:?} they would be {}",
                    what("guarantee"),
                    max.get(d),
                    spec.name,
                    guarantee.get(d)
                )));
            }
        }
        if let Some(max) = &caps.capability {
            match &capability {
                None => {
                    return Err(ApiError::forbidden(format!(
                        "{} at {max} in all; queue {:?} (or another top-level queue) states no capability, which is unbounded: give it one",
                        what("capability"),
                        spec.name
                    )));
                }
                Some(cap) => {
                    if let Some(d) = cap.exceeding(max).first() {
                        return Err(ApiError::forbidden(format!(
                            "{} at {d} {} in all; with queue {:?} they would be {}",
                            what("capability"),
                            max.get(d),
                            spec.name,
                            cap.get(d)
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    pub async fn create_queue(&self, c: &Caller, spec: QueueSpec) -> Result<Value, ApiError> {
        c.require(Role::Operator)?;
        let body = Self::queue_body(&spec)?;
        self.check_caps(c, &spec).await?;
        let now = now_ms();
        let out = self
            .store
            .commit(vec![
                Op::Create {
                    key: Key::new(kind::QUEUE, &c.tenant, &spec.name),
                    body,
                },
                self.audit(c, "create", format!("queue/{}", spec.name), now)?,
            ])
            .await?;
        Ok(render(&out[0]))
    }

    /// Replaces a queue; with `resource_version`, only if it is still current.
    pub async fn put_queue(
        &self,
        c: &Caller,
        name: &str,
        spec: QueueSpec,
    ) -> Result<Value, ApiError> {
        c.require(Role::Operator)?;
        if spec.name != name {
            return Err(ApiError::invalid(
                "name",
                format!("the body names queue {:?} but the path {name:?}", spec.name),
            ));
        }
        let body = Self::queue_body(&spec)?;
        self.check_caps(c, &spec).await?;
        let now = now_ms();
        let out = self
            .store
            .commit(vec![
                Op::Update {
                    key: Key::new(kind::QUEUE, &c.tenant, name),
                    expected: spec.resource_version,
                    body,
                },
                self.audit(c, "update", format!("queue/{name}"), now)?,
            ])
            .await?;
        Ok(render(&out[0]))
    }

    pub async fn list_queues(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store.list(kind::QUEUE, Some(&c.tenant)).await?;
        Ok(l.objects.iter().map(render).collect())
    }

    pub async fn get_queue(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let o = self
            .store
            .get(&Key::new(kind::QUEUE, &c.tenant, name))
            .await?;
        o.map(|o| render(&o))
            .ok_or_else(|| ApiError::not_found(format!("queue {name:?}")))
    }

    pub async fn delete_queue(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Operator)?;
        let now = now_ms();
        let out = self
            .store
            .commit(vec![
                Op::Delete {
                    key: Key::new(kind::QUEUE, &c.tenant, name),
                    expected: None,
                },
                self.audit(c, "delete", format!("queue/{name}"), now)?,
            ])
            .await?;
        Ok(render(&out[0]))
    }
}

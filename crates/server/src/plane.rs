//! The control plane's state logic: tenants, keys, role bindings, nodes, queues,
//! jobs, events and audit, over a [`Store`]. HTTP handlers call these methods and
//! only translate; everything here is independent of HTTP.

use serde::Serialize;
use serde_json::{Map, Value, json};
use tessera_model::{Node, Queue};
use tessera_store::{AnyStore, Key, Object, Op, Store, WatchFilter, Watcher};

use crate::auth::{self, KeyRecord, Role};
use crate::problem::{ApiError, Code};
use crate::wire::*;

/// The tenant created at first start; its admins administer the cluster.
pub const SYSTEM_TENANT: &str = "admin";

/// Object kinds in the store.
pub mod kind {
    pub const TENANT: &str = "tenant";
    pub const APIKEY: &str = "apikey";
    pub const ROLEBINDING: &str = "rolebinding";
    pub const NODE: &str = "node";
    pub const QUEUE: &str = "queue";
    pub const JOB: &str = "job";
    pub const EVENT: &str = "event";
    pub const AUDIT: &str = "audit";
    pub const USER: &str = "user";
    pub const SERVICEACCOUNT: &str = "serviceaccount";
    /// The operator's caps on a tenant's top-level queues (one per tenant).
    pub const QUEUECAPS: &str = "queuecaps";
}

/// Caps the cluster operator (an operator of the system tenant) sets on a
/// tenant's top-level queues, summed over them, which the tenant's own admins
/// and operators cannot exceed. Unset: not capped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueCaps {
    /// Most total weight of the top-level queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u64>,
    /// Most total guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<tessera_model::Resources>,
    /// Most total capability; a top-level queue then must state one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<tessera_model::Resources>,
}

/// Kinds a tenant may watch.
pub const WATCHABLE: &[&str] = &[
    kind::JOB,
    kind::QUEUE,
    kind::EVENT,
    tessera_agent::sessions::KIND_SESSION,
];

/// Who is calling, after authentication.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub tenant: String,
    pub subject: String,
    pub key_id: String,
    pub role: Role,
}

/// The subject prefix of session-scoped keys: the key the agent inside a session's
/// sandbox holds (`session:<id>`).
pub const SESSION_SUBJECT: &str = "session:";

impl Caller {
    /// The session this caller's key is scoped to, when it is a session key. Such a
    /// key acts on its own session only: the [`Caller`] extractor refuses it on every
    /// route, and the few routes a session's agent needs take [`crate::api::SessionCaller`].
    pub fn session(&self) -> Option<&str> {
        self.subject.strip_prefix(SESSION_SUBJECT)
    }

    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this needs the {} role in tenant {:?}; {:?} has {}",
                role.as_str(),
                self.tenant,
                self.subject,
                self.role.as_str()
            )))
        }
    }

    /// Requires `role` in the system tenant.
    pub fn require_system(&self, role: Role) -> Result<(), ApiError> {
        if self.tenant != SYSTEM_TENANT {
            return Err(ApiError::forbidden(format!(
                "this needs the {} role in the system tenant {SYSTEM_TENANT:?}",
                role.as_str()
            )));
        }
        self.require(role)
    }
}

/// Milliseconds since the Unix epoch (the one clock helper, `tessera-sandbox`'s).
pub use tessera_agent::error::now_ms;

/// Checks a DNS-label-like name: 1..=63 of `a-z0-9-`, starting and ending alphanumeric.
pub fn check_name(field: &str, s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!(
                "{} is not a valid name: use 1 to 63 of a-z, 0-9 and '-', starting and ending with a letter or digit",
                crate::problem::quote(s)
            ),
        ))
    }
}

pub(crate) fn check_subject(field: &str, s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!(
                "{} is not a valid subject: use 1 to 128 of A-Z, a-z, 0-9 and @ . _ : -",
                crate::problem::quote(s)
            ),
        ))
    }
}

pub(crate) fn to_value<T: Serialize>(v: &T) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(ApiError::internal)
}

pub(crate) fn from_value<T: serde::de::DeserializeOwned>(o: &Object) -> Result<T, ApiError> {
    serde_json::from_value(o.body.clone())
        .map_err(|e| ApiError::internal(format!("stored {} is unreadable: {e}", o.key())))
}

/// Renders a stored object for the API: its body with `name`, `tenant` (when
/// tenant-scoped) and `resource_version` added.
pub fn render(o: &Object) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), Value::String(o.name.clone()));
    if !o.tenant.is_empty() {
        m.insert("tenant".into(), Value::String(o.tenant.clone()));
    }
    m.insert("resource_version".into(), json!(o.version));
    match &o.body {
        Value::Object(b) => {
            for (k, v) in b {
                m.insert(k.clone(), v.clone());
            }
        }
        other => {
            m.insert("body".into(), other.clone());
        }
    }
    Value::Object(m)
}

pub(crate) fn render_key(o: &Object) -> Value {
    let mut v = render(o);
    if let Value::Object(m) = &mut v {
        m.remove("salt");
        m.remove("hash");
        m.insert("id".into(), Value::String(o.name.clone()));
    }
    v
}

/// A sortable, unique name for events and audit records.
fn record_name(now: u64) -> String {
    format!("{now:013}-{}", auth::random_hex(4))
}

/// How long a verified key is trusted without reading the store again. Revoking a
/// key or changing a role binding clears this process's cache at once; other
/// replicas see it within this time.
const AUTH_TTL: std::time::Duration = std::time::Duration::from_secs(2);
const AUTH_CACHE_MAX: usize = 10_000;

type AuthCache =
    std::sync::Mutex<std::collections::HashMap<String, (Caller, Option<u64>, std::time::Instant)>>;

/// The control plane over one store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    store: AnyStore,
    auth_cache: std::sync::Arc<AuthCache>,
    logs: Option<std::path::PathBuf>,
    oidc: Option<std::sync::Arc<crate::oidc::Verifier>>,
    guard: std::sync::Arc<tessera_sandbox::PolicyGuard>,
    templates: Option<tessera_sandbox::TemplateRegistry>,
    classes: std::sync::Arc<crate::classes::ClassPolicy>,
}

impl ControlPlane {
    pub fn new(store: AnyStore) -> Self {
        ControlPlane {
            store,
            auth_cache: Default::default(),
            logs: None,
            oidc: None,
            guard: Default::default(),
            templates: None,
            classes: Default::default(),
        }
    }

    /// The runtime classes and the tenants' minimum classes.
    pub fn with_classes(mut self, classes: crate::classes::ClassPolicy) -> Self {
        self.classes = std::sync::Arc::new(classes);
        self
    }

    pub fn classes(&self) -> &crate::classes::ClassPolicy {
        &self.classes
    }

    /// The template registry (`None`: only the built-in `host` template).
    pub fn with_templates(mut self, templates: Option<tessera_sandbox::TemplateRegistry>) -> Self {
        self.templates = templates;
        self
    }

    /// Resolves a tenant's template reference (`host`, `NAME`, `NAME@sha256:<hex>`) to
    /// the sandbox template and its digest. A host path is refused: templates are
    /// registered by an operator, never given as a path by a tenant.
    pub fn resolve_template(
        &self,
        field: &str,
        reference: &str,
        who: &tessera_sandbox::trust::Subject<'_>,
    ) -> Result<(tessera_sandbox::Template, String), ApiError> {
        tessera_sandbox::registry::resolve_in(self.templates.as_ref(), reference, who)
            .map_err(|e| template_error(field, e))
    }

    /// The template registry, if this server has one.
    pub fn templates(&self) -> Option<&tessera_sandbox::TemplateRegistry> {
        self.templates.as_ref()
    }

    /// The templates a caller may name: the built-in `host` and the registered ones.
    pub fn list_templates(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let mut v = vec![json!({
            "name": tessera_sandbox::registry::HOST_TEMPLATE,
            "digest": tessera_sandbox::registry::HOST_TEMPLATE,
            "source": "built in: the host's /usr read-only with a generated /etc",
        })];
        let registered = match &self.templates {
            Some(r) => r.list().map_err(ApiError::internal)?,
            None => Vec::new(),
        };
        for r in registered {
            v.push(json!({
                "name": r.name,
                "digest": r.digest,
                "source": r.source,
                "created_at_ms": r.created_at_ms,
                "files": r.files,
                "bytes": r.bytes,
            }));
        }
        Ok(v)
    }

    /// The runtime guard every workload of this server answers to: the operator's
    /// policy as the floor, and each tenant's own (tighten-only) policy.
    pub fn with_guard(mut self, guard: std::sync::Arc<tessera_sandbox::PolicyGuard>) -> Self {
        self.guard = guard;
        self
    }

    /// The server's guard (see [`ControlPlane::with_guard`]).
    pub fn guard(&self) -> &std::sync::Arc<tessera_sandbox::PolicyGuard> {
        &self.guard
    }

    /// Accept OIDC bearer tokens validated against this configuration.
    pub fn with_oidc(mut self, oidc: Option<std::sync::Arc<crate::oidc::Verifier>>) -> Self {
        self.oidc = oidc;
        self
    }

    /// Where the local executor writes task logs (for `GET /v1/jobs/{name}/logs`).
    pub fn with_logs(mut self, logs: Option<std::path::PathBuf>) -> Self {
        self.logs = logs;
        self
    }

    pub(crate) fn forget_credentials(&self) {
        if let Ok(mut m) = self.auth_cache.lock() {
            m.clear();
        }
    }

    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    pub(crate) fn audit(
        &self,
        caller: &Caller,
        action: &str,
        object: String,
        now: u64,
    ) -> Result<Op, ApiError> {
        Ok(Op::Create {
            key: Key::new(kind::AUDIT, &caller.tenant, record_name(now)),
            body: to_value(&AuditBody {
                at: now,
                subject: caller.subject.clone(),
                key_id: caller.key_id.clone(),
                action: action.into(),
                object,
            })?,
        })
    }

    /// Creates the system tenant and its first admin key, if the store has none.
    /// Returns the key text (to print once) on first start, `None` afterwards.
    pub async fn bootstrap(&self) -> Result<Option<String>, ApiError> {
        let key = Key::new(kind::TENANT, "", SYSTEM_TENANT);
        if self.store.get(&key).await?.is_some() {
            return Ok(None);
        }
        let now = now_ms();
        let (ops, text) = self.tenant_ops(SYSTEM_TENANT, true, "admin", now)?;
        match self.store.commit(ops).await {
            Ok(_) => Ok(Some(text)),
            // Another replica bootstrapped first.
            Err(tessera_store::StoreError::AlreadyExists(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Operations that create a tenant with an admin key for `subject`.
    fn tenant_ops(
        &self,
        name: &str,
        system: bool,
        subject: &str,
        now: u64,
    ) -> Result<(Vec<Op>, String), ApiError> {
        let k = auth::new_key(name, subject, now / 1000, None);
        let ops = vec![
            Op::Create {
                key: Key::new(kind::TENANT, "", name),
                body: to_value(&TenantBody {
                    created_at: now,
                    system,
                })?,
            },
            Op::Create {
                key: Key::new(kind::APIKEY, "", &k.id),
                body: to_value(&k.record)?,
            },
            Op::Create {
                key: Key::new(kind::ROLEBINDING, name, subject),
                body: to_value(&RoleBinding {
                    subject: subject.into(),
                    role: Role::Admin,
                })?,
            },
            Op::Create {
                key: Key::new(kind::USER, name, subject),
                body: to_value(&crate::identity::SubjectBody {
                    subject: subject.into(),
                    display_name: None,
                    description: None,
                    created_at: now,
                    created_by: "implicit".into(),
                })?,
            },
        ];
        Ok((ops, k.text))
    }

    /// Checks a bearer credential: a missing, malformed, unknown, wrong, revoked or
    /// expired key is 401 (with the same message, to reveal nothing); a key whose
    /// subject has no role binding is 403.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, ApiError> {
        let denied = || {
            ApiError::unauthenticated(
                "a valid API key is required: send `Authorization: Bearer tsk_…`",
            )
        };
        let text = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(denied)?;
        if !text.starts_with(auth::KEY_PREFIX) {
            return self.authenticate_token(text).await;
        }
        let (id, secret) = auth::parse_key(text).ok_or_else(denied)?;
        let now_s = now_ms() / 1000;
        let cache_key = auth::fingerprint(text);
        if let Ok(m) = self.auth_cache.lock()
            && let Some((caller, expires, at)) = m.get(&cache_key)
            && at.elapsed() < AUTH_TTL
            && expires.is_none_or(|e| now_s < e)
        {
            return Ok(caller.clone());
        }
        let o = self
            .store
            .get(&Key::new(kind::APIKEY, "", id))
            .await?
            .ok_or_else(denied)?;
        let rec: KeyRecord = from_value(&o)?;
        if !auth::verify(&rec, secret) || rec.revoked {
            return Err(denied());
        }
        if rec.expires_at.is_some_and(|e| now_ms() / 1000 >= e) {
            return Err(ApiError::unauthenticated(
                "the API key has expired: ask an admin for a new one",
            ));
        }
        let rb = self
            .store
            .get(&Key::new(kind::ROLEBINDING, &rec.tenant, &rec.subject))
            .await?
            .ok_or_else(|| {
                ApiError::forbidden(format!(
                    "{:?} has no role in tenant {:?}: ask an admin to bind one",
                    rec.subject, rec.tenant
                ))
            })?;
        let rb: RoleBinding = from_value(&rb)?;
        let caller = Caller {
            tenant: rec.tenant,
            subject: rec.subject,
            key_id: id.to_string(),
            role: rb.role,
        };
        if let Ok(mut m) = self.auth_cache.lock() {
            if m.len() >= AUTH_CACHE_MAX {
                m.clear();
            }
            m.insert(
                cache_key,
                (caller.clone(), rec.expires_at, std::time::Instant::now()),
            );
        }
        Ok(caller)
    }

    /// An OIDC bearer token: valid signature, issuer, audience and expiry, a tenant
    /// that exists, and a role binding for its subject there.
    async fn authenticate_token(&self, token: &str) -> Result<Caller, ApiError> {
        let denied = || ApiError::unauthenticated("a valid API key or bearer token is required");
        let oidc = self.oidc.as_ref().ok_or_else(denied)?;
        let (tenant, subject) = oidc.verify(token).await.ok_or_else(denied)?;
        if self
            .store
            .get(&Key::new(kind::TENANT, "", &tenant))
            .await?
            .is_none()
        {
            return Err(denied());
        }
        let rb = self
            .store
            .get(&Key::new(kind::ROLEBINDING, &tenant, &subject))
            .await?
            .ok_or_else(|| {
                ApiError::forbidden(format!(
                    "{subject:?} has no role in tenant {tenant:?}: ask an admin to bind one"
                ))
            })?;
        let rb: RoleBinding = from_value(&rb)?;
        Ok(Caller {
            tenant,
            subject,
            key_id: "oidc".into(),
            role: rb.role,
        })
    }

    pub fn whoami(&self, c: &Caller) -> Value {
        json!({"tenant": c.tenant, "subject": c.subject, "key_id": c.key_id, "role": c.role})
    }

    // ---- tenants ----

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

    // ---- nodes (cluster-scoped: readable by all, written by system operators) ----

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

    // ---- queues ----

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

    // ---- jobs ----

    fn check_job(spec: &JobSpec) -> Result<(), ApiError> {
        check_name("name", &spec.name)?;
        check_name("queue", &spec.queue)?;
        if spec.tasks.is_empty() {
            return Err(ApiError::invalid("tasks", "a job needs at least one task"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in spec.tasks.iter().enumerate() {
            check_name(&format!("tasks[{i}].name"), &t.name)?;
            if !names.insert(&t.name) {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].name"),
                    format!("task {:?} appears twice", t.name),
                ));
            }
            if t.resources.gpu_milli != 0 || t.resources.gpu_memory != 0 {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].resources"),
                    "ask for GPUs with `gpu` (whole or shared), not with resources.gpu_milli/gpu_memory",
                ));
            }
            if let Some(d) = t.duration
                && !(d.is_finite() && d >= 0.0)
            {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].duration"),
                    format!("{d} is not a duration: give seconds, 0 or more"),
                ));
            }
            if let tessera_model::GpuRequest::Shared { milli, .. } = t.gpu
                && !(1..=999).contains(&milli)
            {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].gpu.shared.milli"),
                    format!("{milli} is not a fraction of a GPU: use 1 to 999"),
                ));
            }
            let env: Vec<(String, String)> = t
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect();
            tessera_node::spec::check_env(&env)
                .map_err(|m| ApiError::invalid(format!("tasks[{i}].env"), m))?;
            if let Some(d) = &t.working_dir
                && (!d.starts_with('/') || d.contains('\0') || d.split('/').any(|c| c == ".."))
            {
                return Err(ApiError::invalid(
                    format!("tasks[{i}].working_dir"),
                    format!(
                        "{d:?} is not an absolute path inside the sandbox (e.g. /workspace/run)"
                    ),
                ));
            }
            tessera_node::spec::sandbox_limits(
                &t.resources,
                &t.limits,
                &tessera_node::Defaults::default(),
            )
            .map_err(|e| ApiError::invalid(format!("tasks[{i}].{}", e.field), e.to_string()))?;
        }
        if let Some(g) = spec.termination_grace_period_seconds
            && g > 24 * 3600
        {
            return Err(ApiError::invalid(
                "termination_grace_period_seconds",
                format!("{g} is more than a day: give 0 to 86400"),
            ));
        }
        if let Some(m) = spec.min_member
            && (m == 0 || m as usize > spec.tasks.len())
        {
            return Err(ApiError::invalid(
                "min_member",
                format!(
                    "{m} must be between 1 and the number of tasks ({})",
                    spec.tasks.len()
                ),
            ));
        }
        Ok(())
    }

    /// Submits a job; the scheduler loop picks it up.
    pub async fn submit_job(&self, c: &Caller, spec: JobSpec) -> Result<Value, ApiError> {
        c.require(Role::Developer)?;
        let mut spec = spec
            .normalize()
            .map_err(|(field, m)| ApiError::invalid(field, m))?;
        Self::check_job(&spec)?;
        // Each task's class as decided now (the tenant's minimum where it names
        // none) is what is stored: the scheduler and the node read it back.
        for (i, t) in spec.tasks.iter_mut().enumerate() {
            let d = self.classes.decide(
                &c.tenant,
                &format!("tasks[{i}].runtime_class"),
                t.runtime_class.as_deref(),
                t.gpu != tessera_model::GpuRequest::None,
            )?;
            t.runtime_class = Some(d.class);
        }
        // A template is a registered name (or `host`), never a host path, and one the
        // trust policy admits for the tenant and the task's class. The name is pinned
        // here: the digest it names now is what runs, whatever the name names later.
        for (i, t) in spec.tasks.iter_mut().enumerate() {
            if let Some(tpl) = &t.template {
                let class = t.runtime_class.as_deref().unwrap_or_default();
                let who = tessera_sandbox::trust::Subject::new(&c.tenant, class);
                let (root, digest) =
                    self.resolve_template(&format!("tasks[{i}].template"), tpl, &who)?;
                // Only a registered template has a digest to pin (`host` has none).
                if let tessera_sandbox::Template::Dir(_) = root
                    && let Ok((name, None)) = tessera_sandbox::registry::parse_reference(tpl)
                {
                    t.template = Some(format!("{name}@{digest}"));
                }
            }
            // A rule that requires attestation: the task runs only on attested nodes.
            if let Some(p) = self.templates.as_ref().and_then(|r| r.policy()) {
                let class = t.runtime_class.as_deref().unwrap_or_default();
                let who = tessera_sandbox::trust::Subject::new(&c.tenant, class);
                let name = t
                    .template
                    .as_deref()
                    .and_then(|r| tessera_sandbox::registry::parse_reference(r).ok())
                    .map(|(n, _)| n.to_string())
                    .unwrap_or_else(|| tessera_sandbox::registry::HOST_TEMPLATE.to_string());
                if p.requires_attestation(&name, &who).is_some() {
                    t.node_selector
                        .insert(tessera_model::ATTESTED_LABEL.into(), "true".into());
                }
            }
        }
        // Weights: ones the tenant owns or was granted, in a class their policy
        // allows; such a task runs only on attested nodes (the key service releases
        // to no other).
        for (i, t) in spec.tasks.iter_mut().enumerate() {
            if t.weights.is_empty() {
                continue;
            }
            let class = t.runtime_class.clone().unwrap_or_default();
            for (j, w) in t.weights.iter().enumerate() {
                crate::weights::admit(&self.store, &c.tenant, w, &class)
                    .await
                    .map_err(|e| ApiError::invalid(format!("tasks[{i}].weights[{j}]"), e))?;
            }
            t.node_selector
                .insert(tessera_model::ATTESTED_LABEL.into(), "true".into());
        }
        if self
            .store
            .get(&Key::new(kind::QUEUE, &c.tenant, &spec.queue))
            .await?
            .is_none()
        {
            return Err(ApiError::invalid(
                "queue",
                format!(
                    "queue {:?} does not exist in tenant {:?}: create it with `tessera queue create`",
                    spec.queue, c.tenant
                ),
            ));
        }
        let now = now_ms();
        let name = spec.name.clone();
        let body = JobBody {
            spec,
            status: JobStatus::default(),
            created_at: now,
        };
        let out = self
            .store
            .commit(vec![
                Op::Create {
                    key: Key::new(kind::JOB, &c.tenant, &name),
                    body: to_value(&body)?,
                },
                self.audit(c, "create", format!("job/{name}"), now)?,
            ])
            .await?;
        Ok(render(&out[0]))
    }

    pub async fn list_jobs(&self, c: &Caller) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store.list(kind::JOB, Some(&c.tenant)).await?;
        Ok(l.objects.iter().map(render).collect())
    }

    pub async fn get_job(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let o = self
            .store
            .get(&Key::new(kind::JOB, &c.tenant, name))
            .await?;
        o.map(|o| render(&o))
            .ok_or_else(|| ApiError::not_found(format!("job {name:?}")))
    }

    /// Cancels a job: it leaves the scheduler; tasks not started are released at
    /// once, running ones once the node has stopped their trees (SIGTERM, the job's
    /// grace period, SIGKILL).
    pub async fn cancel_job(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Developer)?;
        self.stop_job(c, name, false).await.map(|(v, _)| v)
    }

    /// Cancels (when `delete` is false) or deletes a job, retrying on a concurrent
    /// change (the executor claims tasks with compare-and-swap). Returns the job as
    /// written and whether it is gone from the store.
    async fn stop_job(
        &self,
        c: &Caller,
        name: &str,
        delete: bool,
    ) -> Result<(Value, bool), ApiError> {
        let key = Key::new(kind::JOB, &c.tenant, name);
        for _ in 0..50 {
            let o = self
                .store
                .get(&key)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("job {name:?}")))?;
            let mut job: JobBody = from_value(&o)?;
            if !delete && job.status.phase.is_final() {
                return Ok((render(&o), false));
            }
            let now = now_ms();
            let was_final = job.status.phase.is_final();
            crate::jobs::cancel(&mut job, &c.subject, now);
            let action = if delete { "delete" } else { "cancel" };
            let mut ops = vec![self.audit(c, action, format!("job/{name}"), now)?];
            let gone = delete && !crate::jobs::has_live(&job);
            if gone {
                ops.insert(
                    0,
                    Op::Delete {
                        key: key.clone(),
                        expected: Some(o.version),
                    },
                );
            } else {
                job.status.deleting |= delete;
                ops.insert(
                    0,
                    Op::Update {
                        key: key.clone(),
                        expected: Some(o.version),
                        body: to_value(&job)?,
                    },
                );
            }
            if !was_final {
                ops.push(event_op(
                    &c.tenant,
                    format!("job/{name}"),
                    "Cancelled",
                    format!("cancelled by {}", c.subject),
                    now,
                )?);
            }
            match self.store.commit(ops).await {
                Ok(out) => {
                    let v = if gone {
                        let mut v = render(&o);
                        v["status"] = serde_json::to_value(&job.status).unwrap_or_default();
                        v
                    } else {
                        render(&out[0])
                    };
                    return Ok((v, gone));
                }
                Err(tessera_store::StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ApiError::new(
            Code::Conflict,
            format!("job {name:?} kept changing; try again"),
        ))
    }

    /// Deletes a job, so that its name can be used again: at once when none of its
    /// tasks has a process; else it is cancelled and deleted (with its logs) once the
    /// node has stopped its trees. Returns the job and whether it is already gone.
    pub async fn delete_job(&self, c: &Caller, name: &str) -> Result<(Value, bool), ApiError> {
        c.require(Role::Developer)?;
        self.stop_job(c, name, true).await
    }

    /// The output of a job's tasks that ran on this machine (the last 1 MiB of each).
    /// The job whose logs a viewer asks for, and where this server keeps logs.
    async fn job_for_logs(
        &self,
        c: &Caller,
        name: &str,
    ) -> Result<(JobBody, &std::path::Path), ApiError> {
        c.require(Role::Viewer)?;
        // Names go into a path: only valid names get that far.
        check_name("name", name).map_err(|_| ApiError::not_found(format!("job {name:?}")))?;
        let o = self
            .store
            .get(&Key::new(kind::JOB, &c.tenant, name))
            .await?
            .ok_or_else(|| ApiError::not_found(format!("job {name:?}")))?;
        let job: JobBody = from_value(&o)?;
        let Some(logs) = &self.logs else {
            return Err(ApiError::not_found("logs: this server runs no executor"));
        };
        Ok((job, logs))
    }

    /// One task's log from byte `from` of its file (at most 1 MiB, ending on a whole
    /// UTF-8 character), redacted, and the offset to ask for next: how `tessera job logs
    /// --follow` reads a growing log without reading it all again.
    pub async fn job_log_from(
        &self,
        c: &Caller,
        name: &str,
        task: &str,
        from: u64,
    ) -> Result<(String, u64), ApiError> {
        let (job, logs) = self.job_for_logs(c, name).await?;
        if !job.spec.tasks.iter().any(|x| x.name == task) {
            return Err(ApiError::not_found(format!(
                "task {task:?} of job {name:?}"
            )));
        }
        let path = crate::exec::log_path(logs, &c.tenant, name, job.created_at, task);
        let bytes = std::fs::read(&path).unwrap_or_default();
        let start = (from as usize).min(bytes.len());
        let mut end = bytes.len().min(start + (1 << 20));
        // End on a whole character; the rest comes with the next call.
        if let Err(e) = std::str::from_utf8(&bytes[start..end])
            && e.error_len().is_none()
        {
            end = start + e.valid_up_to();
        }
        let text = String::from_utf8_lossy(&bytes[start..end]).into_owned();
        let text = self.redact_text(&c.tenant, &format!("job {name}/{task} log"), text);
        Ok((text, end as u64))
    }

    pub async fn job_logs(
        &self,
        c: &Caller,
        name: &str,
        task: Option<&str>,
    ) -> Result<String, ApiError> {
        let (job, logs) = self.job_for_logs(c, name).await?;
        let tasks: Vec<&str> = match task {
            Some(t) => {
                if !job.spec.tasks.iter().any(|x| x.name == t) {
                    return Err(ApiError::not_found(format!("task {t:?} of job {name:?}")));
                }
                vec![t]
            }
            None => job.spec.tasks.iter().map(|t| t.name.as_str()).collect(),
        };
        let mut out = String::new();
        for t in &tasks {
            let path = crate::exec::log_path(logs, &c.tenant, name, job.created_at, t);
            let text = match std::fs::read(&path) {
                Ok(b) => {
                    let from = b.len().saturating_sub(1 << 20);
                    String::from_utf8_lossy(&b[from..]).into_owned()
                }
                Err(_) => String::new(),
            };
            // A task's output is redacted again on the way out (a log written before a
            // tenant tightened its policy, or by an older version, is covered too).
            let text = self.redact_text(&c.tenant, &format!("job {name}/{t} log"), text);
            if tasks.len() > 1 {
                out.push_str(&format!("==> {t} <==\n"));
            }
            out.push_str(&text);
        }
        Ok(out)
    }

    // ---- events and audit ----

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

/// A node as the API shows it: its record, and under `status` the heartbeat and
/// conditions its node runtime last reported (nodes without a runtime have none).
fn with_status(mut v: Value, status: Option<&Value>) -> Value {
    if let (Value::Object(m), Some(s)) = (&mut v, status) {
        m.insert("status".into(), s.clone());
    }
    v
}

/// An operation that records an event in `tenant`.
pub fn event_op(
    tenant: &str,
    object: String,
    reason: &str,
    message: String,
    now: u64,
) -> Result<Op, ApiError> {
    Ok(Op::Create {
        key: Key::new(kind::EVENT, tenant, record_name(now)),
        body: to_value(&EventBody {
            at: now,
            object,
            reason: reason.into(),
            message,
        })?,
    })
}

impl From<Code> for ApiError {
    fn from(c: Code) -> Self {
        ApiError::new(c, c.as_str())
    }
}

/// A template the registry refused, as the API reports it: 400 naming the field, for
/// a name that is not registered and for one the trust policy refuses alike (as a
/// runtime class below the tenant's minimum is).
pub(crate) fn template_error(field: &str, e: tessera_sandbox::RegistryError) -> ApiError {
    ApiError::invalid(field, format!("{field}: {e}"))
}

#[cfg(test)]
mod queue_caps_tests {
    use super::*;

    fn caller(tenant: &str, role: Role) -> Caller {
        Caller {
            tenant: tenant.into(),
            subject: "someone".into(),
            key_id: "k".into(),
            role,
        }
    }

    fn spec(name: &str, weight: u32, gpus: Option<u64>) -> QueueSpec {
        QueueSpec {
            name: name.into(),
            parent: None,
            weight,
            guarantee: tessera_model::Resources::default(),
            capability: gpus.map(|g| tessera_model::Resources::default().with_gpu_milli(g * 1000)),
            reclaimable: true,
            resource_version: None,
        }
    }

    #[tokio::test]
    async fn tenant_admins_cannot_exceed_the_operators_caps() {
        let dir = tempfile::tempdir().unwrap();
        let store = tessera_store::SqliteStore::open(dir.path().join("data")).unwrap();
        let plane = ControlPlane::new(store.into());
        let admin = caller("team", Role::Admin);
        let caps = QueueCaps {
            weight: Some(4),
            guarantee: None,
            capability: Some(tessera_model::Resources::default().with_gpu_milli(8000)),
        };
        // Only the system tenant's operators set caps.
        assert!(
            plane
                .put_queue_caps(&admin, "team", caps.clone())
                .await
                .is_err()
        );
        let op = caller(SYSTEM_TENANT, Role::Operator);
        plane
            .put_queue_caps(&op, "team", caps.clone())
            .await
            .unwrap();
        assert_eq!(
            plane.get_queue_caps(&admin, "team").await.unwrap(),
            Some(caps)
        );
        plane
            .create_queue(&admin, spec("a", 2, Some(6)))
            .await
            .unwrap();
        // Over the capability cap in all (6 + 4 > 8), over the weight cap, unbounded.
        let e = plane
            .create_queue(&admin, spec("b", 1, Some(4)))
            .await
            .unwrap_err();
        assert!(format!("{e:?}").contains("capability"), "{e:?}");
        let e = plane
            .create_queue(&admin, spec("b", 3, Some(2)))
            .await
            .unwrap_err();
        assert!(format!("{e:?}").contains("weight"), "{e:?}");
        assert!(
            plane
                .create_queue(&admin, spec("b", 1, None))
                .await
                .is_err()
        );
        plane
            .create_queue(&admin, spec("b", 2, Some(2)))
            .await
            .unwrap();
        // A child queue is not capped by itself (its parent is).
        let mut child = spec("c", 9, None);
        child.parent = Some("a".into());
        plane.create_queue(&admin, child).await.unwrap();
        // Other tenants are not capped.
        plane
            .create_queue(&caller("other", Role::Admin), spec("x", 50, None))
            .await
            .unwrap();
    }
}

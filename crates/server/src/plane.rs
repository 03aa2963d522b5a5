//! The control plane's state logic: tenants, keys, role bindings, nodes, queues,
//! jobs, events and audit, over a [`Store`]. HTTP handlers call these methods and
//! only translate; everything here is independent of HTTP.

mod identity;
mod jobs;
mod nodes;
mod queues;
mod records;

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

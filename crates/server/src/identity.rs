//! Users and service accounts: the subjects of a tenant, as objects.
//!
//! A *subject* is who an API key or an OIDC token acts as; a role binding gives a
//! subject a role in a tenant. Subjects are of two kinds:
//!
//! - a **user** (a person), named by its subject (`alice`, `alice@example.com`);
//!   a key or role binding for a subject that is not yet a user creates the user;
//! - a **service account** (a program), named like other objects (`ci-bot`) and
//!   acting as the subject `sa:<name>`; it must exist before a key or binding
//!   names it.
//!
//! Reading a user or service account shows its role and its keys (ids, never
//! secrets). Deleting one removes its role binding and revokes its keys in the same
//! commit, so none of its credentials works afterwards.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_store::{Key, Op, Store};

use crate::api::{App, Body};
use crate::auth::{KeyRecord, Role};
use crate::plane::{
    Caller, ControlPlane, check_name, check_subject, from_value, kind, now_ms, render, render_key,
    to_value,
};
use crate::problem::ApiError;
use crate::wire::RoleBinding;

/// The subject prefix of service accounts.
pub const SA_PREFIX: &str = "sa:";

/// A user as created.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// The subject the user acts as (API keys, OIDC `sub`).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Binds this role in the tenant as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// A service account as created.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewServiceAccount {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Binds this role in the tenant as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// A stored user or service account.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct SubjectBody {
    /// The subject keys and bindings name.
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub created_at: u64,
    /// Who created it (a subject), or `implicit` for a user created by a key or
    /// binding that named it first.
    pub created_by: String,
}

/// Which of the two kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    User,
    ServiceAccount,
}

impl SubjectKind {
    fn kind(self) -> &'static str {
        match self {
            SubjectKind::User => kind::USER,
            SubjectKind::ServiceAccount => kind::SERVICEACCOUNT,
        }
    }
    fn noun(self) -> &'static str {
        match self {
            SubjectKind::User => "user",
            SubjectKind::ServiceAccount => "service account",
        }
    }
    fn subject(self, name: &str) -> String {
        match self {
            SubjectKind::User => name.to_string(),
            SubjectKind::ServiceAccount => format!("{SA_PREFIX}{name}"),
        }
    }
}

impl ControlPlane {
    /// Operations that make `subject` a known subject of `tenant` before a key or
    /// binding names it: none when it exists, a user when it is a new plain
    /// subject; a service account must have been created first.
    pub(crate) async fn subject_ops(
        &self,
        tenant: &str,
        subject: &str,
        now: u64,
    ) -> Result<Vec<Op>, ApiError> {
        if let Some(sa) = subject.strip_prefix(SA_PREFIX) {
            let key = Key::new(kind::SERVICEACCOUNT, tenant, sa);
            if self.store().get(&key).await?.is_none() {
                return Err(ApiError::invalid(
                    "subject",
                    format!(
                        "service account {sa:?} does not exist in tenant {tenant:?}: create it first (POST /v1/serviceaccounts or `tessera serviceaccount create {sa}`)"
                    ),
                ));
            }
            return Ok(Vec::new());
        }
        let key = Key::new(kind::USER, tenant, subject);
        if self.store().get(&key).await?.is_some() {
            return Ok(Vec::new());
        }
        Ok(vec![Op::Create {
            key,
            body: to_value(&SubjectBody {
                subject: subject.into(),
                display_name: None,
                description: None,
                created_at: now,
                created_by: "implicit".into(),
            })?,
        }])
    }

    async fn create_subject(
        &self,
        c: &Caller,
        which: SubjectKind,
        name: &str,
        body: SubjectBody,
        role: Option<Role>,
    ) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let now = body.created_at;
        let subject = body.subject.clone();
        let mut ops = vec![Op::Create {
            key: Key::new(which.kind(), &c.tenant, name),
            body: to_value(&body)?,
        }];
        if let Some(role) = role {
            let key = Key::new(kind::ROLEBINDING, &c.tenant, &subject);
            let body = to_value(&RoleBinding {
                subject: subject.clone(),
                role,
            })?;
            ops.push(match self.store().get(&key).await? {
                Some(o) => Op::Update {
                    key,
                    expected: Some(o.version),
                    body,
                },
                None => Op::Create { key, body },
            });
        }
        ops.push(self.audit(c, "create", format!("{}/{name}", which.kind()), now)?);
        let out = self.store().commit(ops).await?;
        self.forget_credentials();
        self.describe(c, which, &out[0]).await
    }

    /// A user: `name` is its subject.
    pub async fn create_user(&self, c: &Caller, u: NewUser) -> Result<Value, ApiError> {
        check_subject("name", &u.name)?;
        if u.name.starts_with(SA_PREFIX) {
            return Err(ApiError::invalid(
                "name",
                format!(
                    "{:?}: names starting with {SA_PREFIX:?} are service accounts' subjects",
                    u.name
                ),
            ));
        }
        let body = SubjectBody {
            subject: u.name.clone(),
            display_name: u.display_name,
            description: None,
            created_at: now_ms(),
            created_by: c.subject.clone(),
        };
        self.create_subject(c, SubjectKind::User, &u.name, body, u.role)
            .await
    }

    /// A service account; it acts as `sa:<name>`.
    pub async fn create_service_account(
        &self,
        c: &Caller,
        sa: NewServiceAccount,
    ) -> Result<Value, ApiError> {
        check_name("name", &sa.name)?;
        let body = SubjectBody {
            subject: SubjectKind::ServiceAccount.subject(&sa.name),
            display_name: None,
            description: sa.description,
            created_at: now_ms(),
            created_by: c.subject.clone(),
        };
        self.create_subject(c, SubjectKind::ServiceAccount, &sa.name, body, sa.role)
            .await
    }

    /// The object rendered with its role and its keys (ids and state, no secrets).
    async fn describe(
        &self,
        c: &Caller,
        which: SubjectKind,
        o: &tessera_store::Object,
    ) -> Result<Value, ApiError> {
        let subject = which.subject(&o.name);
        let mut v = render(o);
        let role = self
            .store()
            .get(&Key::new(kind::ROLEBINDING, &c.tenant, &subject))
            .await?
            .map(|b| from_value::<RoleBinding>(&b))
            .transpose()?
            .map(|b| b.role);
        v["role"] = json!(role);
        let keys = self.subject_keys(&c.tenant, &subject).await?;
        v["keys"] = Value::Array(keys.iter().map(render_key).collect());
        Ok(v)
    }

    async fn subject_keys(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<Vec<tessera_store::Object>, ApiError> {
        let mut out = Vec::new();
        for o in self.store().list(kind::APIKEY, Some("")).await?.objects {
            let r: KeyRecord = from_value(&o)?;
            if r.tenant == tenant && r.subject == subject {
                out.push(o);
            }
        }
        Ok(out)
    }

    pub async fn list_subjects(
        &self,
        c: &Caller,
        which: SubjectKind,
    ) -> Result<Vec<Value>, ApiError> {
        c.require(Role::Viewer)?;
        let l = self.store().list(which.kind(), Some(&c.tenant)).await?;
        let bindings = self
            .store()
            .list(kind::ROLEBINDING, Some(&c.tenant))
            .await?;
        let mut out = Vec::with_capacity(l.objects.len());
        for o in &l.objects {
            let subject = which.subject(&o.name);
            let role = bindings
                .objects
                .iter()
                .find(|b| b.name == subject)
                .map(from_value::<RoleBinding>)
                .transpose()?
                .map(|b| b.role);
            let mut v = render(o);
            v["role"] = json!(role);
            out.push(v);
        }
        Ok(out)
    }

    pub async fn get_subject(
        &self,
        c: &Caller,
        which: SubjectKind,
        name: &str,
    ) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let o = self
            .store()
            .get(&Key::new(which.kind(), &c.tenant, name))
            .await?
            .ok_or_else(|| ApiError::not_found(format!("{} {name:?}", which.noun())))?;
        self.describe(c, which, &o).await
    }

    /// Deletes a user or service account, its role binding, and revokes its keys,
    /// in one commit.
    pub async fn delete_subject(
        &self,
        c: &Caller,
        which: SubjectKind,
        name: &str,
    ) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let key = Key::new(which.kind(), &c.tenant, name);
        let o = self
            .store()
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("{} {name:?}", which.noun())))?;
        let subject = which.subject(name);
        if subject == c.subject {
            return Err(ApiError::invalid(
                "name",
                format!("{subject:?} is the caller: an admin cannot delete itself"),
            ));
        }
        let now = now_ms();
        let mut ops = vec![Op::Delete {
            key,
            expected: Some(o.version),
        }];
        let rb = Key::new(kind::ROLEBINDING, &c.tenant, &subject);
        if let Some(b) = self.store().get(&rb).await? {
            ops.push(Op::Delete {
                key: rb,
                expected: Some(b.version),
            });
        }
        let mut revoked = Vec::new();
        for k in self.subject_keys(&c.tenant, &subject).await? {
            let mut r: KeyRecord = from_value(&k)?;
            if r.revoked {
                continue;
            }
            r.revoked = true;
            revoked.push(k.name.clone());
            ops.push(Op::Update {
                key: k.key(),
                expected: Some(k.version),
                body: to_value(&r)?,
            });
        }
        ops.push(self.audit(c, "delete", format!("{}/{name}", which.kind()), now)?);
        let out = self.store().commit(ops).await?;
        self.forget_credentials();
        let mut v = render(&out[0]);
        v["revoked_keys"] = json!(revoked);
        Ok(v)
    }
}

type R = Result<Response, ApiError>;

async fn create_user(State(a): State<App>, c: Caller, Body(b): Body<NewUser>) -> R {
    Ok((StatusCode::CREATED, Json(a.plane.create_user(&c, b).await?)).into_response())
}
async fn list_users(State(a): State<App>, c: Caller) -> R {
    let items = a.plane.list_subjects(&c, SubjectKind::User).await?;
    Ok(Json(json!({ "items": items })).into_response())
}
async fn get_user(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    Ok(Json(a.plane.get_subject(&c, SubjectKind::User, &n).await?).into_response())
}
async fn delete_user(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    Ok(Json(a.plane.delete_subject(&c, SubjectKind::User, &n).await?).into_response())
}
async fn create_sa(State(a): State<App>, c: Caller, Body(b): Body<NewServiceAccount>) -> R {
    Ok((
        StatusCode::CREATED,
        Json(a.plane.create_service_account(&c, b).await?),
    )
        .into_response())
}
async fn list_sas(State(a): State<App>, c: Caller) -> R {
    let items = a
        .plane
        .list_subjects(&c, SubjectKind::ServiceAccount)
        .await?;
    Ok(Json(json!({ "items": items })).into_response())
}
async fn get_sa(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    Ok(Json(
        a.plane
            .get_subject(&c, SubjectKind::ServiceAccount, &n)
            .await?,
    )
    .into_response())
}
async fn delete_sa(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    Ok(Json(
        a.plane
            .delete_subject(&c, SubjectKind::ServiceAccount, &n)
            .await?,
    )
    .into_response())
}

crate::api::routes! {
    ROUTES, routes;
    post "/v1/users" create_user "Create a user (admins); with role, bind it too" Some("NewUser"), 201;
    get "/v1/users" list_users "List the tenant's users with their roles" None, 200;
    get "/v1/users/{name}" get_user "A user with its role and API keys (no secrets)" None, 200;
    delete "/v1/users/{name}" delete_user "Delete a user: its role binding goes and its keys are revoked" None, 200;
    post "/v1/serviceaccounts" create_sa "Create a service account (subject sa:NAME; admins)" Some("NewServiceAccount"), 201;
    get "/v1/serviceaccounts" list_sas "List the tenant's service accounts with their roles" None, 200;
    get "/v1/serviceaccounts/{name}" get_sa "A service account with its role and API keys (no secrets)" None, 200;
    delete "/v1/serviceaccounts/{name}" delete_sa "Delete a service account: its role binding goes and its keys are revoked" None, 200;
}

/// Request-body schemas of these routes, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "NewUser",
            json!({"type": "object", "additionalProperties": false, "required": ["name"], "properties": {
                "name": {"type": "string", "description": "The subject: 1 to 128 of A-Z a-z 0-9 @ . _ : -"},
                "display_name": {"type": "string"},
                "role": {"$ref": "#/components/schemas/Role"}}}),
        ),
        (
            "NewServiceAccount",
            json!({"type": "object", "additionalProperties": false, "required": ["name"], "properties": {
                "name": {"type": "string", "description": "A name (a-z 0-9 -); the subject is sa:NAME"},
                "description": {"type": "string"},
                "role": {"$ref": "#/components/schemas/Role"}}}),
        ),
    ]
}

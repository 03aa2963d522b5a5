//! Model weights, the control plane's side: the store of sealed weights and the key
//! service that releases their data keys.
//!
//! - **At rest**: `tessera weights put` streams the file in; it is sealed on the way
//!   ([`tessera_node::weights::format`], a fresh data key per weights) into
//!   `DATA/weights/TENANT/NAME.RANDOM.sealed`; the data key is kept only wrapped under the
//!   key-encryption key (`DATA/keys/weights.kek`, 0600, made on first use).
//! - **Policy** (the record `weights/TENANT/NAME`): the owner tenant, the tenants it
//!   granted them to, and the runtime classes they may run in (none: any).
//! - **Release** ([`KeyService::release`]): to a node whose attestation verifies now
//!   (its TPM quotes a nonce this service issued, single-use, bound to the node's
//!   ephemeral key), for a task bound to that node whose tenant owns or was granted
//!   the weights, which names them, whose class the policy allows, and whose device
//!   view (reported from the start) matches the scheduler's binding on a node without
//!   the device-view-mismatch taint. Every release and every refusal is audited in the
//!   owner's audit log (and the requester's, when another tenant).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_node::weights::format::{self, DataKey};
use tessera_node::weights::{Release, ReleaseRequest, wrap};
use tessera_store::{AnyStore, Key, Store};

use crate::auth::Role;
use crate::plane::{Caller, kind, now_ms};
use crate::problem::{ApiError, Code};

/// The frames [`KeyService::put`] takes.
pub use axum::body::Bytes;

/// The store kind of weights records (tenant-scoped).
pub const WEIGHTS: &str = "weights";
/// How long a release nonce stays valid.
const NONCE_TTL: Duration = Duration::from_secs(120);

/// What the control plane keeps of one weights object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WeightsRecord {
    pub name: String,
    pub tenant: String,
    /// The file's name inside the task's folder (`/weights/NAME/FILE`).
    pub file: String,
    /// Plaintext bytes.
    pub bytes: u64,
    /// `sha256:HEX` of the plaintext, as `sha256sum` prints it for the original.
    pub sha256: String,
    /// Runtime classes the weights may be released into; empty: any.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Other tenants allowed to use them (as `OWNER/NAME`).
    #[serde(default)]
    pub grants: Vec<String>,
    pub created_ms: u64,
    pub created_by: String,
    /// The data key, wrapped under the KEK (hex). Never in a reply.
    pub wrapped_key: String,
    /// Which KEK wrapped it (the first bytes of its SHA-256).
    pub kek: String,
    /// The sealed file's name in `DATA/weights/TENANT/` (unique per put, so two
    /// racing puts of one name never share a file).
    pub blob: String,
}

impl WeightsRecord {
    /// What callers see (no wrapped key).
    pub fn view(&self) -> Value {
        json!({
            "name": self.name,
            "tenant": self.tenant,
            "file": self.file,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "classes": self.classes,
            "grants": self.grants,
            "created_ms": self.created_ms,
            "created_by": self.created_by,
        })
    }
}

/// The weights store and key service.
pub struct KeyService {
    store: AnyStore,
    dir: PathBuf,
    kek: DataKey,
    kek_id: String,
    nonces: Mutex<HashMap<Vec<u8>, Instant>>,
}

impl std::fmt::Debug for KeyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyService")
            .field("dir", &self.dir)
            .field("kek", &self.kek_id)
            .finish()
    }
}

/// A name of weights or of their file: letters, digits, `.`, `_`, `-`; not starting
/// with `.`; at most 128 bytes.
pub fn check_name(field: &str, s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!(
                "{s:?} is not a valid name: letters, digits, '.', '_' and '-' (not starting with '.'), at most 128"
            ),
        ))
    }
}

/// `NAME` of `tenant`, or `OWNER/NAME`: (owner, name).
pub fn resolve_ref<'a>(tenant: &'a str, r: &'a str) -> (&'a str, &'a str) {
    match r.split_once('/') {
        Some((o, n)) => (o, n),
        None => (tenant, r),
    }
}

fn kek_file(dir: &Path) -> Result<(DataKey, String), String> {
    let k = crate::keyfile::seed(
        dir,
        "weights.kek",
        "the weights sealed under it cannot be opened without it",
    )?;
    let id = tessera_node::attest::Measurement::of("kek", &k).digest[7..23].to_string();
    Ok((DataKey::from_bytes(k), id))
}

async fn read(
    store: &AnyStore,
    tenant: &str,
    name: &str,
) -> Result<Option<WeightsRecord>, ApiError> {
    match store.get(&Key::new(WEIGHTS, tenant, name)).await? {
        Some(o) => Ok(Some(
            serde_json::from_value(o.body).map_err(ApiError::internal)?,
        )),
        None => Ok(None),
    }
}

/// Whether a task of `tenant` in `class` may name weights `r` (checked at submit, so
/// a job that could never get its weights is refused at once; the release checks
/// again).
pub async fn admit(store: &AnyStore, tenant: &str, r: &str, class: &str) -> Result<(), String> {
    let (owner, name) = resolve_ref(tenant, r);
    if check_name("weights", owner).is_err() || check_name("weights", name).is_err() {
        return Err(format!("{r:?} is not NAME or OWNER/NAME"));
    }
    let rec = read(store, owner, name)
        .await
        .map_err(|e| e.to_string())?
        .filter(|w| w.tenant == tenant || w.grants.iter().any(|g| g == tenant))
        .ok_or_else(|| {
            format!(
                "weights {r:?} do not exist or were not granted to tenant {tenant:?} (see `tessera weights list`)"
            )
        })?;
    if !rec.classes.is_empty() && !rec.classes.iter().any(|k| k == class) {
        return Err(format!(
            "weights {r:?} may run only in runtime class {} (the task's class is {class:?}): set runtime_class",
            rec.classes.join(", ")
        ));
    }
    Ok(())
}

impl KeyService {
    /// The service over `data` (the server's data folder): its KEK loaded or made.
    pub fn open(store: AnyStore, data: &Path) -> Result<Arc<KeyService>, String> {
        let (kek, kek_id) = kek_file(data)?;
        Ok(Arc::new(KeyService {
            store,
            dir: data.join("weights"),
            kek,
            kek_id,
            nonces: Mutex::new(HashMap::new()),
        }))
    }

    fn blob(&self, tenant: &str, blob: &str) -> PathBuf {
        self.dir.join(tenant).join(blob)
    }

    async fn read(&self, tenant: &str, name: &str) -> Result<Option<WeightsRecord>, ApiError> {
        read(&self.store, tenant, name).await
    }

    /// Seals what `body` streams into weights `name` of the caller's tenant.
    pub async fn put<S, E>(
        &self,
        c: &Caller,
        name: &str,
        file: Option<&str>,
        classes: Vec<String>,
        mut body: S,
    ) -> Result<Value, ApiError>
    where
        S: futures_util::Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures_util::StreamExt;
        c.require(Role::Developer)?;
        check_name("name", name)?;
        let file = file.unwrap_or(name);
        check_name("file", file)?;
        for k in &classes {
            check_name("class", k)?;
        }
        if self.read(&c.tenant, name).await?.is_some() {
            return Err(ApiError::new(
                Code::AlreadyExists,
                format!(
                    "weights {name:?} exist in tenant {:?}: delete them first (`tessera weights delete {name}`)",
                    c.tenant
                ),
            ));
        }
        let dir = self.dir.join(&c.tenant);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ApiError::internal(format!("{}: {e}", dir.display())))?;
        let blob = format!("{name}.{}.sealed", crate::auth::random_hex(6));
        let final_path = self.blob(&c.tenant, &blob);
        let tmp = dir.join(format!(".{name}.{}.partial", crate::auth::random_hex(6)));
        let dek = DataKey::generate();
        let dek_bytes = *dek.as_bytes();
        // Sealing runs on a blocking thread; the body's frames reach it through a
        // small bounded channel (memory stays a few chunks, whatever the size).
        let (tx, rx) = std::sync::mpsc::sync_channel::<axum::body::Bytes>(64);
        let tmp2 = tmp.clone();
        let sealer = tokio::task::spawn_blocking(move || -> Result<format::Sealed, String> {
            use std::io::Write;
            let dek = DataKey::from_bytes(dek_bytes);
            let f = std::fs::File::create(&tmp2).map_err(|e| e.to_string())?;
            let mut s = format::Sealer::new(&dek, format::CHUNK, std::io::BufWriter::new(f))
                .map_err(|e| e.to_string())?;
            for b in rx {
                s.write_all(&b).map_err(|e| e.to_string())?;
            }
            let (w, sealed) = s.finish().map_err(|e| e.to_string())?;
            let f = w.into_inner().map_err(|e| e.to_string())?;
            f.sync_all().map_err(|e| e.to_string())?;
            Ok(sealed)
        });
        let mut failed = None;
        while let Some(frame) = body.next().await {
            match frame {
                Ok(b) => {
                    let sent = match tx.try_send(b) {
                        Ok(()) => true,
                        Err(std::sync::mpsc::TrySendError::Full(b)) => {
                            // Wait for the sealer off the async runtime's threads.
                            let tx = tx.clone();
                            tokio::task::spawn_blocking(move || tx.send(b))
                                .await
                                .is_ok_and(|r| r.is_ok())
                        }
                        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => false,
                    };
                    if !sent {
                        failed = Some("the sealer stopped".to_string());
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(format!("the upload broke off: {e}"));
                    break;
                }
            }
        }
        drop(tx);
        let sealed = sealer.await.map_err(ApiError::internal)?;
        let sealed = match (failed, sealed) {
            (None, Ok(s)) => s,
            (_, Err(e)) | (Some(e), Ok(_)) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(ApiError::new(
                    Code::InvalidRequest,
                    format!("weights {name:?} were not stored: {e}"),
                ));
            }
        };
        std::fs::rename(&tmp, &final_path)
            .map_err(|e| ApiError::internal(format!("{}: {e}", final_path.display())))?;
        let rec = WeightsRecord {
            name: name.to_string(),
            tenant: c.tenant.clone(),
            file: file.to_string(),
            bytes: sealed.bytes,
            sha256: sealed.sha256,
            classes,
            grants: Vec::new(),
            created_ms: now_ms(),
            created_by: c.subject.clone(),
            wrapped_key: tessera_node::attest::hex(&wrap::wrap_at_rest(
                &self.kek,
                &format!("{}/{name}", c.tenant),
                &dek,
            )),
            kek: self.kek_id.clone(),
            blob,
        };
        let body = serde_json::to_value(&rec).map_err(ApiError::internal)?;
        if let Err(e) = self
            .store
            .create(Key::new(WEIGHTS, &c.tenant, name), body)
            .await
        {
            let _ = std::fs::remove_file(&final_path);
            return Err(e.into());
        }
        crate::tools::audit(&self.store, c, "weights.put", format!("weights/{name}")).await;
        Ok(rec.view())
    }

    /// The caller's tenant's weights and those granted to it.
    pub async fn list(&self, c: &Caller) -> Result<Value, ApiError> {
        c.require(Role::Viewer)?;
        let mut own = Vec::new();
        let mut granted = Vec::new();
        for o in self.store.list(WEIGHTS, None).await?.objects {
            let Ok(r) = serde_json::from_value::<WeightsRecord>(o.body) else {
                continue;
            };
            if r.tenant == c.tenant {
                own.push(r.view());
            } else if r.grants.iter().any(|g| g == &c.tenant) {
                let mut v = r.view();
                v["name"] = json!(format!("{}/{}", r.tenant, r.name));
                v["grants"] = json!([]);
                granted.push(v);
            }
        }
        own.extend(granted);
        Ok(json!({ "items": own }))
    }

    /// Grants (or with `revoke`, takes back) the weights to `tenant`.
    pub async fn grant(
        &self,
        c: &Caller,
        name: &str,
        tenant: &str,
        revoke: bool,
    ) -> Result<Value, ApiError> {
        c.require(Role::Admin)?;
        let key = Key::new(WEIGHTS, &c.tenant, name);
        for _ in 0..5 {
            let o = self
                .store
                .get(&key)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("weights {name:?}")))?;
            let mut r: WeightsRecord =
                serde_json::from_value(o.body).map_err(ApiError::internal)?;
            if revoke {
                r.grants.retain(|g| g != tenant);
            } else {
                if tenant == c.tenant {
                    return Err(ApiError::invalid(
                        "tenant",
                        "the weights are this tenant's own: a grant is for other tenants",
                    ));
                }
                if self
                    .store
                    .get(&Key::new(kind::TENANT, "", tenant))
                    .await?
                    .is_none()
                {
                    return Err(ApiError::invalid(
                        "tenant",
                        format!("tenant {tenant:?} does not exist"),
                    ));
                }
                if !r.grants.iter().any(|g| g == tenant) {
                    r.grants.push(tenant.to_string());
                    r.grants.sort();
                }
            }
            let body = serde_json::to_value(&r).map_err(ApiError::internal)?;
            if self
                .store
                .update(key.clone(), Some(o.version), body)
                .await
                .is_ok()
            {
                let action = if revoke {
                    "weights.revoke"
                } else {
                    "weights.grant"
                };
                crate::tools::audit(
                    &self.store,
                    c,
                    action,
                    format!("weights/{name} to tenant {tenant}"),
                )
                .await;
                return Ok(r.view());
            }
        }
        Err(ApiError::new(
            Code::Conflict,
            "the weights changed meanwhile: try again",
        ))
    }

    /// Deletes weights: their record, then their sealed file.
    pub async fn delete(&self, c: &Caller, name: &str) -> Result<Value, ApiError> {
        c.require(Role::Developer)?;
        let key = Key::new(WEIGHTS, &c.tenant, name);
        let o = self
            .store
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("weights {name:?}")))?;
        let rec: WeightsRecord = serde_json::from_value(o.body).map_err(ApiError::internal)?;
        self.store.delete(key, Some(o.version)).await?;
        // A release under way keeps reading its open file.
        let _ = std::fs::remove_file(self.blob(&c.tenant, &rec.blob));
        crate::tools::audit(&self.store, c, "weights.delete", format!("weights/{name}")).await;
        Ok(json!({ "deleted": name }))
    }

    /// A fresh single-use nonce for one release.
    pub fn nonce(&self) -> Vec<u8> {
        let mut n = [0u8; 32];
        getrandom::fill(&mut n).expect("the operating system's random source works");
        let mut m = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        m.retain(|_, t| now.duration_since(*t) < NONCE_TTL);
        m.insert(n.to_vec(), now);
        n.to_vec()
    }

    fn take_nonce(&self, n: &[u8]) -> bool {
        let mut m = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        matches!(m.remove(n), Some(t) if t.elapsed() < NONCE_TTL)
    }

    /// Decides a release and audits it either way.
    pub async fn release(&self, req: &ReleaseRequest) -> Result<Release, String> {
        let r = self.decide(req).await;
        let tenant = &req.task.tenant;
        let (owner, name) = resolve_ref(tenant, &req.weights);
        let (action, object) = match &r {
            Ok(_) => (
                "weights.release",
                format!(
                    "weights/{owner}/{name} released to node {} for task {}",
                    req.node, req.task
                ),
            ),
            Err(why) => (
                "weights.refuse",
                format!(
                    "weights/{owner}/{name} refused to node {} for task {}: {why}",
                    req.node, req.task
                ),
            ),
        };
        let who = |t: &str| Caller {
            tenant: t.to_string(),
            subject: format!("node:{}", req.node),
            key_id: String::new(),
            role: Role::Viewer,
        };
        // The owner's log (who used its weights), and the requester's.
        crate::tools::audit(&self.store, &who(owner), action, object.clone()).await;
        if owner != tenant {
            crate::tools::audit(&self.store, &who(tenant), action, object).await;
        }
        r
    }

    async fn decide(&self, req: &ReleaseRequest) -> Result<Release, String> {
        let nonce = tessera_node::attest::unhex(&req.nonce).unwrap_or_default();
        if !self.take_nonce(&nonce) {
            return Err("the nonce was not issued by this key service, has expired, or was used already (a replayed request)".to_string());
        }
        let t = &req.task;
        let job = self
            .store
            .get(&Key::new(kind::JOB, &t.tenant, &t.job))
            .await
            .map_err(|e| e.to_string())?
            .and_then(|o| serde_json::from_value::<crate::wire::JobBody>(o.body).ok())
            .ok_or_else(|| format!("no job {}/{}", t.tenant, t.job))?;
        let spec = job
            .spec
            .tasks
            .iter()
            .find(|s| s.name == t.task)
            .ok_or_else(|| format!("job {} has no task {}", t.job, t.task))?;
        let st = job
            .status
            .tasks
            .get(&t.task)
            .filter(|s| s.node == req.node)
            .ok_or_else(|| format!("task {} is not bound to node {}", t, req.node))?;
        if !spec.weights.iter().any(|w| w == &req.weights) {
            return Err(format!(
                "task {} does not name weights {:?}",
                t, req.weights
            ));
        }
        // Tenant and class.
        let (owner, name) = resolve_ref(&t.tenant, &req.weights);
        let rec = self
            .read(owner, name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no weights {owner}/{name}"))?;
        if rec.tenant != t.tenant && !rec.grants.iter().any(|g| g == &t.tenant) {
            return Err(format!(
                "tenant {} was not granted weights {owner}/{name}",
                t.tenant
            ));
        }
        let class = spec
            .runtime_class
            .as_deref()
            .unwrap_or(tessera_sandbox::class::DEFAULT_CLASS);
        if !rec.classes.is_empty() && !rec.classes.iter().any(|k| k == class) {
            return Err(format!(
                "weights {owner}/{name} may run only in runtime class {}; task {t} runs in {class}",
                rec.classes.join(", ")
            ));
        }
        // The node: attested now, by a quote over this nonce and this recipient.
        let att = crate::attestation::get_record(&self.store, &req.node)
            .await
            .ok_or_else(|| format!("node {} has no attestation record", req.node))?;
        if !att.attested {
            return Err(format!("node {} is not attested: {}", req.node, att.reason));
        }
        let (Some(id), Some(reference)) = (&att.identity, &att.reference) else {
            return Err(format!(
                "node {} has no registered keys or approved values",
                req.node
            ));
        };
        if reference.ak_public != id.ak_public {
            return Err("the node's attestation key changed since approval".to_string());
        }
        let recipient = tessera_node::attest::unhex(&req.recipient)
            .ok_or_else(|| "the recipient key is not hex".to_string())?;
        let binding = wrap::binding(&nonce, &recipient);
        tessera_node::attest::verify(reference, &req.evidence, &binding)
            .map_err(|e| format!("the node's quote does not verify: {e}"))?;
        // The device view: what the sandbox sees is what the scheduler bound.
        self.check_view(req, &st.gpus).await?;
        // Released: the data key, from its wrapping at rest to the node's key.
        let dek = tessera_node::attest::unhex(&rec.wrapped_key)
            .ok_or_else(|| "the stored key is malformed".to_string())
            .and_then(|w| {
                if rec.kek != self.kek_id {
                    return Err(format!(
                        "the weights were sealed under another key-encryption key ({}; this control plane holds {})",
                        rec.kek, self.kek_id
                    ));
                }
                wrap::unwrap_at_rest(&self.kek, &format!("{owner}/{name}"), &w)
                    .map_err(|e| e.to_string())
            })?;
        let ctx = tessera_node::weights::context(&binding, &req.weights);
        let envelope = wrap::seal_to(&recipient, &ctx, &dek).map_err(|e| e.to_string())?;
        Ok(Release {
            envelope,
            blob: self.blob(owner, &rec.blob),
            file: rec.file.clone(),
            bytes: rec.bytes,
        })
    }

    async fn check_view(&self, req: &ReleaseRequest, bound: &[u32]) -> Result<(), String> {
        let node = self
            .store
            .get(&Key::new(kind::NODE, "", &req.node))
            .await
            .map_err(|e| e.to_string())?
            .and_then(|o| serde_json::from_value::<tessera_model::Node>(o.body).ok())
            .ok_or_else(|| format!("no node {}", req.node))?;
        if node
            .taints
            .iter()
            .any(|t| t.key == crate::heartbeat::MISMATCH_TAINT)
        {
            return Err(format!(
                "node {} carries the device-view mismatch taint: its GPUs do not match its record",
                req.node
            ));
        }
        let mut seen: Vec<u32> = req.view.iter().map(|d| d.index).collect();
        seen.sort_unstable();
        seen.dedup();
        let mut want = bound.to_vec();
        want.sort_unstable();
        if seen != want {
            return Err(format!(
                "device view mismatch: the scheduler bound GPUs {want:?}; the sandbox sees {seen:?}"
            ));
        }
        Ok(())
    }
}

/// The key service as the node runtime calls it (blocking, from the task's start
/// thread, never from the async runtime's own threads).
pub struct LocalBroker {
    pub service: Arc<KeyService>,
    pub handle: tokio::runtime::Handle,
}

impl tessera_node::weights::KeyBroker for LocalBroker {
    fn nonce(&self) -> Result<Vec<u8>, String> {
        Ok(self.service.nonce())
    }
    fn release(&self, req: &ReleaseRequest) -> Result<Release, String> {
        self.handle.block_on(self.service.release(req))
    }
}

crate::api::routes! {
    ROUTES, routes;
    put "/v1/weights/{name}" put_weights "Store model weights: the raw file as the body (streamed, sealed on the way; ?file=NAME inside the folder, ?class=C repeated for the runtime classes allowed)" None, 201;
    get "/v1/weights" list_weights "The tenant's weights and those granted to it (never a key)" None, 200;
    delete "/v1/weights/{name}" delete_weights "Delete weights and their sealed file" None, 200;
    post "/v1/weights/{name}/grants" grant_weights "Grant weights to another tenant ({\"tenant\": T}; \"revoke\": true takes it back) (admins)" Some("WeightsGrant"), 200;
}

/// `PUT /v1/weights/{name}`'s query.
#[derive(Debug, Default, Deserialize)]
struct PutQuery {
    file: Option<String>,
    /// Comma-separated runtime classes.
    class: Option<String>,
}

/// `POST /v1/weights/{name}/grants`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsGrant {
    pub tenant: String,
    #[serde(default)]
    pub revoke: bool,
}

async fn put_weights(
    axum::extract::State(a): axum::extract::State<crate::api::App>,
    c: Caller,
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::extract::Query(q): axum::extract::Query<PutQuery>,
    body: axum::body::Body,
) -> crate::api::R {
    let classes = q
        .class
        .as_deref()
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let v = a
        .weights
        .put(
            &c,
            &name,
            q.file.as_deref(),
            classes,
            body.into_data_stream(),
        )
        .await?;
    crate::api::created(v)
}

async fn list_weights(
    axum::extract::State(a): axum::extract::State<crate::api::App>,
    c: Caller,
) -> crate::api::R {
    crate::api::ok(a.weights.list(&c).await?)
}

async fn delete_weights(
    axum::extract::State(a): axum::extract::State<crate::api::App>,
    c: Caller,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> crate::api::R {
    crate::api::ok(a.weights.delete(&c, &name).await?)
}

async fn grant_weights(
    axum::extract::State(a): axum::extract::State<crate::api::App>,
    c: Caller,
    axum::extract::Path(name): axum::extract::Path<String>,
    crate::api::Body(g): crate::api::Body<WeightsGrant>,
) -> crate::api::R {
    crate::api::ok(a.weights.grant(&c, &name, &g.tenant, g.revoke).await?)
}

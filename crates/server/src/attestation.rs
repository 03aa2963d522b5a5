//! Node attestation, the control plane's side: registrar and verifier for the local
//! node's TPM (`tessera up --tpm TCTI`). `tessera-node`'s `attest` does the TPM work
//! and the pure check; this module runs the protocol and carries out the verdict.
//!
//! - **Registration**, at start: the node's EK and AK, then credential activation (a
//!   random secret encrypted to the EK, bound to the AK's name; the TPM must give it
//!   back). A node that fails it is never attested.
//! - **Measurement**, at start: the tessera binary, the sandbox init, the seccomp
//!   policy, the node configuration and the micro-VM guest kernel, extended into the
//!   TPM (a restart measures afresh, so a changed binary shows at once).
//! - **Verification**, at start, every period and on demand: a fresh random nonce, the
//!   node's quote, checked against the reference values an operator approved
//!   (`tessera node trust`). The verdict is the node label
//!   [`tessera_model::ATTESTED_LABEL`]: set while quotes verify, removed on the first
//!   failure (the scheduler then places nothing that requires attestation there, and
//!   says why in the pending reason), and the running tasks that required it are
//!   evicted from the node ("stop sensitive work there").
//!
//! The record (`attestation/NODE`, cluster-scoped) keeps the identity, the reference,
//! the last verdict and the last authentic evidence (what `trust` approves).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_node::attest::{self, Evidence, Identity, Measurement, Reference, Tpm};
use tessera_store::{AnyStore, Key, Store};

use crate::plane::{kind, now_ms};
use crate::problem::ApiError;

/// The store kind of attestation records (cluster-scoped, named by node).
pub const ATTESTATION: &str = "attestation";

/// What the control plane knows of a node's attestation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    /// How the TPM is reached (`device:/dev/tpmrm0`, `swtpm:…`).
    pub tcti: String,
    /// Whether this is a software TPM (proves the protocol, not hardware).
    pub software_tpm: bool,
    #[serde(default)]
    pub identity: Option<Identity>,
    /// Credential activation passed for `identity`.
    #[serde(default)]
    pub registered: bool,
    /// The operator-approved values; `None` until `tessera node trust`.
    #[serde(default)]
    pub reference: Option<Reference>,
    pub attested: bool,
    /// Why not (or what was verified).
    pub reason: String,
    pub checked_ms: u64,
    #[serde(default)]
    pub last_ok_ms: Option<u64>,
    /// What the node measured at its last start.
    #[serde(default)]
    pub measurements: Vec<Measurement>,
    /// The last authentic quote (what `trust` approves).
    #[serde(default)]
    pub evidence: Option<Evidence>,
}

/// The verifier of the local node.
pub struct Attester {
    store: AnyStore,
    node: String,
    tpm: Arc<Tpm>,
    /// The software TPM this server started (`--tpm swtpm`), kept alive with it.
    swtpm: Option<tessera_node::attest::tpm::Swtpm>,
    lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Attester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attester")
            .field("node", &self.node)
            .field("software", &self.swtpm.is_some())
            .finish()
    }
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the operating system's random source works");
    b
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())?
}

impl Attester {
    /// Registers and measures the node, writes its record, and checks it once.
    pub async fn start(
        store: AnyStore,
        node: String,
        tpm: Tpm,
        swtpm: Option<tessera_node::attest::tpm::Swtpm>,
        measurements: Vec<Measurement>,
    ) -> Arc<Attester> {
        let software = swtpm.is_some() || tpm.tcti().starts_with("swtpm:");
        let tpm = Arc::new(tpm);
        let a = Arc::new(Attester {
            store,
            node,
            tpm,
            swtpm,
            lock: tokio::sync::Mutex::new(()),
        });
        let mut rec = a.read().await.unwrap_or_default();
        rec.node = a.node.clone();
        rec.tcti = a.tpm.tcti().to_string();
        rec.software_tpm = software;
        if software {
            tracing::info!(
                "tessera: node {}: attesting with a software TPM ({}): this proves the protocol, not hardware",
                a.node,
                a.tpm.tcti()
            );
        }
        rec.attested = false;
        rec.measurements = measurements.clone();
        match a.register(measurements).await {
            Ok(id) => {
                rec.registered = true;
                rec.identity = Some(id);
                rec.reason = "registered; not verified yet".into();
            }
            Err(e) => {
                rec.registered = false;
                rec.reason = format!("registration failed: {e}");
                tracing::warn!("tessera: node {}: attestation {}", a.node, rec.reason);
            }
        }
        rec.checked_ms = now_ms();
        let _ = a.write(&rec).await;
        a.check().await;
        a
    }

    /// EK and AK, credential activation, then the measurements extended.
    async fn register(&self, log: Vec<Measurement>) -> Result<Identity, String> {
        let tpm = self.tpm.clone();
        blocking(move || {
            let id = tpm.identity().map_err(|e| e.to_string())?;
            let secret: [u8; 32] = random();
            let cred = attest::challenge(&id, &secret, &random()).map_err(|e| e.to_string())?;
            let got = tpm.activate(&cred).map_err(|e| e.to_string())?;
            if got != secret {
                return Err("credential activation returned another secret".into());
            }
            tpm.measure(&log).map_err(|e| e.to_string())?;
            Ok(id)
        })
        .await
    }

    async fn read(&self) -> Option<Record> {
        get_record(&self.store, &self.node).await
    }

    /// The node's TPM (the node runtime quotes weights releases with it).
    pub fn tpm(&self) -> Arc<Tpm> {
        self.tpm.clone()
    }

    async fn write(&self, rec: &Record) -> Result<(), ApiError> {
        let key = Key::new(ATTESTATION, "", &self.node);
        let body = serde_json::to_value(rec).map_err(ApiError::internal)?;
        match self.store.get(&key).await? {
            Some(o) => self.store.update(key, Some(o.version), body).await?,
            None => self.store.create(key, body).await?,
        };
        Ok(())
    }

    /// Attests now: a fresh nonce, a quote, the verdict carried out. The record after.
    pub async fn check(&self) -> Record {
        let _g = self.lock.lock().await;
        let mut rec = self.read().await.unwrap_or_default();
        let was = rec.attested;
        let verdict = self.verdict(&mut rec).await;
        let now = now_ms();
        rec.checked_ms = now;
        match verdict {
            Ok(why) => {
                rec.attested = true;
                rec.reason = why;
                rec.last_ok_ms = Some(now);
            }
            Err(why) => {
                rec.attested = false;
                rec.reason = why;
            }
        }
        if let Err(e) = self.write(&rec).await {
            tracing::warn!("tessera: node {}: attestation not recorded: {e}", self.node);
        }
        self.label(rec.attested).await;
        if was && !rec.attested {
            tracing::warn!(
                "tessera: node {} lost its attestation: {}",
                self.node,
                rec.reason
            );
            crate::jobs::evict_on_node(
                &self.store,
                &self.node,
                tessera_model::ATTESTED_LABEL,
                &format!("node {} lost its attestation: {}", self.node, rec.reason),
            )
            .await;
        }
        rec
    }

    /// Quotes a registered node with a fresh nonce and judges it against its
    /// reference; keeps the quote in `rec` when it is authentic.
    async fn verdict(&self, rec: &mut Record) -> Result<String, String> {
        if !rec.registered {
            return Err(rec.reason.clone());
        }
        let id = rec
            .identity
            .clone()
            .ok_or("the node has no registered keys")?;
        let nonce: [u8; 32] = random();
        let tpm = self.tpm.clone();
        let e = blocking(move || tpm.quote(&nonce).map_err(|e| e.to_string()))
            .await
            .map_err(|e| format!("the TPM did not quote: {e}"))?;
        attest::quote::authentic(&id.ak_public, &e, &nonce).map_err(|e| e.to_string())?;
        rec.evidence = Some(e.clone());
        let r = rec.reference.as_ref().ok_or_else(|| {
            format!(
                "no reference values approved for node {}: check its measurements with `tessera node attestation {0}`, then `tessera node trust {0}`",
                self.node
            )
        })?;
        if r.ak_public != id.ak_public {
            return Err(attest::AttestError::KeyChanged.to_string());
        }
        let v = attest::verify(r, &e, &nonce).map_err(|e| e.to_string())?;
        Ok(format!(
            "quote verified: {} measurements, TPM clock {} (resets {}, restarts {})",
            v.measurements.len(),
            v.clock,
            v.reset_count,
            v.restart_count
        ))
    }

    /// Approves the node's last authentic quote as its reference values.
    pub async fn trust(&self) -> Result<Record, ApiError> {
        {
            let _g = self.lock.lock().await;
            let mut rec = self.read().await.unwrap_or_default();
            let (Some(id), Some(e), true) = (&rec.identity, &rec.evidence, rec.registered) else {
                return Err(ApiError::new(
                    crate::problem::Code::Conflict,
                    format!(
                        "node {} has no authentic quote to approve: {}",
                        self.node, rec.reason
                    ),
                ));
            };
            rec.reference = Some(Reference::approving(&id.ak_public, e));
            self.write(&rec).await?;
        }
        Ok(self.check().await)
    }

    /// Sets or removes the attested label on the node record (compare-and-swap,
    /// retried on a conflicting write).
    async fn label(&self, attested: bool) {
        let key = Key::new(kind::NODE, "", &self.node);
        for _ in 0..5 {
            let Ok(Some(o)) = self.store.get(&key).await else {
                return;
            };
            let Ok(mut n) = serde_json::from_value::<tessera_model::Node>(o.body) else {
                return;
            };
            let has = n
                .labels
                .get(tessera_model::ATTESTED_LABEL)
                .map(String::as_str)
                == Some("true");
            if has == attested {
                return;
            }
            if attested {
                n.labels
                    .insert(tessera_model::ATTESTED_LABEL.into(), "true".into());
            } else {
                n.labels.remove(tessera_model::ATTESTED_LABEL);
            }
            let Ok(body) = serde_json::to_value(&n) else {
                return;
            };
            if self
                .store
                .update(key.clone(), Some(o.version), body)
                .await
                .is_ok()
            {
                return;
            }
        }
    }
}

/// Re-attests every `period` until `stop`.
pub async fn run_loop(
    a: Arc<Attester>,
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        a.check().await;
    }
}

/// What the local node measures at start: the tessera binary, the sandbox init (when
/// it is a file), the seccomp policy, the node configuration (a canonical text of
/// what decides how workloads run; the guard policy is not in it yet: its types
/// have no stable text) and the micro-VM guest kernel (when configured).
pub fn measurements(cfg: &crate::ServerConfig) -> Vec<Measurement> {
    let mut v = Vec::new();
    match std::fs::read("/proc/self/exe") {
        Ok(b) => v.push(Measurement::of("tessera-binary", &b)),
        Err(e) => tracing::warn!("tessera: the tessera binary is not measured: {e}"),
    }
    if let Some(init) = &cfg.node.init
        && let Ok(b) = std::fs::read(&init.path)
    {
        v.push(Measurement::of("sandbox-init", &b));
    }
    v.push(Measurement::of(
        "seccomp-policy",
        tessera_sandbox::seccomp::POLICY.as_bytes(),
    ));
    let mut classes: Vec<String> = cfg
        .classes
        .classes
        .iter()
        .map(|(n, t)| format!("{n}={t}"))
        .collect();
    classes.sort();
    let trust = cfg
        .trust
        .as_ref()
        .map(|t| format!("{t:?}"))
        .unwrap_or_default();
    let config = format!(
        "classes: {}\nmin_classes: {:?}\ntrust: {trust}\ndevices: {:?}\nvm_kernel: {:?}\n",
        classes.join(","),
        cfg.classes.min_class,
        cfg.node.devices,
        cfg.node.vm_kernel
    );
    v.push(Measurement::of("node-config", config.as_bytes()));
    if let Some(k) = &cfg.node.vm_kernel {
        match std::fs::read(k.join("vmlinuz")) {
            Ok(b) => v.push(Measurement::of("guest-kernel", &b)),
            Err(e) => tracing::warn!("tessera: the guest kernel is not measured: {e}"),
        }
    }
    v
}

/// A node's attestation record as stored.
pub async fn get_record(store: &AnyStore, node: &str) -> Option<Record> {
    let o = store.get(&Key::new(ATTESTATION, "", node)).await.ok()??;
    serde_json::from_value(o.body).ok()
}

/// The attestation record of a node, for the API.
pub async fn get(store: &AnyStore, node: &str) -> Result<Value, ApiError> {
    let o = store
        .get(&Key::new(ATTESTATION, "", node))
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "attestation of node {node:?} (a node attests only with a TPM: `tessera up --tpm`)"
            ))
        })?;
    Ok(o.body)
}

impl crate::plane::ControlPlane {
    /// A node's attestation record (viewers): keys, measurements, approved values and
    /// the last verdict. The last evidence's raw bytes are left out.
    pub async fn get_attestation(
        &self,
        c: &crate::plane::Caller,
        node: &str,
    ) -> Result<Value, ApiError> {
        c.require(crate::auth::Role::Viewer)?;
        Ok(public(get(self.store(), node).await?))
    }

    /// Attests `node` now (operators; only the local node has a verifier here).
    pub async fn check_attestation(
        &self,
        c: &crate::plane::Caller,
        node: &str,
        a: Option<&Attester>,
    ) -> Result<Value, ApiError> {
        c.require_system(crate::auth::Role::Operator)?;
        let a = local(a, node)?;
        Ok(public(
            serde_json::to_value(a.check().await).map_err(ApiError::internal)?,
        ))
    }

    /// Approves `node`'s last authentic quote as its reference values (system
    /// operators), then attests it.
    pub async fn trust_node(
        &self,
        c: &crate::plane::Caller,
        node: &str,
        a: Option<&Attester>,
    ) -> Result<Value, ApiError> {
        c.require_system(crate::auth::Role::Operator)?;
        let a = local(a, node)?;
        Ok(public(
            serde_json::to_value(a.trust().await?).map_err(ApiError::internal)?,
        ))
    }
}

/// A record as the API shows it: without the last evidence's raw bytes.
fn public(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("evidence");
    }
    v
}

fn local<'a>(a: Option<&'a Attester>, node: &str) -> Result<&'a Attester, ApiError> {
    match a {
        Some(a) if a.node == node => Ok(a),
        _ => Err(ApiError::not_found(format!(
            "a verifier for node {node:?}: this server attests only its own node, and only with a TPM (`tessera up --tpm`)"
        ))),
    }
}

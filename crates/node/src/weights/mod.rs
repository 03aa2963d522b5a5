//! Model weights, the node's side: released only into an attested node's sandbox,
//! decrypted into its memory, never onto a disk.
//!
//! - [`format`]: the sealed file (AES-256-GCM in 1 MiB chunks, streamed).
//! - [`wrap`]: the data key wrapped at rest (the control plane's KEK) and in release
//!   (to an ephemeral key of this node, bound into a TPM quote).
//! - [`deliver`]: what the node runtime does for a task that names weights, after
//!   its device-view check and before its command: a fresh nonce from the key
//!   service, an ephemeral P-256 key, a TPM quote over both, the release (the key
//!   service checks attestation, tenant, class and device view, and audits), then the
//!   sealed file decrypted chunk by chunk over a pipe into the sandbox's sealed folder
//!   (ramfs, private to its mount namespace), which is then made read-only.

pub mod format;
pub mod wrap;

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::attest::{Evidence, Tpm};
use crate::fence::SeenDevice;
use crate::spec::TaskKey;

/// Where a task's weights appear inside its sandbox: `/weights/NAME`.
pub const MOUNT_ROOT: &str = "/weights";

/// Weights a task asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightsMount {
    /// As the task names them: `NAME` (its tenant's) or `OWNER/NAME` (granted).
    pub name: String,
    /// The sealed folder inside the sandbox.
    pub path: String,
}

impl WeightsMount {
    /// `/weights/NAME` for `NAME` or `OWNER/NAME`.
    pub fn new(name: &str) -> WeightsMount {
        let last = name.rsplit('/').next().unwrap_or(name);
        WeightsMount {
            name: name.to_string(),
            path: format!("{MOUNT_ROOT}/{last}"),
        }
    }
}

/// A node's request for the data key of one task's weights.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseRequest {
    pub node: String,
    /// The task it is for (the key service reads its tenant, class and binding from
    /// the job record, not from this request).
    pub task: TaskKey,
    /// As the task names them.
    pub weights: String,
    /// The key service's nonce (hex).
    pub nonce: String,
    /// The node's ephemeral P-256 public key for this release (hex).
    pub recipient: String,
    /// The node's TPM quote over [`wrap::binding`] of the nonce and the recipient.
    pub evidence: Evidence,
    /// The devices the task's sandbox sees (the device-view check's result).
    pub view: Vec<SeenDevice>,
}

/// What the key service gives back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    pub envelope: wrap::Envelope,
    /// The sealed file, readable by this node.
    pub blob: PathBuf,
    /// The file's name inside the folder.
    pub file: String,
    /// Plaintext bytes.
    pub bytes: u64,
}

/// The control plane's key service, as a node sees it. Blocking.
pub trait KeyBroker: Send + Sync {
    /// A fresh, single-use nonce for one release.
    fn nonce(&self) -> Result<Vec<u8>, String>;
    /// The data key, wrapped to `req.recipient`; `Err` is the refusal's reason.
    fn release(&self, req: &ReleaseRequest) -> Result<Release, String>;
}

/// What a node needs to receive weights: the key service and its own TPM.
#[derive(Clone)]
pub struct WeightsAccess {
    pub broker: Arc<dyn KeyBroker>,
    pub tpm: Arc<Tpm>,
}

impl std::fmt::Debug for WeightsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightsAccess")
            .field("tpm", &self.tpm.tcti())
            .finish()
    }
}

/// The AEAD context of one release: its binding and the weights' name.
pub fn context(binding: &[u8; 32], weights: &str) -> Vec<u8> {
    let mut c = binding.to_vec();
    c.extend_from_slice(weights.as_bytes());
    c
}

/// The sealed folders of a task's weights on node `node` (`can_receive`: it has a
/// key service and a TPM); refuses what cannot receive them, saying why.
pub fn folders(
    node: &str,
    can_receive: bool,
    tier: tessera_sandbox::TierKind,
    mounts: &[WeightsMount],
) -> Result<Vec<String>, String> {
    if mounts.is_empty() {
        return Ok(Vec::new());
    }
    if !can_receive {
        return Err(format!(
            "node {node} cannot receive model weights: weights are released only to an attested node, and this one has no TPM (start it with --tpm)"
        ));
    }
    if tier != tessera_sandbox::TierKind::Namespace {
        return Err(format!(
            "model weights cannot be delivered into the {tier} tier yet (a guest needs a memory-backed folder of its own): use a class of the namespace tier"
        ));
    }
    let mut paths: Vec<String> = mounts.iter().map(|m| m.path.clone()).collect();
    paths.sort();
    if let Some(d) = paths.windows(2).find(|p| p[0] == p[1]) {
        return Err(format!(
            "two of the task's weights would both appear at {}: their names must differ in the last part",
            d[0]
        ));
    }
    Ok(paths)
}

/// What was delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub name: String,
    pub path: String,
    pub file: String,
    pub bytes: u64,
}

/// Releases and decrypts each of `mounts` into `sb`'s sealed folders, then seals
/// them. Any failure is the task's start failure (the caller destroys the sandbox,
/// and with it whatever was written). `memory` is the task's memory limit: the
/// weights live in its memory.
pub fn deliver(
    sb: &tessera_sandbox::Sandbox,
    access: &WeightsAccess,
    node: &str,
    task: &TaskKey,
    mounts: &[WeightsMount],
    view: &[SeenDevice],
    memory: Option<u64>,
) -> Result<Vec<Delivered>, String> {
    let mut out = Vec::new();
    let mut held = 0u64;
    for m in mounts {
        let nonce = access.broker.nonce()?;
        let me = wrap::Recipient::generate();
        let b = wrap::binding(&nonce, me.public());
        let evidence = access
            .tpm
            .quote(&b)
            .map_err(|e| format!("weights {}: the TPM did not quote: {e}", m.name))?;
        let req = ReleaseRequest {
            node: node.to_string(),
            task: task.clone(),
            weights: m.name.clone(),
            nonce: crate::attest::hex(&nonce),
            recipient: crate::attest::hex(me.public()),
            evidence,
            view: view.to_vec(),
        };
        let rel = access
            .broker
            .release(&req)
            .map_err(|e| format!("weights {} not released: {e}", m.name))?;
        held += rel.bytes;
        if let Some(limit) = memory
            && held > limit
        {
            return Err(format!(
                "weights {}: {held} bytes of weights must fit in the task's memory limit of {limit} bytes (they are held in memory, never on a disk): raise resources.memory",
                m.name
            ));
        }
        let key = me
            .open(&rel.envelope, &context(&b, &m.name))
            .map_err(|e| format!("weights {}: {e}", m.name))?;
        drop(me);
        let f = std::fs::File::open(&rel.blob)
            .map_err(|e| format!("weights {}: {}: {e}", m.name, rel.blob.display()))?;
        let input = std::io::BufReader::with_capacity(1 << 20, f);
        let mut err = None;
        sb.fill_sealed(&m.path, &rel.file, rel.bytes, |pipe| {
            match format::open(&key, input.take(u64::MAX), |p| {
                std::io::Write::write_all(pipe, p)
            }) {
                Ok(_) => Ok(()),
                Err(e) => {
                    let m = e.to_string();
                    err = Some(m.clone());
                    Err(std::io::Error::other(m))
                }
            }
        })
        .map_err(|e| match &err {
            Some(d) => format!("weights {}: {d}", m.name),
            None => format!("weights {}: {e}", m.name),
        })?;
        sb.seal(&m.path)
            .map_err(|e| format!("weights {}: {e}", m.name))?;
        out.push(Delivered {
            name: m.name.clone(),
            path: m.path.clone(),
            file: rel.file,
            bytes: rel.bytes,
        });
    }
    Ok(out)
}

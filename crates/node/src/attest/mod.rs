//! Node attestation: the node proves with its TPM what it runs, the control plane
//! checks the proof against reference values an operator approved (Keylime's
//! registrar → verifier → quote model, without its agent).
//!
//! The chain, link by link:
//! 1. **Registration** ([`Tpm::identity`], [`credential::make_credential`],
//!    [`Tpm::activate`]): the node reports its endorsement key (EK) and an
//!    attestation key (AK) made under it; the verifier encrypts a random secret to the
//!    EK, bound to the AK's name, and only a TPM holding both can recover it
//!    (TPM2_ActivateCredential). The AK must be a restricted, fixed-TPM signing key
//!    ([`quote::parse_ak_public`]).
//! 2. **Measurement** ([`Tpm::measure`]): the node extends PCR [`MEASURE_PCR`] with
//!    the digest of each thing it runs (the tessera binary, the sandbox init, the
//!    seccomp policy, the node configuration, the micro-VM guest kernel) and keeps
//!    the list as its event log. A stand-in for measured boot: on a real machine
//!    PCRs 0-7 (firmware, boot loader) are quoted too, and compared.
//! 3. **Quote** ([`Tpm::quote`]): the verifier's fresh nonce, signed by the AK over
//!    the selected PCRs' digest.
//! 4. **Verification** ([`verify`], pure): the signature under the registered AK, the
//!    nonce (a replayed quote carries an old one), the reported PCR values against the
//!    signed digest, the event log replayed against PCR [`MEASURE_PCR`], and every
//!    measurement and boot PCR against the [`Reference`]; the first difference is
//!    named.
//!
//! What a software TPM (swtpm) cannot prove: that the TPM is hardware (its EK is
//! not certified by a manufacturer here), nor that the measurements were taken by
//! firmware rather than by the software being measured. See `docs/trust.md`.

pub mod credential;
pub mod quote;
pub mod tpm;
mod wire;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use quote::{AttestError, Verified, verify};
pub use tpm::{Tpm, TpmError};

/// The PCR the node extends with its measurements (23: the application PCR, resettable
/// by software, which is what makes this a stand-in and not measured boot).
pub const MEASURE_PCR: u32 = 23;

/// The boot PCRs quoted besides [`MEASURE_PCR`] (firmware and boot loader on a real
/// machine; zeros on swtpm).
pub const BOOT_PCRS: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

pub use tessera_model::ATTESTED_LABEL;

/// One thing the node measured: a name (`tessera-binary`, `sandbox-init`,
/// `seccomp-policy`, `node-config`, `guest-kernel`) and its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measurement {
    pub name: String,
    /// `sha256:HEX`.
    pub digest: String,
}

impl Measurement {
    /// The measurement of `bytes` under `name`.
    pub fn of(name: &str, bytes: &[u8]) -> Measurement {
        Measurement {
            name: name.to_string(),
            digest: format!("sha256:{}", hex(&sha256(bytes))),
        }
    }

    /// The 32 bytes of the digest (what is extended into the PCR).
    pub fn bytes(&self) -> Option<[u8; 32]> {
        let h = self.digest.strip_prefix("sha256:")?;
        unhex(h)?.try_into().ok()
    }
}

/// What the node registers: its keys, as the TPM wrote them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The EK's TPM2B_PUBLIC, hex.
    pub ek_public: String,
    /// The AK's TPM2B_PUBLIC, hex.
    pub ak_public: String,
}

/// What the node answers to a nonce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The TPMS_ATTEST the AK signed, hex.
    pub quote: String,
    /// The TPMT_SIGNATURE, hex.
    pub signature: String,
    /// The quoted PCRs' values (SHA-256 bank), hex, by index.
    pub pcrs: BTreeMap<u32, String>,
    /// The measurements extended into [`MEASURE_PCR`], in order.
    pub log: Vec<Measurement>,
}

/// What an operator approved for a node (`tessera node trust`): its AK and the values
/// its quotes must show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    /// The registered AK's TPM2B_PUBLIC, hex (credential activation bound it to the EK).
    pub ak_public: String,
    /// The boot PCRs' approved values, hex.
    pub boot_pcrs: BTreeMap<u32, String>,
    /// The approved measurements, by name.
    pub measurements: BTreeMap<String, String>,
}

impl Reference {
    /// The reference that approves exactly what `e` shows (after `verify` accepted its
    /// signature against `ak_public`).
    pub fn approving(ak_public: &str, e: &Evidence) -> Reference {
        Reference {
            ak_public: ak_public.to_string(),
            boot_pcrs: e
                .pcrs
                .iter()
                .filter(|(i, _)| BOOT_PCRS.contains(i))
                .map(|(i, v)| (*i, v.clone()))
                .collect(),
            measurements: e
                .log
                .iter()
                .map(|m| (m.name.clone(), m.digest.clone()))
                .collect(),
        }
    }
}

pub(crate) fn sha256(b: &[u8]) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

pub use tessera_sandbox::identity::hex;

/// The bytes of hex `s` (either case), or `None`.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The verifier's registration challenge for `id` (credential activation): `secret`
/// encrypted to the EK and bound to the AK's name, which the verifier computes itself
/// from the AK's public area after checking it is a restricted signing key. Only a TPM
/// holding both keys recovers `secret` ([`Tpm::activate`]). `seed`: 32 random bytes.
pub fn challenge(id: &Identity, secret: &[u8], seed: &[u8; 32]) -> Result<Vec<u8>, AttestError> {
    let ak = unhex(&id.ak_public).ok_or_else(|| AttestError::Malformed {
        what: "the attestation key",
        why: "not hex".into(),
    })?;
    let ak = quote::parse_ak_public(&ak)?;
    let ek = unhex(&id.ek_public).ok_or_else(|| AttestError::Malformed {
        what: "the endorsement key",
        why: "not hex".into(),
    })?;
    credential::make_credential(&ek, &ak.name, secret, seed)
        .map(|c| c.to_tpm2_tools_file())
        .map_err(|e| AttestError::Malformed {
            what: "the endorsement key",
            why: e.to_string(),
        })
}

//! The verifier's side, pure: the TPM structures it reads (TPMS_ATTEST of a quote,
//! TPMT_SIGNATURE, the AK's TPM2B_PUBLIC), parsed with bounds checks (bad bytes are
//! an error naming the field, never a panic), and [`verify`].

use std::collections::BTreeMap;

use super::wire::{
    ALG_ECC, ALG_ECDSA, ALG_NULL, ALG_SHA256, ATTR_DECRYPT, ATTR_FIXED_TPM, ATTR_RESTRICTED,
    ATTR_SIGN, CURVE_P256, Reader, ST_ATTEST_QUOTE, TPM_GENERATED, WireError, sha256_name,
    strip_leading_zeros,
};
use super::{BOOT_PCRS, Evidence, MEASURE_PCR, Measurement, Reference, hex, sha256, unhex};

/// A quote or a key refused; the message says which check and what was seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    #[error("{what} is malformed: {why}")]
    Malformed { what: &'static str, why: String },
    #[error(
        "the attestation key is not a restricted, fixed-TPM ECDSA P-256 signing key ({0}): it could sign data that only looks like a quote"
    )]
    WeakKey(String),
    #[error("the quote's signature does not verify under the node's registered attestation key")]
    Signature,
    #[error("the quote answers nonce {got}, not the verifier's {want}: a replayed or stale quote")]
    Nonce { got: String, want: String },
    #[error("the quote covers PCRs {got:?} of bank {bank:#06x}, not sha256 {want:?}")]
    Selection {
        bank: u16,
        got: Vec<u32>,
        want: Vec<u32>,
    },
    #[error("the reported PCR values do not hash to the digest the TPM signed")]
    PcrDigest,
    #[error(
        "the event log does not replay to PCR {pcr}: replayed {replayed}, quoted {quoted} (a measurement was left out or added)"
    )]
    LogReplay {
        pcr: u32,
        replayed: String,
        quoted: String,
    },
    #[error("boot PCR {index} is {got}, the approved value is {want}")]
    BootPcr {
        index: u32,
        got: String,
        want: String,
    },
    #[error("measurement {name} is {got}, the approved value is {want}")]
    Changed {
        name: String,
        got: String,
        want: String,
    },
    #[error("measurement {name} ({digest}) has no approved value")]
    Unapproved { name: String, digest: String },
    #[error("the approved measurement {0} is missing from the node's log")]
    Missing(String),
    #[error("the node quoted with a different attestation key than the one registered")]
    KeyChanged,
}

fn bad(what: &'static str, why: impl Into<String>) -> AttestError {
    AttestError::Malformed {
        what,
        why: why.into(),
    }
}

impl From<WireError> for AttestError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Truncated {
                what,
                field,
                need,
                have,
            } => bad(
                what,
                format!("{field}: needs {need} bytes, {have} are left"),
            ),
            WireError::Trailing { what, field, count } => {
                bad(what, format!("{count} bytes after {field}"))
            }
        }
    }
}

/// A parsed quote (TPMS_ATTEST of type TPM_ST_ATTEST_QUOTE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attest {
    pub qualified_signer: Vec<u8>,
    /// The caller's nonce.
    pub extra_data: Vec<u8>,
    pub clock: u64,
    pub reset_count: u32,
    pub restart_count: u32,
    pub firmware_version: u64,
    /// The PCR selection: (hash algorithm, selected indices).
    pub selection: Vec<(u16, Vec<u32>)>,
    pub pcr_digest: Vec<u8>,
}

/// Parses a TPMS_ATTEST that must be a quote.
pub fn parse_attest(b: &[u8]) -> Result<Attest, AttestError> {
    let mut r = Reader::new("the quote (TPMS_ATTEST)", b);
    let magic = r.u32("magic")?;
    if magic != TPM_GENERATED {
        return Err(bad(
            "the quote (TPMS_ATTEST)",
            format!("magic is {magic:#010x}, not TPM_GENERATED_VALUE: the TPM did not make it"),
        ));
    }
    let ty = r.u16("type")?;
    if ty != ST_ATTEST_QUOTE {
        return Err(bad(
            "the quote (TPMS_ATTEST)",
            format!("type is {ty:#06x}, not a quote (0x8018)"),
        ));
    }
    let qualified_signer = r.tpm2b("qualifiedSigner")?.to_vec();
    let extra_data = r.tpm2b("extraData")?.to_vec();
    let clock = r.u64("clockInfo.clock")?;
    let reset_count = r.u32("clockInfo.resetCount")?;
    let restart_count = r.u32("clockInfo.restartCount")?;
    r.u8("clockInfo.safe")?;
    let firmware_version = r.u64("firmwareVersion")?;
    let count = r.u32("pcrSelect.count")?;
    if count > 16 {
        return Err(bad(
            "the quote (TPMS_ATTEST)",
            format!("pcrSelect.count is {count}; a TPM has at most a few banks"),
        ));
    }
    let mut selection = Vec::new();
    for _ in 0..count {
        let hash = r.u16("pcrSelect.hash")?;
        let n = r.u8("pcrSelect.sizeofSelect")? as usize;
        let bits = r.take(n, "pcrSelect.pcrSelect")?;
        let idx = (0..n * 8)
            .filter(|i| bits[i / 8] & (1 << (i % 8)) != 0)
            .map(|i| i as u32)
            .collect();
        selection.push((hash, idx));
    }
    let pcr_digest = r.tpm2b("pcrDigest")?.to_vec();
    r.finish("pcrDigest")?;
    Ok(Attest {
        qualified_signer,
        extra_data,
        clock,
        reset_count,
        restart_count,
        firmware_version,
        selection,
        pcr_digest,
    })
}

/// The ECDSA signature of a TPMT_SIGNATURE, as r || s of 32 bytes each.
pub fn parse_signature(b: &[u8]) -> Result<[u8; 64], AttestError> {
    const WHAT: &str = "the quote's signature (TPMT_SIGNATURE)";
    let mut r = Reader::new(WHAT, b);
    let alg = r.u16("sigAlg")?;
    let hash = r.u16("hash")?;
    if (alg, hash) != (ALG_ECDSA, ALG_SHA256) {
        return Err(bad(
            WHAT,
            format!("algorithm {alg:#06x} with hash {hash:#06x}, not ECDSA with SHA-256"),
        ));
    }
    let mut out = [0u8; 64];
    for (i, f) in ["signatureR", "signatureS"].into_iter().enumerate() {
        let v = r.tpm2b(f)?;
        let v = strip_leading_zeros(v);
        if v.len() > 32 {
            return Err(bad(WHAT, format!("{f} is {} bytes, over 32", v.len())));
        }
        out[i * 32 + 32 - v.len()..(i + 1) * 32].copy_from_slice(v);
    }
    r.finish("signatureS")?;
    Ok(out)
}

/// An attestation key, from its TPM2B_PUBLIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AkPublic {
    /// The uncompressed P-256 point (0x04 || x || y).
    pub point: Vec<u8>,
    /// The key's TPM name: nameAlg || SHA-256(TPMT_PUBLIC).
    pub name: Vec<u8>,
}

/// Parses the AK's TPM2B_PUBLIC (what `tpm2_createak -u` writes) and checks it is a
/// restricted, fixed-TPM ECDSA P-256 signing key: a restricted key signs only
/// digests the TPM computed itself, so it cannot be made to sign a forged quote.
pub fn parse_ak_public(b: &[u8]) -> Result<AkPublic, AttestError> {
    const WHAT: &str = "the attestation key (TPM2B_PUBLIC)";
    let mut outer = Reader::new(WHAT, b);
    let area = outer.tpm2b("size")?;
    outer.finish("TPM2B_PUBLIC")?;
    let mut r = Reader::new(WHAT, area);
    let ty = r.u16("type")?;
    let name_alg = r.u16("nameAlg")?;
    let attrs = r.u32("objectAttributes")?;
    r.tpm2b("authPolicy")?;
    if ty != ALG_ECC {
        return Err(AttestError::WeakKey(format!(
            "type {ty:#06x}; Tessera makes ECC attestation keys"
        )));
    }
    if name_alg != ALG_SHA256 {
        return Err(AttestError::WeakKey(format!(
            "name algorithm {name_alg:#06x}, not SHA-256"
        )));
    }
    let need = ATTR_FIXED_TPM | ATTR_RESTRICTED | ATTR_SIGN;
    if attrs & need != need || attrs & ATTR_DECRYPT != 0 {
        return Err(AttestError::WeakKey(format!("attributes {attrs:#010x}")));
    }
    let sym = r.u16("parameters.symmetric")?;
    if sym != ALG_NULL {
        return Err(AttestError::WeakKey(format!(
            "symmetric algorithm {sym:#06x} on a signing key"
        )));
    }
    let scheme = r.u16("parameters.scheme")?;
    let scheme_hash = if scheme == ALG_NULL {
        ALG_NULL
    } else {
        r.u16("parameters.scheme.hashAlg")?
    };
    if (scheme, scheme_hash) != (ALG_ECDSA, ALG_SHA256) {
        return Err(AttestError::WeakKey(format!(
            "scheme {scheme:#06x} with hash {scheme_hash:#06x}, not ECDSA with SHA-256"
        )));
    }
    let curve = r.u16("parameters.curveID")?;
    if curve != CURVE_P256 {
        return Err(AttestError::WeakKey(format!(
            "curve {curve:#06x}, not P-256"
        )));
    }
    if r.u16("parameters.kdf")? != ALG_NULL {
        r.u16("parameters.kdf.hashAlg")?;
    }
    let x = r.tpm2b("unique.x")?;
    let y = r.tpm2b("unique.y")?;
    r.finish("unique.y")?;
    if x.len() != 32 || y.len() != 32 {
        return Err(bad(WHAT, format!("point of {}+{} bytes", x.len(), y.len())));
    }
    let mut point = vec![4u8];
    point.extend_from_slice(x);
    point.extend_from_slice(y);
    Ok(AkPublic {
        point,
        name: sha256_name(area),
    })
}

/// What a verified quote showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub clock: u64,
    pub reset_count: u32,
    pub restart_count: u32,
    pub measurements: Vec<Measurement>,
}

/// The PCRs a quote must cover: the boot PCRs and [`MEASURE_PCR`], SHA-256 bank.
pub fn quoted_pcrs() -> Vec<u32> {
    let mut v = BOOT_PCRS.to_vec();
    v.push(MEASURE_PCR);
    v
}

/// Checks that `e` is a genuine, fresh quote by the key `ak_public` (hex TPM2B_PUBLIC)
/// over the PCR values and the event log it reports; says nothing yet about whether
/// those values are the approved ones (that is [`verify`]).
pub fn authentic(ak_public: &str, e: &Evidence, nonce: &[u8]) -> Result<Verified, AttestError> {
    let ak = parse_ak_public(&unhex_field("the attestation key", ak_public)?)?;
    let msg = unhex_field("the quote", &e.quote)?;
    let sig = parse_signature(&unhex_field("the quote's signature", &e.signature)?)?;
    aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
        &ak.point,
    )
    .verify(&msg, &sig)
    .map_err(|_| AttestError::Signature)?;
    let a = parse_attest(&msg)?;
    if a.extra_data != nonce {
        return Err(AttestError::Nonce {
            got: hex(&a.extra_data),
            want: hex(nonce),
        });
    }
    let want = quoted_pcrs();
    let sel_ok = matches!(a.selection.as_slice(), [(ALG_SHA256, got)] if *got == want);
    if !sel_ok {
        let (bank, got) = a.selection.first().cloned().unwrap_or((0, vec![]));
        return Err(AttestError::Selection { bank, got, want });
    }
    // The reported values, in index order, must hash to the signed digest.
    let mut cat = Vec::with_capacity(32 * want.len());
    let mut values: BTreeMap<u32, [u8; 32]> = BTreeMap::new();
    for i in &want {
        let v = e
            .pcrs
            .get(i)
            .and_then(|h| unhex(h))
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| {
                bad(
                    "the reported PCR values",
                    format!("PCR {i} is missing or not 32 bytes of hex"),
                )
            })?;
        cat.extend_from_slice(&v);
        values.insert(*i, v);
    }
    if sha256(&cat).as_slice() != a.pcr_digest.as_slice() {
        return Err(AttestError::PcrDigest);
    }
    // The event log replays to the measurement PCR.
    let mut pcr = [0u8; 32];
    for m in &e.log {
        let d = m.bytes().ok_or_else(|| {
            bad(
                "the event log",
                format!(
                    "measurement {} has digest {:?}, not sha256:HEX",
                    m.name, m.digest
                ),
            )
        })?;
        let mut buf = pcr.to_vec();
        buf.extend_from_slice(&d);
        pcr = sha256(&buf);
    }
    if values.get(&MEASURE_PCR) != Some(&pcr) {
        return Err(AttestError::LogReplay {
            pcr: MEASURE_PCR,
            replayed: hex(&pcr),
            quoted: values.get(&MEASURE_PCR).map(|v| hex(v)).unwrap_or_default(),
        });
    }
    Ok(Verified {
        clock: a.clock,
        reset_count: a.reset_count,
        restart_count: a.restart_count,
        measurements: e.log.clone(),
    })
}

/// Verifies a node's quote against what the operator approved: [`authentic`] under
/// the registered AK, then every boot PCR and every measurement equal to the
/// reference (none changed, none added, none missing). The first difference is the
/// error.
pub fn verify(reference: &Reference, e: &Evidence, nonce: &[u8]) -> Result<Verified, AttestError> {
    let v = authentic(&reference.ak_public, e, nonce)?;
    for (i, want) in &reference.boot_pcrs {
        let got = e.pcrs.get(i).cloned().unwrap_or_default();
        if !got.eq_ignore_ascii_case(want) {
            return Err(AttestError::BootPcr {
                index: *i,
                got,
                want: want.clone(),
            });
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for m in &e.log {
        match reference.measurements.get(&m.name) {
            Some(want) if *want == m.digest => {}
            Some(want) => {
                return Err(AttestError::Changed {
                    name: m.name.clone(),
                    got: m.digest.clone(),
                    want: want.clone(),
                });
            }
            None => {
                return Err(AttestError::Unapproved {
                    name: m.name.clone(),
                    digest: m.digest.clone(),
                });
            }
        }
        seen.insert(m.name.as_str());
    }
    if let Some(name) = reference
        .measurements
        .keys()
        .find(|n| !seen.contains(n.as_str()))
    {
        return Err(AttestError::Missing(name.clone()));
    }
    Ok(v)
}

fn unhex_field(what: &'static str, s: &str) -> Result<Vec<u8>, AttestError> {
    unhex(s).ok_or_else(|| bad(what, "not hex"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_parsers(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_attest(&b);
            let _ = parse_signature(&b);
            let _ = parse_ak_public(&b);
        }

        #[test]
        fn a_quote_prefix_is_never_accepted(cut in 0usize..119) {
            let q = unhex(SAMPLE_QUOTE).unwrap();
            prop_assert!(parse_attest(&q[..cut]).is_err());
        }
    }

    /// A quote swtpm made (`tpm2_quote -l sha256:0,1,2,3,4,5,6,7,23 -q deadbeefcafe`).
    const SAMPLE_QUOTE: &str = "ff54434780180022000b9d7e8243b2bc05da77528def3e122abdc7e12840206277c164268219718626200006deadbeefcafe0000000000004954000000020000000001201910230016363600000001000b03ff00800020d5ac569217906c005859bf52b247105e542c22d4550b98bd899f286f9fe6ae35";

    #[test]
    fn a_swtpm_quote_parses() {
        let a = parse_attest(&unhex(SAMPLE_QUOTE).unwrap()).unwrap();
        assert_eq!(a.extra_data, unhex("deadbeefcafe").unwrap());
        assert_eq!(a.selection, vec![(ALG_SHA256, quoted_pcrs())]);
        assert_eq!(a.pcr_digest.len(), 32);
    }
}

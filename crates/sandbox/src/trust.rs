//! Signed templates: Sigstore bundles over a template's manifest, and the operator's
//! trust policy that decides which templates may run for whom.
//!
//! **What is signed.** A registered template's digest is SHA-256 over its *manifest*
//! (one line per entry: path, kind, mode, content digest; see [`crate::registry`]). The
//! manifest is the artefact: `cosign sign-blob --bundle B MANIFEST` (or
//! `tessera template sign`) makes a Sigstore bundle whose `messageSignature.messageDigest`
//! is the template's digest, so a signature names exactly one tree, byte for byte.
//!
//! **How it is checked.** Offline, with [`sigstore_verify`] (the Sigstore project's Rust
//! verifier): a managed-key bundle against the policy's public keys (ECDSA P-256, Ed25519;
//! a transparency-log entry, when the bundle has one, is verified against the trusted
//! root's Rekor keys); a keyless bundle (Fulcio certificate) against the trusted root's
//! certificate authorities, its SCT, its log entry, and the subject and issuer the policy
//! names.
//!
//! **The policy** (YAML, `tessera up --trust-policy FILE`):
//!
//! ```yaml
//! trusted_root: trusted_root.json   # for keyless signers and log entries; default:
//!                                   # the Sigstore public-good root built in
//! signers:
//!   release: { key: keys/release.pub }            # PEM, relative to this file
//!   ci:                                           # keyless (Fulcio certificate)
//!     subject: https://github.com/acme/images/.github/workflows/build.yml@refs/heads/main
//!     issuer: https://token.actions.githubusercontent.com
//! rules:
//!   - name: isolated-signed
//!     tenants: ["*"]              # default "*"
//!     runtime_classes: [isolated] # default "*"
//!     templates: ["*"]            # default "*": template names
//!     require_signed: true
//!     signers: [release, ci]      # default: any signer above
//!     digests: []                 # a non-empty list pins: only these digests run
//!     require_attested: false     # true: runs only on nodes whose TPM quote verified
//! ```
//!
//! Every rule that applies to a (tenant, runtime class, template) must hold: rules only
//! ever add walls. The built-in `host` template has no manifest and cannot be signed, so
//! a rule that requires signatures refuses it.
//!
//! This module does no I/O but reading the policy's own files at load time: the registry
//! hands it the manifest and the bundles.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sigstore_verify::types::bundle::{
    MessageDigest, MessageSignature, PublicKeyIdentifier, SignatureContent, VerificationMaterial,
    VerificationMaterialContent,
};
use sigstore_verify::types::{
    Bundle, DerPublicKey, DigestBytes, HashAlgorithm, MediaType, SignatureBytes,
};
use sigstore_verify::{PublicKeyVerificationPolicy, VerificationPolicy, Verifier};

/// The policy file was unreadable or wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct PolicyError {
    pub file: String,
    /// Where in the file (`rules[1].signers[0]`), or `-` for the whole file.
    pub field: String,
    pub message: String,
}

/// A template a rule refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "template {name:?} ({digest}) refused by trust rule {rule:?} (tenant {tenant:?}, runtime \
     class {class:?}): {why}"
)]
pub struct TrustError {
    pub name: String,
    pub digest: String,
    pub rule: String,
    pub tenant: String,
    pub class: String,
    pub why: String,
}

/// Making a key or a signature failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SignError(pub String);

/// Who a workload is for: the rules are scoped by these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'a> {
    pub tenant: &'a str,
    pub runtime_class: &'a str,
}

impl<'a> Subject<'a> {
    pub fn new(tenant: &'a str, runtime_class: &'a str) -> Self {
        Subject {
            tenant,
            runtime_class,
        }
    }
}

/// A bundle attached to a template, and the file it came from (for messages).
#[derive(Debug, Clone)]
pub struct StoredBundle {
    pub file: String,
    pub bundle: Bundle,
}

/// What is being admitted: a template's name, digest, manifest (`None` for the built-in
/// `host` template) and the bundles attached to that digest.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub digest: &'a str,
    pub manifest: Option<&'a [u8]>,
    pub bundles: &'a [StoredBundle],
}

/// A template the policy let through: the rules that applied and the signers whose
/// signatures satisfied them (empty when no rule applied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted {
    pub rules: Vec<String>,
    pub signers: Vec<String>,
}

#[derive(Debug)]
enum SignerKind {
    Key(DerPublicKey),
    Identity { subject: String, issuer: String },
}

#[derive(Debug)]
struct Signer {
    kind: SignerKind,
    /// A managed-key bundle must carry a transparency-log entry.
    require_tlog: bool,
}

#[derive(Debug)]
struct Rule {
    name: String,
    tenants: Vec<String>,
    classes: Vec<String>,
    templates: Vec<String>,
    require_signed: bool,
    /// Workloads it applies to run only on attested nodes (`attested.tessera.io`).
    require_attested: bool,
    /// Names into `TrustPolicy::signers`; all of them where the file named none.
    signers: Vec<String>,
    digests: Vec<String>,
}

fn matches(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == "*" || x == v)
}

impl Rule {
    fn applies(&self, template: &str, who: &Subject<'_>) -> bool {
        matches(&self.tenants, who.tenant)
            && matches(&self.classes, who.runtime_class)
            && matches(&self.templates, template)
    }
}

/// The operator's trust policy (see the module docs).
pub struct TrustPolicy {
    file: String,
    signers: BTreeMap<String, Signer>,
    rules: Vec<Rule>,
    verifier: Verifier,
}

impl std::fmt::Debug for TrustPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustPolicy")
            .field("file", &self.file)
            .field("signers", &self.signers.keys().collect::<Vec<_>>())
            .field("rules", &self.rules)
            .finish()
    }
}

fn star() -> Vec<String> {
    vec!["*".into()]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    trusted_root: Option<PathBuf>,
    #[serde(default)]
    signers: BTreeMap<String, SignerFile>,
    #[serde(default)]
    rules: Vec<RuleFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignerFile {
    /// A PEM public key file, relative to the policy file's folder.
    #[serde(default)]
    key: Option<PathBuf>,
    /// A PEM public key, inline.
    #[serde(default)]
    public_key: Option<String>,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    issuer: Option<String>,
    #[serde(default)]
    require_tlog: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    name: Option<String>,
    #[serde(default = "star")]
    tenants: Vec<String>,
    #[serde(default = "star")]
    runtime_classes: Vec<String>,
    #[serde(default = "star")]
    templates: Vec<String>,
    #[serde(default)]
    require_signed: bool,
    #[serde(default)]
    require_attested: bool,
    #[serde(default)]
    signers: Vec<String>,
    #[serde(default)]
    digests: Vec<String>,
}

/// `sha256:` and 64 lower-case hex digits.
pub fn is_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Parses a PEM public key (`-----BEGIN PUBLIC KEY-----`, what `cosign generate-key-pair`,
/// `openssl pkey -pubout` and `tessera template keygen` write): ECDSA P-256 or Ed25519.
pub fn parse_public_key(pem_text: &str) -> Result<DerPublicKey, String> {
    let key = DerPublicKey::from_pem(pem_text.trim())
        .map_err(|e| format!("not a PEM public key (-----BEGIN PUBLIC KEY-----): {e}"))?;
    match sigstore_verify::crypto::KeyAlgorithm::from_spki(&key) {
        Ok(
            sigstore_verify::crypto::KeyAlgorithm::EcdsaP256
            | sigstore_verify::crypto::KeyAlgorithm::Ed25519,
        ) => Ok(key),
        Ok(other) => Err(format!(
            "a {other:?} key; signers here are ECDSA P-256 or Ed25519 keys"
        )),
        Err(e) => Err(format!("not a key this verifier knows: {e}")),
    }
}

impl TrustPolicy {
    /// Reads and checks the policy at `path` (and the key and root files it names,
    /// relative to its folder). Every error names the file and the field.
    pub fn load(path: &Path) -> Result<TrustPolicy, PolicyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
            file: file.clone(),
            field: "-".into(),
            message: format!("cannot read it: {e}"),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&file, &text, base)
    }

    /// [`TrustPolicy::load`] from text; relative paths in it are under `base`.
    pub fn parse(file: &str, text: &str, base: &Path) -> Result<TrustPolicy, PolicyError> {
        let err = |field: &str, message: String| PolicyError {
            file: file.to_string(),
            field: field.to_string(),
            message,
        };
        let de = serde_norway::Deserializer::from_str(text);
        let raw: PolicyFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            err(
                if field == "." { "-" } else { &field },
                e.into_inner().to_string(),
            )
        })?;
        let root = match &raw.trusted_root {
            Some(p) => {
                let p = base.join(p);
                sigstore_verify::trust_root::TrustedRoot::from_file(&p).map_err(|e| {
                    err(
                        "trusted_root",
                        format!("{}: not a Sigstore trusted root: {e}", p.display()),
                    )
                })?
            }
            None => sigstore_verify::trust_root::TrustedRoot::from_json(
                sigstore_verify::trust_root::SIGSTORE_PRODUCTION_TRUSTED_ROOT,
            )
            .map_err(|e| err("trusted_root", format!("the built-in root: {e}")))?,
        };
        let verifier =
            Verifier::new(&root).map_err(|e| err("trusted_root", format!("unusable: {e}")))?;
        let mut signers = BTreeMap::new();
        for (name, s) in raw.signers {
            let field = format!("signers.{name}");
            if name.is_empty() || name == "*" {
                return Err(err(&field, "a signer needs a name (not `*`)".into()));
            }
            let kind = match (&s.key, &s.public_key, &s.subject, &s.issuer) {
                (Some(k), None, None, None) => {
                    let p = base.join(k);
                    let text = std::fs::read_to_string(&p).map_err(|e| {
                        err(&format!("{field}.key"), format!("{}: {e}", p.display()))
                    })?;
                    SignerKind::Key(parse_public_key(&text).map_err(|m| {
                        err(&format!("{field}.key"), format!("{}: {m}", p.display()))
                    })?)
                }
                (None, Some(pem_text), None, None) => SignerKind::Key(
                    parse_public_key(pem_text)
                        .map_err(|m| err(&format!("{field}.public_key"), m))?,
                ),
                (None, None, Some(subject), Some(issuer)) => {
                    if subject.is_empty() || issuer.is_empty() {
                        return Err(err(&field, "subject and issuer must not be empty".into()));
                    }
                    SignerKind::Identity {
                        subject: subject.clone(),
                        issuer: issuer.clone(),
                    }
                }
                _ => {
                    return Err(err(
                        &field,
                        "give either `key` (a PEM file) or `public_key` (PEM text), or \
                         `subject` and `issuer` (a keyless identity), and nothing else"
                            .into(),
                    ));
                }
            };
            signers.insert(
                name,
                Signer {
                    kind,
                    require_tlog: s.require_tlog,
                },
            );
        }
        let mut rules = Vec::new();
        for (i, r) in raw.rules.into_iter().enumerate() {
            let field = format!("rules[{i}]");
            for (j, s) in r.signers.iter().enumerate() {
                if !signers.contains_key(s) {
                    return Err(err(
                        &format!("{field}.signers[{j}]"),
                        format!(
                            "no signer {s:?} in `signers` (there: {})",
                            if signers.is_empty() {
                                "none".to_string()
                            } else {
                                signers.keys().cloned().collect::<Vec<_>>().join(", ")
                            }
                        ),
                    ));
                }
            }
            for (j, d) in r.digests.iter().enumerate() {
                if !is_digest(d) {
                    return Err(err(
                        &format!("{field}.digests[{j}]"),
                        format!("{d:?} is not sha256:<64 lower-case hex digits>"),
                    ));
                }
            }
            for (list, what) in [
                (&r.tenants, "tenants"),
                (&r.runtime_classes, "runtime_classes"),
                (&r.templates, "templates"),
            ] {
                if list.is_empty() {
                    return Err(err(
                        &format!("{field}.{what}"),
                        "empty: the rule would apply to nothing; leave it out for all (`*`)".into(),
                    ));
                }
            }
            if r.require_signed && signers.is_empty() {
                return Err(err(
                    &format!("{field}.require_signed"),
                    "the policy has no signers, so nothing could satisfy this rule".into(),
                ));
            }
            if !r.require_signed && r.digests.is_empty() && !r.require_attested {
                return Err(err(
                    &field,
                    "none of `require_signed`, `digests`, `require_attested`: the rule asks for nothing".into(),
                ));
            }
            let signers_of = if r.signers.is_empty() {
                signers.keys().cloned().collect()
            } else {
                r.signers
            };
            rules.push(Rule {
                name: r.name.unwrap_or(field),
                tenants: r.tenants,
                classes: r.runtime_classes,
                templates: r.templates,
                require_signed: r.require_signed,
                require_attested: r.require_attested,
                signers: signers_of,
                digests: r.digests,
            });
        }
        Ok(TrustPolicy {
            file: file.to_string(),
            signers,
            rules,
            verifier,
        })
    }

    /// The file it was read from.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Whether any rule applies to `template` for `who` (when none does, nothing needs
    /// to be read to admit it).
    pub fn applies(&self, template: &str, who: &Subject<'_>) -> bool {
        self.rules.iter().any(|r| r.applies(template, who))
    }

    /// The first rule that makes `template` for `who` run only on attested nodes.
    pub fn requires_attestation(&self, template: &str, who: &Subject<'_>) -> Option<&str> {
        self.rules
            .iter()
            .find(|r| r.require_attested && r.applies(template, who))
            .map(|r| r.name.as_str())
    }

    /// Admits or refuses a template for `who`: every rule that applies must hold.
    pub fn check(&self, c: &Candidate<'_>, who: &Subject<'_>) -> Result<Admitted, Box<TrustError>> {
        let mut ok = Admitted::default();
        for rule in self.rules.iter().filter(|r| r.applies(c.name, who)) {
            let refuse = |why: String| {
                Box::new(TrustError {
                    name: c.name.to_string(),
                    digest: c.digest.to_string(),
                    rule: rule.name.clone(),
                    tenant: who.tenant.to_string(),
                    class: who.runtime_class.to_string(),
                    why,
                })
            };
            if !rule.digests.is_empty() && !rule.digests.iter().any(|d| d == c.digest) {
                return Err(refuse(format!(
                    "the digest is not one the rule pins ({}); import the pinned tree or \
                     add its digest to the rule",
                    rule.digests.join(", ")
                )));
            }
            if rule.require_signed {
                let Some(manifest) = c.manifest else {
                    return Err(refuse(
                        "the rule requires a signed template, and the built-in `host` \
                         template cannot be signed; use a registered, signed template"
                            .into(),
                    ));
                };
                if c.bundles.is_empty() {
                    return Err(refuse(format!(
                        "not signed: no signature is attached; sign it with `tessera template \
                         sign {0} --key KEY`, or attach a cosign bundle made over `tessera \
                         template manifest {0}` with `tessera template attach {0} BUNDLE`",
                        c.name
                    )));
                }
                let mut tried = String::new();
                let mut by = None;
                'bundles: for b in c.bundles {
                    for s in &rule.signers {
                        match self.verify_one(manifest, &b.bundle, &self.signers[s]) {
                            Ok(()) => {
                                by = Some(s.clone());
                                break 'bundles;
                            }
                            Err(why) => {
                                let _ = write!(tried, "; {} by {s}: {why}", b.file);
                            }
                        }
                    }
                }
                match by {
                    Some(s) => {
                        if !ok.signers.contains(&s) {
                            ok.signers.push(s);
                        }
                    }
                    None => {
                        return Err(refuse(format!(
                            "no attached signature verifies as one of the rule's signers \
                             ({}){tried}",
                            rule.signers.join(", ")
                        )));
                    }
                }
            }
            ok.rules.push(rule.name.clone());
        }
        Ok(ok)
    }

    fn verify_one(&self, manifest: &[u8], b: &Bundle, s: &Signer) -> Result<(), String> {
        let keyless = matches!(
            b.verification_material.content,
            VerificationMaterialContent::Certificate(_)
                | VerificationMaterialContent::X509CertificateChain { .. }
        );
        let has_tlog = !b.verification_material.tlog_entries.is_empty();
        let res = match &s.kind {
            SignerKind::Key(der) => {
                if keyless {
                    return Err("signed with a certificate (keyless), not this key".into());
                }
                let has_time = !b
                    .verification_material
                    .timestamp_verification_data
                    .rfc3161_timestamps
                    .is_empty();
                let mut policy = PublicKeyVerificationPolicy::new(der.clone());
                if !has_tlog {
                    if s.require_tlog {
                        return Err(
                            "no transparency-log entry, and this signer requires one".into()
                        );
                    }
                    if !has_time {
                        // What `cosign sign-blob --tlog-upload=false` makes and `cosign
                        // verify-blob --insecure-ignore-tlog` accepts: the signature alone.
                        return verify_offline(manifest, b, der);
                    }
                    // Signing time from the RFC 3161 timestamp instead.
                    policy = policy.skip_tlog_unsafe();
                }
                self.verifier.verify(manifest, b, &policy)
            }
            SignerKind::Identity { subject, issuer } => {
                if !keyless {
                    return Err(format!(
                        "signed with a key, not a certificate for {subject} from {issuer}"
                    ));
                }
                let policy = VerificationPolicy::new(subject.as_str(), issuer.as_str());
                self.verifier.verify(manifest, b, &policy)
            }
        };
        res.map(drop).map_err(|e| e.to_string())
    }
}

/// A managed-key bundle with neither a log entry nor a timestamp: its message digest
/// must be the artefact's, and its signature must verify over the artefact with `key`.
/// There is no signing-time evidence: revoking a key is removing it from the policy.
fn verify_offline(artifact: &[u8], b: &Bundle, key: &DerPublicKey) -> Result<(), String> {
    use sigstore_verify::crypto::{KeyAlgorithm, SigningScheme};
    let SignatureContent::MessageSignature(m) = &b.content else {
        return Err("a DSSE envelope without a log entry: not accepted offline".into());
    };
    if let Some(md) = &m.message_digest {
        if md.algorithm != HashAlgorithm::Sha2256 {
            return Err(format!(
                "message digest algorithm {:?}, not SHA2_256",
                md.algorithm
            ));
        }
        if md.digest.as_bytes() != Sha256::digest(artifact).as_slice() {
            return Err(format!(
                "the bundle signs sha256:{}, not this template's manifest",
                md.digest.to_hex()
            ));
        }
    }
    let scheme = match KeyAlgorithm::from_spki(key).map_err(|e| e.to_string())? {
        KeyAlgorithm::EcdsaP256 => SigningScheme::EcdsaP256Sha256,
        KeyAlgorithm::Ed25519 => SigningScheme::Ed25519,
        other => return Err(format!("a {other:?} key is not accepted here")),
    };
    sigstore_verify::crypto::verify_signature(key, artifact, &m.signature, scheme)
        .map_err(|e| format!("signature does not verify: {e}"))
}

/// Where a bundle says it signs: the `messageDigest` of a message signature as
/// `sha256:<hex>` (`None` for DSSE envelopes and other digests).
pub fn signed_digest(b: &Bundle) -> Option<String> {
    match &b.content {
        SignatureContent::MessageSignature(m) => {
            let md = m.message_digest.as_ref()?;
            (md.algorithm == HashAlgorithm::Sha2256)
                .then(|| format!("sha256:{}", md.digest.to_hex()))
        }
        _ => None,
    }
}

// ------------------------------------------------------------------- keys and signing

const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// A signing key from a PEM file: PKCS#8 (`-----BEGIN PRIVATE KEY-----`), ECDSA P-256 or
/// Ed25519.
pub enum SigningKey {
    P256(aws_lc_rs::signature::EcdsaKeyPair),
    Ed25519(aws_lc_rs::signature::Ed25519KeyPair),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SigningKey::P256(_) => "SigningKey::P256",
            SigningKey::Ed25519(_) => "SigningKey::Ed25519",
        })
    }
}

/// The algorithm of a key to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    P256,
    Ed25519,
}

/// A new key pair: (private key as PKCS#8 PEM, public key as PEM).
pub fn generate_key(kind: KeyKind) -> Result<(String, String), SignError> {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let fail = |e: aws_lc_rs::error::Unspecified| SignError(format!("making a key: {e}"));
    let pkcs8 = match kind {
        KeyKind::P256 => aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &rng,
        )
        .map_err(fail)?,
        KeyKind::Ed25519 => {
            aws_lc_rs::signature::Ed25519KeyPair::generate_pkcs8(&rng).map_err(fail)?
        }
    };
    let key = SigningKey::from_pkcs8(pkcs8.as_ref())?;
    let private = pem::encode(&pem::Pem::new("PRIVATE KEY", pkcs8.as_ref().to_vec()));
    let public = key.public_key().to_pem();
    Ok((private, public))
}

impl SigningKey {
    /// Reads a PKCS#8 PEM private key.
    pub fn from_pem(text: &str) -> Result<SigningKey, SignError> {
        let p = pem::parse(text.trim()).map_err(|e| {
            SignError(format!(
                "not a PEM key: {e}; give a PKCS#8 `PRIVATE KEY` file"
            ))
        })?;
        match p.tag() {
            "PRIVATE KEY" => SigningKey::from_pkcs8(p.contents()),
            "EC PRIVATE KEY" => Err(SignError(
                "an `EC PRIVATE KEY` (SEC 1) file; convert it to PKCS#8 with `openssl pkcs8 \
                 -topk8 -nocrypt -in KEY -out KEY.pkcs8`"
                    .into(),
            )),
            "ENCRYPTED SIGSTORE PRIVATE KEY" | "ENCRYPTED COSIGN PRIVATE KEY" => Err(SignError(
                "a cosign-encrypted key: sign with `cosign sign-blob --key KEY --bundle B \
                 MANIFEST` (MANIFEST from `tessera template manifest NAME`) and attach B with \
                 `tessera template attach NAME B`"
                    .into(),
            )),
            other => Err(SignError(format!(
                "a PEM `{other}` block, not a PKCS#8 `PRIVATE KEY`"
            ))),
        }
    }

    fn from_pkcs8(der: &[u8]) -> Result<SigningKey, SignError> {
        if let Ok(k) = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            der,
        ) {
            return Ok(SigningKey::P256(k));
        }
        aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map(SigningKey::Ed25519)
            .map_err(|_| SignError("a PKCS#8 key that is neither ECDSA P-256 nor Ed25519".into()))
    }

    /// The public key, as DER SubjectPublicKeyInfo.
    pub fn public_key(&self) -> DerPublicKey {
        use aws_lc_rs::encoding::AsDer as _;
        use aws_lc_rs::signature::KeyPair as _;
        match self {
            SigningKey::P256(k) => DerPublicKey::new(
                k.public_key()
                    .as_der()
                    .map(|d| d.as_ref().to_vec())
                    .unwrap_or_default(),
            ),
            SigningKey::Ed25519(k) => {
                let mut der = ED25519_SPKI_PREFIX.to_vec();
                der.extend_from_slice(k.public_key().as_ref());
                DerPublicKey::new(der)
            }
        }
    }

    /// A Sigstore bundle (v0.3, managed key, no log entry) over `artifact`, as
    /// `cosign sign-blob --key KEY --tlog-upload=false --bundle` makes: the message
    /// digest is SHA-256 of the artefact, the public-key hint is the base64 SHA-256 of
    /// the key's DER.
    pub fn sign(&self, artifact: &[u8]) -> Result<Bundle, SignError> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let sig = match self {
            SigningKey::P256(k) => k
                .sign(&rng, artifact)
                .map_err(|e| SignError(format!("signing: {e}")))?
                .as_ref()
                .to_vec(),
            SigningKey::Ed25519(k) => k.sign(artifact).as_ref().to_vec(),
        };
        let hint = base64::engine::general_purpose::STANDARD
            .encode(Sha256::digest(self.public_key().as_bytes()));
        let digest = Sha256::digest(artifact).to_vec();
        Ok(Bundle::new(
            MediaType::Bundle0_3,
            VerificationMaterial::new(VerificationMaterialContent::PublicKey(
                PublicKeyIdentifier::new(hint),
            )),
            SignatureContent::MessageSignature(
                MessageSignature::new(SignatureBytes::new(sig)).with_message_digest(
                    MessageDigest::new(HashAlgorithm::Sha2256, DigestBytes::new(digest)),
                ),
            ),
        ))
    }
}

#[cfg(test)]
mod tests;

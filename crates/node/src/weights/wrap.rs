//! The weights' data key in its two wrappings.
//!
//! - **At rest**, under the control plane's key-encryption key (KEK):
//!   `nonce (12) | AES-256-GCM(KEK, nonce, aad = "tessera-weights-kek-v1" | name, DEK) | tag`.
//! - **In release**, to the node's ephemeral key (ECDH-ES, as HPKE's base mode and
//!   JWE's `ECDH-ES` do): the node makes a P-256 key pair for one release and has its
//!   TPM quote [`binding`] of the verifier's nonce and that public key, so the key the
//!   DEK is wrapped to is one only the attested node holds. The control plane makes
//!   its own ephemeral pair, derives `HKDF-SHA256(salt = context, ikm = ECDH secret)`
//!   and seals the DEK under it with AES-256-GCM (`aad = context`); the node derives the
//!   same key from its private half, which never leaves its memory and is dropped with
//!   the release.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::agreement::{self, ECDH_P256, PrivateKey, UnparsedPublicKey};
use aws_lc_rs::{digest, hkdf};
use serde::{Deserialize, Serialize};

use super::format::{DataKey, wipe};

/// Why a key did not unwrap.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WrapError {
    #[error("the wrapped key is malformed ({0})")]
    Malformed(&'static str),
    #[error(
        "the wrapped key does not authenticate (another key, another name or context, or changed)"
    )]
    Forged,
    #[error("the recipient key is not a P-256 public key")]
    BadPublicKey,
}

fn aead(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

fn kek_aad(name: &str) -> Vec<u8> {
    let mut a = b"tessera-weights-kek-v1\0".to_vec();
    a.extend_from_slice(name.as_bytes());
    a
}

/// Wraps `dek` under `kek` for the weights `name` (the name is authenticated: a
/// wrapped key copied onto other weights does not open).
pub fn wrap_at_rest(kek: &DataKey, name: &str, dek: &DataKey) -> Vec<u8> {
    let mut nonce = [0u8; 12];
    aws_lc_rs::rand::fill(&mut nonce).expect("the operating system's random source works");
    let mut buf = dek.as_bytes().to_vec();
    aead(kek.as_bytes())
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(kek_aad(name)),
            &mut buf,
        )
        .expect("AES-GCM seals 32 bytes");
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    out
}

/// The data key of `name` back from its wrapping at rest.
pub fn unwrap_at_rest(kek: &DataKey, name: &str, wrapped: &[u8]) -> Result<DataKey, WrapError> {
    if wrapped.len() != 12 + 32 + 16 {
        return Err(WrapError::Malformed("not 60 bytes"));
    }
    let nonce: [u8; 12] = wrapped[..12].try_into().expect("12 bytes");
    let mut buf = wrapped[12..].to_vec();
    let r = aead(kek.as_bytes())
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(kek_aad(name)),
            &mut buf,
        )
        .map(|p| <[u8; 32]>::try_from(&*p).expect("32 bytes"))
        .map(DataKey::from_bytes)
        .map_err(|_| WrapError::Forged);
    wipe(&mut buf);
    r
}

/// What the TPM quotes for a release: the verifier's nonce and the node's ephemeral
/// public key, bound (`SHA-256("tessera-weights-release-v1\0" | nonce | public)`).
pub fn binding(nonce: &[u8], recipient: &[u8]) -> [u8; 32] {
    let mut c = digest::Context::new(&digest::SHA256);
    c.update(b"tessera-weights-release-v1\0");
    c.update(&(nonce.len() as u32).to_be_bytes());
    c.update(nonce);
    c.update(recipient);
    c.finish().as_ref().try_into().expect("32 bytes")
}

/// A data key sealed to a node's ephemeral key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The control plane's ephemeral P-256 public key (uncompressed, hex).
    pub sender: String,
    /// AES-256-GCM of the data key with its tag (hex).
    pub sealed: String,
}

struct Okm32;
impl hkdf::KeyType for Okm32 {
    fn len(&self) -> usize {
        32
    }
}

fn derive(shared: &[u8], context: &[u8]) -> Result<[u8; 32], aws_lc_rs::error::Unspecified> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, context).extract(shared);
    let okm = prk.expand(&[b"tessera weights key release v1"], Okm32)?;
    let mut k = [0u8; 32];
    okm.fill(&mut k)?;
    Ok(k)
}

/// The control plane's side: seals `dek` to `recipient` (the node's ephemeral public
/// key, uncompressed P-256) under `context` (the binding and the weights' name).
pub fn seal_to(recipient: &[u8], context: &[u8], dek: &DataKey) -> Result<Envelope, WrapError> {
    let mine = PrivateKey::generate(&ECDH_P256).map_err(|_| WrapError::BadPublicKey)?;
    let sender = mine
        .compute_public_key()
        .map_err(|_| WrapError::BadPublicKey)?;
    let peer = UnparsedPublicKey::new(&ECDH_P256, recipient);
    let mut key = agreement::agree(&mine, peer, WrapError::BadPublicKey, |s| {
        derive(s, context).map_err(|_| WrapError::BadPublicKey)
    })?;
    let mut buf = dek.as_bytes().to_vec();
    // A fresh key per envelope: the all-zero nonce is used once.
    aead(&key)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key([0u8; 12]),
            Aad::from(context),
            &mut buf,
        )
        .expect("AES-GCM seals 32 bytes");
    wipe(&mut key);
    Ok(Envelope {
        sender: crate::attest::hex(sender.as_ref()),
        sealed: crate::attest::hex(&buf),
    })
}

/// The node's ephemeral key for one release.
pub struct Recipient {
    key: PrivateKey,
    public: Vec<u8>,
}

impl Recipient {
    pub fn generate() -> Recipient {
        let key = PrivateKey::generate(&ECDH_P256).expect("P-256 key generation works");
        let public = key
            .compute_public_key()
            .expect("a P-256 public key")
            .as_ref()
            .to_vec();
        Recipient { key, public }
    }
    /// The public half (uncompressed P-256, 65 bytes).
    pub fn public(&self) -> &[u8] {
        &self.public
    }
    /// Opens an envelope sealed to this key under `context`.
    pub fn open(&self, e: &Envelope, context: &[u8]) -> Result<DataKey, WrapError> {
        let sender = crate::attest::unhex(&e.sender).ok_or(WrapError::Malformed("sender"))?;
        let mut buf = crate::attest::unhex(&e.sealed).ok_or(WrapError::Malformed("sealed"))?;
        if buf.len() != 32 + 16 {
            return Err(WrapError::Malformed("sealed is not 48 bytes"));
        }
        let peer = UnparsedPublicKey::new(&ECDH_P256, &sender);
        let mut key = agreement::agree(&self.key, peer, WrapError::BadPublicKey, |s| {
            derive(s, context).map_err(|_| WrapError::BadPublicKey)
        })?;
        let r = aead(&key)
            .open_in_place(
                Nonce::assume_unique_for_key([0u8; 12]),
                Aad::from(context),
                &mut buf,
            )
            .map(|p| <[u8; 32]>::try_from(&*p).expect("32 bytes"))
            .map(DataKey::from_bytes)
            .map_err(|_| WrapError::Forged);
        wipe(&mut key);
        wipe(&mut buf);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_rest_round_trip_and_name_binding() {
        let kek = DataKey::generate();
        let dek = DataKey::generate();
        let w = wrap_at_rest(&kek, "acme/llama", &dek);
        assert_eq!(
            unwrap_at_rest(&kek, "acme/llama", &w).unwrap().as_bytes(),
            dek.as_bytes()
        );
        assert_eq!(
            unwrap_at_rest(&kek, "other/llama", &w).unwrap_err(),
            WrapError::Forged
        );
        assert_eq!(
            unwrap_at_rest(&DataKey::generate(), "acme/llama", &w).unwrap_err(),
            WrapError::Forged
        );
        assert!(unwrap_at_rest(&kek, "acme/llama", &w[..59]).is_err());
    }

    #[test]
    fn release_opens_only_for_the_recipient_and_its_context() {
        let dek = DataKey::generate();
        let node = Recipient::generate();
        let ctx = binding(b"nonce", node.public());
        let e = seal_to(node.public(), &ctx, &dek).unwrap();
        assert_eq!(node.open(&e, &ctx).unwrap().as_bytes(), dek.as_bytes());
        // Another node's key, another context, a changed envelope: nothing.
        let other = Recipient::generate();
        assert_eq!(other.open(&e, &ctx).unwrap_err(), WrapError::Forged);
        let ctx2 = binding(b"nonce2", node.public());
        assert_eq!(node.open(&e, &ctx2).unwrap_err(), WrapError::Forged);
        let mut bad = e.clone();
        bad.sealed
            .replace_range(0..2, if &e.sealed[0..2] == "00" { "01" } else { "00" });
        assert_eq!(node.open(&bad, &ctx).unwrap_err(), WrapError::Forged);
        assert!(seal_to(b"not a key", &ctx, &dek).is_err());
    }

    #[test]
    fn binding_depends_on_nonce_and_key() {
        let a = Recipient::generate();
        let b = Recipient::generate();
        assert_ne!(binding(b"n", a.public()), binding(b"n", b.public()));
        assert_ne!(binding(b"n", a.public()), binding(b"m", a.public()));
    }
}

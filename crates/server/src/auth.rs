//! API keys and roles.
//!
//! A key reads `tsk_<id>_<secret>`: `id` (12 hex digits) names the stored record,
//! `secret` (64 hex digits, 256 random bits) is shown once and stored only as
//! SHA-256 over a per-key salt and the secret. A fast hash is enough for
//! high-entropy random secrets (there is nothing to brute-force from a dictionary);
//! comparison is constant-time.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Roles within a tenant, weakest first: each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything in the tenant.
    Viewer,
    /// Submits and cancels jobs.
    Developer,
    /// Manages queues (and, in the system tenant, nodes).
    Operator,
    /// Manages keys and role bindings (and, in the system tenant, tenants).
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Developer => "developer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// The stored form of an API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub tenant: String,
    pub subject: String,
    /// Hex salt and hex SHA-256(salt || secret).
    pub salt: String,
    pub hash: String,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(default)]
    pub revoked: bool,
}

/// A freshly made key: the text to show once and the record to store.
pub struct NewKey {
    pub id: String,
    pub text: String,
    pub record: KeyRecord,
}

pub const KEY_PREFIX: &str = "tsk_";

use tessera_sandbox::identity::hex;

/// `n` random bytes as hex.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the operating system's random source works");
    hex(&b)
}

fn digest(salt: &str, secret: &str) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(secret.as_bytes());
    hex(&h.finalize())
}

/// A digest of a whole presented key, to index a cache without keeping secrets.
pub fn fingerprint(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// Makes a new key for `subject` in `tenant`.
pub fn new_key(tenant: &str, subject: &str, now: u64, expires_at: Option<u64>) -> NewKey {
    let id = random_hex(6);
    let secret = random_hex(32);
    let salt = random_hex(16);
    let hash = digest(&salt, &secret);
    NewKey {
        text: format!("{KEY_PREFIX}{id}_{secret}"),
        id,
        record: KeyRecord {
            tenant: tenant.into(),
            subject: subject.into(),
            salt,
            hash,
            created_at: now,
            expires_at,
            revoked: false,
        },
    }
}

/// Splits a presented key into (id, secret), if it has the right shape.
pub fn parse_key(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (ok(id, 12) && ok(secret, 64)).then_some((id, secret))
}

/// Whether `secret` matches the record (constant-time in the secret).
pub fn verify(record: &KeyRecord, secret: &str) -> bool {
    let got = digest(&record.salt, secret);
    let a = got.as_bytes();
    let b = record.hash.as_bytes();
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_tampering() {
        let k = new_key("t", "alice", 10, None);
        let (id, secret) = parse_key(&k.text).unwrap();
        assert_eq!(id, k.id);
        assert!(verify(&k.record, secret));
        let mut wrong = secret.to_string();
        wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
        assert!(!verify(&k.record, &wrong));
        assert!(!k.record.hash.contains(secret));
        for bad in [
            "",
            "tsk_",
            "tsk_abc_def",
            "xyz_0123456789ab_00",
            &k.text[1..],
        ] {
            assert!(parse_key(bad).is_none(), "{bad}");
        }
    }
}

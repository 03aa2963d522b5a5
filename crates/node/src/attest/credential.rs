//! TPM 2.0 `MakeCredential` in software: the verifier's half of credential
//! activation (TPM 2.0 Part 1 §24 "Credential Protection", Part 3 §12.6), as
//! Keylime's registrar does it without a TPM.
//!
//! The verifier holds the node's EK public area and the name of an AK the node
//! claims lives in the same TPM. It wraps a secret (the challenge) so that only
//! that TPM can unwrap it, and only for that AK: `TPM2_ActivateCredential`
//! recovers the secret only when the EK's private key decrypts the seed and the
//! integrity HMAC over the AK's name matches an object loaded in the TPM.
//!
//! 1. `encrypted_secret` = RSA-OAEP(EK, SHA-256, label `"IDENTITY\0"`, seed).
//! 2. `symKey` = KDFa(SHA-256, seed, `"STORAGE"`, ak_name, empty, the EK's AES key bits).
//! 3. `encIdentity` = AES-CFB(symKey, IV = 0, TPM2B_DIGEST(secret)).
//! 4. `HMACkey` = KDFa(SHA-256, seed, `"INTEGRITY"`, empty, empty, 256).
//! 5. `integrityHMAC` = HMAC-SHA-256(HMACkey, encIdentity || ak_name).
//! 6. `id_object` = TPM2B(TPM2B_DIGEST(integrityHMAC) || encIdentity).
//!
//! Pure: no I/O; the seed is an input (tests pin it). Only OAEP's own padding
//! randomness is drawn inside aws-lc. Bad input is an error, never a panic.

use aws_lc_rs::cipher::{AES_128, AES_256, EncryptingKey, EncryptionContext, UnboundCipherKey};
use aws_lc_rs::hmac;
use aws_lc_rs::iv::FixedLength;
use aws_lc_rs::rsa::{
    OAEP_SHA256_MGF1SHA256, OaepPublicEncryptingKey, PublicEncryptingKey, PublicKeyComponents,
};

use super::wire::*;

/// The digest size of SHA-256, the only EK nameAlg supported: the seed's size and
/// the largest secret the TPM accepts (Part 3 MakeCredential: `TPM_RC_SIZE`).
pub const MAX_SECRET: usize = 32;
/// The OAEP label of a credential's seed (Part 1 §24.4), NUL included.
const IDENTITY_LABEL: &[u8] = b"IDENTITY\0";
/// The magic number opening tpm2-tools' credential file (`tpm2_makecredential -o`).
const TPM2_TOOLS_MAGIC: u32 = 0xBADC_C0DE;
/// The version of tpm2-tools' credential file format.
const TPM2_TOOLS_VERSION: u32 = 1;

impl From<WireError> for CredentialError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Truncated {
                field, need, have, ..
            } => CredentialError::Truncated { field, need, have },
            WireError::Trailing { field, count, .. } => {
                CredentialError::TrailingBytes { field, count }
            }
        }
    }
}

/// Why a credential could not be made: the field at fault and the value found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("EK public: {field} is truncated: needs {need} bytes, {have} left")]
    Truncated {
        field: &'static str,
        need: usize,
        have: usize,
    },
    #[error("EK public: {count} unexpected bytes after {field}")]
    TrailingBytes { field: &'static str, count: usize },
    #[error(
        "EK public: TPMT_PUBLIC.type is {} (0x{found:04x}); only RSA (0x0001) is supported",
        alg_name(*found)
    )]
    KeyType { found: u16 },
    #[error(
        "EK public: TPMT_PUBLIC.nameAlg is {} (0x{found:04x}); only SHA-256 (0x000b) is supported",
        alg_name(*found)
    )]
    NameAlg { found: u16 },
    #[error(
        "EK public: objectAttributes 0x{found:08x} are not a storage key's (restricted and decrypt set, sign clear), which MakeCredential needs"
    )]
    Attributes { found: u32 },
    #[error(
        "EK public: TPMS_RSA_PARMS.symmetric.{field} is {} (0x{found:04x}); expected {expected}",
        alg_name(*found)
    )]
    Symmetric {
        field: &'static str,
        found: u16,
        expected: &'static str,
    },
    #[error("EK public: TPMS_RSA_PARMS.symmetric.keyBits is {found}; expected 128 or 256")]
    SymmetricKeyBits { found: u16 },
    #[error(
        "EK public: TPMS_RSA_PARMS.scheme is {} (0x{found:04x}); a storage key's is TPM_ALG_NULL (0x0010)",
        alg_name(*found)
    )]
    Scheme { found: u16 },
    #[error("EK public: TPMS_RSA_PARMS.keyBits is {found}; expected 2048, 3072 or 4096")]
    RsaKeyBits { found: u16 },
    #[error("EK public: unique (the RSA modulus) is {found} bytes; keyBits {key_bits} needs {}", key_bits / 8)]
    ModulusSize { key_bits: u16, found: usize },
    #[error(
        "EK public: aws-lc refused the RSA key (exponent {exponent}, modulus {modulus_len} bytes)"
    )]
    RsaKeyRejected { exponent: u32, modulus_len: usize },
    #[error("ak_name is {len} bytes; a name is a 2-byte hash algorithm and its digest")]
    AkNameShort { len: usize },
    #[error(
        "ak_name's hash algorithm is {} (0x{alg:04x}); expected SHA-1, SHA-256, SHA-384, SHA-512 or SM3-256",
        alg_name(*alg)
    )]
    AkNameAlg { alg: u16 },
    #[error("ak_name is {len} bytes; a {} name (0x{alg:04x}) is {expected}", alg_name(*alg))]
    AkNameLength {
        alg: u16,
        len: usize,
        expected: usize,
    },
    #[error("secret is {len} bytes; must be 1 to {MAX_SECRET} (the EK nameAlg's digest size)")]
    SecretSize { len: usize },
    #[error("{field} is {len} bytes, more than a TPM2B holds")]
    TooLarge { field: &'static str, len: usize },
    #[error("{op} failed in aws-lc")]
    Crypto { op: &'static str },
}

/// What `tpm2_makecredential` writes: the credential blob (`TPM2B_ID_OBJECT`) and
/// the encrypted seed (`TPM2B_ENCRYPTED_SECRET`), both marshalled with their
/// size prefix, and the same in tpm2-tools' file format (what
/// `tpm2_activatecredential -i FILE` reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// `TPM2B_ID_OBJECT`: u16 size, `TPM2B_DIGEST(integrityHMAC)`, `encIdentity`.
    pub id_object: Vec<u8>,
    /// `TPM2B_ENCRYPTED_SECRET`: u16 size, the OAEP ciphertext of the seed.
    pub encrypted_secret: Vec<u8>,
}

impl Credential {
    /// tpm2-tools' credential file (as tpm2-tools 5.4 writes and reads it): u32 BE
    /// magic `0xBADCC0DE`, u32 BE version 1, the `TPM2B_ID_OBJECT`, the
    /// `TPM2B_ENCRYPTED_SECRET`.
    pub fn to_tpm2_tools_file(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.id_object.len() + self.encrypted_secret.len());
        out.extend_from_slice(&TPM2_TOOLS_MAGIC.to_be_bytes());
        out.extend_from_slice(&TPM2_TOOLS_VERSION.to_be_bytes());
        out.extend_from_slice(&self.id_object);
        out.extend_from_slice(&self.encrypted_secret);
        out
    }
}

/// The parts of an EK's public area that `MakeCredential` uses, as refused or
/// accepted by [`parse_ek_public`]: an RSA storage key with nameAlg SHA-256 and
/// an AES-CFB symmetric definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EkPublic {
    /// `TPMA_OBJECT` (restricted and decrypt set, sign clear).
    pub object_attributes: u32,
    /// The AES key size of the symmetric definition (128 or 256), in bits: the
    /// size of the key that wraps the credential.
    pub aes_key_bits: u16,
    /// The RSA key size, in bits.
    pub rsa_bits: u16,
    /// The public exponent (a stored 0 is the default, 65537).
    pub exponent: u32,
    /// The modulus, big-endian, `rsa_bits / 8` bytes.
    pub modulus: Vec<u8>,
    /// The EK's name: `0x000b || SHA-256(TPMT_PUBLIC)` (what `tpm2_readpublic -n`
    /// writes).
    pub name: Vec<u8>,
}

/// Parses an EK's `TPM2B_PUBLIC` (what `tpm2_createek -u` or `tpm2_readpublic -o`
/// writes) far enough for `MakeCredential`: an RSA storage key, nameAlg SHA-256,
/// symmetric AES-128 or AES-256 in CFB mode, scheme NULL, 2048 to 4096 bits.
/// Anything else is refused with an error naming the field and the value found;
/// so are truncated input and trailing bytes.
pub fn parse_ek_public(tpm2b_public: &[u8]) -> Result<EkPublic, CredentialError> {
    let mut outer = Reader::new("EK public", tpm2b_public);
    let area = outer.tpm2b("TPM2B_PUBLIC")?;
    outer.finish("TPM2B_PUBLIC")?;
    let mut r = Reader::new("EK public", area);
    let key_type = r.u16("TPMT_PUBLIC.type")?;
    if key_type != ALG_RSA {
        return Err(CredentialError::KeyType { found: key_type });
    }
    let name_alg = r.u16("TPMT_PUBLIC.nameAlg")?;
    if name_alg != ALG_SHA256 {
        return Err(CredentialError::NameAlg { found: name_alg });
    }
    let object_attributes = check_attributes(r.u32("TPMT_PUBLIC.objectAttributes")?)?;
    r.tpm2b("TPMT_PUBLIC.authPolicy")?;
    let aes_key_bits = parse_symmetric(&mut r)?;
    parse_scheme(&mut r)?;
    let rsa_bits = check_rsa_bits(r.u16("TPMS_RSA_PARMS.keyBits")?)?;
    let exponent = match r.u32("TPMS_RSA_PARMS.exponent")? {
        0 => 65537,
        e => e,
    };
    let modulus = r.tpm2b("TPMT_PUBLIC.unique")?.to_vec();
    r.finish("TPMT_PUBLIC.unique")?;
    if modulus.len() != usize::from(rsa_bits / 8) {
        return Err(CredentialError::ModulusSize {
            key_bits: rsa_bits,
            found: modulus.len(),
        });
    }
    Ok(EkPublic {
        object_attributes,
        aes_key_bits,
        rsa_bits,
        exponent,
        modulus,
        name: sha256_name(area),
    })
}

/// Makes a credential for the TPM holding `ek_public` (its `TPM2B_PUBLIC`, see
/// [`parse_ek_public`]) and the object named `ak_name` (`0x000b || SHA-256` of
/// the AK's public area, what `tpm2_createak -n` writes): only that TPM, with an
/// object of that name loaded, recovers `secret` (1 to 32 bytes) with
/// `TPM2_ActivateCredential`. `seed` must be fresh random bytes for each
/// credential; it is an input so that tests can pin it.
pub fn make_credential(
    ek_public: &[u8],
    ak_name: &[u8],
    secret: &[u8],
    seed: &[u8; 32],
) -> Result<Credential, CredentialError> {
    let ek = parse_ek_public(ek_public)?;
    check_name(ak_name)?;
    if secret.is_empty() || secret.len() > MAX_SECRET {
        return Err(CredentialError::SecretSize { len: secret.len() });
    }
    let ciphertext = encrypt_seed(&ek, seed)?;
    Ok(Credential {
        id_object: id_object(&ek, ak_name, secret, seed)?,
        encrypted_secret: tpm2b("TPM2B_ENCRYPTED_SECRET", &ciphertext)?,
    })
}

/// The `TPM2B_ID_OBJECT` of a credential: steps 2 to 6 of the module's recipe.
fn id_object(
    ek: &EkPublic,
    ak_name: &[u8],
    secret: &[u8],
    seed: &[u8; 32],
) -> Result<Vec<u8>, CredentialError> {
    let sym_key = kdfa_sha256(
        seed,
        "STORAGE",
        ak_name,
        &[],
        usize::from(ek.aes_key_bits / 8),
    );
    let mut enc_identity = tpm2b("credential", secret)?;
    aes_cfb_encrypt(&sym_key, &mut enc_identity)?;
    let hmac_key = kdfa_sha256(seed, "INTEGRITY", &[], &[], 32);
    let integrity = hmac_sha256(&hmac_key, &[&enc_identity, ak_name]);
    let mut body = tpm2b("integrityHMAC", &integrity)?;
    body.extend_from_slice(&enc_identity);
    tpm2b("TPM2B_ID_OBJECT", &body)
}

/// KDFa (Part 1 §11.4.10.2) with HMAC-SHA-256, in counter mode: the first `len`
/// bytes of HMAC(key, u32 BE i || label || 0x00 || contextU || contextV || u32 BE
/// bits) for i = 1, 2, ….
fn kdfa_sha256(key: &[u8], label: &str, context_u: &[u8], context_v: &[u8], len: usize) -> Vec<u8> {
    let bits = u32::try_from(len.saturating_mul(8)).unwrap_or(u32::MAX);
    let hmac_key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut out = Vec::with_capacity(len + 32);
    let mut counter: u32 = 1;
    while out.len() < len {
        let mut ctx = hmac::Context::with_key(&hmac_key);
        ctx.update(&counter.to_be_bytes());
        ctx.update(label.as_bytes());
        ctx.update(&[0]);
        ctx.update(context_u);
        ctx.update(context_v);
        ctx.update(&bits.to_be_bytes());
        out.extend_from_slice(ctx.sign().as_ref());
        counter = counter.wrapping_add(1);
    }
    out.truncate(len);
    out
}

/// HMAC-SHA-256 of the concatenation of `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, key));
    for part in parts {
        ctx.update(part);
    }
    ctx.sign().as_ref().to_vec()
}

/// AES-CFB128 encryption in place with a zero IV (the credential's key is used
/// once, so the IV is fixed by the spec); the key's length picks AES-128 or -256.
fn aes_cfb_encrypt(key: &[u8], data: &mut [u8]) -> Result<(), CredentialError> {
    let failed = |_| CredentialError::Crypto {
        op: "AES-CFB encryption of the credential",
    };
    let algorithm = if key.len() == 32 { &AES_256 } else { &AES_128 };
    let key = EncryptingKey::cfb128(UnboundCipherKey::new(algorithm, key).map_err(failed)?)
        .map_err(failed)?;
    let iv = EncryptionContext::Iv128(FixedLength::from([0u8; 16]));
    key.less_safe_encrypt(data, iv).map_err(failed)?;
    Ok(())
}

/// RSA-OAEP (SHA-256, MGF1-SHA-256, label `"IDENTITY\0"`) of the seed to the EK.
fn encrypt_seed(ek: &EkPublic, seed: &[u8; 32]) -> Result<Vec<u8>, CredentialError> {
    let exponent = ek.exponent.to_be_bytes();
    let components = PublicKeyComponents {
        n: strip_leading_zeros(&ek.modulus),
        e: strip_leading_zeros(&exponent),
    };
    let rejected = |_| CredentialError::RsaKeyRejected {
        exponent: ek.exponent,
        modulus_len: ek.modulus.len(),
    };
    let key: PublicEncryptingKey = components.try_into().map_err(rejected)?;
    let key = OaepPublicEncryptingKey::new(key).map_err(rejected)?;
    let mut out = vec![0u8; key.ciphertext_size()];
    let written = key
        .encrypt(
            &OAEP_SHA256_MGF1SHA256,
            seed,
            &mut out,
            Some(IDENTITY_LABEL),
        )
        .map_err(|_| CredentialError::Crypto {
            op: "RSA-OAEP encryption of the seed",
        })?
        .len();
    out.truncate(written);
    Ok(out)
}

/// Refuses objectAttributes that are not a storage key's (restricted, decrypt,
/// not sign): the TPM refuses MakeCredential/ActivateCredential with any other.
fn check_attributes(attributes: u32) -> Result<u32, CredentialError> {
    let storage = attributes & (ATTR_RESTRICTED | ATTR_DECRYPT | ATTR_SIGN);
    if storage == ATTR_RESTRICTED | ATTR_DECRYPT {
        Ok(attributes)
    } else {
        Err(CredentialError::Attributes { found: attributes })
    }
}

/// Reads `TPMT_SYM_DEF_OBJECT` and refuses all but AES-128/256 in CFB mode;
/// returns the AES key bits.
fn parse_symmetric(r: &mut Reader<'_>) -> Result<u16, CredentialError> {
    let algorithm = r.u16("TPMS_RSA_PARMS.symmetric.algorithm")?;
    if algorithm != ALG_AES {
        return Err(CredentialError::Symmetric {
            field: "algorithm",
            found: algorithm,
            expected: "AES (0x0006)",
        });
    }
    let key_bits = r.u16("TPMS_RSA_PARMS.symmetric.keyBits")?;
    let mode = r.u16("TPMS_RSA_PARMS.symmetric.mode")?;
    if key_bits != 128 && key_bits != 256 {
        return Err(CredentialError::SymmetricKeyBits { found: key_bits });
    }
    if mode != ALG_CFB {
        return Err(CredentialError::Symmetric {
            field: "mode",
            found: mode,
            expected: "CFB (0x0043)",
        });
    }
    Ok(key_bits)
}

/// Reads `TPMT_RSA_SCHEME` and refuses all but `TPM_ALG_NULL` (a storage key has
/// no scheme; any other has details this parser does not read).
fn parse_scheme(r: &mut Reader<'_>) -> Result<(), CredentialError> {
    match r.u16("TPMS_RSA_PARMS.scheme")? {
        ALG_NULL => Ok(()),
        found => Err(CredentialError::Scheme { found }),
    }
}

/// Refuses RSA key sizes other than the TCG EK profiles' 2048, 3072 and 4096.
fn check_rsa_bits(bits: u16) -> Result<u16, CredentialError> {
    match bits {
        2048 | 3072 | 4096 => Ok(bits),
        found => Err(CredentialError::RsaKeyBits { found }),
    }
}

/// Refuses an `ak_name` that is not a digest name: a known hash algorithm's id
/// and a digest of its size.
fn check_name(name: &[u8]) -> Result<(), CredentialError> {
    let Some((alg, digest)) = name.split_first_chunk::<2>() else {
        return Err(CredentialError::AkNameShort { len: name.len() });
    };
    let alg = u16::from_be_bytes(*alg);
    let size = match alg {
        ALG_SHA1 => 20,
        ALG_SHA256 | ALG_SM3_256 => 32,
        ALG_SHA384 => 48,
        ALG_SHA512 => 64,
        _ => return Err(CredentialError::AkNameAlg { alg }),
    };
    if digest.len() == size {
        Ok(())
    } else {
        Err(CredentialError::AkNameLength {
            alg,
            len: name.len(),
            expected: size + 2,
        })
    }
}

/// `bytes` marshalled as a TPM2B: u16 BE size, then the bytes.
fn tpm2b(field: &'static str, bytes: &[u8]) -> Result<Vec<u8>, CredentialError> {
    let size = u16::try_from(bytes.len()).map_err(|_| CredentialError::TooLarge {
        field,
        len: bytes.len(),
    })?;
    let mut out = Vec::with_capacity(bytes.len() + 2);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::cipher::{DecryptingKey, DecryptionContext};
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::rsa::{KeyPair, KeySize, OaepPrivateDecryptingKey, PrivateDecryptingKey};
    use aws_lc_rs::signature::KeyPair as _;
    use proptest::prelude::*;

    /// The default EK template's objectAttributes (fixedTPM, fixedParent,
    /// sensitiveDataOrigin, adminWithPolicy, restricted, decrypt).
    const EK_ATTRIBUTES: u32 = 0x0003_00b2;
    /// The default EK template's authPolicy (PolicySecret(TPM_RH_ENDORSEMENT)).
    const EK_POLICY: &str = "837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa";

    /// The fields of an RSA `TPMT_PUBLIC`, to marshal test EKs good and bad.
    #[derive(Clone)]
    struct Area {
        key_type: u16,
        name_alg: u16,
        attributes: u32,
        sym_alg: u16,
        sym_bits: u16,
        sym_mode: u16,
        scheme: u16,
        key_bits: u16,
        exponent: u32,
        modulus: Vec<u8>,
    }

    impl Area {
        /// The default EK template (RSA 2048, SHA-256, AES-128-CFB) with `modulus`.
        fn ek(modulus: Vec<u8>) -> Self {
            Self {
                key_type: ALG_RSA,
                name_alg: ALG_SHA256,
                attributes: EK_ATTRIBUTES,
                sym_alg: ALG_AES,
                sym_bits: 128,
                sym_mode: ALG_CFB,
                scheme: ALG_NULL,
                key_bits: 2048,
                exponent: 0,
                modulus,
            }
        }

        /// This area as a `TPM2B_PUBLIC`.
        fn marshal(&self) -> Vec<u8> {
            let mut a = Vec::new();
            a.extend_from_slice(&self.key_type.to_be_bytes());
            a.extend_from_slice(&self.name_alg.to_be_bytes());
            a.extend_from_slice(&self.attributes.to_be_bytes());
            a.extend_from_slice(&tpm2b("policy", &hex(EK_POLICY)).unwrap());
            a.extend_from_slice(&self.sym_alg.to_be_bytes());
            a.extend_from_slice(&self.sym_bits.to_be_bytes());
            a.extend_from_slice(&self.sym_mode.to_be_bytes());
            a.extend_from_slice(&self.scheme.to_be_bytes());
            a.extend_from_slice(&self.key_bits.to_be_bytes());
            a.extend_from_slice(&self.exponent.to_be_bytes());
            a.extend_from_slice(&tpm2b("unique", &self.modulus).unwrap());
            tpm2b("public", &a).unwrap()
        }
    }

    /// Hex to bytes (test constants).
    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Bytes to hex (test output).
    fn to_hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// An RSA-2048 key pair standing in for the EK: the private half (for a
    /// software ActivateCredential) and the modulus.
    fn rsa_ek() -> (OaepPrivateDecryptingKey, Vec<u8>) {
        let pair = KeyPair::generate(KeySize::Rsa2048).unwrap();
        let modulus = rsa_public_key_modulus(pair.public_key().as_ref());
        let pkcs8 = pair.as_der().unwrap();
        let private = PrivateDecryptingKey::from_pkcs8(pkcs8.as_ref()).unwrap();
        (OaepPrivateDecryptingKey::new(private).unwrap(), modulus)
    }

    /// The modulus of a DER `RSAPublicKey` (SEQUENCE { INTEGER n, INTEGER e }),
    /// left-padded to 256 bytes.
    fn rsa_public_key_modulus(der: &[u8]) -> Vec<u8> {
        /// A DER header at `at`: (tag, content start, content length).
        fn header(der: &[u8], at: usize) -> (u8, usize, usize) {
            let (tag, first) = (der[at], der[at + 1]);
            if first < 0x80 {
                return (tag, at + 2, usize::from(first));
            }
            let n = usize::from(first & 0x7f);
            let len = der[at + 2..at + 2 + n]
                .iter()
                .fold(0usize, |l, &b| (l << 8) | usize::from(b));
            (tag, at + 2 + n, len)
        }
        let (seq, body, _) = header(der, 0);
        let (int, start, len) = header(der, body);
        assert_eq!((seq, int), (0x30, 0x02));
        let n = strip_leading_zeros(&der[start..start + len]);
        let mut out = vec![0u8; 256 - n.len()];
        out.extend_from_slice(n);
        out
    }

    /// TPM2_ActivateCredential in software, with the EK's private key: `None`
    /// where the TPM would refuse (integrity check failed, bad structure).
    fn activate(
        ek: &OaepPrivateDecryptingKey,
        aes_bits: u16,
        name: &[u8],
        cred: &Credential,
    ) -> Option<Vec<u8>> {
        let mut seed = vec![0u8; ek.min_output_size()];
        let seed = ek
            .decrypt(
                &OAEP_SHA256_MGF1SHA256,
                &cred.encrypted_secret[2..],
                &mut seed,
                Some(b"IDENTITY\0"),
            )
            .ok()?
            .to_vec();
        let id = Reader::new("EK public", &cred.id_object).tpm2b("id").ok()?;
        let mut r = Reader::new("EK public", id);
        let integrity = r.tpm2b("integrity").ok()?;
        let enc_identity = r.rest();
        let hmac_key = kdfa_sha256(&seed, "INTEGRITY", &[], &[], 32);
        if hmac_sha256(&hmac_key, &[enc_identity, name]) != integrity {
            return None;
        }
        let sym = kdfa_sha256(&seed, "STORAGE", name, &[], usize::from(aes_bits / 8));
        let alg = if aes_bits == 256 { &AES_256 } else { &AES_128 };
        let key = DecryptingKey::cfb128(UnboundCipherKey::new(alg, &sym).unwrap()).unwrap();
        let mut plain = enc_identity.to_vec();
        let iv = DecryptionContext::Iv128(FixedLength::from([0u8; 16]));
        let plain = key.decrypt(&mut plain, iv).ok()?;
        let mut r = Reader::new("EK public", plain);
        let secret = r.tpm2b("credential").ok()?.to_vec();
        r.finish("credential").ok()?;
        Some(secret)
    }

    /// An AK name (SHA-256) made of one repeated byte.
    fn name(byte: u8) -> Vec<u8> {
        let mut n = vec![0x00, 0x0b];
        n.extend_from_slice(&[byte; 32]);
        n
    }

    #[test]
    fn kdfa_counts_blocks_and_truncates() {
        // Two blocks for 40 bytes; the first 32 differ from the 32-byte KDF's
        // because the bit count is part of every block's input.
        let long = kdfa_sha256(b"key", "L", b"u", b"v", 40);
        let short = kdfa_sha256(b"key", "L", b"u", b"v", 32);
        assert_eq!((long.len(), short.len()), (40, 32));
        assert_ne!(long[..32], short[..]);
        let mut first = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, b"key"));
        for part in [&[0, 0, 0, 1][..], b"L\0", b"u", b"v", &256u32.to_be_bytes()] {
            first.update(part);
        }
        assert_eq!(short, first.sign().as_ref());
    }

    #[test]
    fn id_object_matches_an_independent_computation() {
        // Computed with Python's hmac/hashlib and `cryptography`'s AES-CFB from
        // the spec's recipe (seed 00..1f, name 000b||a5*32, secret below).
        let seed: [u8; 32] = std::array::from_fn(|i| i as u8);
        let secret = b"tessera challenge";
        let (_, modulus) = rsa_ek();
        let mut area = Area::ek(modulus);
        let want128 = "003500202c429e77271351e7fbbc87e6538c147050610da896f80a02bf137e8367f90f8061e9b7e63c64bba472dfe8af2bd47192ca58c7";
        let want256 = "00350020392fed27ae89dc9134229f64eff339d459ad68c4e272cdb9e3e6c92a26197ac51f713c1e3f8db1127f353308ef298442fdc765";
        let cred = make_credential(&area.marshal(), &name(0xa5), secret, &seed).unwrap();
        assert_eq!(to_hex(&cred.id_object), want128);
        area.sym_bits = 256;
        let cred = make_credential(&area.marshal(), &name(0xa5), secret, &seed).unwrap();
        assert_eq!(to_hex(&cred.id_object), want256);
    }

    #[test]
    fn software_activation_recovers_the_secret_for_that_name_only() {
        let (ek, modulus) = rsa_ek();
        for bits in [128, 256] {
            let area = Area {
                sym_bits: bits,
                ..Area::ek(modulus.clone())
            };
            let seed = [7u8; 32];
            let cred = make_credential(&area.marshal(), &name(1), b"s3cret", &seed).unwrap();
            assert_eq!(cred.encrypted_secret.len(), 2 + 256);
            assert_eq!(&cred.encrypted_secret[..2], &[0x01, 0x00]);
            assert_eq!(
                activate(&ek, bits, &name(1), &cred).as_deref(),
                Some(&b"s3cret"[..])
            );
            assert_eq!(activate(&ek, bits, &name(2), &cred), None);
            // A wrong OAEP label: the TPM's decryption of the seed fails.
            let mut out = vec![0u8; 256];
            let wrong = ek.decrypt(
                &OAEP_SHA256_MGF1SHA256,
                &cred.encrypted_secret[2..],
                &mut out,
                Some(b"IDENTITY"),
            );
            assert!(wrong.is_err());
        }
    }

    #[test]
    fn the_tpm2_tools_file_is_header_id_object_secret() {
        let (_, modulus) = rsa_ek();
        let cred =
            make_credential(&Area::ek(modulus).marshal(), &name(3), &[9; 32], &[1; 32]).unwrap();
        let file = cred.to_tpm2_tools_file();
        assert_eq!(&file[..8], &hex("badcc0de00000001")[..]);
        // id_object: 2 + (2 + 32) + (2 + 32); the secret: 2 + 256 (tpm2-tools 5.4 writes 336 bytes).
        assert_eq!(&file[8..12], &[0x00, 0x44, 0x00, 0x20]);
        assert_eq!(&file[8 + 70..8 + 72], &[0x01, 0x00]);
        assert_eq!(file.len(), 336);
        assert_eq!(file[8..8 + 70], cred.id_object[..]);
        assert_eq!(file[78..], cred.encrypted_secret[..]);
    }

    #[test]
    fn parse_reads_the_default_ek_template() {
        let (_, modulus) = rsa_ek();
        let area = Area::ek(modulus.clone());
        let ek = parse_ek_public(&area.marshal()).unwrap();
        assert_eq!(
            (
                ek.object_attributes,
                ek.aes_key_bits,
                ek.rsa_bits,
                ek.exponent
            ),
            (EK_ATTRIBUTES, 128, 2048, 65537)
        );
        assert_eq!(ek.modulus, modulus);
        assert_eq!(ek.name, sha256_name(&area.marshal()[2..]));
    }

    /// `parse_ek_public` of `area` changed by `change`, as an error message.
    fn refused(change: impl FnOnce(&mut Area)) -> String {
        let (_, modulus) = rsa_ek();
        let mut area = Area::ek(modulus);
        change(&mut area);
        parse_ek_public(&area.marshal()).unwrap_err().to_string()
    }

    /// A change to a good EK and the words its refusal must contain.
    type Case = (fn(&mut Area), &'static str);

    #[test]
    fn parse_refuses_other_keys_naming_field_and_value() {
        let cases: [Case; 9] = [
            (|a| a.key_type = ALG_ECC, "TPMT_PUBLIC.type is ECC (0x0023)"),
            (|a| a.name_alg = ALG_SHA384, "nameAlg is SHA-384 (0x000c)"),
            (
                |a| a.attributes = 0x0004_0072,
                "objectAttributes 0x00040072",
            ),
            (
                |a| a.sym_alg = ALG_SM4,
                "symmetric.algorithm is SM4 (0x0013)",
            ),
            (|a| a.sym_mode = 0x0042, "symmetric.mode is CBC (0x0042)"),
            (|a| a.sym_bits = 192, "symmetric.keyBits is 192"),
            (|a| a.scheme = 0x0017, "scheme is OAEP (0x0017)"),
            (|a| a.key_bits = 1024, "keyBits is 1024"),
            (
                |a| a.modulus.truncate(128),
                "is 128 bytes; keyBits 2048 needs 256",
            ),
        ];
        for (change, want) in cases {
            let got = refused(change);
            assert!(got.contains(want), "{got:?} lacks {want:?}");
        }
        let area = Area::ek(vec![0xff; 256]).marshal();
        let got = parse_ek_public(&area[..100]).unwrap_err().to_string();
        assert!(got.contains("TPM2B_PUBLIC is truncated"), "{got}");
        let mut longer = area.clone();
        longer.push(0);
        let got = parse_ek_public(&longer).unwrap_err().to_string();
        assert!(
            got.contains("1 unexpected bytes after TPM2B_PUBLIC"),
            "{got}"
        );
        let got = parse_ek_public(&[]).unwrap_err().to_string();
        assert!(got.contains("needs 2 bytes, 0 left"), "{got}");
    }

    #[test]
    fn make_credential_refuses_bad_names_and_secrets() {
        let (_, modulus) = rsa_ek();
        let ek = Area::ek(modulus).marshal();
        let err = |n: &[u8], s: &[u8]| make_credential(&ek, n, s, &[0; 32]).unwrap_err();
        assert_eq!(err(&[0x00], b"x"), CredentialError::AkNameShort { len: 1 });
        assert_eq!(
            err(&[0x00, 0x23, 1], b"x"),
            CredentialError::AkNameAlg { alg: 0x23 }
        );
        let got = err(&name(1)[..20], b"x").to_string();
        assert!(
            got.contains("ak_name is 20 bytes; a SHA-256 name (0x000b) is 34"),
            "{got}"
        );
        assert_eq!(err(&name(1), b""), CredentialError::SecretSize { len: 0 });
        assert_eq!(
            err(&name(1), &[0; 33]),
            CredentialError::SecretSize { len: 33 }
        );
        // An even exponent: aws-lc takes the key but its encryption fails; an
        // error either way, not a panic.
        let (_, modulus) = rsa_ek();
        let even = Area {
            exponent: 4,
            ..Area::ek(modulus)
        };
        let got = make_credential(&even.marshal(), &name(1), b"x", &[0; 32]).unwrap_err();
        assert!(
            matches!(
                got,
                CredentialError::RsaKeyRejected { exponent: 4, .. }
                    | CredentialError::Crypto { .. }
            ),
            "{got}"
        );
    }

    proptest! {
        /// Arbitrary bytes into the parser: an error or a key, never a panic.
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_ek_public(&bytes);
        }

        /// A valid EK public with bytes changed, cut or appended, and arbitrary
        /// names and secrets: an error or a credential, never a panic.
        #[test]
        fn make_credential_never_panics(
            edits in proptest::collection::vec((0usize..330, any::<u8>()), 0..4),
            cut in 0usize..340,
            name in proptest::collection::vec(any::<u8>(), 0..70),
            secret in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut ek = Area::ek(vec![0xc5; 256]).marshal();
            for (at, byte) in edits {
                if let Some(b) = ek.get_mut(at) { *b = byte; }
            }
            ek.truncate(cut.max(1));
            let _ = make_credential(&ek, &name, &secret, &[0; 32]);
        }
    }

    /// Against a real software TPM: swtpm and tpm2-tools.
    mod swtpm {
        use super::super::*;
        use super::to_hex;
        use std::net::{TcpListener, TcpStream};
        use std::path::PathBuf;
        use std::process::{Child, Command, Output, Stdio};
        use std::time::{Duration, Instant};

        /// The programs this test runs.
        const TOOLS: &[&str] = &[
            "swtpm",
            "swtpm_setup",
            "tpm2_readpublic",
            "tpm2_createak",
            "tpm2_evictcontrol",
            "tpm2_flushcontext",
            "tpm2_startauthsession",
            "tpm2_policysecret",
            "tpm2_activatecredential",
            "tpm2_makecredential",
        ];
        /// Where swtpm_setup persists the RSA EK.
        const EK_HANDLE: &str = "0x81010001";

        /// The first of [`TOOLS`] not on PATH.
        fn missing_tool() -> Option<&'static str> {
            let path = std::env::var_os("PATH").unwrap_or_default();
            TOOLS
                .iter()
                .copied()
                .find(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file()))
        }

        /// A port P with P and P + 1 free on loopback (swtpm's server and control).
        fn free_port_pair() -> u16 {
            loop {
                let a = TcpListener::bind(("127.0.0.1", 0)).unwrap();
                let p = a.local_addr().unwrap().port();
                if p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                    return p;
                }
            }
        }

        /// A manufactured swtpm in a temporary folder, killed on drop.
        struct Tpm {
            child: Child,
            dir: tempfile::TempDir,
            port: u16,
        }

        impl Drop for Tpm {
            fn drop(&mut self) {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }

        impl Tpm {
            /// Manufactures a TPM (EK persisted at 0x81010001) and serves it.
            fn start() -> Self {
                let dir = tempfile::tempdir().unwrap();
                let state = dir.path().join("state");
                std::fs::create_dir(&state).unwrap();
                let setup = Command::new("swtpm_setup")
                    .args(["--tpm2", "--createek", "--overwrite", "--tpmstate"])
                    .arg(&state)
                    .output()
                    .unwrap();
                assert!(setup.status.success(), "swtpm_setup: {setup:?}");
                for _ in 0..5 {
                    let port = free_port_pair();
                    let mut child = spawn_swtpm(&state, &dir.path().join("swtpm.log"), port);
                    if wait_ready(&mut child, port) {
                        return Tpm { child, dir, port };
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                }
                let log = std::fs::read_to_string(dir.path().join("swtpm.log")).unwrap_or_default();
                panic!("swtpm did not start in 5 tries; its log: {log}");
            }

            /// A path in the TPM's folder.
            fn path(&self, file: &str) -> PathBuf {
                self.dir.path().join(file)
            }

            /// Runs a tpm2-tools program against this TPM, in its folder.
            fn tool(&self, program: &str, args: &[&str]) -> Output {
                Command::new(program)
                    .args(args)
                    .current_dir(self.dir.path())
                    .env(
                        "TPM2TOOLS_TCTI",
                        format!("swtpm:host=127.0.0.1,port={}", self.port),
                    )
                    .output()
                    .unwrap()
            }

            /// [`Tpm::tool`], which must succeed.
            fn ok(&self, program: &str, args: &[&str]) -> Output {
                let out = self.tool(program, args);
                assert!(
                    out.status.success(),
                    "{program} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                out
            }

            /// Flushes transient objects and sessions (there is no resource
            /// manager: they would pile up across tool runs).
            fn flush(&self) {
                self.ok("tpm2_flushcontext", &["-t"]);
                self.ok("tpm2_flushcontext", &["-s"]);
            }

            /// Creates an ECC AK under the EK, persists it at `handle`; its name.
            fn create_ak(&self, handle: &str, tag: &str) -> Vec<u8> {
                let f = |ext: &str| format!("ak-{tag}.{ext}");
                self.flush();
                self.ok(
                    "tpm2_createak",
                    &[
                        "-C",
                        EK_HANDLE,
                        "-c",
                        &f("ctx"),
                        "-G",
                        "ecc",
                        "-g",
                        "sha256",
                        "-s",
                        "ecdsa",
                        "-u",
                        &f("pub"),
                        "-f",
                        "pem",
                        "-n",
                        &f("name"),
                        "-r",
                        &f("priv"),
                    ],
                );
                self.flush();
                self.ok("tpm2_evictcontrol", &["-C", "o", "-c", &f("ctx"), handle]);
                self.flush();
                std::fs::read(self.path(&f("name"))).unwrap()
            }

            /// TPM2_ActivateCredential of a tpm2-tools credential file with the
            /// AK at `ak_handle` and the EK: the secret, or the tool's stderr.
            fn activate(&self, ak_handle: &str, file: &[u8]) -> Result<Vec<u8>, String> {
                std::fs::write(self.path("cred.in"), file).unwrap();
                let _ = std::fs::remove_file(self.path("secret.out"));
                self.flush();
                self.ok(
                    "tpm2_startauthsession",
                    &["--policy-session", "-S", "s.ctx"],
                );
                self.ok("tpm2_policysecret", &["-S", "s.ctx", "-c", "e"]);
                let out = self.tool(
                    "tpm2_activatecredential",
                    &[
                        "-c",
                        ak_handle,
                        "-C",
                        EK_HANDLE,
                        "-i",
                        "cred.in",
                        "-o",
                        "secret.out",
                        "-P",
                        "session:s.ctx",
                    ],
                );
                let _ = self.tool("tpm2_flushcontext", &["s.ctx"]);
                self.flush();
                if out.status.success() {
                    Ok(std::fs::read(self.path("secret.out")).unwrap())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                }
            }
        }

        /// Serves the TPM in `state` on `port` (commands) and `port + 1` (control).
        fn spawn_swtpm(state: &std::path::Path, log: &std::path::Path, port: u16) -> Child {
            let log = std::fs::File::create(log).unwrap();
            Command::new("swtpm")
                .args(["socket", "--tpm2", "--tpmstate"])
                .arg(format!("dir={}", state.display()))
                .args(["--server", &format!("type=tcp,port={port}")])
                .args(["--ctrl", &format!("type=tcp,port={}", port + 1)])
                .args(["--flags", "not-need-init,startup-clear"])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap()
        }

        /// Waits (10 s at most) for swtpm's control port; false if it exited.
        fn wait_ready(child: &mut Child, port: u16) -> bool {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
                if TcpStream::connect(("127.0.0.1", port + 1)).is_ok() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            false
        }

        #[test]
        fn swtpm_activates_the_credential_for_its_ak_only() {
            if let Some(tool) = missing_tool() {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI is set and {tool} is not on PATH"
                );
                eprintln!(
                    "skipping swtpm_activates_the_credential_for_its_ak_only: {tool} is not on PATH"
                );
                return;
            }
            let tpm = Tpm::start();
            tpm.ok(
                "tpm2_readpublic",
                &["-c", EK_HANDLE, "-o", "ek.pub", "-n", "ek.name"],
            );
            tpm.flush();
            let ek_pub = std::fs::read(tpm.path("ek.pub")).unwrap();
            let ek = parse_ek_public(&ek_pub).unwrap();
            assert_eq!(ek.name, std::fs::read(tpm.path("ek.name")).unwrap());
            let ak1 = tpm.create_ak("0x81010002", "1");
            let ak2 = tpm.create_ak("0x81010003", "2");
            assert_ne!(ak1, ak2);
            eprintln!(
                "swtpm on port {}: EK {}, AK1 {}, AK2 {}",
                tpm.port,
                to_hex(&ek.name),
                to_hex(&ak1),
                to_hex(&ak2)
            );

            // The harness itself works: tpm2_makecredential's own file activates,
            // and ours has its layout.
            let secret = b"0123456789abcdef0123456789abcdef";
            std::fs::write(tpm.path("secret.bin"), secret).unwrap();
            tpm.ok(
                "tpm2_makecredential",
                &[
                    "-T",
                    "none",
                    "-e",
                    "ek.pub",
                    "-s",
                    "secret.bin",
                    "-n",
                    &to_hex(&ak1),
                    "-o",
                    "tools.cred",
                ],
            );
            let tools_file = std::fs::read(tpm.path("tools.cred")).unwrap();
            assert_eq!(tpm.activate("0x81010002", &tools_file).unwrap(), secret);

            let seed: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
            let ours = make_credential(&ek_pub, &ak1, secret, &seed)
                .unwrap()
                .to_tpm2_tools_file();
            assert_eq!(ours.len(), tools_file.len());
            assert_eq!(
                ours[..12],
                tools_file[..12],
                "header, id_object size, HMAC size"
            );
            assert_eq!(ours[78..80], tools_file[78..80], "encrypted secret size");
            eprintln!(
                "layout matches tpm2_makecredential: {} bytes, header {}",
                ours.len(),
                to_hex(&ours[..12])
            );

            let got = tpm
                .activate("0x81010002", &ours)
                .unwrap_or_else(|e| panic!("swtpm refused our credential: {e}"));
            assert_eq!(got, secret);
            eprintln!(
                "swtpm recovered the secret from our credential: {}",
                String::from_utf8_lossy(&got)
            );

            // Short secret too.
            let ours = make_credential(&ek_pub, &ak1, b"hi", &[3; 32])
                .unwrap()
                .to_tpm2_tools_file();
            assert_eq!(tpm.activate("0x81010002", &ours).unwrap(), b"hi");

            // Made for AK2: the TPM refuses it with AK1 (integrity), accepts it with AK2.
            let for_ak2 = make_credential(&ek_pub, &ak2, secret, &seed)
                .unwrap()
                .to_tpm2_tools_file();
            let refused = tpm.activate("0x81010002", &for_ak2).unwrap_err();
            assert!(
                refused.contains("integrity"),
                "refused, but not for integrity: {refused}"
            );
            eprintln!(
                "credential for AK2 refused with AK1: {}",
                refused
                    .lines()
                    .find(|l| l.contains("integrity"))
                    .unwrap_or("")
            );
            assert_eq!(tpm.activate("0x81010003", &for_ak2).unwrap(), secret);
        }
    }
}

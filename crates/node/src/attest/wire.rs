//! The TPM wire format both parsers read (the verifier's quote and AK, and the EK in
//! `credential`): algorithm and attribute constants, a bounds-checked big-endian
//! [`Reader`] whose errors name the structure and field, and small helpers.

/// `TPM_ALG_RSA`.
pub(crate) const ALG_RSA: u16 = 0x0001;
/// `TPM_ALG_SHA1`.
pub(crate) const ALG_SHA1: u16 = 0x0004;
/// `TPM_ALG_AES`.
pub(crate) const ALG_AES: u16 = 0x0006;
/// `TPM_ALG_KEYEDHASH`.
pub(crate) const ALG_KEYEDHASH: u16 = 0x0008;
/// `TPM_ALG_SHA256`.
pub(crate) const ALG_SHA256: u16 = 0x000B;
/// `TPM_ALG_SHA384`.
pub(crate) const ALG_SHA384: u16 = 0x000C;
/// `TPM_ALG_SHA512`.
pub(crate) const ALG_SHA512: u16 = 0x000D;
/// `TPM_ALG_NULL`.
pub(crate) const ALG_NULL: u16 = 0x0010;
/// `TPM_ALG_SM3_256`.
pub(crate) const ALG_SM3_256: u16 = 0x0012;
/// `TPM_ALG_SM4`.
pub(crate) const ALG_SM4: u16 = 0x0013;
/// `TPM_ALG_ECC`.
pub(crate) const ALG_ECC: u16 = 0x0023;
/// `TPM_ALG_SYMCIPHER`.
pub(crate) const ALG_SYMCIPHER: u16 = 0x0025;
/// `TPM_ALG_CAMELLIA`.
pub(crate) const ALG_CAMELLIA: u16 = 0x0026;
/// `TPM_ALG_CFB`.
pub(crate) const ALG_CFB: u16 = 0x0043;

/// `TPMA_OBJECT.restricted`.
pub(crate) const ATTR_RESTRICTED: u32 = 1 << 16;
/// `TPMA_OBJECT.decrypt`.
pub(crate) const ATTR_DECRYPT: u32 = 1 << 17;
/// `TPMA_OBJECT.sign`.
pub(crate) const ATTR_SIGN: u32 = 1 << 18;

/// `TPM_ALG_ECDSA`.
pub(crate) const ALG_ECDSA: u16 = 0x0018;
/// `TPM_ECC_NIST_P256`.
pub(crate) const CURVE_P256: u16 = 0x0003;
/// `TPMA_OBJECT.fixedTPM`.
pub(crate) const ATTR_FIXED_TPM: u32 = 1 << 1;
/// `TPM_GENERATED_VALUE`: the magic of every structure the TPM itself made.
pub(crate) const TPM_GENERATED: u32 = 0xff54_4347;
/// `TPM_ST_ATTEST_QUOTE`.
pub(crate) const ST_ATTEST_QUOTE: u16 = 0x8018;

/// A read past the end, or bytes left after it: in which structure (`what`), at
/// which field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    Truncated {
        what: &'static str,
        field: &'static str,
        need: usize,
        have: usize,
    },
    Trailing {
        what: &'static str,
        field: &'static str,
        count: usize,
    },
}

/// A cursor over TPM-marshalled (big-endian) bytes of structure `what`, whose reads
/// name the field they are for, so that errors say where.
pub(crate) struct Reader<'a> {
    what: &'static str,
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`, which hold a `what`.
    pub(crate) fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Self { what, rest: bytes }
    }

    /// The next `n` bytes, or `Truncated` naming `field`.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        let (head, tail) = self.rest.split_at_checked(n).ok_or(WireError::Truncated {
            what: self.what,
            field,
            need: n,
            have: self.rest.len(),
        })?;
        self.rest = tail;
        Ok(head)
    }

    /// The next byte.
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, field)?[0])
    }

    /// The next u16 (big-endian).
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        let mut b = [0u8; 2];
        b.copy_from_slice(self.take(2, field)?);
        Ok(u16::from_be_bytes(b))
    }

    /// The next u32 (big-endian).
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4, field)?);
        Ok(u32::from_be_bytes(b))
    }

    /// The next u64 (big-endian).
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_be_bytes(b))
    }

    /// The contents of the next TPM2B (u16 size, then that many bytes).
    pub(crate) fn tpm2b(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let size = self.u16(field)?;
        self.take(usize::from(size), field)
    }

    /// The bytes not read yet.
    #[cfg(test)]
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// Refuses bytes left over after `field`, the last one read.
    pub(crate) fn finish(&self, field: &'static str) -> Result<(), WireError> {
        match self.rest.len() {
            0 => Ok(()),
            count => Err(WireError::Trailing {
                what: self.what,
                field,
                count,
            }),
        }
    }
}

/// `bytes` without its leading zero bytes (aws-lc wants minimal big-endian).
pub(crate) fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// The name of a public area whose nameAlg is SHA-256: `0x000b || SHA-256(area)`.
pub(crate) fn sha256_name(area: &[u8]) -> Vec<u8> {
    let mut name = ALG_SHA256.to_be_bytes().to_vec();
    name.extend_from_slice(&super::sha256(area));
    name
}

/// The TPM's name of an algorithm id, for error messages.
pub(crate) fn alg_name(alg: u16) -> &'static str {
    match alg {
        ALG_RSA => "RSA",
        ALG_SHA1 => "SHA-1",
        ALG_AES => "AES",
        ALG_KEYEDHASH => "KEYEDHASH",
        ALG_SHA256 => "SHA-256",
        ALG_SHA384 => "SHA-384",
        ALG_SHA512 => "SHA-512",
        ALG_NULL => "NULL",
        ALG_SM3_256 => "SM3-256",
        ALG_SM4 => "SM4",
        ALG_ECC => "ECC",
        ALG_SYMCIPHER => "SYMCIPHER",
        ALG_CAMELLIA => "CAMELLIA",
        ALG_CFB => "CFB",
        0x0014 => "RSASSA",
        0x0015 => "RSAES",
        0x0016 => "RSAPSS",
        0x0017 => "OAEP",
        0x0040 => "CTR",
        0x0041 => "OFB",
        0x0042 => "CBC",
        0x0044 => "ECB",
        _ => "an unknown algorithm",
    }
}

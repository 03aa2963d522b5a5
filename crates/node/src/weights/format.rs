//! The sealed weights file: AES-256-GCM in fixed-size chunks, so a 100 GB file is
//! sealed and opened as a stream with one chunk in memory.
//!
//! ```text
//! header  32 bytes: "TESSERA-WEIGHTS1" | chunk size (u32 BE) | 12 zero bytes
//! chunk i: AES-256-GCM(data key, nonce_i, aad = header, plaintext_i) | tag (16 bytes)
//! nonce_i = i (u64 BE) | 0 0 0 | last (1 on the final chunk, else 0)
//! ```
//!
//! Every chunk but the last holds exactly the chunk size; the last (flagged in its
//! nonce, as in the STREAM construction) holds the rest, possibly nothing. A chunk
//! moved, dropped, repeated or cut off, a file truncated at a chunk boundary, bytes
//! appended after the last chunk, or a changed header all fail to open. A data key
//! seals one file only (it is made for it), so counter nonces never repeat under it.

use std::io::{self, Read, Write};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::digest;

/// The first bytes of a sealed file.
pub const MAGIC: &[u8; 16] = b"TESSERA-WEIGHTS1";
/// Header length.
pub const HEADER: usize = 32;
/// The tag after each chunk.
pub const TAG: usize = 16;
/// The chunk size files are sealed with (1 MiB: few syscalls, little memory).
pub const CHUNK: usize = 1 << 20;
/// The largest chunk size a header may name (a hostile header must not make the
/// opener allocate gigabytes).
pub const MAX_CHUNK: usize = 16 << 20;

/// A 256-bit data key, wiped when dropped.
pub struct DataKey([u8; 32]);

impl DataKey {
    /// A fresh random key.
    pub fn generate() -> DataKey {
        let mut k = [0u8; 32];
        aws_lc_rs::rand::fill(&mut k).expect("the operating system's random source works");
        DataKey(k)
    }
    pub fn from_bytes(b: [u8; 32]) -> DataKey {
        DataKey(b)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte AES-256 key"))
    }
}

impl Drop for DataKey {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(…)")
    }
}

/// Overwrites secret bytes (the zeros are observed through `black_box`, so the
/// store is not optimised away as dead).
pub fn wipe(b: &mut [u8]) {
    b.fill(0);
    std::hint::black_box(b);
}

/// Why a sealed file did not open.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "not a sealed weights file (no {} header)",
        String::from_utf8_lossy(MAGIC)
    )]
    NotSealed,
    #[error("the header names a chunk size of {0} bytes (1 to {MAX_CHUNK} allowed)")]
    BadChunk(u64),
    #[error(
        "chunk {0} does not authenticate: the file was changed, reordered or sealed under another key"
    )]
    Forged(u64),
    #[error("the file ends before its last chunk (truncated after chunk {0})")]
    Truncated(u64),
    #[error("bytes follow the last chunk")]
    Trailing,
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn nonce(i: u64, last: bool) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&i.to_be_bytes());
    n[11] = last as u8;
    Nonce::assume_unique_for_key(n)
}

fn header(chunk: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..16].copy_from_slice(MAGIC);
    h[16..20].copy_from_slice(&(chunk as u32).to_be_bytes());
    h
}

/// The sealed size of `plain` bytes under `chunk`-byte chunks.
pub fn sealed_len(plain: u64, chunk: usize) -> u64 {
    // The last chunk may be full; an empty input is one empty chunk.
    let chunks = plain.div_ceil(chunk as u64).max(1);
    HEADER as u64 + plain + chunks * TAG as u64
}

/// What sealing produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Plaintext bytes.
    pub bytes: u64,
    /// `sha256:HEX` of the plaintext (what `sha256sum` prints for the original).
    pub sha256: String,
}

/// Seals a stream as it is written: `write` the plaintext, then [`Sealer::finish`].
/// Holds one chunk.
pub struct Sealer<W: Write> {
    /// `None` only once finished.
    out: Option<W>,
    key: LessSafeKey,
    aad: [u8; HEADER],
    chunk: usize,
    buf: Vec<u8>,
    index: u64,
    bytes: u64,
    hash: digest::Context,
}

impl<W: Write> Sealer<W> {
    /// Writes the header to `out`.
    pub fn new(key: &DataKey, chunk: usize, mut out: W) -> io::Result<Sealer<W>> {
        assert!((1..=MAX_CHUNK).contains(&chunk), "chunk size {chunk}");
        let aad = header(chunk);
        out.write_all(&aad)?;
        Ok(Sealer {
            out: Some(out),
            key: key.aead(),
            aad,
            chunk,
            buf: Vec::with_capacity(chunk + TAG),
            index: 0,
            bytes: 0,
            hash: digest::Context::new(&digest::SHA256),
        })
    }

    fn emit(&mut self, last: bool) -> io::Result<()> {
        let tag = self
            .key
            .seal_in_place_separate_tag(
                nonce(self.index, last),
                Aad::from(&self.aad),
                &mut self.buf,
            )
            .map_err(|_| io::Error::other("AES-GCM seal failed"))?;
        let out = self.out.as_mut().expect("not finished");
        out.write_all(&self.buf)?;
        out.write_all(tag.as_ref())?;
        wipe(&mut self.buf);
        self.buf.clear();
        self.index += 1;
        Ok(())
    }

    /// Ends the stream: the last chunk, then the writer back and what was sealed.
    pub fn finish(mut self) -> io::Result<(W, Sealed)> {
        self.emit(true)?;
        let mut out = self.out.take().expect("not finished");
        out.flush()?;
        let sha = crate::attest::hex(self.hash.clone().finish().as_ref());
        Ok((
            out,
            Sealed {
                bytes: self.bytes,
                sha256: format!("sha256:{sha}"),
            },
        ))
    }
}

impl<W: Write> Write for Sealer<W> {
    fn write(&mut self, mut data: &[u8]) -> io::Result<usize> {
        let n = data.len();
        self.hash.update(data);
        self.bytes += n as u64;
        while !data.is_empty() {
            // A full chunk is sealed only once more data shows it is not the last.
            if self.buf.len() == self.chunk {
                self.emit(false)?;
            }
            let take = (self.chunk - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.out {
            Some(o) => o.flush(),
            None => Ok(()),
        }
    }
}

impl<W: Write> Drop for Sealer<W> {
    fn drop(&mut self) {
        wipe(&mut self.buf);
    }
}

/// Seals all of `input` into `out` (chunks of [`CHUNK`]).
pub fn seal<R: Read, W: Write>(key: &DataKey, mut input: R, out: W) -> io::Result<(W, Sealed)> {
    let mut s = Sealer::new(key, CHUNK, out)?;
    io::copy(&mut input, &mut s)?;
    s.finish()
}

/// Reads until `buf` is full or the stream ends; the bytes read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Opens a sealed stream, handing each authenticated chunk of plaintext to `sink`
/// in order (nothing unauthenticated ever reaches it; the buffer is wiped after
/// each). The plaintext bytes, once the last chunk authenticated.
pub fn open<R: Read>(
    key: &DataKey,
    mut input: R,
    mut sink: impl FnMut(&[u8]) -> io::Result<()>,
) -> Result<u64, FormatError> {
    let mut h = [0u8; HEADER];
    if fill(&mut input, &mut h)? < HEADER || &h[..16] != MAGIC || h[20..] != [0u8; 12] {
        return Err(FormatError::NotSealed);
    }
    let chunk = u32::from_be_bytes([h[16], h[17], h[18], h[19]]) as usize;
    if !(1..=MAX_CHUNK).contains(&chunk) {
        return Err(FormatError::BadChunk(chunk as u64));
    }
    let key = key.aead();
    let mut buf = vec![0u8; chunk + TAG + 1];
    let mut carry: Option<u8> = None;
    let mut index = 0u64;
    let mut total = 0u64;
    let r = loop {
        let start = match carry.take() {
            Some(b) => {
                buf[0] = b;
                1
            }
            None => 0,
        };
        // One byte past a full chunk tells whether another follows.
        let got = start + fill(&mut input, &mut buf[start..])?;
        let last = got <= chunk + TAG;
        if got < TAG {
            break Err(FormatError::Truncated(index));
        }
        let len = if last { got } else { chunk + TAG };
        if !last {
            carry = Some(buf[chunk + TAG]);
        }
        // A final chunk that is exactly full may be a middle chunk of a file cut at a
        // chunk boundary: kept to tell "truncated" from "forged" if it fails.
        let spare = (last && got == chunk + TAG).then(|| buf[..len].to_vec());
        let opened = key
            .open_in_place(nonce(index, last), Aad::from(&h), &mut buf[..len])
            .map(|p| p.len());
        match opened {
            Ok(n) => {
                total += n as u64;
                let s = sink(&buf[..n]);
                wipe(&mut buf[..len]);
                if let Err(e) = s {
                    break Err(e.into());
                }
            }
            Err(_) => {
                let cut = spare.is_some_and(|mut c| {
                    let ok = key
                        .open_in_place(nonce(index, false), Aad::from(&h), &mut c)
                        .is_ok();
                    wipe(&mut c);
                    ok
                });
                break Err(if cut {
                    FormatError::Truncated(index)
                } else {
                    FormatError::Forged(index)
                });
            }
        }
        if last {
            break Ok(total);
        }
        index += 1;
    };
    wipe(&mut buf);
    r
}

/// Opens `input` completely but keeps nothing: checks a sealed file (and measures
/// decrypt throughput).
pub fn check<R: Read>(key: &DataKey, input: R) -> Result<u64, FormatError> {
    open(key, input, |_| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sealed_with(key: &DataKey, data: &[u8], chunk: usize) -> Vec<u8> {
        let mut s = Sealer::new(key, chunk, Vec::new()).unwrap();
        // Written in uneven pieces: chunking must not depend on how data arrives.
        for part in data.chunks(7) {
            s.write_all(part).unwrap();
        }
        s.finish().unwrap().0
    }

    fn opened(key: &DataKey, sealed: &[u8]) -> Result<Vec<u8>, FormatError> {
        let mut out = Vec::new();
        open(key, sealed, |p| {
            out.extend_from_slice(p);
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn round_trip_at_chunk_edges() {
        let key = DataKey::generate();
        for len in [0, 1, 15, 16, 17, 32, 33, 100] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let s = sealed_with(&key, &data, 16);
            assert_eq!(s.len() as u64, sealed_len(len as u64, 16), "len {len}");
            assert_eq!(opened(&key, &s).unwrap(), data, "len {len}");
        }
    }

    #[test]
    fn sha256_is_of_the_plaintext() {
        let key = DataKey::generate();
        let (_, s) = seal(&key, &b"abc"[..], Vec::new()).unwrap();
        assert_eq!(
            s.sha256,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(s.bytes, 3);
    }

    #[test]
    fn truncation_at_a_chunk_boundary_is_refused() {
        let key = DataKey::generate();
        let data = vec![7u8; 64];
        let s = sealed_with(&key, &data, 16);
        // Four full chunks, the last flagged: cut after the first, second or third
        // whole chunk, the rest opens but the end is missing.
        for keep in 1..4 {
            let at = HEADER + keep * (16 + TAG);
            let e = opened(&key, &s[..at]).unwrap_err();
            assert!(matches!(e, FormatError::Truncated(_)), "keep {keep}: {e}");
        }
        // A cut inside a chunk is a forgery of that chunk.
        let e = opened(&key, &s[..s.len() - 1]).unwrap_err();
        assert!(matches!(e, FormatError::Forged(3)), "{e}");
    }

    #[test]
    fn wrong_key_trailing_bytes_and_bad_header_are_refused() {
        let key = DataKey::generate();
        let s = sealed_with(&key, b"weights", 16);
        assert!(matches!(
            opened(&DataKey::generate(), &s),
            Err(FormatError::Forged(0))
        ));
        let mut t = s.clone();
        t.push(0);
        assert!(opened(&key, &t).is_err());
        let mut h = s.clone();
        h[16..20].copy_from_slice(&(32u32).to_be_bytes());
        assert!(opened(&key, &h).is_err());
        assert!(matches!(
            opened(&key, b"plain text"),
            Err(FormatError::NotSealed)
        ));
        let mut big = s.clone();
        big[16..20].copy_from_slice(&(u32::MAX).to_be_bytes());
        assert!(matches!(opened(&key, &big), Err(FormatError::BadChunk(_))));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_data_round_trips(data in proptest::collection::vec(any::<u8>(), 0..200), chunk in 1usize..40) {
            let key = DataKey::generate();
            let s = sealed_with(&key, &data, chunk);
            prop_assert_eq!(opened(&key, &s).unwrap(), data);
        }

        /// Any change to a sealed file (one bit, a cut, chunks swapped) fails to
        /// open, and nothing of a chunk that does not authenticate reaches the sink.
        #[test]
        fn any_tamper_is_refused(
            data in proptest::collection::vec(any::<u8>(), 1..120),
            chunk in 1usize..24,
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
            cut in any::<prop::sample::Index>(),
        ) {
            let key = DataKey::generate();
            let s = sealed_with(&key, &data, chunk);
            let mut flipped = s.clone();
            let i = at.index(s.len());
            flipped[i] ^= 1 << bit;
            prop_assert!(opened(&key, &flipped).is_err());
            let c = cut.index(s.len());
            let mut got = Vec::new();
            let r = open(&key, &s[..c], |p| { got.extend_from_slice(p); Ok(()) });
            prop_assert!(r.is_err());
            prop_assert!(data.starts_with(&got), "only authentic prefix chunks are handed out");
            let n = data.len().div_ceil(chunk);
            if n >= 2 {
                let w = chunk + TAG;
                let mut swapped = s.clone();
                let (a, b) = (HEADER, HEADER + w);
                let first: Vec<u8> = swapped[a..a + w].to_vec();
                let second: Vec<u8> = swapped.get(b..b + w).unwrap_or_default().to_vec();
                if b + w <= s.len() && first != second {
                    swapped[a..a + w].copy_from_slice(&second);
                    swapped[b..b + w].copy_from_slice(&first);
                    prop_assert!(opened(&key, &swapped).is_err());
                }
            }
        }
    }
}

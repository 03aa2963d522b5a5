//! Redaction of a byte stream that arrives in chunks: [`Redactor::push`] returns the
//! bytes that are safe to release (redacted), [`Redactor::finish`] the rest. A secret
//! split across chunks is held back until it is complete, so the released stream is
//! exactly [`crate::Scanner::redact`] of the whole, and [`Redactor::findings`] says what
//! was redacted where (rule and byte range in the input, never the secret).
//!
//! How much is held back: only what could still be the start of an unfinished match —
//! a keyword hit whose rule's window reaches past the end and is not yet closed, a
//! trailing number or e-mail local part, a trailing partial keyword. Text without such
//! a tail is released at once; the most ever held is the longest rule's window
//! (a private key block, 12 KiB).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::scan::{Inner, MAX_MATCH};

/// One redaction: which rule, and where in the input stream (byte offsets of the
/// original text, not of the redacted output). Carries no secret.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Redaction {
    /// Rule id, e.g. `aws_access_key`; also the label written in the output.
    pub rule: String,
    /// `"secret"` or `"pii"`.
    pub kind: String,
    /// Offset of the first redacted byte in the input stream.
    pub offset: u64,
    /// Number of input bytes redacted.
    pub len: u64,
}

/// Bytes of already released text kept before the undecided tail, as left context
/// for the next scan (every rule looks at most 65 bytes before a match it reports).
const CONTEXT: usize = 128;
/// A released cut is moved back to the start of the word it would split, when that
/// word started at most this far back (so numbers and tokens are scanned whole).
const WORD_BACK: usize = 512;

/// A streaming redactor; see the module documentation. Made by
/// [`crate::Scanner::redactor`].
#[derive(Debug)]
pub struct Redactor {
    inner: Arc<Inner>,
    /// Released context (`buf[..ctx]`) followed by input not yet released.
    buf: Vec<u8>,
    ctx: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    /// Undecided bytes at the last scan: rescans wait for more input than this (so a
    /// trickle of tiny chunks behind a held block costs linear time, not quadratic).
    held_at_scan: usize,
    findings: Vec<Redaction>,
}

impl Redactor {
    pub(crate) fn new(inner: Arc<Inner>) -> Redactor {
        Redactor {
            inner,
            buf: Vec::new(),
            ctx: 0,
            base: 0,
            held_at_scan: 0,
            findings: Vec::new(),
        }
    }

    /// Feeds the next chunk; returns the redacted bytes that are now certain (possibly
    /// none, possibly more than `chunk`).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.buf.extend_from_slice(chunk);
        let pending = self.buf.len() - self.ctx;
        if self.held_at_scan > 0 && pending < 2 * self.held_at_scan.min(4096) {
            return Vec::new();
        }
        self.release(false)
    }

    /// Ends the stream; returns everything not released yet, redacted.
    pub fn finish(&mut self) -> Vec<u8> {
        self.release(true)
    }

    /// Every redaction so far, in stream order.
    pub fn findings(&self) -> &[Redaction] {
        &self.findings
    }

    /// Bytes received and not released yet (at most about the longest rule's window,
    /// [`crate::Scanner`]'s private-key block of 12 KiB, plus one word).
    pub fn held(&self) -> usize {
        self.buf.len() - self.ctx
    }

    /// Whether anything was redacted so far.
    pub fn redacted(&self) -> bool {
        !self.findings.is_empty()
    }

    /// One round of moving `cut` back: to the start of a match it splits, of a word it
    /// splits (when that word started at most [`WORD_BACK`] before), of a number it
    /// splits (the scanner joins digits across single spaces, dashes and dots:
    /// `4111 1111 1111 1111`).
    fn settle(&self, h: &[u8], ms: &[crate::SecretMatch], mut cut: usize) -> usize {
        for m in ms {
            if m.start < cut && cut < m.end {
                cut = m.start;
            }
        }
        if cut > self.ctx
            && cut < h.len()
            && !h[cut - 1].is_ascii_whitespace()
            && !h[cut].is_ascii_whitespace()
        {
            let floor = cut.saturating_sub(WORD_BACK).max(self.ctx);
            if let Some(ws) = h[floor..cut].iter().rposition(u8::is_ascii_whitespace) {
                cut = floor + ws + 1;
            } else if floor == self.ctx {
                cut = self.ctx;
            }
            // else: a word longer than WORD_BACK; cut inside it.
        }
        number_start(h, cut, self.ctx)
    }

    fn release(&mut self, last: bool) -> Vec<u8> {
        let h = &self.buf;
        let ms = self.inner.scan(h);
        let mut cut = if last {
            h.len()
        } else {
            undecided_from(&self.inner, h, self.ctx)
        };
        // Never cut through a match, nor (within reason) through a word or a number:
        // each move goes back, so this settles.
        if !last {
            for _ in 0..16 {
                let before = cut;
                cut = self.settle(h, &ms, cut);
                if cut == before {
                    break;
                }
            }
            if ms.iter().any(|m| m.start < cut && cut < m.end) {
                cut = self.ctx;
            }
        }
        let cut = cut.max(self.ctx);
        let mut out = Vec::with_capacity(cut - self.ctx + 64);
        let mut at = self.ctx;
        for m in ms {
            if m.end <= self.ctx || m.start >= cut {
                continue;
            }
            // A match reaching back into released context can only be a fragment
            // seen through the cut; its released part is gone, redact the rest.
            let s = m.start.max(at);
            if s >= m.end {
                continue;
            }
            out.extend_from_slice(&h[at..s]);
            out.extend_from_slice(b"[REDACTED:");
            out.extend_from_slice(m.rule.as_bytes());
            out.push(b']');
            self.findings.push(Redaction {
                rule: m.rule,
                kind: m.kind,
                offset: self.base + s as u64,
                len: (m.end - s) as u64,
            });
            at = m.end;
        }
        if at < cut {
            out.extend_from_slice(&h[at..cut]);
        }
        // Keep CONTEXT bytes of released text, then the undecided tail.
        let keep_from = cut.saturating_sub(CONTEXT);
        self.buf.drain(..keep_from);
        self.base += keep_from as u64;
        self.ctx = cut - keep_from;
        self.held_at_scan = self.buf.len() - self.ctx;
        debug_assert!(self.held_at_scan <= MAX_MATCH + WORD_BACK + 1024 || last);
        out
    }
}

/// `cut`, or the start of the number it would split (less the few bytes a match may
/// take before its first digit: `+`, an IBAN's letters).
fn number_start(h: &[u8], cut: usize, floor: usize) -> usize {
    let digit = |i: usize| h.get(i).is_some_and(u8::is_ascii_digit);
    let sep = |i: usize| h.get(i).is_some_and(|b| matches!(b, b' ' | b'-' | b'.'));
    if cut <= floor || cut >= h.len() {
        return cut;
    }
    // Joined across the cut: digit|digit, digit|sep digit, digit sep|digit.
    let joined = digit(cut) && (digit(cut - 1) || sep(cut - 1) && cut >= 2 && digit(cut - 2))
        || sep(cut) && digit(cut + 1) && digit(cut - 1);
    if !joined {
        return cut;
    }
    let mut t = cut;
    while t > floor && (digit(t - 1) || sep(t - 1) && t >= 2 && digit(t - 2)) {
        t -= 1;
        if cut - t > 256 {
            return cut;
        }
    }
    t.saturating_sub(4).max(floor)
}

fn is_ws(b: u8) -> bool {
    b.is_ascii_whitespace()
}

fn email_local(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._%+-".contains(&b)
}

/// Rules whose match may contain whitespace (`key = value` forms); every other keyword
/// rule's match is one run of non-whitespace bytes.
const SPACED: &[&str] = &["aws_secret_key", "generic_secret", "private_key"];

/// The first offset of `h` (at or after `from`) where a match could start that more
/// input might still create, extend or cancel; `h.len()` when there is none.
pub(crate) fn undecided_from(inner: &Inner, h: &[u8], from: usize) -> usize {
    let n = h.len();
    let mut hold = n;
    let mut at = |p: usize| hold = hold.min(p.max(from));
    // 1. A keyword cut in half at the end.
    for lit in &inner.lits {
        for k in (1..lit.len().min(n + 1)).rev() {
            if h[n - k..] == lit[..k] {
                at(n - k);
                break;
            }
        }
    }
    // A word at the end may go on into a keyword whose match starts before it
    // (`https://` + `hooks.slack.com/…`).
    let mut w = n;
    while w > 0 && n - w <= 24 && !is_ws(h[w - 1]) {
        w -= 1;
    }
    if w < n {
        at(w.max(n.saturating_sub(24)));
    }
    // 2. Keyword hits whose rule's window is still open.
    let max_fwd = inner
        .kw_rules
        .iter()
        .map(|r| r.fwd)
        .max()
        .unwrap_or(0)
        .max(MAX_MATCH);
    let start = n.saturating_sub(max_fwd).max(from.saturating_sub(64));
    for m in inner.pre.find_iter(&h[start..]) {
        let p = start + m.start();
        let Some(ki) = inner
            .kw_lower
            .iter()
            .position(|k| k.eq_ignore_ascii_case(m.as_bytes()))
        else {
            continue;
        };
        for &ri in &inner.kw_to_rules[ki] {
            let r = &inner.kw_rules[ri];
            let open = if r.id == "private_key" {
                // The header first; then the block runs to its END line, looked for
                // up to MAX_MATCH on.
                let head = r.re.find(&h[p..(p + r.fwd).min(n)]);
                if p + r.fwd > n && head.is_none() {
                    true
                } else if head.is_some_and(|m| m.start() == 0) {
                    p + MAX_MATCH > n
                        && crate::validate::memfind(&h[p..], b"-----END ").is_none_or(|e| {
                            crate::validate::memfind(&h[p + e + 9..], b"-----").is_none()
                        })
                } else {
                    false
                }
            } else if p + r.fwd <= n {
                false
            } else if SPACED.contains(&r.id) {
                true
            } else {
                // One run of non-whitespace: closed once whitespace (or, in a URL, a
                // quote) follows the hit.
                !h[p..].iter().any(|&b| is_ws(b) || b == b'\'' || b == b'"')
            };
            if open {
                at(p.saturating_sub(r.back));
            }
        }
    }
    // 3. A number at the end (it may go on), or one an IBAN's letters may follow.
    let num_on = inner.num.enabled.iter().any(|e| *e);
    if num_on {
        let mut t = n;
        while t > 0 && (h[t - 1].is_ascii_digit() || matches!(h[t - 1], b' ' | b'-' | b'.')) {
            t -= 1;
            if n - t > 64 {
                break;
            }
        }
        if h[t..].iter().any(u8::is_ascii_digit) {
            at(t.saturating_sub(4));
        }
        // `+` or two capitals at the very end: digits may follow (phone, IBAN).
        if n >= 1 && (h[n - 1] == b'+' || h[n - 1].is_ascii_uppercase()) {
            at(n - 1 - usize::from(n >= 2 && h[n - 2].is_ascii_uppercase()));
        }
        // IBAN: two capitals, digits, then groups of capitals and digits, up to 40
        // bytes from its first digit.
        let tail = n.saturating_sub(48);
        for ts in tail.max(2)..n {
            if h[ts].is_ascii_digit()
                && h[ts - 1].is_ascii_uppercase()
                && h[ts - 2].is_ascii_uppercase()
                && h[ts..]
                    .iter()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b' ')
            {
                at(ts - 2);
                break;
            }
        }
    }
    // 4. E-mail: an `@` whose domain may go on, or a local part an `@` may follow.
    if inner.enabled_email {
        let tail = n.saturating_sub(260);
        if let Some(a) = h[tail..].iter().rposition(|b| *b == b'@') {
            let p = tail + a;
            if h[p + 1..]
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'.' || *b == b'-')
            {
                at(p.saturating_sub(65));
            }
        }
        let mut t = n;
        while t > 0 && n - t < 64 && email_local(h[t - 1]) {
            t -= 1;
        }
        if t < n {
            at(t);
        }
    }
    hold
}

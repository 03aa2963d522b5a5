//! Validators of scan matches: boundaries, checksums (Luhn, ISO 7064 for Chinese
//! resident ids, IBAN mod-97), entropy, JWT headers, and the context rules that keep
//! numbers inside other identifiers from being cards and version strings from being
//! addresses. Each takes the haystack and the match's `[s, e)`.

use crate::scan::MAX_MATCH;

pub(crate) fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}
pub(crate) fn bounded(h: &[u8], s: usize, e: usize) -> bool {
    (s == 0 || !is_word(h[s - 1]) && h[s - 1] != b'_' && h[s - 1] != b'-')
        && (e >= h.len() || !is_word(h[e]) && h[e] != b'_')
}
/// A number standing on its own: not glued to letters, digits or an identifier's joiners
/// (`id_4111…`, `4111…-ab`, `/1.2.3.4`, `1.2.3.4.5`).
pub(crate) fn digit_bounded(h: &[u8], s: usize, e: usize) -> bool {
    let before_ok = s == 0
        || !(h[s - 1].is_ascii_alphanumeric() || matches!(h[s - 1], b'.' | b'-' | b'/' | b'_'));
    let joins = |i: usize| {
        i + 1 < h.len()
            && (matches!(h[i], b'.' | b'-') && h[i + 1].is_ascii_digit()
                || matches!(h[i], b'-' | b'_') && h[i + 1].is_ascii_alphanumeric())
    };
    let after_ok = e >= h.len() || !(h[e].is_ascii_alphanumeric() || h[e] == b'_' || joins(e));
    before_ok && after_ok
}

/// The digits at `s` are groups of an IBAN (`NL12 4111 1111 1111 1111`): two capitals
/// and two check digits, then up to two groups of four, before them.
fn inside_iban(h: &[u8], s: usize) -> bool {
    let mut p = s;
    for _ in 0..3 {
        if p < 5 || h[p - 1] != b' ' {
            return false;
        }
        let g = &h[p - 5..p - 1];
        if g[..2].iter().all(u8::is_ascii_uppercase)
            && g[2..].iter().all(u8::is_ascii_digit)
            && (p == 5 || !h[p - 6].is_ascii_alphanumeric())
        {
            return true;
        }
        if !g
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        {
            return false;
        }
        p -= 5;
    }
    false
}

/// Words that make the dotted number after them a version, not an address.
const VERSION_WORDS: &[&[u8]] = &[
    b"version",
    b"ver",
    b"v",
    b"release",
    b"rel",
    b"build",
    b"firmware",
    b"fw",
    b"kernel",
    b"tag",
    b"revision",
    b"rev",
];

/// `version 1.2.3.4`, `Version: 10.0.0.1`, `release 2.10.3.1`.
fn after_version_word(h: &[u8], s: usize) -> bool {
    let mut p = s;
    let mut seps = 0;
    while p > 0 && matches!(h[p - 1], b' ' | b':' | b'=') && seps < 3 {
        p -= 1;
        seps += 1;
    }
    if seps == 0 {
        return false;
    }
    let mut w = p;
    while w > 0 && h[w - 1].is_ascii_alphabetic() && p - w < 12 {
        w -= 1;
    }
    let word = h[w..p].to_ascii_lowercase();
    (w == 0 || !h[w - 1].is_ascii_alphanumeric()) && VERSION_WORDS.contains(&word.as_slice())
}
pub(crate) fn any_ok(_: &[u8], _: usize, _: usize) -> bool {
    true
}

pub(crate) fn entropy(v: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for &b in v {
        counts[b as usize] += 1;
    }
    let n = v.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

pub(crate) fn generic_ok(h: &[u8], s: usize, e: usize) -> bool {
    let v = &h[s..e];
    if v.len() < 12 || matches!(v[0], b'$' | b'{' | b'<' | b'%') {
        return false;
    }
    let digits = v.iter().any(u8::is_ascii_digit);
    let letters = v.iter().any(u8::is_ascii_alphabetic);
    digits && letters && entropy(v) >= 3.3 && (e >= h.len() || !is_word(h[e]))
}

pub(crate) fn dburl_ok(h: &[u8], s: usize, e: usize) -> bool {
    let v = &h[s..e];
    !(v.is_empty()
        || matches!(v[0], b'$' | b'{' | b'<' | b'%')
        || v.iter().all(|b| *b == b'*' || *b == b'x' || *b == b'X'))
}

pub(crate) fn openai_ok(h: &[u8], s: usize, e: usize) -> bool {
    let v = &h[s..e];
    !v.starts_with(b"sk-ant-")
        && bounded(h, s, e)
        && v.iter().skip(3).any(u8::is_ascii_digit)
        && v.iter().skip(3).any(u8::is_ascii_alphabetic)
        && e - s >= 40
}

pub(crate) fn jwt_ok(h: &[u8], s: usize, e: usize) -> bool {
    if !bounded(h, s, e) {
        return false;
    }
    let head = h[s..e].split(|b| *b == b'.').next().unwrap_or(b"");
    let mut buf = 0u32;
    let mut bits = 0;
    let mut out = Vec::new();
    for &c in head {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return false,
        };
        buf = (buf << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    out.starts_with(b"{") && out.windows(5).any(|w| w == b"\"alg\"")
}

/// Luhn checksum over the digits of `v`.
pub(crate) fn luhn(v: &[u8]) -> bool {
    let d: Vec<u32> = v
        .iter()
        .filter(|b| b.is_ascii_digit())
        .map(|b| (b - b'0') as u32)
        .collect();
    if d.len() < 12 {
        return false;
    }
    let mut sum = 0;
    for (i, x) in d.iter().rev().enumerate() {
        let mut y = *x;
        if i % 2 == 1 {
            y *= 2;
            if y > 9 {
                y -= 9;
            }
        }
        sum += y;
    }
    sum % 10 == 0
}

pub(crate) fn card_ok(h: &[u8], s: usize, e: usize) -> bool {
    let v = &h[s..e];
    let digits: Vec<u8> = v.iter().copied().filter(u8::is_ascii_digit).collect();
    (13..=19).contains(&digits.len())
        && matches!(digits[0], b'2'..=b'6')
        && !digits.iter().all(|d| *d == digits[0])
        && luhn(v)
        && digit_bounded(h, s, e)
        && !inside_iban(h, s)
}

/// Chinese resident identity number: 17 digits + check character (ISO 7064 MOD 11-2),
/// with a plausible birth date.
pub(crate) fn cn_id_ok_bytes(v: &[u8]) -> bool {
    if v.len() != 18 || !v[..17].iter().all(u8::is_ascii_digit) {
        return false;
    }
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    const C: &[u8; 11] = b"10X98765432";
    let sum: u32 = v[..17]
        .iter()
        .zip(W)
        .map(|(d, w)| (d - b'0') as u32 * w)
        .sum();
    let check = C[(sum % 11) as usize];
    let last = v[17].to_ascii_uppercase();
    let num = |a: usize, b: usize| {
        std::str::from_utf8(&v[a..b])
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let (y, m, d) = (num(6, 10), num(10, 12), num(12, 14));
    last == check && (1900..=2100).contains(&y) && (1..=12).contains(&m) && (1..=31).contains(&d)
}

pub(crate) fn cn_id_ok(h: &[u8], s: usize, e: usize) -> bool {
    cn_id_ok_bytes(&h[s..e]) && digit_bounded(h, s, e)
}

/// IBAN mod-97 check (spaces ignored).
pub(crate) fn iban_ok_bytes(v: &[u8]) -> bool {
    let c: Vec<u8> = v.iter().copied().filter(|b| *b != b' ').collect();
    if c.len() < 15 || c.len() > 34 {
        return false;
    }
    let mut rem: u32 = 0;
    for &b in c[4..].iter().chain(&c[..4]) {
        let val = match b {
            b'0'..=b'9' => (b - b'0') as u32,
            b'A'..=b'Z' => (b - b'A') as u32 + 10,
            _ => return false,
        };
        rem = if val >= 10 {
            (rem * 100 + val) % 97
        } else {
            (rem * 10 + val) % 97
        };
    }
    rem == 1
}

pub(crate) fn iban_ok(h: &[u8], s: usize, e: usize) -> bool {
    iban_ok_bytes(&h[s..e]) && bounded(h, s, e)
}

pub(crate) fn phone_ok(h: &[u8], s: usize, e: usize) -> bool {
    let digits = h[s..e].iter().filter(|b| b.is_ascii_digit()).count();
    (8..=15).contains(&digits) && digit_bounded(h, s, e) && (s == 0 || h[s - 1] != b'+')
}

pub(crate) fn ipv4_ok(h: &[u8], s: usize, e: usize) -> bool {
    let v = &h[s..e];
    if !digit_bounded(h, s, e)
        || v.starts_with(b"0.")
        || v.starts_with(b"127.")
        || v == b"255.255.255.255"
    {
        return false;
    }
    // Not a version string: `v10.0.0.1` is glued to its `v` (not bounded), a fifth
    // component is not bounded either, and `version 1.2.3.4` is named one.
    !after_version_word(h, s)
}

pub(crate) fn email_ok(h: &[u8], s: usize, e: usize) -> bool {
    let v = &h[s..e];
    let tld_start = v
        .iter()
        .rposition(|b| *b == b'.')
        .map(|i| i + 1)
        .unwrap_or(0);
    let tld = v[tld_start..].to_ascii_lowercase();
    let at = v.iter().position(|b| *b == b'@').unwrap_or(0);
    !matches!(
        tld.as_slice(),
        b"png" | b"jpg" | b"jpeg" | b"gif" | b"svg" | b"webp" | b"ico" | b"bmp" | b"tif" | b"tiff"
    ) && at > 0
        && v[0] != b'.'
        && v[at - 1] != b'.'
        && (s == 0 || !(is_word(h[s - 1]) || b"._%+-".contains(&h[s - 1])))
        && (e >= h.len() || !is_word(h[e]))
}

pub(crate) fn private_key_ok(_: &[u8], _: usize, _: usize) -> bool {
    true
}

pub(crate) fn phone_ok_plus(h: &[u8], s: usize, e: usize) -> bool {
    let digits = h[s..e].iter().filter(|b| b.is_ascii_digit()).count();
    (8..=15).contains(&digits)
        && (e >= h.len() || !h[e].is_ascii_alphanumeric())
        && (s == 0 || !h[s - 1].is_ascii_alphanumeric())
}

pub(crate) fn cn_mobile_ok(h: &[u8], s: usize, e: usize) -> bool {
    phone_ok(h, s, e) && h[e - 11] == b'1'
}

pub(crate) fn private_key_end(h: &[u8], header_end: usize) -> usize {
    let lim = (header_end + MAX_MATCH - 128).min(h.len());
    let hay = &h[header_end..lim];
    let Some(i) = memfind(hay, b"-----END ") else {
        return header_end;
    };
    let after = header_end + i + 9;
    let rest = &h[after..lim];
    match memfind(rest, b"-----") {
        Some(j) if j < 48 && memfind(&rest[..j], b"PRIVATE KEY").is_some() => after + j + 5,
        _ => header_end,
    }
}

pub(crate) fn memfind(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

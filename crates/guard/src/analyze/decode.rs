//! Decoders the analysis runs itself, so that hidden text is checked as what it
//! becomes: backslash escapes, `printf` formats, base64, hex, rot13; and helpers for
//! string literals in interpreter code.

/// Decodes backslash escapes (`$'…'` and `echo -e`).
pub(super) fn unescape(s: &str, echo: bool) -> String {
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'e' | b'E' => out.push(27),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                if n == 0 {
                    out.extend_from_slice(b"\\x");
                } else {
                    out.push(v as u8);
                }
            }
            b'u' | b'U' => {
                let max = if c == b'u' { 4 } else { 8 };
                let mut v = 0u32;
                let mut n = 0;
                while n < max && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                let ch = char::from_u32(v).unwrap_or('\u{fffd}');
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
            b'0'..=b'7' => {
                let mut v = (c - b'0') as u32;
                let mut n = 1;
                let max = if echo && c == b'0' { 4 } else { 3 };
                while n < max && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + (b[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'c' if echo => break,
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn printf(fmt: &str, args: &[&str]) -> Option<String> {
    let f = unescape(fmt, true);
    let mut out = String::new();
    let mut it = args.iter();
    let mut chars = f.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('s') => out.push_str(it.next().copied().unwrap_or("")),
            Some('b') => out.push_str(&unescape(it.next().copied().unwrap_or(""), true)),
            Some('c') => out.push_str(
                &it.next()
                    .copied()
                    .unwrap_or("")
                    .chars()
                    .take(1)
                    .collect::<String>(),
            ),
            _ => return None,
        }
    }
    Some(out)
}

pub(super) fn b64decode(s: &str) -> Option<String> {
    let mut buf = 0u32;
    let mut bits = 0;
    let mut out = Vec::new();
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return None,
        };
        buf = (buf << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(super) fn hexdecode(s: &str) -> Option<String> {
    let h: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !h.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::new();
    for p in h.chunks(2) {
        let hi = (p[0] as char).to_digit(16)?;
        let lo = (p[1] as char).to_digit(16)?;
        out.push((hi * 16 + lo) as u8);
    }
    String::from_utf8(out).ok()
}

pub(super) fn is_rot13(a: &str, b: &str) -> bool {
    let a = a.replace(['[', ']', '\''], "");
    let b = b.replace(['[', ']', '\''], "");
    matches!(
        (a.as_str(), b.as_str()),
        ("A-Za-z", "N-ZA-Mn-za-m")
            | ("a-zA-Z", "n-za-mN-ZA-M")
            | ("a-z", "n-za-m")
            | ("A-Z", "N-ZA-M")
    )
}

pub(super) fn rot13(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' => (((c as u8 - b'a') + 13) % 26 + b'a') as char,
            'A'..='Z' => (((c as u8 - b'A') + 13) % 26 + b'A') as char,
            _ => c,
        })
        .collect()
}

/// Byte ranges of the contents of '…' and "…" literals in interpreter code.
pub(super) fn string_literals(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() && out.len() < 64 {
        let q = b[i];
        if q == b'\'' || q == b'"' || q == b'`' {
            let s = i + 1;
            let mut j = s;
            while j < b.len() && b[j] != q {
                if b[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            if j >= b.len() {
                break;
            }
            if code.is_char_boundary(s) && code.is_char_boundary(j) {
                out.push((s, j));
            }
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

pub(super) fn shell_quote(w: &str) -> String {
    if !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%~".contains(&b))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

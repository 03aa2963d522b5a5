//! Pieces of a request to the server that several client commands build.

use serde_json::Value;

/// Percent-encodes one path segment or query value (names are checked by the
/// server; this keeps an odd one from changing the path or the query).
pub(crate) fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A JSON request body of `fields`, those that are null left out (the server's
/// defaults apply to them).
pub(crate) fn json_body(fields: Value) -> Option<(&'static str, Vec<u8>)> {
    let mut m = fields;
    if let Some(o) = m.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
    Some(("application/json", m.to_string().into_bytes()))
}

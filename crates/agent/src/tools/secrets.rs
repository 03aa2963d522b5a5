//! Tool credentials kept as secrets: write-only header values.
//!
//! A registration may give a header as `{"secret": "…"}`. The value is split off
//! before anything is stored: the tool object (which every viewer of the tenant
//! can read, and which every route renders) keeps only the mark `"<secret>"`,
//! and the values go to one `tool_secret` object per tool, which no route
//! renders. A send looks the marks up ([`ToolSecrets::headers`]) and puts the
//! values on the outgoing request only; what comes back is scrubbed of them
//! ([`ToolSecrets::scrub`]) before it reaches the ledger, the agent or a log.
//! A tool and its secrets are written together, in one commit
//! (`ToolGateway::write_tool`, behind `register` and `put`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use tessera_store::{Key, Object, Op, Store, StoreError};

use super::dispatch::Sent;
use super::spec::{CompiledTool, HeaderValue, SECRET_MARK, SpecError, Target, ToolSpec};
use super::{AdminError, ToolGateway, kind, to_value};

/// What a scrubbed secret is replaced with in results and errors.
pub const SCRUBBED: &str = "[REDACTED:tool-secret]";

/// The shortest secret accepted: a shorter one could not be scrubbed from a
/// tool's replies without mangling them.
pub const MIN_SECRET_LEN: usize = 8;

/// The secret header values of one tool (the body of its `tool_secret` object).
/// Its `Debug` shows the header names only.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSecrets {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for ToolSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSecrets")
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ToolSecrets {
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }

    /// Splits the secrets off a specification: each `{"secret": v}` header
    /// becomes the mark `"<secret>"` in the returned spec and `v` in the
    /// returned secrets; a header already given as the mark keeps its value
    /// from `stored` (what a client that read the tool sends back). A mark with
    /// no stored value is refused, naming the header.
    pub fn split(spec: ToolSpec, stored: &ToolSecrets) -> Result<(ToolSpec, Self), SpecError> {
        let mut spec = spec;
        let mut out = ToolSecrets::default();
        let headers = match &mut spec.target {
            Target::Http { headers, .. } | Target::Mcp { headers, .. } => headers,
            Target::Builtin { .. } => return Ok((spec, out)),
        };
        for (name, value) in headers.iter_mut() {
            match value {
                HeaderValue::Secret(s) => {
                    out.headers.insert(name.clone(), s.expose().to_string());
                    *value = HeaderValue::Text(SECRET_MARK.into());
                }
                HeaderValue::Text(t) if t == SECRET_MARK => {
                    let Some(kept) = stored.headers.get(name) else {
                        return Err(SpecError {
                            field: format!("target/headers/{name}"),
                            message: format!(
                                "{SECRET_MARK:?} keeps the stored secret, but this tool has none for {name:?}: give {{\"secret\": \"…\"}}"
                            ),
                        });
                    };
                    out.headers.insert(name.clone(), kept.clone());
                }
                HeaderValue::Text(_) => {}
            }
        }
        Ok((spec, out))
    }

    /// The headers of a stored specification with the marks replaced by their
    /// values, for the outgoing request only. A mark without a value (the
    /// secret object was lost) is an error naming the header.
    pub fn headers(
        &self,
        tool: &str,
        headers: &BTreeMap<String, HeaderValue>,
    ) -> Result<Vec<(String, String)>, String> {
        headers
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    HeaderValue::Text(t) if t == SECRET_MARK => {
                        self.headers.get(k).cloned().ok_or_else(|| {
                            format!(
                                "header {k:?} of tool {tool:?} is a secret with no stored value: set it again with PUT /v1/tools/{tool}"
                            )
                        })?
                    }
                    HeaderValue::Text(t) => t.clone(),
                    HeaderValue::Secret(s) => s.expose().to_string(),
                };
                Ok((k.clone(), v))
            })
            .collect()
    }

    /// These secrets and one more header value (a token minted for one send).
    pub fn with(mut self, header: &str, value: &str) -> Self {
        self.headers.insert(header.into(), value.into());
        self
    }

    /// The strings scrubbed from replies: each value, its JSON-escaped form, and
    /// the credential after an authentication scheme (`Bearer abc…` → `abc…`).
    fn needles(&self) -> Vec<String> {
        let mut out = Vec::new();
        for v in self.headers.values() {
            out.push(v.clone());
            let escaped = serde_json::to_string(v).unwrap_or_default();
            let escaped = escaped.trim_matches('"');
            if escaped != v {
                out.push(escaped.to_string());
            }
            if let Some((_, token)) = v.split_once(' ') {
                let token = token.trim();
                if token.len() >= MIN_SECRET_LEN {
                    out.push(token.to_string());
                }
            }
        }
        // Longest first, so that a value is replaced whole before its token.
        out.sort_by_key(|n| std::cmp::Reverse(n.len()));
        out.dedup();
        out
    }

    /// `sent` with every secret value removed from its result and messages.
    pub fn scrub(&self, sent: Sent) -> Sent {
        if self.headers.is_empty() {
            return sent;
        }
        let needles = self.needles();
        let text = |s: String| scrub_str(&needles, s);
        match sent {
            Sent::Ok(mut v) => {
                scrub_value(&needles, &mut v);
                Sent::Ok(v)
            }
            Sent::Failed(m) => Sent::Failed(text(m)),
            Sent::Unknown(m) => Sent::Unknown(text(m)),
            Sent::NotSent(m) => Sent::NotSent(text(m)),
        }
    }
}

fn scrub_str(needles: &[String], mut s: String) -> String {
    for n in needles {
        if s.contains(n.as_str()) {
            s = s.replace(n.as_str(), SCRUBBED);
        }
    }
    s
}

fn scrub_value(needles: &[String], v: &mut Value) {
    match v {
        Value::String(s) => *s = scrub_str(needles, std::mem::take(s)),
        Value::Array(a) => a.iter_mut().for_each(|x| scrub_value(needles, x)),
        Value::Object(m) => {
            let old = std::mem::take(m);
            for (k, mut x) in old {
                scrub_value(needles, &mut x);
                m.insert(scrub_str(needles, k), x);
            }
        }
        _ => {}
    }
}

impl<S: Store> ToolGateway<S> {
    /// Writes a tool and its secrets in one commit, each compared-and-swapped
    /// against what was read (so that a concurrent write cannot pair one
    /// request's tool with another's secrets).
    pub(super) async fn write_tool(
        &self,
        tenant: &str,
        spec: ToolSpec,
        how: Write,
    ) -> Result<Object, AdminError> {
        let c = CompiledTool::compile(spec, 0)?;
        let name = c.spec.name.clone();
        let key = Key::new(kind::TOOL, tenant, &name);
        let skey = Key::new(kind::SECRET, tenant, &name);
        let store = &self.inner.store;
        for _ in 0..16 {
            let (cur, cur_secrets) = tokio::join!(store.get(&key), store.get(&skey));
            let (cur, cur_secrets) = (cur?, cur_secrets?);
            match (&how, &cur) {
                (Write::Create, Some(_)) => {
                    return Err(AdminError::Conflict(format!(
                        "tool {name:?} already exists: PUT /v1/tools/{name} replaces it"
                    )));
                }
                (Write::Replace(Some(_)), None) => {
                    return Err(AdminError::NotFound(key.to_string()));
                }
                (Write::Replace(Some(v)), Some(o)) if o.version != *v => {
                    return Err(AdminError::Conflict(format!(
                        "{key} changed: expected version {v}, found {}: read it again and retry",
                        o.version
                    )));
                }
                _ => {}
            }
            // A new tool keeps nothing, even from a leftover secret object.
            let kept = match (&how, &cur_secrets) {
                (Write::Replace(_), Some(o)) if cur.is_some() => secrets_of(o)?,
                _ => ToolSecrets::default(),
            };
            let (spec, secrets) = ToolSecrets::split((*c.spec).clone(), &kept)?;
            let mut ops = vec![match &cur {
                Some(o) => Op::Update {
                    key: key.clone(),
                    expected: Some(o.version),
                    body: to_value(&spec),
                },
                None => Op::Create {
                    key: key.clone(),
                    body: to_value(&spec),
                },
            }];
            match (&cur_secrets, secrets.is_empty()) {
                (None, true) => {}
                (None, false) => ops.push(Op::Create {
                    key: skey.clone(),
                    body: to_value(&secrets),
                }),
                (Some(o), true) => ops.push(Op::Delete {
                    key: skey.clone(),
                    expected: Some(o.version),
                }),
                (Some(o), false) => ops.push(Op::Update {
                    key: skey.clone(),
                    expected: Some(o.version),
                    body: to_value(&secrets),
                }),
            }
            let r = store.commit(ops).await;
            self.forget_tools();
            match r {
                Ok(mut v) => return Ok(v.remove(0)),
                Err(
                    StoreError::Conflict { .. }
                    | StoreError::AlreadyExists(_)
                    | StoreError::NotFound(_),
                ) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(AdminError::Conflict(format!(
            "tool {name:?} changed under this write 16 times: retry"
        )))
    }
}

/// How [`ToolGateway::write_tool`] writes.
pub(super) enum Write {
    /// Only a tool that does not exist yet.
    Create,
    /// Replace or create; with a version, only that version.
    Replace(Option<u64>),
}

pub(super) fn secrets_of(o: &Object) -> Result<ToolSecrets, StoreError> {
    // The parse error is left out: it could quote a value.
    serde_json::from_value(o.body.clone())
        .map_err(|_| StoreError::Backend(format!("stored {} is unreadable", o.key())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> ToolSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn secrets_are_split_off_and_kept_by_the_mark() {
        let s = spec(
            json!({"name": "t", "target": {"type": "http", "url": "http://h/x",
            "headers": {"Authorization": {"secret": "Bearer sk-live-123456"}, "X-Plain": "p"}}}),
        );
        let (stored, secrets) = ToolSecrets::split(s, &ToolSecrets::default()).unwrap();
        let text = serde_json::to_string(&stored).unwrap();
        assert!(!text.contains("sk-live"), "{text}");
        assert!(text.contains(SECRET_MARK), "{text}");
        assert!(!format!("{secrets:?}").contains("sk-live"));
        // Sent back as read: the stored value is kept.
        let (_, again) = ToolSecrets::split(stored.clone(), &secrets).unwrap();
        assert_eq!(again, secrets);
        // The mark with nothing stored names the header.
        let e = ToolSecrets::split(stored, &ToolSecrets::default()).unwrap_err();
        assert_eq!(e.field, "target/headers/Authorization");
    }

    #[test]
    fn replies_are_scrubbed_of_the_value_and_its_token() {
        let s = ToolSecrets {
            headers: [("Authorization".into(), "Bearer sk-live-123456".into())].into(),
        };
        let out = s.scrub(Sent::Ok(
            json!({"echo": "Bearer sk-live-123456", "token": "sk-live-123456", "sk-live-123456": 1}),
        ));
        let text = format!("{out:?}");
        assert!(!text.contains("sk-live"), "{text}");
        let out = s.scrub(Sent::Failed("401: bad token sk-live-123456".into()));
        assert_eq!(out, Sent::Failed(format!("401: bad token {SCRUBBED}")));
    }
}

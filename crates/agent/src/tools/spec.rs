//! What a tool is: its kind (HTTP, remote MCP, built-in sandbox tool), its JSON
//! Schemas, and the traits that decide how the ledger treats it; and who may call
//! it (grants).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A tool as registered (the body of a `tool` object in the store).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or digit.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Where calls go.
    pub target: Target,
    /// JSON Schema of the arguments (an object schema). Defaults to any object.
    #[serde(default = "any_object")]
    pub input_schema: Value,
    /// JSON Schema of a successful result, checked on every result when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// The tool only reads: calling it twice changes nothing. Read-only calls are
    /// recorded but never need a write before they are sent.
    #[serde(default)]
    pub read_only: bool,
    /// The tool honours the `Idempotency-Key` header: a repeated key does not
    /// repeat the effect. After a crash such a call is re-sent with the same key;
    /// any other side-effecting call is marked in-doubt instead.
    #[serde(default)]
    pub idempotency_keys: bool,
    /// Require a human (or an operator agent) to approve each call first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
    /// Fee metered per completed call (`tool_fee` usage), in the price table's unit.
    #[serde(default)]
    pub fee: f64,
    /// How long one attempt may take, in milliseconds (default 30,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

fn any_object() -> Value {
    json!({"type": "object"})
}

/// Where a tool's calls go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Target {
    /// `POST url` with the arguments as the JSON body; the JSON reply is the result.
    Http {
        url: String,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, HeaderValue>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auth: Option<ToolAuth>,
    },
    /// A tool of a remote MCP server (Streamable HTTP), called by its remote name.
    Mcp {
        url: String,
        /// The tool's name on the remote server (default: this tool's name).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, HeaderValue>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auth: Option<ToolAuth>,
    },
    /// A tool built into Tessera that acts on the calling session's sandbox.
    Builtin { builtin: Builtin },
}

/// How a tool's calls prove who they act for, besides its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolAuth {
    /// Each call carries `Authorization: Bearer <token>`: a short-lived token the
    /// server mints (RFC 8693 token exchange) for the user who started the
    /// calling session, with this tool as its audience and the session as its
    /// actor (see [`super::Delegation`]).
    Exchange,
}

/// How a stored header value says "the secret kept apart" (and how every
/// route shows a secret header).
pub const SECRET_MARK: &str = "<secret>";

/// A header value as registered: text anyone who reads the tool sees, or a
/// secret (`{"secret": "…"}`), which is write-only. A stored tool holds only
/// text: secrets are split off before it is written (see
/// [`super::secrets::ToolSecrets::split`]) and replaced by [`SECRET_MARK`].
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    Text(String),
    Secret(Secret),
}

impl HeaderValue {
    fn as_str(&self) -> &str {
        match self {
            HeaderValue::Text(t) => t,
            HeaderValue::Secret(s) => s.expose(),
        }
    }
}

impl Serialize for HeaderValue {
    /// A secret is never written out: it serializes as [`SECRET_MARK`].
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HeaderValue::Text(t) => s.serialize_str(t),
            HeaderValue::Secret(_) => s.serialize_str(SECRET_MARK),
        }
    }
}

impl<'de> Deserialize<'de> for HeaderValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct SecretForm {
            secret: String,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Secret(SecretForm),
        }
        match Form::deserialize(d) {
            Ok(Form::Text(t)) => Ok(HeaderValue::Text(t)),
            Ok(Form::Secret(s)) => Ok(HeaderValue::Secret(Secret(s.secret))),
            Err(_) => Err(serde::de::Error::custom(
                "a header value is a string, or {\"secret\": \"…\"} for a credential (write-only)",
            )),
        }
    }
}

/// A write-only value: its `Debug` and serialized forms are [`SECRET_MARK`].
#[derive(Clone, PartialEq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(SECRET_MARK)
    }
}

/// The built-in sandbox tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Builtin {
    /// Run a command: `{"command": "sh text"}` or `{"argv": [...]}`, optional
    /// `cwd`, `stdin`, `timeout_ms`.
    Exec,
    /// `{"path"}` -> `{"content"}` (UTF-8) or `{"content_base64"}`.
    ReadFile,
    /// `{"path", "content"}`.
    WriteFile,
    /// `{"path"}` -> `{"entries": [{"name", "kind", "size"}]}`.
    ListFiles,
}

impl Builtin {
    /// The input schema the gateway uses for this built-in.
    pub fn input_schema(self) -> Value {
        match self {
            Builtin::Exec => json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "cwd": {"type": "string"},
                    "stdin": {"type": "string"},
                    "timeout_ms": {"type": "integer", "minimum": 1}
                },
                "oneOf": [{"required": ["command"]}, {"required": ["argv"]}],
                "additionalProperties": false
            }),
            Builtin::ReadFile | Builtin::ListFiles => json!({
                "type": "object",
                "properties": {"path": {"type": "string", "minLength": 1}},
                "required": ["path"],
                "additionalProperties": false
            }),
            Builtin::WriteFile => json!({
                "type": "object",
                "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}},
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    /// Whether the built-in only reads.
    pub fn read_only(self) -> bool {
        matches!(self, Builtin::ReadFile | Builtin::ListFiles)
    }
}

/// A two-phase confirm: each call waits for an approval event, denied when
/// nobody decides within `ttl_seconds`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    pub ttl_seconds: u64,
}

/// A registration problem, naming the field (a path such as
/// `input_schema/properties/n/type`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// Checks a tool name.
pub fn check_tool_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(bad(
            "name",
            format!(
                "{name:?} is not a valid tool name: use 1 to 64 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit"
            ),
        ))
    }
}

/// A registered tool with its schemas compiled.
#[derive(Debug, Clone)]
pub struct CompiledTool {
    pub spec: Arc<ToolSpec>,
    /// The store version of the tool object this was compiled from.
    pub version: u64,
    input: Arc<jsonschema::Validator>,
    output: Option<Arc<jsonschema::Validator>>,
}

/// An argument or result that does not match its schema: `path` is a JSON
/// pointer into the value (`/items/0/id`), `message` what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaViolation {
    pub path: String,
    pub message: String,
}

fn compile(field: &str, schema: &Value) -> Result<jsonschema::Validator, SpecError> {
    if !schema.is_object() {
        return Err(bad(field, "a JSON Schema here must be an object"));
    }
    if let Some(s) = schema.get("$schema") {
        const KNOWN: &[&str] = &[
            "https://json-schema.org/draft/2020-12/schema",
            "https://json-schema.org/draft/2019-09/schema",
            "http://json-schema.org/draft-07/schema#",
            "http://json-schema.org/draft-07/schema",
            "http://json-schema.org/draft-06/schema#",
            "http://json-schema.org/draft-04/schema#",
        ];
        if !s.as_str().is_some_and(|s| KNOWN.contains(&s)) {
            return Err(bad(
                format!("{field}/$schema"),
                format!(
                    "unsupported meta-schema {s}: use one of {}",
                    KNOWN.join(", ")
                ),
            ));
        }
    }
    if let Err(e) = jsonschema::meta::validate(schema) {
        return Err(bad(
            format!("{field}{}", e.instance_path()),
            format!("not a valid JSON Schema: {}", e.masked()),
        ));
    }
    jsonschema::validator_for(schema).map_err(|e| {
        let at = e.instance_path().to_string();
        bad(
            format!("{field}{at}"),
            format!("cannot use this schema: {e} (remote $ref are not fetched: inline them)"),
        )
    })
}

impl CompiledTool {
    /// Checks a specification and compiles its schemas. Errors name the field.
    pub fn compile(spec: ToolSpec, version: u64) -> Result<CompiledTool, SpecError> {
        check_tool_name(&spec.name)?;
        match &spec.target {
            Target::Http { url, headers, auth }
            | Target::Mcp {
                url, headers, auth, ..
            } => {
                if auth.is_some()
                    && headers
                        .keys()
                        .any(|k| k.eq_ignore_ascii_case("authorization"))
                {
                    return Err(bad(
                        "target/auth",
                        "auth: exchange sets the Authorization header: drop it from headers",
                    ));
                }
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(bad(
                        "target/url",
                        format!("{url:?} is not an http:// or https:// URL"),
                    ));
                }
                let Ok(parsed) = url.parse::<reqwest::Url>() else {
                    return Err(bad("target/url", format!("{url:?} is not a valid URL")));
                };
                if !parsed.username().is_empty() || parsed.password().is_some() {
                    return Err(bad(
                        "target/url",
                        "a URL with a user or password would show the credential to every viewer: give it as a secret header instead, e.g. {\"Authorization\": {\"secret\": \"Basic …\"}}",
                    ));
                }
                for (k, v) in headers {
                    let lower = k.to_ascii_lowercase();
                    if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                        || reqwest::header::HeaderValue::from_str(v.as_str()).is_err()
                    {
                        // The value is not quoted: it may be a secret.
                        return Err(bad(
                            format!("target/headers/{k}"),
                            "not a valid HTTP header name and value",
                        ));
                    }
                    if let HeaderValue::Secret(s) = v {
                        if s.expose().len() < super::secrets::MIN_SECRET_LEN
                            || s.expose() == SECRET_MARK
                        {
                            return Err(bad(
                                format!("target/headers/{k}/secret"),
                                format!(
                                    "a secret has at least {} characters (a shorter one could not be told apart in the tool's replies to scrub it)",
                                    super::secrets::MIN_SECRET_LEN
                                ),
                            ));
                        }
                    }
                    if ["idempotency-key", "content-type", "content-length", "host"]
                        .contains(&lower.as_str())
                    {
                        return Err(bad(
                            format!("target/headers/{k}"),
                            "this header is set by the gateway",
                        ));
                    }
                }
            }
            Target::Builtin { .. } => {}
        }
        if let Target::Builtin { builtin } = spec.target {
            if builtin.read_only() != spec.read_only && spec.read_only {
                return Err(bad(
                    "read_only",
                    format!("the built-in {builtin:?} changes the sandbox; it cannot be read_only"),
                ));
            }
        }
        if spec.read_only && spec.approval.is_some() {
            return Err(bad(
                "approval",
                "a read-only tool has no side effect to approve: drop approval or read_only",
            ));
        }
        if let Some(a) = &spec.approval {
            if a.ttl_seconds == 0 || a.ttl_seconds > 7 * 24 * 3600 {
                return Err(bad(
                    "approval/ttl_seconds",
                    "use 1 to 604800 seconds (7 days)",
                ));
            }
        }
        if !spec.fee.is_finite() || spec.fee < 0.0 {
            return Err(bad("fee", "use a finite number >= 0"));
        }
        if spec.timeout_ms == Some(0) {
            return Err(bad("timeout_ms", "use at least 1 millisecond"));
        }
        let schema = match spec.target {
            Target::Builtin { builtin } => builtin.input_schema(),
            _ => spec.input_schema.clone(),
        };
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(bad(
                "input_schema/type",
                "tool arguments are a JSON object: the schema needs \"type\": \"object\"",
            ));
        }
        let input = compile("input_schema", &schema)?;
        let output = match &spec.output_schema {
            Some(s) => Some(Arc::new(compile("output_schema", s)?)),
            None => None,
        };
        let mut spec = spec;
        if let Target::Builtin { builtin } = spec.target {
            spec.input_schema = schema;
            spec.read_only = builtin.read_only();
        }
        Ok(CompiledTool {
            spec: Arc::new(spec),
            version,
            input: Arc::new(input),
            output,
        })
    }

    /// Checks call arguments against the input schema.
    pub fn check_arguments(&self, args: &Value) -> Result<(), SchemaViolation> {
        first_violation(&self.input, args)
    }

    /// Checks a result against the output schema, if there is one.
    pub fn check_result(&self, result: &Value) -> Result<(), SchemaViolation> {
        match &self.output {
            Some(v) => first_violation(v, result),
            None => Ok(()),
        }
    }

    /// The timeout of one attempt.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.spec.timeout_ms.unwrap_or(30_000))
    }

    /// Whether a crash in `dispatched` can be repaired by re-sending with the same key.
    pub fn resend_safe(&self) -> bool {
        self.spec.read_only || self.spec.idempotency_keys
    }
}

fn first_violation(v: &jsonschema::Validator, value: &Value) -> Result<(), SchemaViolation> {
    match v.iter_errors(value).next() {
        None => Ok(()),
        Some(e) => {
            let path = e.instance_path().to_string();
            Err(SchemaViolation {
                path: if path.is_empty() { "/".into() } else { path },
                message: e.masked().to_string(),
            })
        }
    }
}

/// One grant: who may call a tool. A grant with a runtime admits sessions of that
/// runtime; a grant with a role admits callers holding at least that role; a grant
/// with both needs both.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// The roles of the API, lowest first.
pub const ROLES: &[&str] = &["viewer", "developer", "operator", "admin"];

fn role_rank(role: &str) -> Option<usize> {
    ROLES.iter().position(|r| *r == role)
}

impl Grant {
    /// Checks a grant as sent by a client.
    pub fn check(&self) -> Result<(), SpecError> {
        if self.runtime.is_none() && self.role.is_none() {
            return Err(bad(
                "runtime",
                "a grant names a runtime, a role, or both (a grant to everyone is not allowed)",
            ));
        }
        if let Some(r) = &self.runtime {
            if r.is_empty() || r.len() > 63 {
                return Err(bad("runtime", format!("{r:?} is not a runtime name")));
            }
        }
        if let Some(r) = &self.role {
            if role_rank(r).is_none() {
                return Err(bad(
                    "role",
                    format!("{r:?} is not a role: use one of {}", ROLES.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// Whether this grant admits a caller with `role` calling for a session of
    /// `runtime`.
    pub fn admits(&self, runtime: Option<&str>, role: &str) -> bool {
        let runtime_ok = match &self.runtime {
            None => true,
            Some(r) => runtime == Some(r.as_str()),
        };
        let role_ok = match &self.role {
            None => true,
            Some(r) => match (role_rank(role), role_rank(r)) {
                (Some(have), Some(need)) => have >= need,
                _ => false,
            },
        };
        runtime_ok && role_ok
    }
}

/// The grants of one tool (the body of a `tool_grant` object named after the tool).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Grants {
    pub grants: Vec<Grant>,
}

impl Grants {
    pub fn admits(&self, runtime: Option<&str>, role: &str) -> bool {
        self.grants.iter().any(|g| g.admits(runtime, role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: Value) -> Result<CompiledTool, SpecError> {
        let s: ToolSpec = serde_json::from_value(v).map_err(|e| bad("body", e.to_string()))?;
        CompiledTool::compile(s, 1)
    }

    #[test]
    fn invalid_schema_is_rejected_with_the_field_path() {
        let e = spec(json!({
            "name": "charge",
            "target": {"type": "http", "url": "http://127.0.0.1:1/x"},
            "input_schema": {"type": "object", "properties": {"amount": {"type": "numbr"}}}
        }))
        .unwrap_err();
        assert!(
            e.field.starts_with("input_schema/properties/amount/type"),
            "{e}"
        );
        let e = spec(json!({
            "name": "charge",
            "target": {"type": "http", "url": "http://127.0.0.1:1/x"},
            "output_schema": {"type": "object", "required": "amount"}
        }))
        .unwrap_err();
        assert_eq!(e.field, "output_schema/required", "{e}");
        let e = spec(json!({
            "name": "charge",
            "target": {"type": "http", "url": "http://127.0.0.1:1/x"},
            "input_schema": {"type": "object", "$schema": "https://example.com/mine"}
        }))
        .unwrap_err();
        assert_eq!(e.field, "input_schema/$schema", "{e}");
        let e = spec(json!({
            "name": "charge",
            "target": {"type": "http", "url": "http://127.0.0.1:1/x"},
            "input_schema": {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}
        }))
        .unwrap_err();
        assert!(e.field.starts_with("input_schema"), "{e}");
        let e = spec(json!({
            "name": "Bad Name",
            "target": {"type": "http", "url": "http://127.0.0.1:1/x"}
        }))
        .unwrap_err();
        assert_eq!(e.field, "name");
        let e =
            spec(json!({"name": "x", "target": {"type": "http", "url": "ftp://h/x"}})).unwrap_err();
        assert_eq!(e.field, "target/url");
        let e = spec(
            json!({"name": "x", "target": {"type": "http", "url": "http://h/x"},
            "input_schema": {"type": "array"}}),
        )
        .unwrap_err();
        assert_eq!(e.field, "input_schema/type");
    }

    #[test]
    fn arguments_are_checked_with_the_path() {
        let t = spec(json!({
            "name": "charge",
            "target": {"type": "http", "url": "http://127.0.0.1:1/x"},
            "input_schema": {"type": "object", "required": ["amount"],
                "properties": {"amount": {"type": "integer", "minimum": 1},
                               "items": {"type": "array", "items": {"type": "string"}}}}
        }))
        .unwrap();
        assert!(t.check_arguments(&json!({"amount": 3})).is_ok());
        let v = t
            .check_arguments(&json!({"amount": 3, "items": ["a", 4]}))
            .unwrap_err();
        assert_eq!(v.path, "/items/1");
        let v = t.check_arguments(&json!({"amount": 0})).unwrap_err();
        assert_eq!(v.path, "/amount");
        let v = t.check_arguments(&json!({})).unwrap_err();
        assert_eq!(v.path, "/");
    }

    #[test]
    fn builtins_get_their_own_schema() {
        let t = spec(json!({"name": "exec", "target": {"type": "builtin", "builtin": "exec"}}))
            .unwrap();
        assert!(t.check_arguments(&json!({"command": "ls"})).is_ok());
        assert!(t.check_arguments(&json!({"cmd": "ls"})).is_err());
        assert!(!t.spec.read_only);
        let t = spec(json!({"name": "cat", "target": {"type": "builtin", "builtin": "read_file"}}))
            .unwrap();
        assert!(t.spec.read_only);
    }

    #[test]
    fn grants_match_runtime_and_role() {
        let g = Grant {
            runtime: Some("shop".into()),
            role: None,
        };
        assert!(g.admits(Some("shop"), "viewer"));
        assert!(!g.admits(Some("other"), "admin"));
        assert!(!g.admits(None, "admin"));
        let g = Grant {
            runtime: None,
            role: Some("operator".into()),
        };
        assert!(g.admits(None, "admin"));
        assert!(g.admits(Some("x"), "operator"));
        assert!(!g.admits(Some("x"), "developer"));
        assert!(!g.admits(Some("x"), "nonsense"));
        assert!(
            Grant {
                runtime: None,
                role: None
            }
            .check()
            .is_err()
        );
        assert_eq!(
            Grant {
                runtime: None,
                role: Some("boss".into())
            }
            .check()
            .unwrap_err()
            .field,
            "role"
        );
    }
}

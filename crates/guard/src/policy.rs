//! Policies as data: the YAML format, its validation, and the compiled form checks use.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::glob::Glob;
use crate::rules::{BUILTIN_RULES, RuleKind};
use crate::types::{Decision, FileOp, PathRule, Severity};

const DEFAULT_POLICY: &str = include_str!("default-policy.yaml");

/// A policy that could not be loaded. The message names the origin, the field path
/// and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The text is not YAML of the right shape (unknown field, wrong type, bad value).
    #[error("{origin}: at `{field}`: {message}")]
    Syntax {
        /// Where the text came from (a file name).
        origin: String,
        /// Field path, e.g. `paths[2].ops[0]`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The YAML is well formed but a value is not acceptable.
    #[error("{origin}: at `{field}`: {message}")]
    Invalid {
        /// Where the text came from (a file name).
        origin: String,
        /// Field path.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
}

// ---------------------------------------------------------------- raw YAML shape

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    version: u32,
    #[serde(default)]
    decisions: BTreeMap<Severity, Decision>,
    #[serde(default)]
    rules: BTreeMap<String, RawRuleSetting>,
    #[serde(default)]
    paths: Vec<RawPathRule>,
    #[serde(default)]
    exceptions: Vec<RawException>,
    #[serde(default)]
    landlock: Option<Vec<PathRuleGrant>>,
    #[serde(default)]
    limits: Option<RawLimits>,
    #[serde(default)]
    tenants: BTreeMap<String, RawTenant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    #[serde(default)]
    decisions: BTreeMap<Severity, Decision>,
    #[serde(default)]
    rules: BTreeMap<String, RawRuleSetting>,
    #[serde(default)]
    paths: Vec<RawPathRule>,
    #[serde(default)]
    exceptions: Vec<RawException>,
    #[serde(default)]
    landlock: Option<Vec<PathRuleGrant>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuleSetting {
    enabled: Option<bool>,
    severity: Option<Severity>,
    decision: Option<Decision>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPathRule {
    id: String,
    #[serde(rename = "match")]
    matches: Vec<String>,
    #[serde(default)]
    except: Vec<String>,
    ops: Vec<FileOp>,
    severity: Severity,
    explanation: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawException {
    rule: String,
    command: Option<String>,
    path: Option<String>,
    text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathRuleGrant {
    path: String,
    access: Vec<FileOp>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_command_bytes: Option<usize>,
    max_depth: Option<usize>,
    max_work: Option<usize>,
}

// ---------------------------------------------------------------- compiled form

/// Bounds that keep every check linear and small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longer command lines are blocked unparsed (`cmd.too_complex`).
    pub max_command_bytes: usize,
    /// How deep `bash -c`, `eval`, `$( )` and decoded payloads are re-parsed.
    pub max_depth: usize,
    /// Work units (AST nodes, words, re-parsed bytes / 64) per check.
    pub max_work: usize,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RuleSetting {
    pub enabled: Option<bool>,
    pub severity: Option<Severity>,
    pub decision: Option<Decision>,
}

#[derive(Debug, Clone)]
pub(crate) struct CompiledPathRule {
    pub id: String,
    pub matches: Vec<Glob>,
    pub except: Vec<Glob>,
    pub ops: Vec<FileOp>,
    pub severity: Severity,
    pub explanation: String,
}

#[derive(Debug, Clone)]
pub(crate) enum ExceptionKind {
    Command(Glob),
    Path(Glob),
    Text(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Exception {
    pub rule: String,
    pub kind: ExceptionKind,
}

/// The settings that apply to one tenant (or to everyone).
#[derive(Debug, Clone)]
pub(crate) struct Effective {
    pub decisions: [Decision; 5],
    pub settings: BTreeMap<String, RuleSetting>,
    pub paths: Vec<CompiledPathRule>,
    pub exceptions: Vec<Exception>,
    pub landlock: Vec<PathRule>,
}

impl Effective {
    /// Severity and decision for a rule, or `None` when the rule is disabled.
    pub(crate) fn resolve(&self, rule: &str, default: Severity) -> Option<(Severity, Decision)> {
        let s = self.settings.get(rule).copied().unwrap_or_default();
        if s.enabled == Some(false) {
            return None;
        }
        let sev = s.severity.unwrap_or(default);
        let dec = s.decision.unwrap_or(self.decisions[sev.index()]);
        Some((sev, dec))
    }

    pub(crate) fn enabled(&self, rule: &str) -> bool {
        self.settings.get(rule).and_then(|s| s.enabled) != Some(false)
    }
}

/// A loaded, validated policy. Cheap to share; checks take `&Policy`.
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) base: Effective,
    pub(crate) tenants: BTreeMap<String, Effective>,
    pub(crate) limits: Limits,
    origin: String,
}

impl Default for Policy {
    /// The shipped default policy (`crates/guard/src/default-policy.yaml`).
    fn default() -> Policy {
        Policy::from_yaml(DEFAULT_POLICY, "<default policy>")
            .expect("the shipped default policy is valid (tested)")
    }
}

impl Policy {
    /// The YAML text of the shipped default policy.
    pub fn default_yaml() -> &'static str {
        DEFAULT_POLICY
    }

    /// Parses and validates a policy. `origin` names the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let de = serde_norway::Deserializer::from_str(text);
        let raw: RawPolicy = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            PolicyError::Syntax {
                origin: origin.to_string(),
                field: if field.is_empty() { ".".into() } else { field },
                message: e.into_inner().to_string(),
            }
        })?;
        compile(raw, origin)
    }

    /// Where this policy came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The bounds used by checks.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Ids of the file-access rules of the base policy, in order.
    pub fn path_rule_ids(&self) -> Vec<String> {
        self.base.paths.iter().map(|p| p.id.clone()).collect()
    }

    /// Tenants with overrides, sorted.
    pub fn tenants(&self) -> Vec<&str> {
        self.tenants.keys().map(String::as_str).collect()
    }

    pub(crate) fn effective(&self, tenant: Option<&str>) -> &Effective {
        tenant
            .and_then(|t| self.tenants.get(t))
            .unwrap_or(&self.base)
    }

    /// Landlock material for everyone: grants from `landlock:`, then one deny entry
    /// per blocking file rule (its literal path prefix, for the operations it blocks).
    pub fn landlock_rules(&self) -> Vec<PathRule> {
        self.landlock_rules_for(None)
    }

    /// Landlock material for one tenant (tenant overlays applied).
    pub fn landlock_rules_for(&self, tenant: Option<&str>) -> Vec<PathRule> {
        let eff = self.effective(tenant);
        let mut out = eff.landlock.clone();
        for r in &eff.paths {
            let Some((_, dec)) = eff.resolve(&r.id, r.severity) else {
                continue;
            };
            if dec != Decision::Block {
                continue;
            }
            for g in &r.matches {
                let prefix = g.literal_prefix();
                let path = if g.is_literal() {
                    prefix
                } else {
                    match prefix.rfind('/') {
                        Some(0) => "/".to_string(),
                        Some(i) => prefix[..i].to_string(),
                        None => continue,
                    }
                };
                if !(path.starts_with('/') || path.starts_with('~')) {
                    continue;
                }
                let rule = PathRule {
                    path,
                    access: r.ops.clone(),
                    allow: false,
                };
                if !out.contains(&rule) {
                    out.push(rule);
                }
            }
        }
        out
    }
}

fn invalid(origin: &str, field: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        origin: origin.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

fn compile(raw: RawPolicy, origin: &str) -> Result<Policy, PolicyError> {
    if raw.version != 1 {
        return Err(invalid(
            origin,
            "version",
            format!(
                "unsupported version {}; this build reads version 1",
                raw.version
            ),
        ));
    }
    let mut decisions = [
        Decision::Allow,
        Decision::Alert,
        Decision::Alert,
        Decision::Block,
        Decision::Block,
    ];
    for (sev, dec) in &raw.decisions {
        decisions[sev.index()] = *dec;
    }
    let limits = {
        let l = raw.limits.as_ref();
        let lim = Limits {
            max_command_bytes: l.and_then(|l| l.max_command_bytes).unwrap_or(16384),
            max_depth: l.and_then(|l| l.max_depth).unwrap_or(6),
            max_work: l.and_then(|l| l.max_work).unwrap_or(20000),
        };
        if !(16..=1 << 20).contains(&lim.max_command_bytes) {
            return Err(invalid(
                origin,
                "limits.max_command_bytes",
                "must be between 16 and 1048576",
            ));
        }
        if !(1..=16).contains(&lim.max_depth) {
            return Err(invalid(
                origin,
                "limits.max_depth",
                "must be between 1 and 16",
            ));
        }
        if !(100..=1_000_000).contains(&lim.max_work) {
            return Err(invalid(
                origin,
                "limits.max_work",
                "must be between 100 and 1000000",
            ));
        }
        lim
    };
    let base_paths = compile_paths(&raw.paths, "paths", origin, &[])?;
    let mut known: Vec<String> = BUILTIN_RULES.iter().map(|r| r.id.to_string()).collect();
    known.extend(base_paths.iter().map(|p| p.id.clone()));
    for t in raw.tenants.values() {
        known.extend(t.paths.iter().map(|p| p.id.clone()));
    }
    let base_settings = compile_settings(&raw.rules, "rules", origin, &known)?;
    let base_exceptions = compile_exceptions(&raw.exceptions, "exceptions", origin, &known)?;
    let base_landlock = compile_landlock(raw.landlock.as_deref(), "landlock", origin)?;
    let base = Effective {
        decisions,
        settings: base_settings,
        paths: base_paths,
        exceptions: base_exceptions,
        landlock: base_landlock,
    };
    let mut tenants = BTreeMap::new();
    for (name, t) in &raw.tenants {
        let at = format!("tenants.{name}");
        if name.is_empty() {
            return Err(invalid(
                origin,
                "tenants",
                "a tenant name must not be empty",
            ));
        }
        let mut eff = base.clone();
        for (sev, dec) in &t.decisions {
            eff.decisions[sev.index()] = *dec;
        }
        for (k, v) in compile_settings(&t.rules, &format!("{at}.rules"), origin, &known)? {
            eff.settings.insert(k, v);
        }
        let extra = compile_paths(&t.paths, &format!("{at}.paths"), origin, &[])?;
        // Tenant rules come first, so a tenant rule can take a path before the base
        // list's broader rules.
        let mut paths = extra;
        paths.extend(eff.paths);
        eff.paths = paths;
        eff.exceptions.extend(compile_exceptions(
            &t.exceptions,
            &format!("{at}.exceptions"),
            origin,
            &known,
        )?);
        if t.landlock.is_some() {
            eff.landlock =
                compile_landlock(t.landlock.as_deref(), &format!("{at}.landlock"), origin)?;
        }
        tenants.insert(name.clone(), eff);
    }
    Ok(Policy {
        base,
        tenants,
        limits,
        origin: origin.to_string(),
    })
}

fn compile_settings(
    raw: &BTreeMap<String, RawRuleSetting>,
    at: &str,
    origin: &str,
    known: &[String],
) -> Result<BTreeMap<String, RuleSetting>, PolicyError> {
    let mut out = BTreeMap::new();
    for (id, s) in raw {
        if !known.iter().any(|k| k == id) {
            return Err(invalid(
                origin,
                format!("{at}.{id}"),
                format!("unknown rule id `{id}`; run `tessera guard rules` for the list of ids"),
            ));
        }
        out.insert(
            id.clone(),
            RuleSetting {
                enabled: s.enabled,
                severity: s.severity,
                decision: s.decision,
            },
        );
    }
    Ok(out)
}

fn compile_paths(
    raw: &[RawPathRule],
    at: &str,
    origin: &str,
    _known: &[String],
) -> Result<Vec<CompiledPathRule>, PolicyError> {
    let mut out: Vec<CompiledPathRule> = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let here = format!("{at}[{i}]");
        if r.id.trim().is_empty() || r.id.contains(char::is_whitespace) {
            return Err(invalid(
                origin,
                format!("{here}.id"),
                "must be a non-empty id without spaces, e.g. `path.my_secrets`",
            ));
        }
        if BUILTIN_RULES.iter().any(|b| b.id == r.id) || out.iter().any(|o| o.id == r.id) {
            return Err(invalid(
                origin,
                format!("{here}.id"),
                format!("duplicate rule id `{}`", r.id),
            ));
        }
        if r.matches.is_empty() {
            return Err(invalid(
                origin,
                format!("{here}.match"),
                "needs at least one path glob",
            ));
        }
        if r.ops.is_empty() {
            return Err(invalid(
                origin,
                format!("{here}.ops"),
                "needs at least one of read, write, delete, exec",
            ));
        }
        if r.explanation.trim().is_empty() {
            return Err(invalid(
                origin,
                format!("{here}.explanation"),
                "must say in one line what the rule catches",
            ));
        }
        let mut matches = Vec::new();
        for (j, m) in r.matches.iter().enumerate() {
            matches.push(compile_path_glob(m, &format!("{here}.match[{j}]"), origin)?);
        }
        let mut except = Vec::new();
        for (j, m) in r.except.iter().enumerate() {
            except.push(compile_path_glob(
                m,
                &format!("{here}.except[{j}]"),
                origin,
            )?);
        }
        out.push(CompiledPathRule {
            id: r.id.clone(),
            matches,
            except,
            ops: r.ops.clone(),
            severity: r.severity,
            explanation: r.explanation.clone(),
        });
    }
    Ok(out)
}

fn compile_path_glob(p: &str, at: &str, origin: &str) -> Result<Glob, PolicyError> {
    if !(p.starts_with('/') || p.starts_with("~/") || p == "~" || p.starts_with("**/")) {
        return Err(invalid(
            origin,
            at,
            format!("path glob `{p}` must start with `/`, `~/` or `**/`"),
        ));
    }
    Glob::new(p, true).map_err(|e| invalid(origin, at, e))
}

fn compile_exceptions(
    raw: &[RawException],
    at: &str,
    origin: &str,
    known: &[String],
) -> Result<Vec<Exception>, PolicyError> {
    let mut out = Vec::new();
    for (i, e) in raw.iter().enumerate() {
        let here = format!("{at}[{i}]");
        if e.rule != "*" && !known.contains(&e.rule) {
            return Err(invalid(
                origin,
                format!("{here}.rule"),
                format!("unknown rule id `{}`; use a rule id or \"*\"", e.rule),
            ));
        }
        let kind = match (&e.command, &e.path, &e.text) {
            (Some(c), None, None) => ExceptionKind::Command(
                Glob::new(c, false).map_err(|m| invalid(origin, format!("{here}.command"), m))?,
            ),
            (None, Some(p), None) => {
                ExceptionKind::Path(compile_path_glob(p, &format!("{here}.path"), origin)?)
            }
            (None, None, Some(t)) if !t.is_empty() => ExceptionKind::Text(t.clone()),
            _ => {
                return Err(invalid(
                    origin,
                    here,
                    "give exactly one of `command`, `path` or `text` (non-empty)",
                ));
            }
        };
        if let ExceptionKind::Command(_) = kind {
            if let Some(b) = BUILTIN_RULES.iter().find(|b| b.id == e.rule) {
                if b.kind == RuleKind::Scan {
                    return Err(invalid(
                        origin,
                        format!("{here}.command"),
                        format!("`{}` is a scan rule; use `text`", e.rule),
                    ));
                }
            }
        }
        out.push(Exception {
            rule: e.rule.clone(),
            kind,
        });
    }
    Ok(out)
}

fn compile_landlock(
    raw: Option<&[PathRuleGrant]>,
    at: &str,
    origin: &str,
) -> Result<Vec<PathRule>, PolicyError> {
    let mut out = Vec::new();
    for (i, g) in raw.unwrap_or(&[]).iter().enumerate() {
        if !(g.path.starts_with('/') || g.path == "~" || g.path.starts_with("~/")) {
            return Err(invalid(
                origin,
                format!("{at}[{i}].path"),
                format!("`{}` must be absolute or start with `~`", g.path),
            ));
        }
        if crate::glob::has_glob_chars(&g.path) {
            return Err(invalid(
                origin,
                format!("{at}[{i}].path"),
                "Landlock grants take plain paths, not globs",
            ));
        }
        if g.access.is_empty() {
            return Err(invalid(
                origin,
                format!("{at}[{i}].access"),
                "needs at least one operation",
            ));
        }
        out.push(PathRule {
            path: g.path.clone(),
            access: g.access.clone(),
            allow: true,
        });
    }
    Ok(out)
}

//! The vocabulary every part of the guard shares: decisions, severities, findings.

use serde::{Deserialize, Serialize};

/// What the caller should do. Ordered `Allow < Alert < Block`, so the decision for a
/// command is the maximum over its findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Run it; nothing to report.
    Allow,
    /// Run it, and record the findings for a person to look at.
    Alert,
    /// Do not run it.
    Block,
}

impl Decision {
    /// The lowercase name used in YAML and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Alert => "alert",
            Decision::Block => "block",
        }
    }
}

/// How bad a finding is. The policy maps each severity to a [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing, not worth an alert.
    Info,
    /// Unusual; often legitimate.
    Low,
    /// Risky; a person should look.
    Medium,
    /// Damaging or leaking if it runs.
    High,
    /// Destroys the machine or hands it to someone else.
    Critical,
}

impl Severity {
    /// All severities, lowest first.
    pub const ALL: [Severity; 5] = [
        Severity::Info,
        Severity::Low,
        Severity::Medium,
        Severity::High,
        Severity::Critical,
    ];

    /// The lowercase name used in YAML and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One thing the guard found in a command line or a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Rule id, e.g. `cmd.delete_root` or `path.ssh_private_key`.
    pub rule: String,
    /// Severity after policy overrides.
    pub severity: Severity,
    /// Byte offsets `[start, end)` in the checked command line (or path) that the
    /// finding concerns.
    pub span: (usize, usize),
    /// One line a person understands.
    pub explanation: String,
}

/// The outcome of a check: the decision and the findings behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The strongest decision over all findings; `Allow` when there are none.
    pub decision: Decision,
    /// Findings in the order of their span start, then rule id.
    pub findings: Vec<Finding>,
}

impl Verdict {
    /// A verdict with no findings.
    pub fn allow() -> Verdict {
        Verdict {
            decision: Decision::Allow,
            findings: Vec::new(),
        }
    }
}

/// A file operation, for file-access rules and Landlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileOp {
    /// Open for reading, or list.
    Read,
    /// Create, write, truncate, change mode or owner.
    Write,
    /// Unlink, remove a directory, rename away.
    Delete,
    /// Execute, or source as a script.
    Exec,
}

impl FileOp {
    /// The lowercase name used in YAML, JSON and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            FileOp::Read => "read",
            FileOp::Write => "write",
            FileOp::Delete => "delete",
            FileOp::Exec => "exec",
        }
    }

    /// Parses `read|write|delete|exec`.
    pub fn parse(s: &str) -> Option<FileOp> {
        match s {
            "read" => Some(FileOp::Read),
            "write" => Some(FileOp::Write),
            "delete" => Some(FileOp::Delete),
            "exec" => Some(FileOp::Exec),
            _ => None,
        }
    }
}

/// One rule a sandbox can turn into Landlock: `allow: true` grants `access` beneath
/// `path`; `allow: false` names a path the policy blocks for `access`, which the
/// sandbox must keep outside every granted hierarchy (Landlock cannot deny beneath a
/// grant) or check itself. A leading `~` stands for the sandbox user's home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRule {
    /// An absolute path, or one starting with `~/`.
    pub path: String,
    /// Operations granted or denied.
    pub access: Vec<FileOp>,
    /// Grant (`true`) or deny (`false`).
    pub allow: bool,
}

/// A secret or a piece of personal data found by the [`crate::Scanner`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SecretMatch {
    /// `"secret"` or `"pii"`.
    pub kind: String,
    /// Rule id, e.g. `aws_access_key`, `cn_resident_id`; also the redaction label.
    pub rule: String,
    /// Byte offset of the first byte.
    pub start: usize,
    /// Byte offset one past the last byte.
    pub end: usize,
}

//! The catalogue of built-in rules, and how raw findings become a [`Verdict`].

use crate::types::{Decision, Finding, Severity, Verdict};

/// What a built-in rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// Command analysis (`check_command`, `check_argv`).
    Command,
    /// Secret / personal-data scanning (`Scanner`).
    Scan,
}

/// One built-in rule.
#[derive(Debug, Clone, Copy)]
pub struct RuleInfo {
    /// Stable id.
    pub id: &'static str,
    /// Command or scan rule.
    pub kind: RuleKind,
    /// Severity unless the policy overrides it.
    pub severity: Severity,
    /// One line: what it catches.
    pub summary: &'static str,
}

const fn c(id: &'static str, severity: Severity, summary: &'static str) -> RuleInfo {
    RuleInfo {
        id,
        kind: RuleKind::Command,
        severity,
        summary,
    }
}
const fn s(id: &'static str, severity: Severity, summary: &'static str) -> RuleInfo {
    RuleInfo {
        id,
        kind: RuleKind::Scan,
        severity,
        summary,
    }
}

use Severity::{Critical, High, Low, Medium};

/// Every built-in rule. File-access rules (`path.*`) come from the policy file.
pub const BUILTIN_RULES: &[RuleInfo] = &[
    c(
        "cmd.delete_root",
        Critical,
        "recursive deletion or moving away of the root, home or a system directory",
    ),
    c(
        "cmd.delete_maybe_root",
        Medium,
        "recursive deletion of a path that becomes / or a system directory when a variable is empty",
    ),
    c(
        "cmd.disk_destroy",
        Critical,
        "filesystem or disk destruction: mkfs, dd or redirection onto a block device, shred, wipefs",
    ),
    c(
        "cmd.chmod_system",
        High,
        "recursive or world-writable permission / ownership change on system paths, setuid on system programs",
    ),
    c(
        "cmd.fork_bomb",
        Critical,
        "a fork bomb: a function or program that spawns itself without bound",
    ),
    c(
        "cmd.download_exec",
        High,
        "downloaded content executed directly (curl | sh, bash <(wget ...), download then run)",
    ),
    c(
        "cmd.decode_exec",
        High,
        "hidden (encoded) text decoded and run as a program",
    ),
    c(
        "cmd.reverse_shell",
        Critical,
        "a shell wired to a network connection (/dev/tcp, nc -e, socat exec, interpreter one-liners)",
    ),
    c(
        "cmd.cloud_metadata",
        High,
        "access to a cloud metadata endpoint that hands out instance credentials",
    ),
    c(
        "cmd.history_tamper",
        High,
        "clearing or disabling shell history",
    ),
    c(
        "cmd.audit_tamper",
        High,
        "disabling audit, SELinux or AppArmor",
    ),
    c(
        "cmd.firewall_tamper",
        High,
        "flushing or disabling firewall rules",
    ),
    c(
        "cmd.cron_tamper",
        High,
        "installing or removing crontabs (persistence)",
    ),
    c("cmd.kill_all", Critical, "killing init or every process"),
    c(
        "cmd.shutdown",
        High,
        "shutting down or rebooting the machine",
    ),
    c(
        "cmd.crypto_miner",
        High,
        "running a cryptocurrency miner or connecting to a mining pool",
    ),
    c(
        "cmd.preload_env",
        Medium,
        "LD_PRELOAD set to inject a library into programs",
    ),
    c(
        "cmd.dynamic_command",
        Low,
        "command name or evaluated text only known at run time",
    ),
    c(
        "cmd.parse_error",
        Medium,
        "the command line could not be parsed as shell; checked word by word instead",
    ),
    c(
        "cmd.too_complex",
        High,
        "the command line exceeds the guard's size, depth or work limits",
    ),
    s("aws_access_key", High, "AWS access key id"),
    s(
        "aws_secret_key",
        High,
        "AWS secret access key next to its name",
    ),
    s("private_key", Critical, "PEM / OpenSSH private key block"),
    s(
        "github_token",
        High,
        "GitHub token (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
    ),
    s(
        "gitlab_token",
        High,
        "GitLab personal access token (glpat-)",
    ),
    s("slack_token", High, "Slack token (xoxb-, xoxp-, ...)"),
    s("slack_webhook", High, "Slack incoming webhook URL"),
    s("stripe_key", High, "Stripe secret or restricted key"),
    s("google_api_key", High, "Google API key (AIza...)"),
    s("openai_key", High, "OpenAI API key (sk-...)"),
    s("anthropic_key", High, "Anthropic API key (sk-ant-...)"),
    s("huggingface_token", High, "Hugging Face token (hf_...)"),
    s("npm_token", High, "npm token (npm_...)"),
    s("pypi_token", High, "PyPI upload token"),
    s("sendgrid_key", High, "SendGrid API key"),
    s("jwt", Medium, "JSON Web Token"),
    s("database_url", High, "database URL with a password"),
    s(
        "generic_secret",
        Medium,
        "high-entropy value assigned to a key-like name (password, token, secret, api_key)",
    ),
    s("email", Low, "e-mail address"),
    s(
        "phone",
        Low,
        "phone number (international +CC or Chinese mobile)",
    ),
    s("bank_card", High, "payment card number (Luhn-valid)"),
    s(
        "cn_resident_id",
        High,
        "Chinese resident identity number (checksum-valid)",
    ),
    s("iban", Medium, "IBAN (mod-97 valid)"),
    s("ipv4", Low, "IPv4 address"),
];

/// Looks up a built-in rule.
pub fn builtin(id: &str) -> Option<&'static RuleInfo> {
    BUILTIN_RULES.iter().find(|r| r.id == id)
}

/// Orders, de-duplicates and aggregates raw findings.
pub(crate) fn finish(mut raw: Vec<(Finding, Decision)>) -> Verdict {
    raw.sort_by(|a, b| {
        (a.0.span.0, &a.0.rule, a.0.span.1).cmp(&(b.0.span.0, &b.0.rule, b.0.span.1))
    });
    raw.dedup_by(|a, b| a.0.rule == b.0.rule && a.0.span == b.0.span);
    let decision = raw.iter().map(|(_, d)| *d).max().unwrap_or(Decision::Allow);
    Verdict {
        decision,
        findings: raw.into_iter().map(|(f, _)| f).collect(),
    }
}

//! `tessera guard …`: check a command line, scan text for secrets, check a path.
//!
//! Exit status: 0 allow or alert, 3 block (`check` and `path`), 2 bad input
//! (unreadable file, invalid policy, bad flag), 1 failure at run time. `scan` exits
//! 0 whether or not it finds anything (the findings are the data).

use std::io::Read;

use clap::{Args, Subcommand};
use serde::Serialize;
use tessera_guard::{Decision, FileOp, Policy, Scanner, Verdict};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

/// Exit status when the verdict is `block`.
pub const EXIT_BLOCK: i32 = 3;

#[derive(Debug, Subcommand)]
pub enum GuardCommand {
    /// Check a shell command line: exit 0 allow/alert, 3 block, 2 bad input.
    Check(CheckArgs),
    /// Scan a file (or stdin) for secrets and personal data.
    Scan(ScanArgs),
    /// Check one file operation against the file-access rules.
    Path(PathArgs),
    /// List the built-in rules and the policy's file rules.
    Rules(RulesArgs),
}

/// The policy file and tenant that `check`, `scan` and `path` share.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Policy YAML file (default: the shipped policy).
    #[arg(long)]
    pub policy: Option<std::path::PathBuf>,
    /// Tenant whose overrides apply.
    #[arg(long)]
    pub tenant: Option<String>,
}

impl PolicyArgs {
    /// The policy, with the tenant checked to exist in it.
    fn load(&self) -> Result<Policy, i32> {
        let policy = load_policy(self.policy.as_deref())?;
        check_tenant(&policy, self.tenant.as_deref())?;
        Ok(policy)
    }

    fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The command line (quote it as one argument, after `--`).
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the input with every finding replaced by `[REDACTED:<rule>]`.
    #[arg(long, conflicts_with = "json")]
    pub redact: bool,
    /// File to scan; `-` or nothing for stdin.
    pub file: Option<String>,
}

#[derive(Debug, Args)]
pub struct PathArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Operation: read, write, delete or exec.
    #[arg(long, value_parser = ["read", "write", "delete", "exec"])]
    pub op: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The path.
    pub path: String,
}

#[derive(Debug, Args)]
pub struct RulesArgs {
    /// Policy YAML file (default: the shipped policy).
    #[arg(long)]
    pub policy: Option<std::path::PathBuf>,
    /// Print the shipped default policy YAML instead.
    #[arg(long)]
    pub default_policy: bool,
}

pub fn run(c: GuardCommand) -> i32 {
    match c {
        GuardCommand::Check(a) => check(a),
        GuardCommand::Scan(a) => scan(a),
        GuardCommand::Path(a) => path(a),
        GuardCommand::Rules(a) => rules(a),
    }
}

fn load_policy(p: Option<&std::path::Path>) -> Result<Policy, i32> {
    let Some(p) = p else {
        return Ok(Policy::default());
    };
    let text = std::fs::read_to_string(p).map_err(|e| {
        fail(
            EXIT_BAD_INPUT,
            format!(
                "cannot read policy file {}: {e}; pass an existing YAML file to --policy",
                p.display()
            ),
        )
    })?;
    Policy::from_yaml(&text, &p.display().to_string()).map_err(|e| {
        fail(
            EXIT_BAD_INPUT,
            format!("{e}; see docs/guard.md for the policy format"),
        )
    })
}

fn check_tenant(policy: &Policy, tenant: Option<&str>) -> Result<(), i32> {
    match tenant {
        Some(t) if !policy.tenants().contains(&t) => Err(fail(
            EXIT_BAD_INPUT,
            format!(
                "--tenant {t}: no such tenant in policy {}; tenants: {:?}",
                policy.origin(),
                policy.tenants()
            ),
        )),
        _ => Ok(()),
    }
}

#[derive(Serialize)]
struct JsonFinding<'a> {
    rule: &'a str,
    severity: &'a str,
    span: [usize; 2],
    explanation: &'a str,
}

#[derive(Serialize)]
struct JsonVerdict<'a> {
    decision: &'a str,
    findings: Vec<JsonFinding<'a>>,
}

fn render(v: &Verdict, subject: &str, json: bool) -> i32 {
    if json {
        let j = JsonVerdict {
            decision: v.decision.as_str(),
            findings: v
                .findings
                .iter()
                .map(|f| JsonFinding {
                    rule: &f.rule,
                    severity: f.severity.as_str(),
                    span: [f.span.0, f.span.1],
                    explanation: &f.explanation,
                })
                .collect(),
        };
        let code = print_json(&j);
        if code != 0 {
            return code;
        }
    } else {
        println!("{}", v.decision.as_str());
        for f in &v.findings {
            let part = subject.get(f.span.0..f.span.1).unwrap_or("");
            println!(
                "  {} [{}] {}..{} `{}`: {}",
                f.rule,
                f.severity.as_str(),
                f.span.0,
                f.span.1,
                part,
                f.explanation
            );
        }
    }
    if v.decision == Decision::Block {
        EXIT_BLOCK
    } else {
        0
    }
}

fn check(a: CheckArgs) -> i32 {
    let policy = match a.policy.load() {
        Ok(p) => p,
        Err(c) => return c,
    };
    let line = a.command.join(" ");
    if line.trim().is_empty() {
        return fail(
            EXIT_BAD_INPUT,
            "the command line is empty; pass it after `--`, e.g. tessera guard check -- 'rm -rf ./build'",
        );
    }
    let v = tessera_guard::check_command(&policy, a.policy.tenant(), &line);
    render(&v, &line, a.json)
}

fn path(a: PathArgs) -> i32 {
    let policy = match a.policy.load() {
        Ok(p) => p,
        Err(c) => return c,
    };
    let Some(op) = FileOp::parse(&a.op) else {
        return fail(
            EXIT_BAD_INPUT,
            format!("--op {}: use read, write, delete or exec", a.op),
        );
    };
    if a.path.is_empty() {
        return fail(EXIT_BAD_INPUT, "the path is empty");
    }
    let v = tessera_guard::check_path(&policy, a.policy.tenant(), op, &a.path);
    render(&v, &a.path, a.json)
}

#[derive(Serialize)]
struct JsonScan<'a> {
    findings: &'a [tessera_guard::SecretMatch],
}

fn scan(a: ScanArgs) -> i32 {
    let policy = match a.policy.load() {
        Ok(p) => p,
        Err(c) => return c,
    };
    let mut data = Vec::new();
    let res = match a.file.as_deref() {
        None | Some("-") => std::io::stdin().read_to_end(&mut data).map(|_| ()),
        Some(f) => std::fs::read(f).map(|d| data = d),
    };
    if let Err(e) = res {
        return fail(
            EXIT_BAD_INPUT,
            format!(
                "cannot read {}: {e}; pass a readable file or `-` for stdin",
                a.file.as_deref().unwrap_or("stdin")
            ),
        );
    }
    let scanner = Scanner::for_tenant(&policy, a.policy.tenant());
    if a.redact {
        use std::io::Write;
        let out = scanner.redact(&data);
        return match std::io::stdout().write_all(&out) {
            Ok(()) => 0,
            // `… | head`: the reader has what it wanted.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
            Err(e) => fail(EXIT_FAILURE, format!("cannot write stdout: {e}")),
        };
    }
    let ms = scanner.scan(&data);
    if a.json {
        return print_json(&JsonScan { findings: &ms });
    }
    for m in &ms {
        println!("{}\t{}\t{}..{}", m.kind, m.rule, m.start, m.end);
    }
    if ms.is_empty() {
        eprintln!("no secrets or personal data found");
    }
    0
}

fn rules(a: RulesArgs) -> i32 {
    if a.default_policy {
        print!("{}", Policy::default_yaml());
        return 0;
    }
    if let Err(c) = load_policy(a.policy.as_deref()) {
        return c;
    }
    for r in tessera_guard::BUILTIN_RULES {
        let kind = match r.kind {
            tessera_guard::RuleKind::Command => "command",
            tessera_guard::RuleKind::Scan => "scan",
        };
        println!(
            "{:<22} {:<8} {:<9} {}",
            r.id,
            kind,
            r.severity.as_str(),
            r.summary
        );
    }
    0
}

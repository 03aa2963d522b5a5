//! `tessera-guard`: runtime protection for commands a model wrote.
//!
//! Three checks, all pure (no I/O, no clock, no randomness) and bounded in time:
//!
//! * [`check_command`] / [`check_argv`]: parse a command line as bash, walk every
//!   command that would run (pipelines, lists, subshells, `$( )`, `bash -c`, `eval`,
//!   wrappers such as `sudo`/`env`/`xargs`/`find -exec`), and apply command rules
//!   (`cmd.*`) and file-access rules (`path.*`) to what each one does.
//! * [`check_path`]: one file operation against the file-access rules.
//! * [`Scanner`]: secrets and personal data in text or byte streams, with redaction.
//!
//! Rules and decisions come from a [`Policy`] (YAML; [`Policy::default`] is shipped).
//! The guard does not know about processes, sandboxes or files on disk: the caller
//! reads files and applies the verdict.

mod analyze;
mod glob;
mod paths;
mod policy;
mod rules;
mod scan;
mod types;

pub use glob::Glob;
pub use paths::{check_path, normalize};
pub use policy::{Limits, Policy, PolicyError};
pub use rules::{BUILTIN_RULES, RuleInfo, RuleKind, builtin};
pub use scan::{ScanStream, Scanner};
pub use types::{Decision, FileOp, Finding, PathRule, SecretMatch, Severity, Verdict};

/// Checks one shell command line. Never panics; lines over the policy's size or work
/// limits are blocked as `cmd.too_complex` rather than parsed.
pub fn check_command(policy: &Policy, tenant: Option<&str>, cmdline: &str) -> Verdict {
    check_command_counted(policy, tenant, cmdline).0
}

/// [`check_command`], also returning the work units spent (bounded by
/// `limits.max_work`; used by the property tests to show the work stays linear).
#[doc(hidden)]
pub fn check_command_counted(
    policy: &Policy,
    tenant: Option<&str>,
    cmdline: &str,
) -> (Verdict, usize) {
    let eff = policy.effective(tenant);
    let limits = policy.limits();
    let mut a = analyze::Analyzer::new(eff, limits, cmdline);
    if cmdline.len() > limits.max_command_bytes {
        a.emit(
            "cmd.too_complex",
            (0, cmdline.len()),
            format!(
                "command line is {} bytes, over the limit of {}",
                cmdline.len(),
                limits.max_command_bytes
            ),
        );
    } else {
        a.analyze_text(cmdline, analyze::Map::Offset(0), 0);
    }
    let work = a.work();
    (rules::finish(a.out), work)
}

/// Checks a program about to be executed with this argv (an `execve`): no shell
/// parsing, no expansion; `argv[0]` may be a path. Spans are byte offsets in the
/// arguments joined by single spaces.
pub fn check_argv(policy: &Policy, tenant: Option<&str>, argv: &[String]) -> Verdict {
    let eff = policy.effective(tenant);
    let limits = policy.limits();
    let joined = argv.join(" ");
    let mut a = analyze::Analyzer::new(eff, limits, &joined);
    if joined.len() > limits.max_command_bytes {
        a.emit(
            "cmd.too_complex",
            (0, joined.len()),
            format!(
                "argv is {} bytes, over the limit of {}",
                joined.len(),
                limits.max_command_bytes
            ),
        );
        return rules::finish(a.out);
    }
    let mut off = 0;
    let mut args = Vec::new();
    for s in argv {
        args.push(analyze::Arg::plain(
            s.replace(['\u{0}', '\u{1}'], ""),
            (off, off + s.len()),
        ));
        off += s.len() + 1;
    }
    a.run_argv_top(args, (0, joined.len()));
    rules::finish(a.out)
}

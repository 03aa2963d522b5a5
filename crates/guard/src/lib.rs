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
mod redact;
mod rules;
mod scan;
mod types;
mod validate;

pub use glob::Glob;
pub use paths::{check_path, normalize};
pub use policy::{Limits, Policy, PolicyError};
pub use redact::{Redaction, Redactor};
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

/// Whether the runtime should identify copies of and links to the program `name` by
/// what they are (its inode, or its content), so that [`check_exec`] judges them as the
/// original: every program the guard has rules for — deleters (`rm`, `dd`, `shred`,
/// `mkfs.*`, …), shells, interpreters, downloaders, network tools, wrappers that run
/// another program, `busybox`/`toybox`.
pub fn followed_program(name: &str) -> bool {
    analyze::followed(name)
}

/// The argv the guard judges for an `execve` of `argv` whose file the runtime
/// identified as the program `program` (a name [`followed_program`] accepts): `argv[0]`
/// replaced by that name, so `/tmp/del -rf /` that is a copy of `rm` is `rm -rf /`. A
/// multi-call binary runs the applet it was called as (`busybox` called as `rm` is
/// `busybox rm`), unless it was called by its own name. Without an identity, or when
/// the name already is the program's, `argv` unchanged.
pub fn exec_argv(argv: &[String], program: Option<&str>) -> Vec<String> {
    let Some(program) = program.filter(|p| !p.is_empty()) else {
        return argv.to_vec();
    };
    let called = argv.first().map(|a| analyze::basename(a)).unwrap_or("");
    if called == program {
        return argv.to_vec();
    }
    let mut out = vec![program.to_string()];
    if analyze::MULTICALL.contains(&program) && !called.starts_with(program) && !called.is_empty() {
        out.push(called.to_string());
    }
    out.extend(argv.iter().skip(1).cloned());
    out
}

/// Checks an `execve` of `argv` whose file the runtime identified as `program` (see
/// [`exec_argv`]): the same rules as [`check_argv`], applied to what really runs.
/// Spans are offsets in [`exec_argv`]'s result joined by single spaces.
pub fn check_exec(
    policy: &Policy,
    tenant: Option<&str>,
    argv: &[String],
    program: Option<&str>,
) -> Verdict {
    check_argv(policy, tenant, &exec_argv(argv, program))
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

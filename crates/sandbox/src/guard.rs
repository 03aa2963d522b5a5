//! The seam to the runtime guard: every command passes a [`CommandCheck`] before it
//! runs, and output passes its scanner on the way out. `tessera-guard` implements it
//! (see the CLI); this crate compiles without it.

use crate::spec::Command;

/// The decision on one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckDecision {
    Allow,
    /// Run it, but report these findings.
    Alert(Vec<String>),
    /// Do not run it, for these reasons.
    Block(Vec<String>),
}

/// A file operation of the files API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAccess {
    Read,
    Write,
    Delete,
}

/// A policy that checks commands before they run and scans what comes out.
pub trait CommandCheck: Send + Sync {
    /// Checks a command about to run for `tenant`.
    fn check(&self, tenant: Option<&str>, command: &Command) -> CheckDecision;
    /// Checks a files-API operation (read, write, list, remove) on a sandbox path.
    fn check_file(&self, _tenant: Option<&str>, _op: FileAccess, _path: &str) -> CheckDecision {
        CheckDecision::Allow
    }
    /// Redacts output when the policy says so; `None` when nothing changed.
    fn redact(&self, _output: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// Allows everything (the default when no guard is configured).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl CommandCheck for AllowAll {
    fn check(&self, _tenant: Option<&str>, _command: &Command) -> CheckDecision {
        CheckDecision::Allow
    }
}

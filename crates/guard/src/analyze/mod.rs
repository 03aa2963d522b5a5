//! Command analysis: parse the command line with `brush-parser`, walk every command
//! that would run, and apply the command rules and the file-access rules to it.
//!
//! Values are evaluated as far as the line itself determines them: quoting, escapes,
//! `~`, `$HOME`, variables assigned earlier in the line, `$(echo …)`, `$(… | base64 -d)`.
//! What the line does not determine is an *unknown* (`UNK`, may be empty; `UNK_SET`,
//! known to be non-empty), never a guess.
//!
//! The parts, in the order a command line meets them:
//! * [`eval`]: the evaluator over the parsed program (lists, pipelines, compound
//!   commands, redirections, assignments) and the word-by-word fallback for text the
//!   parser rejects; [`words`]: quoting, expansions and brace expansion of one word.
//! * [`exec`]: one argv about to run: wrappers (`sudo`, `env`, `xargs`, `busybox`, …)
//!   unwrapped, shell strings (`bash -c`, `eval`) analysed again.
//! * [`commands`]: what each program does (deletes, writes, downloads, decodes, …),
//!   reached through one dispatch table.
//! * [`names`]: the name tables (shells, interpreters, downloaders, protected trees);
//!   [`flags`]: option parsing; [`decode`]: the decoders the analysis runs itself
//!   (escapes, `printf`, base64, hex, rot13).

#![allow(clippy::collapsible_match, clippy::collapsible_if)]

mod code;
mod commands;
mod decode;
mod eval;
mod exec;
mod flags;
mod names;
mod words;

use std::collections::BTreeMap;

use crate::glob::{Glob, has_glob_chars};
use crate::paths::{home_forms, normalize, path_findings};
use crate::policy::{Effective, ExceptionKind, Limits};
use crate::rules::builtin;
use crate::types::{Decision, FileOp, Finding};

use names::PROTECTED;
pub(crate) use names::{MULTICALL, basename, followed, is_block_device};

pub(crate) const UNK: char = '\u{0}';
pub(crate) const UNK_SET: char = '\u{1}';

pub(super) fn has_unk(s: &str) -> bool {
    s.contains(UNK) || s.contains(UNK_SET)
}

/// How offsets in a (re-)parsed text map to the outermost command line.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Map {
    Offset(usize),
    Whole(usize, usize),
}

impl Map {
    pub(super) fn apply(self, s: usize, e: usize) -> (usize, usize) {
        match self {
            Map::Offset(b) => (b + s, b + e),
            Map::Whole(a, b) => (a, b),
        }
    }
}

struct Cx {
    map: Map,
    chars: Option<Vec<usize>>,
    len: usize,
    depth: usize,
}

impl Cx {
    fn byte(&self, ci: usize) -> usize {
        match &self.chars {
            None => ci.min(self.len),
            Some(v) => v.get(ci).copied().unwrap_or(self.len),
        }
    }
    fn span(&self, s: &brush_parser::SourceSpan) -> (usize, usize) {
        let a = self.byte(s.start.index);
        let b = self.byte(s.end.index).max(a);
        self.map.apply(a, b)
    }
    fn whole(&self) -> (usize, usize) {
        self.map.apply(0, self.len)
    }
}

/// What a command writes on stdout, as far as the analysis knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Out {
    Unknown,
    Known {
        text: String,
        decoded: bool,
    },
    /// Content fetched from the network by a downloader.
    Remote,
    /// A live network connection (nc, telnet, socat).
    Network,
    /// Decoded content whose value is unknown.
    Decoded,
    /// `find ROOT` with no filter: every path under ROOT.
    FindAll(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Plain,
    Remote,
    Network,
    Decoded,
}

#[derive(Debug, Clone)]
pub(crate) struct Arg {
    pub text: String,
    pub span: (usize, usize),
    origin: Origin,
}

impl Arg {
    pub(crate) fn plain(text: String, span: (usize, usize)) -> Arg {
        Arg {
            text,
            span,
            origin: Origin::Plain,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Stage {
    out: Option<Out>,
    network: bool,
    shell: bool,
}

#[derive(Debug, Clone)]
struct Inv {
    span: (usize, usize),
    stdin: Out,
    pipeline_span: (usize, usize),
    net_redirect: bool,
    dup_stdin: bool,
    nest: usize,
    /// Where stdout is redirected to (`> FILE`), when it is a file.
    stdout_to: Option<String>,
}

pub(crate) struct Analyzer<'a> {
    eff: &'a Effective,
    limits: Limits,
    cmdline: &'a str,
    pub out: Vec<(Finding, Decision)>,
    vars: BTreeMap<String, String>,
    downloaded: Vec<String>,
    cwd: Option<String>,
    funcs: Vec<(String, (usize, usize))>,
    /// Copies of and links to programs made earlier in the line (`cp /bin/rm /tmp/x`,
    /// `ln -s /bin/rm /tmp/r`): normalized path, and the program it is.
    aliases: Vec<(String, String)>,
    work: usize,
    exhausted: bool,
    opts: brush_parser::ParserOptions,
}

/// The rule a value's origin sets off when the value is run (as a program, a script,
/// shell text or interpreter code), and how to say where it came from.
fn origin_rule(o: Origin) -> Option<(&'static str, &'static str)> {
    match o {
        Origin::Plain => None,
        Origin::Remote => Some(("cmd.download_exec", "downloaded at run time")),
        Origin::Decoded => Some(("cmd.decode_exec", "decoded at run time")),
        Origin::Network => Some(("cmd.reverse_shell", "read from a network connection")),
    }
}

impl<'a> Analyzer<'a> {
    pub(crate) fn new(eff: &'a Effective, limits: Limits, cmdline: &'a str) -> Analyzer<'a> {
        Analyzer {
            eff,
            limits,
            cmdline,
            out: Vec::new(),
            vars: BTreeMap::new(),
            downloaded: Vec::new(),
            cwd: None,
            funcs: Vec::new(),
            aliases: Vec::new(),
            work: 0,
            exhausted: false,
            opts: brush_parser::ParserOptions::default(),
        }
    }

    /// Work units spent so far (for the bounded-work property tests).
    pub(crate) fn work(&self) -> usize {
        self.work
    }

    fn tick(&mut self, n: usize) -> bool {
        self.work += n;
        if self.work > self.limits.max_work && !self.exhausted {
            self.exhausted = true;
            self.emit(
                "cmd.too_complex",
                (0, self.cmdline.len()),
                format!(
                    "analysis stopped after {} work units; the line is too complex to check",
                    self.limits.max_work
                ),
            );
        }
        self.exhausted
    }

    pub(crate) fn emit(&mut self, rule: &'static str, span: (usize, usize), explanation: String) {
        let Some(info) = builtin(rule) else { return };
        let Some((sev, dec)) = self.eff.resolve(rule, info.severity) else {
            return;
        };
        if self.command_excepted(rule, span) {
            return;
        }
        self.out.push((
            Finding {
                rule: rule.to_string(),
                severity: sev,
                span,
                explanation,
            },
            dec,
        ));
    }

    /// Emits the rule of [`origin_rule`] for `what` ("runs a script", "runs shell
    /// text", …) when its origin is not plain.
    fn emit_origin(&mut self, o: Origin, span: (usize, usize), what: &str) {
        if let Some((rule, how)) = origin_rule(o) {
            self.emit(rule, span, format!("{what} {how}"));
        }
    }

    fn command_excepted(&self, rule: &str, span: (usize, usize)) -> bool {
        let seg = self.cmdline.get(span.0..span.1).unwrap_or("");
        self.eff.exceptions.iter().any(|e| {
            (e.rule == "*" || e.rule == rule)
                && matches!(&e.kind, ExceptionKind::Command(g) if g.matches(self.cmdline) || g.matches(seg))
        })
    }

    fn file_op(&mut self, op: FileOp, path: &str, recursive: bool, span: (usize, usize)) {
        if path.is_empty() || path.contains(UNK) && path.trim_matches(UNK).is_empty() {
            return;
        }
        let resolved = self.resolve(path);
        let mut tmp = Vec::new();
        path_findings(self.eff, op, &resolved, recursive, span, &mut tmp);
        for (f, d) in tmp {
            if !self.command_excepted(&f.rule, span) {
                self.out.push((f, d));
            }
        }
        if op == FileOp::Write && is_block_device(&resolved) {
            self.emit(
                "cmd.disk_destroy",
                span,
                format!("writes directly onto the block device {resolved}"),
            );
        }
        if op == FileOp::Exec {
            let n = normalize(&resolved);
            if self.downloaded.contains(&n) {
                self.emit(
                    "cmd.download_exec",
                    span,
                    format!("runs {n}, which this command line just downloaded"),
                );
            }
        }
    }

    /// Resolves a relative path against a `cd` earlier in the line, when known.
    fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') || path.starts_with('~') {
            return path.to_string();
        }
        match &self.cwd {
            Some(c) => format!("{c}/{path}"),
            None => path.to_string(),
        }
    }

    /// Records that `dst` now holds a copy of, or a link to, the program `src`, so that
    /// running `dst` later in the line is judged as running `src`.
    fn note_copy(&mut self, src: &str, dst: &str) {
        if has_unk(src) || has_unk(dst) || src.is_empty() || dst.is_empty() {
            return;
        }
        let program = self
            .program_of(src)
            .unwrap_or_else(|| basename(src).to_string());
        let d = normalize(&self.resolve(dst));
        if program.is_empty() || basename(&d) == program {
            return;
        }
        self.aliases.retain(|(p, _)| *p != d);
        if self.aliases.len() < 32 {
            self.aliases.push((d, program));
        }
    }

    /// The program `a0` (a path, or a bare name looked up in `PATH`) is a copy of or a
    /// link to, when the line made it so.
    fn program_of(&self, a0: &str) -> Option<String> {
        if self.aliases.is_empty() || has_unk(a0) {
            return None;
        }
        if a0.contains('/') {
            let n = normalize(&self.resolve(a0));
            return self
                .aliases
                .iter()
                .rev()
                .find(|(p, _)| *p == n)
                .map(|(_, c)| c.clone());
        }
        let path = self.vars.get("PATH").map(String::as_str);
        let dirs: Vec<&str> = path
            .filter(|p| !has_unk(p))
            .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .split(':')
            .collect();
        self.aliases
            .iter()
            .rev()
            .find(|(p, _)| {
                p.rsplit_once('/')
                    .is_some_and(|(d, b)| b == a0 && dirs.iter().any(|x| normalize(x) == d))
            })
            .map(|(_, c)| c.clone())
    }

    /// The protected tree a path is (or, for a glob, covers), if any.
    fn protected(&self, path: &str, include_home: bool) -> Option<String> {
        if path.is_empty() || has_unk(path) {
            return None;
        }
        let resolved = self.resolve(path);
        if !(resolved.starts_with('/') || resolved.starts_with('~')) {
            return None;
        }
        let norm = normalize(&resolved);
        let is_prot = |p: &str| {
            PROTECTED.contains(&p) && (include_home || !(p == "~" || p == "/root" || p == "/home"))
        };
        if has_glob_chars(&norm) {
            let g = Glob::new(&norm, true).ok()?;
            for p in PROTECTED {
                if !is_prot(p) {
                    continue;
                }
                let probe = if *p == "/" {
                    "/x9".to_string()
                } else {
                    format!("{p}/x9")
                };
                if g.matches(p) || g.matches(&probe) {
                    return Some(norm);
                }
            }
            return None;
        }
        home_forms(&norm)
            .iter()
            .take(if norm.starts_with('/') { 2 } else { 1 })
            .any(|f| is_prot(f))
            .then_some(norm)
    }
}

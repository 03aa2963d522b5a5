//! Command analysis: parse the command line with `brush-parser`, walk every command
//! that would run, and apply the command rules and the file-access rules to it.
//!
//! Values are evaluated as far as the line itself determines them: quoting, escapes,
//! `~`, `$HOME`, variables assigned earlier in the line, `$(echo …)`, `$(… | base64 -d)`.
//! What the line does not determine is an *unknown* (`UNK`, may be empty; `UNK_SET`,
//! known to be non-empty), never a guess.

#![allow(clippy::collapsible_match, clippy::collapsible_if)]

use std::collections::BTreeMap;

use brush_parser::ast::{self, SourceLocation};
use brush_parser::word::{
    Parameter, ParameterExpr, SpecialParameter, TildeExpr, WordPiece, WordPieceWithSource,
};

use crate::glob::{Glob, has_glob_chars};
use crate::paths::{home_forms, normalize, path_findings};
use crate::policy::{Effective, ExceptionKind, Limits};
use crate::rules::builtin;
use crate::types::{Decision, FileOp, Finding};

pub(crate) const UNK: char = '\u{0}';
pub(crate) const UNK_SET: char = '\u{1}';

fn has_unk(s: &str) -> bool {
    s.contains(UNK) || s.contains(UNK_SET)
}

/// How offsets in a (re-)parsed text map to the outermost command line.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Map {
    Offset(usize),
    Whole(usize, usize),
}

impl Map {
    fn apply(self, s: usize, e: usize) -> (usize, usize) {
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
    work: usize,
    exhausted: bool,
    opts: brush_parser::ParserOptions,
}

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "rbash", "yash",
    "posh",
];
const INTERPS: &[&str] = &[
    "python",
    "python2",
    "python3",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "php",
    "lua",
    "pwsh",
    "powershell",
    "irb",
    "jshell",
    "deno",
    "bun",
];
const DOWNLOADERS: &[&str] = &[
    "curl",
    "wget",
    "fetch",
    "aria2c",
    "axel",
    "lwp-download",
    "http",
    "https",
    "xh",
];
const NETCATS: &[&str] = &[
    "nc",
    "ncat",
    "netcat",
    "nc.traditional",
    "nc.openbsd",
    "pwncat",
];
const MINERS: &[&str] = &[
    "xmrig",
    "xmr-stak",
    "xmr-stak-cpu",
    "minerd",
    "cpuminer",
    "cpuminer-multi",
    "cgminer",
    "bfgminer",
    "ethminer",
    "t-rex",
    "nbminer",
    "lolminer",
    "phoenixminer",
    "ccminer",
    "nanominer",
    "gminer",
    "teamredminer",
    "srbminer",
    "srbminer-multi",
    "xmrig-cuda",
    "kawpowminer",
    "ethdcrminer64",
    "nheqminer",
    "claymore",
];
const MINER_MARKERS: &[&str] = &[
    "stratum+tcp://",
    "stratum+ssl://",
    "stratum+tls://",
    "stratum2+tcp://",
    "stratum://",
    "minexmr.com",
    "supportxmr.com",
    "moneroocean.stream",
    "nanopool.org",
    "2miners.com",
    "hashvault.pro",
    "f2pool.com",
    "ethermine.org",
    "xmrpool.eu",
    "c3pool.com",
    "herominers.com",
    "unmineable.com",
    "--donate-level",
    "--randomx",
];
const METADATA: &[&str] = &[
    "169.254.169.254",
    "metadata.google.internal",
    "100.100.100.200",
    "fd00:ec2::254",
    "169.254.170.2",
    "2852039166",
    "0xa9fea9fe",
    "0251.0376.0251.0376",
    "metadata.azure.com",
    "169.254.169.123",
];
const PROTECTED: &[&str] = &[
    "/",
    "~",
    "/root",
    "/home",
    "/etc",
    "/usr",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/share",
    "/usr/local",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/var",
    "/var/lib",
    "/opt",
    "/srv",
    "/dev",
    "/proc",
    "/sys",
    "/snap",
    "/run",
];
/// Never inferred as file reads: these commands name paths without reading them.
const NO_READ: &[&str] = &[
    "ls",
    "stat",
    "test",
    "[",
    "[[",
    "du",
    "df",
    "realpath",
    "readlink",
    "dirname",
    "basename",
    "echo",
    "printf",
    "which",
    "type",
    "mkdir",
    "cd",
    "pushd",
    "popd",
    "ssh",
    "ssh-add",
    "ssh-keygen",
    "ssh-copy-id",
    "sftp",
    "git",
    "touch",
    "export",
    "declare",
    "local",
    "readonly",
    "typeset",
    "unset",
    "alias",
    "exit",
    "return",
    "true",
    "false",
    "sleep",
    "kill",
    "pkill",
    "killall",
    "mount",
    "umount",
    "ln",
    "help",
    "man",
    "whereis",
    "command",
    "hash",
    "set",
    "docker",
    "kubectl",
    "helm",
    "make",
    "cargo",
    "npm",
    "pip",
    "pip3",
    "apt",
    "apt-get",
    "yum",
    "dnf",
    "go",
];

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

    // ------------------------------------------------------------ text and AST

    pub(crate) fn analyze_text(&mut self, text: &str, map: Map, depth: usize) -> Out {
        if self.tick(1 + text.len() / 64) {
            return Out::Unknown;
        }
        let whole = map.apply(0, text.len());
        if depth > self.limits.max_depth {
            self.emit(
                "cmd.too_complex",
                whole,
                format!(
                    "nested shell text deeper than {} levels",
                    self.limits.max_depth
                ),
            );
            return Out::Unknown;
        }
        if text.len() > self.limits.max_command_bytes {
            self.emit(
                "cmd.too_complex",
                whole,
                format!(
                    "shell text longer than {} bytes",
                    self.limits.max_command_bytes
                ),
            );
            return Out::Unknown;
        }
        if nesting(text) > 32 {
            self.emit(
                "cmd.too_complex",
                whole,
                "brackets nested more than 32 deep".into(),
            );
            return Out::Unknown;
        }
        // brush-parser backtracks exponentially over runs of `(` (subshell
        // or arithmetic?): 24 of them took 16 s. Real commands nest a few.
        if paren_nesting(text) > MAX_PAREN_DEPTH {
            self.emit(
                "cmd.too_complex",
                whole,
                format!("parentheses nested more than {MAX_PAREN_DEPTH} deep"),
            );
            return Out::Unknown;
        }
        let cx = Cx {
            map,
            chars: if text.is_ascii() {
                None
            } else {
                Some(text.char_indices().map(|(i, _)| i).collect())
            },
            len: text.len(),
            depth,
        };
        let parsed = brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &self.opts)
            .parse_program();
        match parsed {
            Ok(p) => {
                let mut last = Out::Unknown;
                for cc in &p.complete_commands {
                    last = self.list(cc, &cx);
                }
                last
            }
            Err(e) => {
                self.emit(
                    "cmd.parse_error",
                    whole,
                    format!("not valid shell ({e}); checked word by word"),
                );
                self.fallback(text, &cx);
                Out::Unknown
            }
        }
    }

    fn list(&mut self, l: &ast::CompoundList, cx: &Cx) -> Out {
        let mut last = Out::Unknown;
        for item in &l.0 {
            if self.exhausted {
                break;
            }
            let bg = matches!(item.1, ast::SeparatorOperator::Async);
            last = self.pipeline(&item.0.first, bg, cx);
            for x in &item.0.additional {
                let p = match x {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => p,
                };
                last = self.pipeline(p, bg, cx);
            }
        }
        last
    }

    fn pipeline(&mut self, p: &ast::Pipeline, bg: bool, cx: &Cx) -> Out {
        if self.tick(1) {
            return Out::Unknown;
        }
        let span = p
            .location()
            .map(|l| cx.span(&l))
            .unwrap_or_else(|| cx.whole());
        let n = p.seq.len();
        let mut stdin = Out::Unknown;
        let mut stages = Vec::new();
        for c in &p.seq {
            let st = self.command(c, stdin.clone(), span, n > 1 || bg, cx);
            stdin = st.out.clone().unwrap_or(Out::Unknown);
            stages.push(st);
        }
        if n > 1 && stages.iter().any(|s| s.network) && stages.iter().any(|s| s.shell) {
            self.emit(
                "cmd.reverse_shell",
                span,
                "pipes a shell through a network connection".into(),
            );
        }
        stdin
    }

    fn command(
        &mut self,
        c: &ast::Command,
        stdin: Out,
        pspan: (usize, usize),
        piped: bool,
        cx: &Cx,
    ) -> Stage {
        match c {
            ast::Command::Simple(sc) => self.simple(sc, stdin, pspan, piped, cx),
            ast::Command::Compound(cc, redirs) => {
                let span = c.location().map(|l| cx.span(&l)).unwrap_or(pspan);
                let mut inv = Inv {
                    span,
                    stdin,
                    pipeline_span: pspan,
                    net_redirect: false,
                    dup_stdin: false,
                    nest: 0,
                };
                if let Some(r) = redirs {
                    for r in &r.0 {
                        self.redirect(r, &mut inv, cx);
                    }
                }
                let out = self.compound(cc, cx);
                Stage {
                    out: Some(out),
                    ..Stage::default()
                }
            }
            ast::Command::Function(fd) => {
                let span = fd.location().map(|l| cx.span(&l)).unwrap_or(pspan);
                self.funcs.push((fd.fname.value.clone(), span));
                if self.funcs.len() <= 8 {
                    self.compound(&fd.body.0, cx);
                }
                self.funcs.pop();
                Stage::default()
            }
            ast::Command::ExtendedTest(..) => Stage::default(),
        }
    }

    fn compound(&mut self, cc: &ast::CompoundCommand, cx: &Cx) -> Out {
        if self.tick(1) {
            return Out::Unknown;
        }
        use ast::CompoundCommand as C;
        match cc {
            C::BraceGroup(b) => self.list(&b.list, cx),
            C::Subshell(s) => {
                let cwd = self.cwd.clone();
                let o = self.list(&s.list, cx);
                self.cwd = cwd;
                o
            }
            C::ForClause(f) => {
                let mut values: Vec<String> = Vec::new();
                let mut literal = true;
                for w in f.values.iter().flatten() {
                    for a in self.word(w, cx) {
                        literal &= !has_unk(&a.text);
                        values.push(a.text);
                    }
                }
                if literal && !values.is_empty() && values.len() <= 8 {
                    let mut out = Out::Unknown;
                    for v in values {
                        self.vars.insert(f.variable_name.clone(), v);
                        out = self.list(&f.body.list, cx);
                    }
                    out
                } else {
                    self.vars.insert(f.variable_name.clone(), UNK.to_string());
                    self.list(&f.body.list, cx)
                }
            }
            C::ArithmeticForClause(f) => self.list(&f.body.list, cx),
            C::CaseClause(c) => {
                let mut out = Out::Unknown;
                for item in &c.cases {
                    if let Some(l) = &item.cmd {
                        out = self.list(l, cx);
                    }
                }
                out
            }
            C::IfClause(i) => {
                self.list(&i.condition, cx);
                let mut out = self.list(&i.then, cx);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.list(c, cx);
                    }
                    out = self.list(&e.body, cx);
                }
                out
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0, cx);
                self.list(&w.1.list, cx)
            }
            C::Coprocess(c) => {
                self.command(&c.body, Out::Unknown, cx.whole(), true, cx);
                Out::Unknown
            }
            C::Arithmetic(_) => Out::Unknown,
        }
    }

    fn simple(
        &mut self,
        sc: &ast::SimpleCommand,
        stdin: Out,
        pspan: (usize, usize),
        piped: bool,
        cx: &Cx,
    ) -> Stage {
        if self.tick(1) {
            return Stage::default();
        }
        let mut span = sc.location().map(|l| cx.span(&l)).unwrap_or(pspan);
        for item in sc
            .prefix
            .iter()
            .flat_map(|p| p.0.iter())
            .chain(sc.suffix.iter().flat_map(|s| s.0.iter()))
        {
            if let ast::CommandPrefixOrSuffixItem::IoRedirect(r) = item {
                if let Some(l) = redirect_loc(r) {
                    let (a, b) = cx.span(&l);
                    span = (span.0.min(a), span.1.max(b));
                }
            }
        }
        let mut inv = Inv {
            span,
            stdin,
            pipeline_span: pspan,
            net_redirect: false,
            dup_stdin: false,
            nest: 0,
        };
        let mut argv: Vec<Arg> = Vec::new();
        if let Some(pre) = &sc.prefix {
            for item in &pre.0 {
                self.prefix_item(item, &mut argv, &mut inv, cx, true);
            }
        }
        if let Some(w) = &sc.word_or_name {
            let a = self.word(w, cx);
            argv.extend(a);
        }
        if let Some(suf) = &sc.suffix {
            for item in &suf.0 {
                self.prefix_item(item, &mut argv, &mut inv, cx, false);
            }
        }
        if let Some(first) = argv.first() {
            let name = basename(&first.text).to_string();
            if let Some((_, fspan)) = self.funcs.iter().find(|(f, _)| *f == name).cloned() {
                if piped {
                    self.emit("cmd.fork_bomb", fspan, format!("function `{name}` starts copies of itself in a pipe or in the background without bound"));
                }
            }
        }
        if argv.is_empty() {
            return Stage {
                out: Some(Out::Unknown),
                ..Stage::default()
            };
        }
        self.run_argv(argv, &mut inv, cx.depth)
    }

    fn prefix_item(
        &mut self,
        item: &ast::CommandPrefixOrSuffixItem,
        argv: &mut Vec<Arg>,
        inv: &mut Inv,
        cx: &Cx,
        prefix: bool,
    ) {
        use ast::CommandPrefixOrSuffixItem as I;
        match item {
            I::IoRedirect(r) => self.redirect(r, inv, cx),
            I::Word(w) => {
                let a = self.word(w, cx);
                argv.extend(a);
            }
            I::AssignmentWord(a, w) => {
                let span = cx.span(&a.loc);
                let (name, value) = self.assignment(a, cx);
                if prefix {
                    self.set_var(&name, value, span);
                } else {
                    // `export X=…`, `declare X=…`: an argument that also assigns.
                    let v = value.clone();
                    self.set_var(&name, value, span);
                    let wspan = w.loc.as_ref().map(|l| cx.span(l)).unwrap_or(span);
                    argv.push(Arg::plain(format!("{name}={v}"), wspan));
                }
            }
            I::ProcessSubstitution(_, sub) => {
                let span = cx.span(&sub.loc);
                let out = self.list(&sub.list, cx);
                argv.push(Arg {
                    text: "/dev/fd/63".into(),
                    span,
                    origin: origin_of(&out),
                });
            }
        }
    }

    fn assignment(&mut self, a: &ast::Assignment, cx: &Cx) -> (String, String) {
        let name = match &a.name {
            ast::AssignmentName::VariableName(n) => n.clone(),
            ast::AssignmentName::ArrayElementName(n, _) => n.clone(),
        };
        let value = match &a.value {
            ast::AssignmentValue::Scalar(w) => self.word_joined(w, cx).0,
            ast::AssignmentValue::Array(_) => UNK.to_string(),
        };
        let value = if a.append {
            format!(
                "{}{}",
                self.vars.get(&name).cloned().unwrap_or_default(),
                value
            )
        } else {
            value
        };
        (name, value)
    }

    fn set_var(&mut self, name: &str, value: String, span: (usize, usize)) {
        match name {
            "HISTFILE" if value.is_empty() || normalize(&value) == "/dev/null" => self.emit(
                "cmd.history_tamper",
                span,
                "points HISTFILE at nothing, so history is not saved".into(),
            ),
            "HISTSIZE" | "HISTFILESIZE" | "SAVEHIST" if value == "0" => self.emit(
                "cmd.history_tamper",
                span,
                format!("sets {name}=0, so history is not kept"),
            ),
            "LD_PRELOAD" if !value.is_empty() => self.emit(
                "cmd.preload_env",
                span,
                format!(
                    "LD_PRELOAD={} injects a library into every program started",
                    value.replace(UNK, "$?")
                ),
            ),
            _ => {}
        }
        if self.vars.len() < 256 {
            self.vars.insert(name.to_string(), value);
        }
    }

    fn redirect(&mut self, r: &ast::IoRedirect, inv: &mut Inv, cx: &Cx) {
        use ast::IoFileRedirectKind as K;
        use ast::IoFileRedirectTarget as T;
        match r {
            ast::IoRedirect::File(fd, kind, target) => match target {
                T::Filename(w) | T::Duplicate(w) => {
                    let (text, _) = self.word_joined(w, cx);
                    let is_fd =
                        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'-');
                    if text.starts_with("/dev/tcp/") || text.starts_with("/dev/udp/") {
                        inv.net_redirect = true;
                    }
                    if is_fd && matches!(kind, K::DuplicateInput | K::DuplicateOutput) {
                        if *fd == Some(0) || matches!(kind, K::DuplicateInput) {
                            inv.dup_stdin = true;
                        }
                        return;
                    }
                    match kind {
                        K::Read | K::DuplicateInput => {
                            self.file_op(FileOp::Read, &text, false, inv.span)
                        }
                        K::Write | K::Append | K::Clobber | K::DuplicateOutput => {
                            self.file_op(FileOp::Write, &text, false, inv.span)
                        }
                        K::ReadAndWrite => {
                            self.file_op(FileOp::Read, &text, false, inv.span);
                            self.file_op(FileOp::Write, &text, false, inv.span)
                        }
                    }
                }
                T::Fd(_) => {
                    if *fd == Some(0) || matches!(kind, K::DuplicateInput) {
                        inv.dup_stdin = true;
                    }
                }
                T::ProcessSubstitution(_, sub) => {
                    let out = self.list(&sub.list, cx);
                    if matches!(kind, K::Read) {
                        inv.stdin = out;
                    }
                }
            },
            ast::IoRedirect::HereDocument(_, doc) => {
                inv.stdin = Out::Known {
                    text: doc.doc.value.clone(),
                    decoded: false,
                };
            }
            ast::IoRedirect::HereString(_, w) => {
                let (t, o) = self.word_joined(w, cx);
                inv.stdin = match o {
                    Origin::Remote => Out::Remote,
                    Origin::Network => Out::Network,
                    Origin::Decoded if has_unk(&t) => Out::Decoded,
                    Origin::Decoded => Out::Known {
                        text: t + "\n",
                        decoded: true,
                    },
                    Origin::Plain if has_unk(&t) => Out::Unknown,
                    Origin::Plain => Out::Known {
                        text: t + "\n",
                        decoded: false,
                    },
                };
            }
            ast::IoRedirect::OutputAndError(w, _) => {
                let (t, _) = self.word_joined(w, cx);
                if t.starts_with("/dev/tcp/") || t.starts_with("/dev/udp/") {
                    inv.net_redirect = true;
                }
                self.file_op(FileOp::Write, &t, false, inv.span);
            }
        }
    }

    // ------------------------------------------------------------ words

    fn word_joined(&mut self, w: &ast::Word, cx: &Cx) -> (String, Origin) {
        let args = self.word(w, cx);
        let origin = args.first().map(|a| a.origin).unwrap_or(Origin::Plain);
        (
            args.into_iter()
                .map(|a| a.text)
                .collect::<Vec<_>>()
                .join(" "),
            origin,
        )
    }

    fn word(&mut self, w: &ast::Word, cx: &Cx) -> Vec<Arg> {
        self.tick(1);
        let span = w
            .loc
            .as_ref()
            .map(|l| cx.span(l))
            .unwrap_or_else(|| cx.whole());
        let raw = &w.value;
        if raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./,:=+@%^*?[]!#".contains(&b))
        {
            return vec![Arg::plain(raw.clone(), span)];
        }
        let Ok(pieces) = brush_parser::word::parse(raw, &self.opts) else {
            return vec![Arg::plain(raw.clone(), span)];
        };
        let base = (raw.is_ascii() && self.cmdline.get(span.0..span.1) == Some(raw.as_str()))
            .then_some(span.0);
        let mut st = WordState {
            fields: vec![String::new()],
            origin: Origin::Plain,
            quoted: false,
        };
        self.pieces(&pieces, false, &mut st, base, span, cx);
        let quoted = st.quoted;
        let braces = !quoted && raw.contains('{') && raw.contains(',') && raw.contains('}');
        st.fields
            .into_iter()
            .filter(|f| !f.is_empty() || quoted)
            .flat_map(|text| {
                if braces {
                    brace_expand(&text)
                } else {
                    vec![text]
                }
            })
            .map(|text| Arg {
                text,
                span,
                origin: st.origin,
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn pieces(
        &mut self,
        pieces: &[WordPieceWithSource],
        quoted: bool,
        st: &mut WordState,
        base: Option<usize>,
        span: (usize, usize),
        cx: &Cx,
    ) {
        for p in pieces {
            match &p.piece {
                WordPiece::Text(s) => st.push(s),
                WordPiece::SingleQuotedText(s) => {
                    st.quoted = true;
                    st.push(s)
                }
                WordPiece::AnsiCQuotedText(s) => {
                    st.quoted = true;
                    st.push(&unescape(s, false))
                }
                WordPiece::DoubleQuotedSequence(v) | WordPiece::GettextDoubleQuotedSequence(v) => {
                    st.quoted = true;
                    self.pieces(v, true, st, base, span, cx)
                }
                WordPiece::TildeExpansion(t) => st.push(&match t {
                    TildeExpr::Home => "~".to_string(),
                    TildeExpr::UserHome(u) if u == "root" => "/root".to_string(),
                    TildeExpr::UserHome(u) => format!("/home/{u}"),
                    _ => UNK.to_string(),
                }),
                WordPiece::ParameterExpansion(e) => {
                    let v = self.param(e, cx);
                    st.expansion(&v, quoted)
                }
                WordPiece::CommandSubstitution(s) | WordPiece::BackquotedCommandSubstitution(s) => {
                    let off = if matches!(p.piece, WordPiece::CommandSubstitution(_)) {
                        2
                    } else {
                        1
                    };
                    let map = match base {
                        Some(b) if !matches!(cx.map, Map::Whole(..)) => {
                            Map::Offset(b + p.start_index + off)
                        }
                        _ => Map::Whole(span.0, span.1),
                    };
                    let out = self.analyze_text(s, map, cx.depth + 1);
                    match out {
                        Out::Known { text, decoded } => {
                            if decoded {
                                st.origin = Origin::Decoded;
                            }
                            st.expansion(text.trim_end_matches('\n'), quoted)
                        }
                        other => {
                            let o = origin_of(&other);
                            if o != Origin::Plain {
                                st.origin = o;
                            }
                            st.push(&UNK.to_string())
                        }
                    }
                }
                WordPiece::EscapeSequence(s) => {
                    if s != "\\\n" {
                        st.push(s.get(1..).unwrap_or(""))
                    }
                }
                WordPiece::ArithmeticExpression(_) => st.push(&UNK_SET.to_string()),
            }
        }
    }

    fn param(&mut self, e: &ParameterExpr, cx: &Cx) -> String {
        match e {
            ParameterExpr::Parameter {
                parameter,
                indirect: false,
            } => self.lookup(parameter),
            ParameterExpr::UseDefaultValues {
                parameter,
                default_value,
                indirect: false,
                ..
            }
            | ParameterExpr::AssignDefaultValues {
                parameter,
                default_value,
                indirect: false,
                ..
            } => {
                let v = self.lookup(parameter);
                if has_unk(&v) || v.is_empty() {
                    match default_value {
                        Some(d) if cx.depth < self.limits.max_depth => self.text_word(d, cx),
                        _ => v,
                    }
                } else {
                    v
                }
            }
            ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                indirect: false,
                ..
            } => {
                let v = self.lookup(parameter);
                if v.is_empty() || v.chars().all(|c| c == UNK) {
                    UNK_SET.to_string()
                } else {
                    v
                }
            }
            _ => UNK.to_string(),
        }
    }

    fn text_word(&mut self, s: &str, cx: &Cx) -> String {
        let Ok(pieces) = brush_parser::word::parse(s, &self.opts) else {
            return s.to_string();
        };
        let sub = Cx {
            map: Map::Whole(cx.whole().0, cx.whole().1),
            chars: None,
            len: 0,
            depth: cx.depth + 1,
        };
        let mut st = WordState {
            fields: vec![String::new()],
            origin: Origin::Plain,
            quoted: true,
        };
        let span = cx.whole();
        self.pieces(&pieces, true, &mut st, None, span, &sub);
        st.fields.join(" ")
    }

    fn lookup(&self, p: &Parameter) -> String {
        match p {
            Parameter::Named(n) => match self.vars.get(n) {
                Some(v) => v.clone(),
                None if n == "HOME" => "~".into(),
                None => UNK.to_string(),
            },
            Parameter::Positional(0) | Parameter::Special(SpecialParameter::ShellName) => {
                "bash".into()
            }
            _ => UNK.to_string(),
        }
    }

    // ------------------------------------------------------------ fallback

    /// Word-by-word check of text the parser rejected: split at unquoted `;&|` and
    /// newlines, strip quotes, and run each piece as a command.
    fn fallback(&mut self, text: &str, cx: &Cx) {
        let b = text.as_bytes();
        let mut segs: Vec<(usize, usize)> = Vec::new();
        let (mut q, mut start, mut i) = (0u8, 0usize, 0usize);
        while i < b.len() {
            let c = b[i];
            if q != 0 {
                if c == q {
                    q = 0;
                } else if c == b'\\' && q == b'"' {
                    i += 1;
                }
            } else if c == b'\'' || c == b'"' {
                q = c;
            } else if c == b'\\' {
                i += 1;
            } else if matches!(
                c,
                b';' | b'&' | b'|' | b'\n' | b'(' | b')' | b'`' | b'{' | b'}'
            ) {
                segs.push((start, i));
                start = i + 1;
            }
            i += 1;
        }
        segs.push((start, b.len().max(start)));
        let mut stdin = Out::Unknown;
        for (s, e) in segs {
            if self.tick(1) {
                return;
            }
            let seg = &text[s.min(text.len())..e.min(text.len())];
            let mut argv = Vec::new();
            let mut off = s;
            for tok in seg.split(|c: char| c.is_ascii_whitespace()) {
                if !tok.is_empty() {
                    let t: String = tok
                        .chars()
                        .filter(|c| *c != '\'' && *c != '"' && *c != '\\')
                        .collect();
                    let sp = cx.map.apply(off, off + tok.len());
                    if !t.starts_with('>') && !t.starts_with('<') && !t.contains('=')
                        || !argv.is_empty()
                    {
                        argv.push(Arg::plain(t, sp));
                    }
                }
                off += tok.len() + 1;
            }
            if argv.is_empty() {
                continue;
            }
            let span = cx.map.apply(s, e.min(text.len()));
            let mut inv = Inv {
                span,
                stdin: stdin.clone(),
                pipeline_span: span,
                net_redirect: false,
                dup_stdin: false,
                nest: 0,
            };
            let st = self.run_argv(argv, &mut inv, cx.depth);
            stdin = st.out.unwrap_or(Out::Unknown);
        }
    }

    // ------------------------------------------------------------ commands

    pub(crate) fn run_argv_top(&mut self, argv: Vec<Arg>, span: (usize, usize)) {
        let mut inv = Inv {
            span,
            stdin: Out::Unknown,
            pipeline_span: span,
            net_redirect: false,
            dup_stdin: false,
            nest: 0,
        };
        self.run_argv(argv, &mut inv, 0);
    }

    fn run_argv(&mut self, mut argv: Vec<Arg>, inv: &mut Inv, depth: usize) -> Stage {
        if self.tick(argv.len()) || argv.is_empty() {
            return Stage::default();
        }
        let span = inv.span;
        for a in &argv {
            let low = a.text.to_ascii_lowercase();
            if let Some(m) = METADATA.iter().find(|m| low.contains(*m)) {
                self.emit("cmd.cloud_metadata", span, format!("contacts the cloud metadata endpoint {m}, which hands out instance credentials"));
            }
            if let Some(m) = MINER_MARKERS.iter().find(|m| low.contains(*m)) {
                self.emit(
                    "cmd.crypto_miner",
                    span,
                    format!("mentions the mining pool or miner option `{m}`"),
                );
            }
        }
        if argv[0].origin == Origin::Decoded {
            self.emit(
                "cmd.decode_exec",
                span,
                "runs a command name decoded at run time".into(),
            );
        }
        if argv[0].origin == Origin::Remote {
            self.emit(
                "cmd.download_exec",
                span,
                "runs a command name downloaded at run time".into(),
            );
        }
        // Unwrap wrappers (sudo, env, nice, timeout, xargs, busybox, …).
        let mut guard = 0;
        loop {
            guard += 1;
            if guard > 12 || argv.is_empty() {
                return Stage::default();
            }
            let a0 = argv[0].text.clone();
            if has_unk(&a0) {
                self.emit(
                    "cmd.dynamic_command",
                    span,
                    "the program to run is only known at run time".into(),
                );
                return Stage::default();
            }
            let name = basename(&a0).to_string();
            if a0.contains('/') {
                self.file_op(FileOp::Exec, &a0, false, span);
            }
            let rest = &argv[1..];
            let next: Option<Vec<Arg>> = match name.as_str() {
                "sudo" | "doas" | "please" => skip_opts(
                    rest,
                    b"ugCDhpprtUT",
                    &[
                        "user",
                        "group",
                        "close-from",
                        "chdir",
                        "host",
                        "prompt",
                        "role",
                        "type",
                        "other-user",
                    ],
                ),
                "nice" => skip_opts(rest, b"n", &["adjustment"]),
                "ionice" => skip_opts(rest, b"cnp", &["class", "classdata", "pid"]),
                "nohup" | "builtin" | "unbuffer" | "torsocks" | "catchsegv" | "setsid" | "time"
                | "stdbuf" | "fakeroot" | "caffeinate" => skip_opts(
                    rest,
                    if name == "stdbuf" { b"ioe" } else { b"fo" },
                    &["input", "output", "error", "format"],
                ),
                "command" => {
                    if rest
                        .first()
                        .is_some_and(|a| a.text == "-v" || a.text == "-V")
                    {
                        return Stage::default();
                    }
                    skip_opts(rest, b"", &[])
                }
                "exec" => {
                    let r = skip_opts(rest, b"a", &[]);
                    if r.as_ref().is_none_or(|v| v.is_empty()) {
                        if inv.net_redirect {
                            self.emit("cmd.reverse_shell", span, "opens a /dev/tcp or /dev/udp connection on the shell's own file descriptors".into());
                        }
                        return Stage::default();
                    }
                    r
                }
                "env" => self.unwrap_env(rest, span),
                "timeout" => skip_opts(rest, b"sk", &["signal", "kill-after"])
                    .map(|v| v.into_iter().skip(1).collect()),
                "chroot" => skip_opts(rest, b"", &["userspec", "groups"])
                    .map(|v| v.into_iter().skip(1).collect()),
                "flock" => {
                    let v = skip_opts(rest, b"wEc", &["timeout", "conflict-exit-code", "command"]);
                    if let Some(c) = opt_value(rest, b'c', "command") {
                        let map = self.arg_map(&c);
                        self.shell_string(&c, map, span, depth);
                        return Stage::default();
                    }
                    v.map(|v| v.into_iter().skip(1).collect())
                }
                "watch" => {
                    let exec_mode = rest.iter().any(|a| a.text == "-x" || a.text == "--exec");
                    let v =
                        skip_opts(rest, b"ndqg", &["interval", "differences"]).unwrap_or_default();
                    if exec_mode || v.len() > 1 {
                        Some(v)
                    } else if let Some(c) = v.first() {
                        let map = self.arg_map(c);
                        self.shell_string(c, map, span, depth);
                        return Stage::default();
                    } else {
                        None
                    }
                }
                "strace" | "ltrace" => skip_opts(rest, b"oepusSIEXa", &["output", "trace", "expr"]),
                "proxychains" | "proxychains4" => skip_opts(rest, b"f", &[]),
                "systemd-run" | "nsenter" | "unshare" | "runcon" => skip_opts(
                    rest,
                    b"pEtSmuinUCNr",
                    &[
                        "unit",
                        "property",
                        "setenv",
                        "uid",
                        "gid",
                        "target",
                        "mount",
                        "slice",
                        "description",
                    ],
                ),
                "busybox" | "toybox" => {
                    if rest.is_empty() {
                        return Stage::default();
                    }
                    Some(rest.to_vec())
                }
                "xargs" => {
                    let mut v = skip_opts(
                        rest,
                        b"IinPLldEsa",
                        &[
                            "replace",
                            "max-args",
                            "max-procs",
                            "max-lines",
                            "delimiter",
                            "eof",
                            "max-chars",
                            "arg-file",
                        ],
                    )
                    .unwrap_or_default();
                    if v.is_empty() {
                        v.push(Arg::plain("echo".into(), span));
                    }
                    let replace = opt_value(rest, b'I', "replace").map(|a| a.text);
                    let extra: Vec<String> = match &inv.stdin {
                        Out::Known { text, .. } => text
                            .split_whitespace()
                            .take(64)
                            .map(str::to_string)
                            .collect(),
                        Out::FindAll(root) => vec![root.clone()],
                        _ => vec![UNK.to_string()],
                    };
                    if let Some(r) = replace {
                        for a in v.iter_mut() {
                            if a.text.contains(&r) {
                                a.text = a
                                    .text
                                    .replace(&r, extra.first().map(String::as_str).unwrap_or(""));
                            }
                        }
                    } else {
                        v.extend(extra.into_iter().map(|t| Arg::plain(t, span)));
                    }
                    inv.stdin = Out::Unknown;
                    Some(v)
                }
                "su" | "runuser" => {
                    if let Some(c) = opt_value(rest, b'c', "command") {
                        let map = self.arg_map(&c);
                        self.shell_string(&c, map, span, depth);
                    }
                    return Stage::default();
                }
                _ => None,
            };
            match next {
                Some(v) if !v.is_empty() => argv = v,
                Some(_) => return Stage::default(),
                None => break,
            }
        }
        let name = basename(&argv[0].text).to_string();
        let args: Vec<Arg> = argv[1..].to_vec();
        self.dispatch(&name, &argv[0].text.clone(), &args, inv, depth)
    }

    fn unwrap_env(&mut self, rest: &[Arg], span: (usize, usize)) -> Option<Vec<Arg>> {
        let mut i = 0;
        let mut out = Vec::new();
        while i < rest.len() {
            let t = &rest[i].text;
            if t == "--" {
                i += 1;
                break;
            } else if t == "-u" || t == "-C" || t == "--unset" || t == "--chdir" {
                i += 2;
            } else if t == "-S" || t == "--split-string" {
                if let Some(s) = rest.get(i + 1) {
                    out.extend(s.text.split_whitespace().map(|w| Arg {
                        text: w.to_string(),
                        span: s.span,
                        origin: s.origin,
                    }));
                }
                i += 2;
                break;
            } else if let Some(s) = t
                .strip_prefix("--split-string=")
                .or_else(|| t.strip_prefix("-S"))
            {
                out.extend(
                    s.split_whitespace()
                        .map(|w| Arg::plain(w.to_string(), rest[i].span)),
                );
                i += 1;
                break;
            } else if t.starts_with('-') {
                i += 1;
            } else if let Some((k, v)) = t.split_once('=') {
                if is_name(k) {
                    self.set_var(k, v.to_string(), span);
                }
                i += 1;
            } else {
                break;
            }
        }
        out.extend(rest.iter().skip(i).cloned());
        if out.is_empty() {
            Some(Vec::new())
        } else {
            Some(out)
        }
    }

    fn arg_map(&self, a: &Arg) -> Map {
        let src = self.cmdline.get(a.span.0..a.span.1).unwrap_or("");
        if src == a.text {
            Map::Offset(a.span.0)
        } else if src.len() >= 2
            && src.get(1..src.len() - 1) == Some(a.text.as_str())
            && (src.starts_with('\'') || src.starts_with('"'))
        {
            Map::Offset(a.span.0 + 1)
        } else {
            Map::Whole(a.span.0, a.span.1)
        }
    }

    /// `bash -c STR`, `eval STR`, `su -c STR`, `watch STR`.
    fn shell_string(&mut self, a: &Arg, map: Map, span: (usize, usize), depth: usize) {
        match a.origin {
            Origin::Remote => self.emit(
                "cmd.download_exec",
                span,
                "runs shell text downloaded at run time".into(),
            ),
            Origin::Decoded => self.emit(
                "cmd.decode_exec",
                span,
                "runs shell text decoded at run time".into(),
            ),
            Origin::Network => self.emit(
                "cmd.reverse_shell",
                span,
                "runs shell text read from a network connection".into(),
            ),
            Origin::Plain => {}
        }
        if has_unk(&a.text) {
            self.emit(
                "cmd.dynamic_command",
                span,
                "runs shell text that is only known at run time".into(),
            );
        }
        let text = a.text.replace([UNK, UNK_SET], "");
        if !text.trim().is_empty() {
            self.analyze_text(&text, map, depth + 1);
        }
    }

    fn stdin_exec(&mut self, inv: &Inv, depth: usize, what: &str, shell: bool) {
        let ps = inv.pipeline_span;
        match &inv.stdin {
            Out::Remote => self.emit(
                "cmd.download_exec",
                ps,
                format!("pipes downloaded content straight into {what}"),
            ),
            Out::Network => self.emit(
                "cmd.reverse_shell",
                ps,
                format!("feeds a network connection into {what}"),
            ),
            Out::Decoded => self.emit(
                "cmd.decode_exec",
                ps,
                format!("pipes decoded (hidden) text into {what}"),
            ),
            Out::Known { text, decoded } => {
                if *decoded {
                    self.emit(
                        "cmd.decode_exec",
                        ps,
                        format!("pipes decoded (hidden) text into {what}"),
                    );
                }
                if shell {
                    let t = text.clone();
                    self.analyze_text(&t, Map::Whole(ps.0, ps.1), depth + 1);
                } else {
                    let t = text.clone();
                    self.interp_code(&t, Map::Whole(ps.0, ps.1), inv.span, depth);
                }
            }
            _ => {}
        }
    }

    fn dispatch(
        &mut self,
        name: &str,
        path0: &str,
        args: &[Arg],
        inv: &mut Inv,
        depth: usize,
    ) -> Stage {
        let span = inv.span;
        let lname = name.to_ascii_lowercase();
        let name = lname.as_str();
        let flags = Flags::parse(args);
        let mut stage = Stage::default();
        let mut generic_reads = !NO_READ.contains(&name);

        if MINERS.contains(&name) {
            self.emit(
                "cmd.crypto_miner",
                span,
                format!("runs the cryptocurrency miner `{name}`"),
            );
        }
        let shell_name = name.strip_suffix(".exe").unwrap_or(name);
        let is_interp = INTERPS.contains(&shell_name)
            || (shell_name.starts_with("python")
                && shell_name[6..]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'.'));

        match name {
            _ if SHELLS.contains(&shell_name) => {
                generic_reads = false;
                let mut cmode = false;
                let mut smode = false;
                let mut interactive = false;
                let mut i = 0;
                let mut operand: Option<&Arg> = None;
                while i < args.len() {
                    let t = &args[i].text;
                    if t == "--" {
                        operand = args.get(i + 1);
                        break;
                    }
                    if t == "-o"
                        || t == "+o"
                        || t == "-O"
                        || t == "+O"
                        || t == "--rcfile"
                        || t == "--init-file"
                    {
                        i += 2;
                        continue;
                    }
                    if let Some(f) = t
                        .strip_prefix('-')
                        .filter(|f| !f.is_empty() && !f.starts_with('-'))
                    {
                        cmode |= f.contains('c');
                        smode |= f.contains('s');
                        interactive |= f.contains('i');
                    } else if t == "-" || !t.starts_with('-') && !t.starts_with('+') {
                        operand = Some(&args[i]);
                        break;
                    } else if t == "--interactive" {
                        interactive = true;
                    }
                    i += 1;
                }
                if inv.net_redirect {
                    self.emit(
                        "cmd.reverse_shell",
                        span,
                        "connects a shell to /dev/tcp or /dev/udp".into(),
                    );
                }
                let operand = if smode && !cmode { None } else { operand };
                match operand {
                    Some(a) if cmode => {
                        let map = self.arg_map(a);
                        let a = a.clone();
                        self.shell_string(&a, map, span, depth);
                    }
                    Some(a) if a.text != "-" && a.text != "/dev/stdin" => match a.origin {
                        Origin::Remote => self.emit(
                            "cmd.download_exec",
                            span,
                            "runs a script downloaded at run time (process substitution)".into(),
                        ),
                        Origin::Decoded => self.emit(
                            "cmd.decode_exec",
                            span,
                            "runs a script decoded at run time".into(),
                        ),
                        Origin::Network => self.emit(
                            "cmd.reverse_shell",
                            span,
                            "runs a script read from a network connection".into(),
                        ),
                        Origin::Plain => {
                            let t = a.text.clone();
                            self.file_op(FileOp::Exec, &t, false, span)
                        }
                    },
                    _ => {
                        stage.shell = true;
                        self.stdin_exec(inv, depth, "a shell", true);
                    }
                }
                stage.shell |= interactive;
            }
            _ if is_interp => {
                generic_reads = false;
                let code_flags: &[&str] = match shell_name {
                    "perl" => &["-e", "-E"],
                    "php" => &["-r"],
                    "node" | "nodejs" | "deno" | "bun" => &["-e", "--eval", "-p", "--print"],
                    "pwsh" | "powershell" => &[
                        "-c",
                        "-command",
                        "-Command",
                        "-EncodedCommand",
                        "-e",
                        "-enc",
                    ],
                    _ => &["-c", "-e"],
                };
                let mut code: Option<&Arg> = None;
                let mut script: Option<&Arg> = None;
                let mut i = 0;
                while i < args.len() {
                    let t = args[i].text.as_str();
                    if code_flags.contains(&t)
                        || (t.starts_with('-')
                            && !t.starts_with("--")
                            && t.len() > 2
                            && t.ends_with(code_flags[0].trim_start_matches('-')))
                    {
                        code = args.get(i + 1);
                        break;
                    }
                    if t == "-m" {
                        break;
                    }
                    if !t.starts_with('-') {
                        script = Some(&args[i]);
                        break;
                    }
                    i += 1;
                }
                if let Some(c) = code {
                    let c = c.clone();
                    match c.origin {
                        Origin::Remote => self.emit(
                            "cmd.download_exec",
                            span,
                            "runs interpreter code downloaded at run time".into(),
                        ),
                        Origin::Decoded => self.emit(
                            "cmd.decode_exec",
                            span,
                            "runs interpreter code decoded at run time".into(),
                        ),
                        _ => {}
                    }
                    let map = self.arg_map(&c);
                    self.interp_code(&c.text, map, span, depth);
                } else if let Some(s) = script {
                    match s.origin {
                        Origin::Remote => self.emit(
                            "cmd.download_exec",
                            span,
                            "runs a script downloaded at run time".into(),
                        ),
                        _ if s.text == "-" => self.stdin_exec(inv, depth, name, false),
                        _ => {
                            let t = s.text.clone();
                            self.file_op(FileOp::Exec, &t, false, span);
                            for a in args.iter().skip(i + 1) {
                                if looks_like_path(&a.text) {
                                    self.file_op(FileOp::Read, &a.text.clone(), false, span);
                                }
                            }
                        }
                    }
                } else if !args.iter().any(|a| a.text == "-m") {
                    stage.shell = true;
                    self.stdin_exec(inv, depth, name, false);
                }
            }
            "eval" => {
                generic_reads = false;
                if !args.is_empty() {
                    let text = args
                        .iter()
                        .map(|a| a.text.as_str())
                        .collect::<Vec<_>>()
                        .join(" ");
                    let origin = args
                        .iter()
                        .map(|a| a.origin)
                        .find(|o| *o != Origin::Plain)
                        .unwrap_or(Origin::Plain);
                    let joined = Arg {
                        text,
                        span: if args.len() == 1 { args[0].span } else { span },
                        origin,
                    };
                    let map = if args.len() == 1 {
                        self.arg_map(&args[0])
                    } else {
                        Map::Whole(span.0, span.1)
                    };
                    self.shell_string(&joined, map, span, depth);
                }
            }
            "source" | "." => {
                generic_reads = false;
                if let Some(a) = args.first() {
                    match a.origin {
                        Origin::Remote => self.emit(
                            "cmd.download_exec",
                            span,
                            "sources a script downloaded at run time".into(),
                        ),
                        Origin::Decoded => self.emit(
                            "cmd.decode_exec",
                            span,
                            "sources a script decoded at run time".into(),
                        ),
                        _ if a.text == "/dev/stdin" || a.text == "-" => {
                            self.stdin_exec(inv, depth, "source", true)
                        }
                        _ => self.file_op(FileOp::Exec, &a.text.clone(), false, span),
                    }
                }
            }
            "rm" | "unlink" | "rmdir" | "srm" => {
                generic_reads = false;
                let recursive = flags.has(&["r", "R", "recursive"])
                    || name == "rmdir" && flags.has(&["p", "parents"]);
                for a in &flags.operands {
                    self.delete(a, recursive, span, "deletes");
                }
            }
            "shred" | "wipe" => {
                generic_reads = false;
                let remove = flags.has(&["u", "remove", "zero"]) || name == "wipe";
                for a in
                    flags.operands_skipping(args, b"ns", &["iterations", "size", "random-source"])
                {
                    let t = self.resolve(&a.text);
                    if is_block_device(&t) {
                        self.emit(
                            "cmd.disk_destroy",
                            span,
                            format!("overwrites the block device {t}"),
                        );
                    } else {
                        self.file_op(FileOp::Write, &a.text, false, span);
                        if remove {
                            self.file_op(FileOp::Delete, &a.text, false, span);
                        }
                        if let Some(p) = self.protected(&a.text, true) {
                            self.emit("cmd.delete_root", span, format!("shreds {p}"));
                        }
                    }
                }
            }
            "find" => {
                generic_reads = false;
                stage.out = self.find(args, inv, depth);
            }
            "mv" => {
                generic_reads = false;
                let ops = flags.operands_skipping(args, b"tS", &["target-directory", "suffix"]);
                if ops.len() >= 2 {
                    let (srcs, dst) = ops.split_at(ops.len() - 1);
                    for s in srcs {
                        if let Some(p) = self.protected(&s.text, true) {
                            self.emit("cmd.delete_root", span, format!("moves {p} away"));
                        }
                        self.file_op(FileOp::Delete, &s.text, true, span);
                    }
                    self.file_op(FileOp::Write, &dst[0].text, false, span);
                }
            }
            "cp" | "install" | "rsync" | "scp" => {
                generic_reads = false;
                let ops = flags.operands_skipping(
                    args,
                    b"tSmogiePF",
                    &[
                        "target-directory",
                        "suffix",
                        "mode",
                        "owner",
                        "group",
                        "rsh",
                        "exclude",
                        "include",
                        "filter",
                        "port",
                    ],
                );
                let recursive = flags.has(&["r", "R", "a", "recursive", "archive"]);
                if ops.len() >= 2 {
                    let (srcs, dst) = ops.split_at(ops.len() - 1);
                    for s in srcs {
                        self.file_op(FileOp::Read, &s.text, recursive, span);
                    }
                    self.file_op(FileOp::Write, &dst[0].text, recursive, span);
                    if name == "rsync" && flags.long_prefix("delete") {
                        if let Some(p) = self.protected(&dst[0].text, true) {
                            self.emit(
                                "cmd.delete_root",
                                span,
                                format!("rsync --delete empties {p}"),
                            );
                        }
                    }
                }
            }
            "ln" => {
                generic_reads = false;
                let ops = flags.operands_skipping(args, b"tS", &["target-directory", "suffix"]);
                if ops.len() >= 2 {
                    self.file_op(FileOp::Write, &ops[ops.len() - 1].text, false, span);
                }
            }
            "tee" => {
                generic_reads = false;
                for a in &flags.operands {
                    self.file_op(FileOp::Write, &a.text, false, span);
                }
                stage.out = Some(inv.stdin.clone());
            }
            "dd" => {
                generic_reads = false;
                for a in args {
                    if let Some(p) = a.text.strip_prefix("of=") {
                        self.file_op(FileOp::Write, p, false, span);
                    } else if let Some(p) = a.text.strip_prefix("if=") {
                        self.file_op(FileOp::Read, p, false, span);
                    }
                }
            }
            "truncate" | "touch" => {
                generic_reads = false;
                for a in flags.operands_skipping(args, b"srdt", &["size", "reference", "date"]) {
                    self.file_op(FileOp::Write, &a.text, false, span);
                }
            }
            "chmod" | "chown" | "chgrp" => {
                generic_reads = false;
                self.chmod(name, &flags, args, span);
            }
            "sed" | "perl-i" => {
                generic_reads = false;
                let inplace = flags.has(&["i", "in-place"])
                    || args
                        .iter()
                        .any(|a| a.text.starts_with("-i") || a.text.starts_with("--in-place"));
                let has_script = args.iter().any(|a| {
                    a.text == "-e" || a.text == "-f" || a.text.starts_with("--expression")
                });
                let ops = flags.operands_skipping(args, b"ef", &["expression", "file"]);
                for (k, a) in ops.iter().enumerate() {
                    if k == 0 && !has_script {
                        continue;
                    }
                    self.file_op(
                        if inplace { FileOp::Write } else { FileOp::Read },
                        &a.text,
                        false,
                        span,
                    );
                }
            }
            "grep" | "egrep" | "fgrep" | "rg" | "ag" | "awk" | "gawk" | "mawk" => {
                generic_reads = false;
                let has_pat = args
                    .iter()
                    .any(|a| a.text == "-e" || a.text == "-f" || a.text.starts_with("--regexp"));
                let ops = flags.operands_skipping(
                    args,
                    b"efABCmdD",
                    &[
                        "regexp",
                        "file",
                        "max-count",
                        "context",
                        "after-context",
                        "before-context",
                        "include",
                        "exclude",
                        "glob",
                        "type",
                    ],
                );
                let recursive = flags.has(&["r", "R", "recursive"]) || name == "rg" || name == "ag";
                for (k, a) in ops.iter().enumerate() {
                    if k == 0 && !has_pat {
                        continue;
                    }
                    self.file_op(FileOp::Read, &a.text, recursive, span);
                }
            }
            "cd" | "pushd" => {
                self.cwd = match flags.operands.first() {
                    None => Some("~".into()),
                    Some(a) if !has_unk(&a.text) && a.text != "-" => {
                        Some(normalize(&self.resolve(&a.text)))
                    }
                    _ => None,
                };
            }
            "echo" => {
                let mut interp = false;
                let mut newline = true;
                let mut k = 0;
                while k < args.len()
                    && args[k].text.starts_with('-')
                    && args[k].text.len() > 1
                    && args[k].text[1..].bytes().all(|b| b"neE".contains(&b))
                {
                    interp |= args[k].text.contains('e');
                    newline &= !args[k].text.contains('n');
                    k += 1;
                }
                let mut t = args[k..]
                    .iter()
                    .map(|a| a.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                if interp {
                    t = unescape(&t, true);
                }
                if newline {
                    t.push('\n');
                }
                stage.out = Some(if has_unk(&t) {
                    Out::Unknown
                } else {
                    Out::Known {
                        text: t,
                        decoded: false,
                    }
                });
            }
            "printf" => {
                generic_reads = false;
                let ops: Vec<&Arg> = args.iter().filter(|a| a.text != "--").collect();
                let ops: Vec<&Arg> = if ops.first().is_some_and(|a| a.text == "-v") {
                    Vec::new()
                } else {
                    ops
                };
                if let Some(fmt) = ops.first() {
                    let t = printf(
                        &fmt.text,
                        &ops[1..].iter().map(|a| a.text.as_str()).collect::<Vec<_>>(),
                    );
                    stage.out = Some(match t {
                        Some(t) if !has_unk(&t) => Out::Known {
                            text: t,
                            decoded: fmt.text.contains("\\x") || fmt.text.contains("\\0"),
                        },
                        _ => Out::Unknown,
                    });
                }
            }
            "cat" | "tac" => {
                if flags.operands.is_empty() || flags.operands.iter().all(|a| a.text == "-") {
                    stage.out = Some(inv.stdin.clone());
                }
            }
            "openssl" if args.first().is_some_and(|a| a.text == "s_client") => {
                stage.network = true;
                stage.out = Some(Out::Network);
            }
            "base64" | "base32" | "basenc" | "xxd" | "rev" | "tr" | "gunzip" | "zcat"
            | "uudecode" | "openssl" | "gzip" | "bzip2" | "xz" | "unxz" | "bunzip2" => {
                if let Some(o) = self.decoder(name, &flags, args, inv) {
                    stage.out = Some(o);
                    if name == "openssl" && args.first().is_some_and(|a| a.text == "s_client") {
                        stage.network = true;
                    }
                }
            }
            _ if DOWNLOADERS.contains(&name) => {
                generic_reads = false;
                stage.out = Some(self.download(name, &flags, args, span));
            }
            _ if NETCATS.contains(&name) => {
                generic_reads = false;
                stage.network = true;
                stage.out = Some(Out::Network);
                let exec = args.iter().any(|a| {
                    let t = a.text.as_str();
                    t == "-e"
                        || t == "-c"
                        || t.starts_with("--exec")
                        || t.starts_with("--sh-exec")
                        || t.starts_with("--lua-exec")
                        || (t.starts_with('-')
                            && !t.starts_with("--")
                            && t.len() > 2
                            && (t.ends_with('e') || t.ends_with('c'))
                            && t[1..].bytes().all(|b| b.is_ascii_alphabetic()))
                });
                if exec {
                    self.emit("cmd.reverse_shell", span, format!("`{name}` hands a program's input and output to a network peer (-e / -c)"));
                }
            }
            "socat" => {
                generic_reads = false;
                stage.network = true;
                stage.out = Some(Out::Network);
                let low: Vec<String> = args.iter().map(|a| a.text.to_ascii_lowercase()).collect();
                let exec = low.iter().any(|t| {
                    t.starts_with("exec:") || t.starts_with("system:") || t.contains(",exec:")
                });
                let net = low.iter().any(|t| {
                    t.contains("tcp")
                        || t.contains("udp")
                        || t.contains("ssl")
                        || t.contains("sctp")
                });
                if exec && net {
                    self.emit(
                        "cmd.reverse_shell",
                        span,
                        "socat joins a program to a network connection".into(),
                    );
                }
            }
            "telnet" => {
                stage.network = true;
                stage.out = Some(Out::Network);
            }
            "kill" => {
                generic_reads = false;
                let mut k = 0;
                if let Some(a) = args.first() {
                    if a.text == "-s" || a.text == "-n" {
                        k = 2;
                    } else if a.text.starts_with('-') && a.text != "--" && a.text != "-1"
                        || a.text == "-1" && args.len() > 1
                    {
                        k = 1;
                    }
                }
                for a in args.iter().skip(k) {
                    if a.text == "-1" || a.text == "1" {
                        self.emit(
                            "cmd.kill_all",
                            span,
                            if a.text == "1" {
                                "kills init (pid 1), taking the machine down".into()
                            } else {
                                "kills every process the user can signal (pid -1)".into()
                            },
                        );
                    }
                }
            }
            "killall5" => self.emit(
                "cmd.kill_all",
                span,
                "killall5 signals every process".into(),
            ),
            "pkill" | "killall" => {
                generic_reads = false;
                for a in flags.operands_skipping(
                    args,
                    b"sUugGPtn",
                    &[
                        "signal", "uid", "euid", "group", "parent", "terminal", "user",
                    ],
                ) {
                    let t = a.text.as_str();
                    if matches!(
                        t,
                        "init"
                            | "systemd"
                            | "."
                            | ".*"
                            | ""
                            | "^"
                            | "sshd"
                            | "containerd"
                            | "dockerd"
                            | "kubelet"
                    ) {
                        self.emit(
                            "cmd.kill_all",
                            span,
                            format!("kills `{t}`, which takes the machine or every process down"),
                        );
                    }
                }
            }
            "shutdown" | "reboot" | "halt" | "poweroff" => {
                if !args
                    .iter()
                    .any(|a| a.text == "-c" || a.text == "--help" || a.text == "--show")
                {
                    self.emit(
                        "cmd.shutdown",
                        span,
                        format!("`{name}` stops or restarts the machine"),
                    );
                }
            }
            "init" | "telinit" => {
                if args.first().is_some_and(|a| a.text == "0" || a.text == "6") {
                    self.emit(
                        "cmd.shutdown",
                        span,
                        format!("`{name} {}` stops or restarts the machine", args[0].text),
                    );
                }
            }
            "systemctl" | "service" => self.services(name, &flags, span),
            "auditctl" => {
                let e0 = args
                    .windows(2)
                    .any(|w| w[0].text == "-e" && w[1].text == "0");
                if e0 || args.iter().any(|a| a.text == "-D") {
                    self.emit(
                        "cmd.audit_tamper",
                        span,
                        "turns off the audit system or deletes its rules".into(),
                    );
                }
            }
            "setenforce" => {
                if args
                    .first()
                    .is_some_and(|a| a.text == "0" || a.text.eq_ignore_ascii_case("permissive"))
                {
                    self.emit(
                        "cmd.audit_tamper",
                        span,
                        "switches SELinux to permissive".into(),
                    );
                }
            }
            "aa-teardown" | "aa-disable" | "aa-complain" => self.emit(
                "cmd.audit_tamper",
                span,
                format!("`{name}` turns AppArmor protection off"),
            ),
            "iptables" | "ip6tables" | "iptables-legacy" | "iptables-nft" | "ip6tables-legacy"
            | "ip6tables-nft" => {
                let flush = args
                    .iter()
                    .any(|a| matches!(a.text.as_str(), "-F" | "--flush" | "-X" | "--delete-chain"));
                let policy_accept = args.windows(3).any(|w| {
                    (w[0].text == "-P" || w[0].text == "--policy") && w[2].text == "ACCEPT"
                });
                if flush || policy_accept {
                    self.emit(
                        "cmd.firewall_tamper",
                        span,
                        "flushes firewall rules or opens the default policy".into(),
                    );
                }
            }
            "ufw" => {
                if flags
                    .operands
                    .first()
                    .is_some_and(|a| a.text == "disable" || a.text == "reset")
                {
                    self.emit(
                        "cmd.firewall_tamper",
                        span,
                        "turns the ufw firewall off".into(),
                    );
                }
            }
            "nft" => {
                let t: Vec<&str> = flags.operands.iter().map(|a| a.text.as_str()).collect();
                if t.len() >= 2
                    && (t[0] == "flush" && t[1] == "ruleset" || t[0] == "delete" && t[1] == "table")
                {
                    self.emit(
                        "cmd.firewall_tamper",
                        span,
                        "deletes nftables firewall rules".into(),
                    );
                }
            }
            "history" => {
                if args
                    .iter()
                    .any(|a| a.text == "-c" || a.text.starts_with("-c") || a.text == "-d")
                {
                    self.emit("cmd.history_tamper", span, "clears shell history".into());
                }
            }
            "set" => {
                if args
                    .windows(2)
                    .any(|w| w[0].text == "+o" && w[1].text == "history")
                {
                    self.emit("cmd.history_tamper", span, "turns shell history off".into());
                }
            }
            "unset" => {
                if args.iter().any(|a| a.text == "HISTFILE") {
                    self.emit(
                        "cmd.history_tamper",
                        span,
                        "unsets HISTFILE, so history is not saved".into(),
                    );
                }
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for a in args {
                    if let Some((k, v)) = a.text.split_once('=') {
                        if is_name(k) && self.vars.get(k).is_none_or(|x| x != v) {
                            self.set_var(k, v.to_string(), span);
                        }
                    }
                }
            }
            "crontab" => {
                generic_reads = false;
                if args.iter().any(|a| a.text == "-r") {
                    self.emit("cmd.cron_tamper", span, "removes the user's crontab".into());
                } else if !args.iter().any(|a| {
                    a.text == "-l" || a.text == "-e" || a.text == "-h" || a.text == "--help"
                }) {
                    self.emit(
                        "cmd.cron_tamper",
                        span,
                        "installs a new crontab (runs commands on a schedule)".into(),
                    );
                }
            }
            _ if name.starts_with("mkfs")
                || matches!(
                    name,
                    "mke2fs"
                        | "mkswap"
                        | "mkntfs"
                        | "mkdosfs"
                        | "wipefs"
                        | "blkdiscard"
                        | "sgdisk"
                        | "sfdisk"
                        | "fdisk"
                        | "parted"
                        | "cfdisk"
                        | "gdisk"
                        | "hdparm"
                        | "badblocks"
                        | "nvme"
                        | "cryptsetup"
                ) =>
            {
                generic_reads = false;
                let readonly = match name {
                    "fdisk" | "sfdisk" | "gdisk" | "sgdisk" | "parted" => {
                        args.iter().any(|a| {
                            matches!(
                                a.text.as_str(),
                                "-l" | "--list" | "-p" | "print" | "--print" | "-d" | "--dump"
                            )
                        }) && !args.iter().any(|a| {
                            a.text.contains("mklabel")
                                || a.text.starts_with("-Z")
                                || a.text == "--zap-all"
                                || a.text == "-o"
                        })
                    }
                    "hdparm" => !args.iter().any(|a| {
                        a.text.starts_with("--security-erase")
                            || a.text.starts_with("--trim-sector")
                            || a.text == "--yes-i-know-what-i-am-doing"
                    }),
                    "badblocks" => !args.iter().any(|a| a.text == "-w"),
                    "nvme" => !args
                        .iter()
                        .any(|a| matches!(a.text.as_str(), "format" | "sanitize")),
                    "cryptsetup" => !args
                        .iter()
                        .any(|a| matches!(a.text.as_str(), "luksFormat" | "erase" | "luksErase")),
                    _ => false,
                };
                if !readonly {
                    for a in args {
                        let t = self.resolve(&a.text);
                        if is_block_device(&t) {
                            self.emit(
                                "cmd.disk_destroy",
                                span,
                                format!("`{name}` destroys the filesystem or data on {t}"),
                            );
                            break;
                        }
                    }
                }
            }
            _ => {}
        }

        if generic_reads {
            for a in args {
                let mut t = a.text.as_str();
                if t.starts_with("--") {
                    match t.split_once('=') {
                        Some((_, v)) => t = v,
                        None => continue,
                    }
                } else if t.starts_with('-') {
                    continue;
                }
                let t = t.trim_start_matches('@').trim_start_matches('<');
                if looks_like_path(t)
                    || self.cwd.is_some() && !t.is_empty() && !t.contains(' ') && !has_unk(t)
                {
                    let t = t.to_string();
                    self.file_op(FileOp::Read, &t, false, span);
                }
            }
        }
        let _ = path0;
        stage
    }

    fn delete(&mut self, a: &Arg, recursive: bool, span: (usize, usize), verb: &str) {
        if recursive {
            if let Some(p) = self.protected(&a.text, true) {
                self.emit("cmd.delete_root", span, format!("{verb} {p} recursively"));
                return;
            } else if has_unk(&a.text) {
                let empty = a.text.replace(UNK, "").replace(UNK_SET, "x");
                if !empty.is_empty() {
                    if let Some(p) = self.protected(&empty, true) {
                        self.emit("cmd.delete_maybe_root", span, format!("{verb} {p} recursively if a variable in it is empty or unset (use ${{VAR:?}})"));
                    }
                }
            }
        }
        self.file_op(FileOp::Delete, &a.text, recursive, span);
    }

    fn chmod(&mut self, name: &str, flags: &Flags, args: &[Arg], span: (usize, usize)) {
        let recursive = flags.has(&["R", "recursive"]);
        let has_ref = args.iter().any(|a| a.text.starts_with("--reference"));
        let ops: Vec<&Arg> = flags.operands.iter().collect();
        let (mode, targets): (Option<&Arg>, &[&Arg]) = if has_ref || ops.is_empty() {
            (None, &ops[..])
        } else {
            (Some(ops[0]), &ops[1..])
        };
        // chmod accepts modes like -x that look like flags.
        let mode_text = mode
            .map(|m| m.text.clone())
            .or_else(|| {
                args.iter()
                    .find(|a| {
                        a.text.starts_with('-')
                            && a.text.len() > 1
                            && a.text[1..].bytes().all(|b| b"rwxXst".contains(&b))
                    })
                    .map(|a| a.text.clone())
            })
            .unwrap_or_default();
        let world = name == "chmod"
            && (mode_text.ends_with("777")
                || mode_text.ends_with("666")
                || mode_text.contains("o+w")
                || mode_text.contains("a+w")
                || mode_text == "+w"
                || mode_text.ends_with("776")
                || mode_text.ends_with("767"));
        let setuid = name == "chmod"
            && (mode_text.contains("+s")
                || mode_text.contains("u+s")
                || mode_text.len() == 4
                    && (mode_text.starts_with('4')
                        || mode_text.starts_with('6')
                        || mode_text.starts_with('2')));
        let loosens = world
            || setuid
            || mode_text.contains("+w")
            || mode_text.contains("+x") && name == "chmod";
        for t in targets {
            let prot = self.protected(&t.text, false);
            if name != "chmod" {
                // Ownership, not content: checked as a write, but not through every
                // file beneath (a home directory holds keys its owner may own).
                self.file_op(FileOp::Write, &t.text, false, span);
            } else if loosens {
                self.file_op(FileOp::Write, &t.text, recursive && prot.is_none(), span);
            }
            if let Some(p) = &prot {
                if recursive || world {
                    self.emit(
                        "cmd.chmod_system",
                        span,
                        format!(
                            "`{name}` {} changes {p}",
                            if recursive {
                                "recursively"
                            } else {
                                "world-writably"
                            }
                        ),
                    );
                }
            }
            if setuid {
                let n = normalize(&self.resolve(&t.text));
                let base = basename(&n);
                let sys = [
                    "/bin/",
                    "/sbin/",
                    "/usr/bin/",
                    "/usr/sbin/",
                    "/usr/local/bin/",
                ]
                .iter()
                .any(|p| n.starts_with(p));
                if sys
                    || SHELLS.contains(&base)
                    || INTERPS.contains(&base)
                    || base.starts_with("python")
                    || matches!(base, "find" | "vim" | "vi" | "less" | "cp" | "env" | "nmap")
                {
                    self.emit(
                        "cmd.chmod_system",
                        span,
                        format!("sets the setuid/setgid bit on {n}, a root shell for anyone"),
                    );
                }
            }
        }
    }

    fn services(&mut self, name: &str, flags: &Flags, span: (usize, usize)) {
        let ops: Vec<&str> = flags.operands.iter().map(|a| a.text.as_str()).collect();
        let (action, units): (&str, Vec<&str>) = if name == "service" {
            (
                ops.get(1).copied().unwrap_or(""),
                ops.first().copied().into_iter().collect(),
            )
        } else {
            (
                ops.first().copied().unwrap_or(""),
                ops.iter().skip(1).copied().collect(),
            )
        };
        if name == "systemctl"
            && matches!(
                action,
                "reboot" | "poweroff" | "halt" | "kexec" | "soft-reboot"
            )
        {
            self.emit(
                "cmd.shutdown",
                span,
                format!("`systemctl {action}` stops or restarts the machine"),
            );
            return;
        }
        if !matches!(action, "stop" | "disable" | "mask" | "kill") {
            return;
        }
        for u in units {
            let u = u.trim_end_matches(".service");
            if matches!(
                u,
                "auditd"
                    | "apparmor"
                    | "selinux"
                    | "falco"
                    | "osqueryd"
                    | "wazuh-agent"
                    | "rsyslog"
                    | "syslog"
                    | "systemd-journald"
            ) {
                self.emit(
                    "cmd.audit_tamper",
                    span,
                    format!("stops the `{u}` security or logging service"),
                );
            } else if matches!(
                u,
                "firewalld"
                    | "ufw"
                    | "nftables"
                    | "iptables"
                    | "ip6tables"
                    | "netfilter-persistent"
            ) {
                self.emit(
                    "cmd.firewall_tamper",
                    span,
                    format!("stops the `{u}` firewall"),
                );
            }
        }
    }

    fn find(&mut self, args: &[Arg], inv: &mut Inv, depth: usize) -> Option<Out> {
        let span = inv.span;
        let mut k = 0;
        while k < args.len() && matches!(args[k].text.as_str(), "-H" | "-L" | "-P") {
            k += 1;
        }
        let mut roots: Vec<String> = Vec::new();
        while k < args.len()
            && !args[k].text.starts_with('-')
            && args[k].text != "("
            && args[k].text != "!"
        {
            roots.push(args[k].text.clone());
            k += 1;
        }
        if roots.is_empty() {
            roots.push(".".into());
        }
        let expr = &args[k..];
        const FILTERS: &[&str] = &[
            "-name",
            "-iname",
            "-path",
            "-ipath",
            "-regex",
            "-iregex",
            "-type",
            "-newer",
            "-mtime",
            "-mmin",
            "-atime",
            "-ctime",
            "-size",
            "-user",
            "-group",
            "-perm",
            "-empty",
            "-links",
            "-inum",
            "-samefile",
            "-wholename",
            "-iwholename",
            "-uid",
            "-gid",
            "-nouser",
            "-nogroup",
            "-lname",
            "-fstype",
            "-xtype",
        ];
        let filtered = expr.windows(2).any(|w| {
            FILTERS.contains(&w[0].text.as_str())
                && !(w[0].text.ends_with("name") && w[1].text == "*")
        }) || expr
            .iter()
            .any(|a| a.text == "-empty" || a.text == "-nouser" || a.text == "-nogroup");
        let mut i = 0;
        let mut has_action = false;
        while i < expr.len() {
            let t = expr[i].text.as_str();
            if t == "-delete" {
                has_action = true;
                for r in &roots {
                    if !filtered {
                        let a = Arg::plain(r.clone(), span);
                        self.delete(&a, true, span, "find -delete empties");
                    }
                }
            } else if matches!(t, "-exec" | "-execdir" | "-ok" | "-okdir") {
                has_action = true;
                let mut j = i + 1;
                let mut sub = Vec::new();
                while j < expr.len() && expr[j].text != ";" && expr[j].text != "+" {
                    sub.push(expr[j].clone());
                    j += 1;
                }
                if inv.nest < 4 {
                    for r in &roots {
                        let replaced: Vec<Arg> = sub
                            .iter()
                            .map(|a| {
                                let mut a = a.clone();
                                if a.text.contains("{}") {
                                    let with = if filtered {
                                        format!("{}/{}", r.trim_end_matches('/'), UNK_SET)
                                    } else {
                                        r.clone()
                                    };
                                    a.text = a.text.replace("{}", &with);
                                }
                                a
                            })
                            .collect();
                        if !replaced.is_empty() {
                            let mut sub_inv = Inv {
                                nest: inv.nest + 1,
                                stdin: Out::Unknown,
                                ..inv.clone()
                            };
                            self.run_argv(replaced, &mut sub_inv, depth);
                        }
                    }
                }
                i = j;
            } else if t == "-fprint" || t == "-fls" || t == "-fprintf" {
                has_action = true;
            }
            i += 1;
        }
        if !has_action && !filtered && roots.len() == 1 {
            return Some(Out::FindAll(roots[0].clone()));
        }
        None
    }

    fn decoder(&mut self, name: &str, flags: &Flags, args: &[Arg], inv: &Inv) -> Option<Out> {
        let decode = match name {
            "base64" | "base32" | "basenc" => flags.has(&["d", "D", "decode"]),
            "xxd" => flags.has(&["r", "revert"]),
            "rev" => true,
            "tr" => true,
            "gunzip" | "zcat" | "uudecode" | "unxz" | "bunzip2" => true,
            "gzip" | "bzip2" | "xz" => flags.has(&["d", "decompress"]),
            "openssl" => {
                args.iter().any(|a| a.text == "-d")
                    && args.iter().any(|a| {
                        a.text == "base64"
                            || a.text == "-base64"
                            || a.text == "enc"
                            || a.text == "-a"
                    })
            }
            _ => false,
        };
        if !decode {
            return None;
        }
        let from_file =
            flags.operands.iter().any(|a| a.text != "-") && !matches!(name, "tr" | "openssl");
        if from_file {
            for a in &flags.operands {
                let t = a.text.clone();
                self.file_op(FileOp::Read, &t, false, inv.span);
            }
            return Some(Out::Decoded);
        }
        Some(match &inv.stdin {
            Out::Remote => Out::Remote,
            Out::Network => Out::Network,
            Out::Known { text, .. } => {
                let r = match name {
                    "base64" | "openssl" | "basenc" if !flags.has(&["base32"]) => {
                        b64decode(text.trim())
                    }
                    "xxd" => hexdecode(text.trim()),
                    "rev" => Some(
                        text.trim_end_matches('\n')
                            .lines()
                            .map(|l| l.chars().rev().collect::<String>())
                            .collect::<Vec<_>>()
                            .join("\n"),
                    ),
                    "tr" => {
                        let ops: Vec<&str> =
                            flags.operands.iter().map(|a| a.text.as_str()).collect();
                        if ops.len() == 2 && is_rot13(ops[0], ops[1]) {
                            Some(rot13(text))
                        } else {
                            None
                        }
                    }
                    _ => None,
                };
                match r {
                    Some(t) => Out::Known {
                        text: t,
                        decoded: true,
                    },
                    None => Out::Decoded,
                }
            }
            _ => Out::Decoded,
        })
    }

    fn download(&mut self, name: &str, flags: &Flags, args: &[Arg], span: (usize, usize)) -> Out {
        let mut to_stdout = true;
        let urls: Vec<String> = args
            .iter()
            .filter(|a| a.text.contains("://"))
            .map(|a| a.text.clone())
            .collect();
        let mut i = 0;
        while i < args.len() {
            let t = args[i].text.as_str();
            let next = args.get(i + 1).map(|a| a.text.clone());
            let file_value = |opt: &str| -> Option<String> {
                if t == opt {
                    next.clone()
                } else {
                    t.strip_prefix(opt)
                        .filter(|v| !v.is_empty() && opt.len() == 2)
                        .map(str::to_string)
                }
            };
            match name {
                "curl" => {
                    if let Some(v) = file_value("-o")
                        .or_else(|| (t == "--output").then(|| next.clone()).flatten())
                    {
                        if v != "-" {
                            to_stdout = false;
                            self.downloaded.push(normalize(&self.resolve(&v)));
                            self.file_op(FileOp::Write, &v, false, span);
                        }
                    } else if t == "-O"
                        || t == "--remote-name"
                        || (t.starts_with('-') && !t.starts_with("--") && t.contains('O'))
                    {
                        to_stdout = false;
                        for u in &urls {
                            if let Some(b) = url_basename(u) {
                                self.downloaded.push(normalize(&self.resolve(&b)));
                            }
                        }
                    } else if matches!(
                        t,
                        "-d" | "--data"
                            | "--data-binary"
                            | "--data-raw"
                            | "--data-urlencode"
                            | "-F"
                            | "--form"
                            | "-T"
                            | "--upload-file"
                    ) {
                        if let Some(v) = next.clone() {
                            let p = v
                                .rsplit_once('@')
                                .map(|(_, p)| p.to_string())
                                .or_else(|| v.rsplit_once('<').map(|(_, p)| p.to_string()))
                                .unwrap_or(v.clone());
                            if t == "-T"
                                || t == "--upload-file"
                                || v.contains('@')
                                || v.contains('<')
                            {
                                self.file_op(FileOp::Read, &p, false, span);
                            }
                        }
                    }
                }
                "wget" => {
                    let v = if t == "-O" || t == "--output-document" {
                        next.clone()
                    } else if let Some(v) = t.strip_prefix("--output-document=") {
                        Some(v.to_string())
                    } else if t.starts_with('-') && !t.starts_with("--") && t.contains('O') {
                        let after = &t[t.find('O').unwrap_or(0) + 1..];
                        Some(if after.is_empty() {
                            next.clone().unwrap_or_default()
                        } else {
                            after.to_string()
                        })
                    } else {
                        None
                    };
                    if let Some(v) = v {
                        if v != "-" {
                            self.downloaded.push(normalize(&self.resolve(&v)));
                            self.file_op(FileOp::Write, &v, false, span);
                            to_stdout = false;
                        } else {
                            to_stdout = true;
                        }
                        i += 1;
                        if i >= args.len() {
                            break;
                        }
                        continue;
                    }
                    if matches!(t, "--post-file" | "--body-file") {
                        if let Some(v) = next.clone() {
                            self.file_op(FileOp::Read, &v, false, span);
                        }
                    }
                }
                _ => {
                    if let Some(v) = file_value("-o") {
                        if v != "-" {
                            to_stdout = false;
                            self.downloaded.push(normalize(&self.resolve(&v)));
                        }
                    }
                }
            }
            i += 1;
        }
        if name == "wget" {
            let explicit = args.iter().any(|a| {
                a.text == "-O"
                    || a.text.starts_with("--output-document")
                    || (a.text.starts_with('-')
                        && !a.text.starts_with("--")
                        && a.text.contains('O'))
            });
            if !explicit {
                to_stdout = false;
                for u in &urls {
                    if let Some(b) = url_basename(u) {
                        self.downloaded.push(normalize(&self.resolve(&b)));
                    }
                }
            }
        }
        let _ = flags;
        if to_stdout { Out::Remote } else { Out::Unknown }
    }

    /// Interpreter one-liners: reverse shells, fork bombs, shell commands in strings,
    /// tree deletion, credential paths.
    fn interp_code(&mut self, code: &str, map: Map, span: (usize, usize), depth: usize) {
        if self.tick(1 + code.len() / 64) {
            return;
        }
        let low = code.to_ascii_lowercase();
        let net = [
            "socket",
            "fsockopen",
            "tcpsocket",
            "net.connect",
            "net.socket",
            "/dev/tcp/",
            "io::socket",
            "new-object system.net.sockets",
        ]
        .iter()
        .any(|k| low.contains(k));
        let exec = [
            "subprocess",
            "pty.spawn",
            "dup2",
            "/bin/sh",
            "/bin/bash",
            "exec(",
            "exec ",
            "spawn",
            "child_process",
            "proc_open",
            "popen",
            "system(",
            "cmd.exe",
            "sh -i",
            "iex",
        ]
        .iter()
        .any(|k| low.contains(k));
        if net && exec {
            self.emit(
                "cmd.reverse_shell",
                span,
                "interpreter one-liner connects a socket to a shell".into(),
            );
        }
        let forks = low.matches("fork").count();
        if forks > 0
            && (low.contains("while")
                || low.contains("loop")
                || low.contains("for ")
                || forks > 1
                || low.contains("until"))
        {
            self.emit(
                "cmd.fork_bomb",
                span,
                "interpreter one-liner forks in a loop".into(),
            );
        }
        let lits = string_literals(code);
        let runs = [
            "system",
            "popen",
            "subprocess",
            "exec",
            "spawn",
            "shell_exec",
            "passthru",
            "check_output",
            "call(",
            "run(",
            "`",
        ]
        .iter()
        .any(|k| low.contains(k));
        let tree = [
            "rmtree",
            "rm_rf",
            "rm_r(",
            "rmsync",
            "rmdirsync",
            "remove_tree",
            "rimraf",
            "remove-item",
        ]
        .iter()
        .any(|k| low.contains(k));
        for (s, e) in lits.iter().take(32) {
            let lit = &code[*s..*e];
            let lspan = match map {
                Map::Offset(b) => (b + s, b + e),
                Map::Whole(a, b) => (a, b),
            };
            if looks_like_path(lit) {
                let p = lit.to_string();
                self.file_op(FileOp::Read, &p, false, lspan);
            }
            if tree {
                if let Some(p) = self.protected(lit, true) {
                    self.emit(
                        "cmd.delete_root",
                        span,
                        format!("interpreter code deletes {p} recursively"),
                    );
                }
            }
            if runs && lit.contains(' ') && depth < self.limits.max_depth {
                let m = match map {
                    Map::Offset(b) => Map::Offset(b + s),
                    w => w,
                };
                self.analyze_text(lit, m, depth + 1);
            }
        }
        if runs && lits.len() >= 2 {
            // subprocess.run(["rm", "-rf", "/"]) -> one command line.
            let mut groups: Vec<Vec<&str>> = vec![Vec::new()];
            let mut last_end = 0;
            for (s, e) in &lits {
                let between = &code[last_end.min(*s)..*s];
                if between.contains(']') || between.contains(')') || between.contains(';') {
                    groups.push(Vec::new());
                }
                if let Some(g) = groups.last_mut() {
                    g.push(&code[*s..*e]);
                }
                last_end = *e;
            }
            for g in groups.iter().filter(|g| g.len() >= 2).take(8) {
                let joined = g
                    .iter()
                    .map(|w| shell_quote(w))
                    .collect::<Vec<_>>()
                    .join(" ");
                self.analyze_text(&joined, Map::Whole(span.0, span.1), depth + 1);
            }
        }
        let plain_lits: Vec<&str> = lits.iter().map(|(s, e)| &code[*s..*e]).collect();
        if plain_lits.iter().any(|l| l.starts_with("/dev/tcp/")) {
            self.emit(
                "cmd.reverse_shell",
                span,
                "interpreter code opens /dev/tcp".into(),
            );
        }
        if low.contains("os.system") || low.contains("subprocess") {
            // handled above through literals
        }
    }
}

struct WordState {
    fields: Vec<String>,
    origin: Origin,
    quoted: bool,
}

impl WordState {
    fn push(&mut self, s: &str) {
        if let Some(f) = self.fields.last_mut() {
            f.push_str(s);
        }
    }
    fn expansion(&mut self, v: &str, quoted: bool) {
        if quoted || !v.contains(|c: char| c.is_ascii_whitespace()) {
            self.push(v);
            return;
        }
        let mut first = true;
        let starts_ws = v.starts_with(|c: char| c.is_ascii_whitespace());
        for part in v.split_ascii_whitespace() {
            if first && !starts_ws {
                self.push(part);
            } else if self.fields.len() < 256 {
                if self.fields.last().is_some_and(|f| f.is_empty()) {
                    self.push(part);
                } else {
                    self.fields.push(part.to_string());
                }
            }
            first = false;
        }
        if v.ends_with(|c: char| c.is_ascii_whitespace()) && self.fields.len() < 256 {
            self.fields.push(String::new());
        }
    }
}

/// Expands `a{b,c}d` into `abd`, `acd` (nested groups too), at most 16 results.
fn brace_expand(s: &str) -> Vec<String> {
    let mut out = vec![s.to_string()];
    for _ in 0..4 {
        let mut next = Vec::new();
        let mut changed = false;
        for w in &out {
            let b = w.as_bytes();
            let Some(open) = b.iter().position(|c| *c == b'{') else {
                next.push(w.clone());
                continue;
            };
            let mut depth = 0;
            let mut close = None;
            let mut commas = Vec::new();
            for (i, c) in b.iter().enumerate().skip(open) {
                match c {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = Some(i);
                            break;
                        }
                    }
                    b',' if depth == 1 => commas.push(i),
                    _ => {}
                }
            }
            let (Some(close), false) = (close, commas.is_empty()) else {
                next.push(w.clone());
                continue;
            };
            changed = true;
            let mut start = open + 1;
            for end in commas.iter().copied().chain(std::iter::once(close)) {
                if next.len() < 16 {
                    next.push(format!(
                        "{}{}{}",
                        &w[..open],
                        &w[start..end],
                        &w[close + 1..]
                    ));
                }
                start = end + 1;
            }
        }
        out = next;
        if !changed {
            break;
        }
    }
    out
}

fn redirect_loc(r: &ast::IoRedirect) -> Option<brush_parser::SourceSpan> {
    use ast::IoFileRedirectTarget as T;
    match r {
        ast::IoRedirect::File(_, _, T::Filename(w) | T::Duplicate(w)) => w.loc.clone(),
        ast::IoRedirect::File(_, _, T::ProcessSubstitution(_, s)) => Some(s.loc.clone()),
        ast::IoRedirect::HereString(_, w) | ast::IoRedirect::OutputAndError(w, _) => w.loc.clone(),
        ast::IoRedirect::HereDocument(_, d) => d.here_end.loc.clone(),
        _ => None,
    }
}

fn origin_of(o: &Out) -> Origin {
    match o {
        Out::Remote => Origin::Remote,
        Out::Network => Origin::Network,
        Out::Decoded | Out::Known { decoded: true, .. } => Origin::Decoded,
        _ => Origin::Plain,
    }
}

/// Options of one command: short flags split into letters, long flags by name.
struct Flags {
    short: Vec<u8>,
    long: Vec<String>,
    operands: Vec<Arg>,
}

impl Flags {
    fn parse(args: &[Arg]) -> Flags {
        let mut f = Flags {
            short: Vec::new(),
            long: Vec::new(),
            operands: Vec::new(),
        };
        let mut end = false;
        for a in args {
            let t = a.text.as_str();
            if end {
                f.operands.push(a.clone());
            } else if t == "--" {
                end = true;
            } else if let Some(l) = t.strip_prefix("--") {
                f.long.push(l.split('=').next().unwrap_or("").to_string());
            } else if t.len() > 1
                && t.starts_with('-')
                && !t[1..].starts_with(|c: char| c.is_ascii_digit())
            {
                f.short.extend(t[1..].bytes());
            } else {
                f.operands.push(a.clone());
            }
        }
        f
    }
    fn has(&self, names: &[&str]) -> bool {
        names.iter().any(|n| {
            if n.len() == 1 {
                self.short.contains(&n.as_bytes()[0])
            } else {
                self.long.iter().any(|l| l == n)
            }
        })
    }
    fn long_prefix(&self, p: &str) -> bool {
        self.long.iter().any(|l| l.starts_with(p))
    }
    /// Operands, skipping the values of options that take one.
    fn operands_skipping<'b>(
        &self,
        args: &'b [Arg],
        short_val: &[u8],
        long_val: &[&str],
    ) -> Vec<&'b Arg> {
        let mut out = Vec::new();
        let mut i = 0;
        let mut end = false;
        while i < args.len() {
            let t = args[i].text.as_str();
            if end {
                out.push(&args[i]);
            } else if t == "--" {
                end = true;
            } else if let Some(l) = t.strip_prefix("--") {
                if !l.contains('=') && long_val.contains(&l) {
                    i += 1;
                }
            } else if t.len() > 1
                && t.starts_with('-')
                && !t[1..].starts_with(|c: char| c.is_ascii_digit())
            {
                let b = t.as_bytes();
                if let Some(pos) = b[1..].iter().position(|c| short_val.contains(c)) {
                    if pos + 2 == b.len() {
                        i += 1;
                    }
                }
            } else {
                out.push(&args[i]);
            }
            i += 1;
        }
        out
    }
}

/// Skips a wrapper's options and returns the wrapped argv.
fn skip_opts(rest: &[Arg], short_val: &[u8], long_val: &[&str]) -> Option<Vec<Arg>> {
    let mut i = 0;
    while i < rest.len() {
        let t = rest[i].text.as_str();
        if t == "--" {
            i += 1;
            break;
        }
        if let Some(l) = t.strip_prefix("--") {
            if !l.contains('=') && long_val.contains(&l) {
                i += 1;
            }
        } else if t.len() > 1 && t.starts_with('-') {
            let b = t.as_bytes();
            if b[1].is_ascii_digit() && short_val.contains(&b'n') {
                // nice -10
            } else if let Some(pos) = b[1..].iter().position(|c| short_val.contains(c)) {
                if pos + 2 == b.len() {
                    i += 1;
                }
            }
        } else {
            break;
        }
        i += 1;
    }
    Some(rest.get(i..).map(<[Arg]>::to_vec).unwrap_or_default())
}

/// The value of `-c VALUE` / `--command VALUE` / `--command=VALUE`.
fn opt_value(rest: &[Arg], short: u8, long: &str) -> Option<Arg> {
    for (i, a) in rest.iter().enumerate() {
        let t = a.text.as_str();
        if let Some(l) = t.strip_prefix("--") {
            if l == long {
                return rest.get(i + 1).cloned();
            }
            if let Some(v) = l.strip_prefix(long).and_then(|v| v.strip_prefix('=')) {
                return Some(Arg {
                    text: v.to_string(),
                    span: a.span,
                    origin: a.origin,
                });
            }
        } else if t.len() > 1
            && t.starts_with('-')
            && t.as_bytes()[t.len() - 1] == short
            && t[1..].bytes().all(|b| b.is_ascii_alphabetic())
        {
            return rest.get(i + 1).cloned();
        }
    }
    None
}

fn is_name(k: &str) -> bool {
    !k.is_empty()
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !k.as_bytes()[0].is_ascii_digit()
}

pub(crate) fn basename(p: &str) -> &str {
    p.trim_end_matches('/').rsplit('/').next().unwrap_or(p)
}

fn looks_like_path(t: &str) -> bool {
    !t.is_empty()
        && t.len() < 4096
        && !t.contains("://")
        && !t.contains(' ')
        && (t.contains('/') || t.starts_with('.') || t.starts_with('~'))
}

fn url_basename(u: &str) -> Option<String> {
    let path = u.split_once("://").map(|(_, r)| r).unwrap_or(u);
    let path = path.split(['?', '#']).next().unwrap_or("");
    let (_, p) = path.split_once('/')?;
    let b = basename(p);
    (!b.is_empty()).then(|| b.to_string())
}

pub(crate) fn is_block_device(p: &str) -> bool {
    let n = normalize(p);
    let Some(d) = n.strip_prefix("/dev/") else {
        return false;
    };
    [
        "sd", "hd", "vd", "xvd", "nvme", "mmcblk", "md", "dm-", "mapper/", "disk/", "loop", "sr",
        "nbd", "rbd", "zd", "bcache",
    ]
    .iter()
    .any(|p| d.starts_with(p))
        && !d.starts_with("mqueue")
}

/// Maximum bracket nesting, counted naively (quotes ignored): an over-estimate.
/// Deepest `(` nesting allowed before the text is parsed at all.
const MAX_PAREN_DEPTH: usize = 12;

/// How deep `(` nest in `text`, ignoring other brackets.
fn paren_nesting(text: &str) -> usize {
    let (mut d, mut m) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'(' => {
                d += 1;
                m = m.max(d);
            }
            b')' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    m
}

fn nesting(text: &str) -> usize {
    let (mut d, mut m) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'(' | b'{' | b'[' => {
                d += 1;
                m = m.max(d);
            }
            b')' | b'}' | b']' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    // Backquotes nest by escaping; count them as depth too.
    m.max(text.matches("\\`").count())
}

/// Decodes backslash escapes (`$'…'` and `echo -e`).
fn unescape(s: &str, echo: bool) -> String {
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'e' | b'E' => out.push(27),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                if n == 0 {
                    out.extend_from_slice(b"\\x");
                } else {
                    out.push(v as u8);
                }
            }
            b'u' | b'U' => {
                let max = if c == b'u' { 4 } else { 8 };
                let mut v = 0u32;
                let mut n = 0;
                while n < max && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                let ch = char::from_u32(v).unwrap_or('\u{fffd}');
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
            b'0'..=b'7' => {
                let mut v = (c - b'0') as u32;
                let mut n = 1;
                let max = if echo && c == b'0' { 4 } else { 3 };
                while n < max && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + (b[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'c' if echo => break,
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn printf(fmt: &str, args: &[&str]) -> Option<String> {
    let f = unescape(fmt, true);
    let mut out = String::new();
    let mut it = args.iter();
    let mut chars = f.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('s') => out.push_str(it.next().copied().unwrap_or("")),
            Some('b') => out.push_str(&unescape(it.next().copied().unwrap_or(""), true)),
            Some('c') => out.push_str(
                &it.next()
                    .copied()
                    .unwrap_or("")
                    .chars()
                    .take(1)
                    .collect::<String>(),
            ),
            _ => return None,
        }
    }
    Some(out)
}

fn b64decode(s: &str) -> Option<String> {
    let mut buf = 0u32;
    let mut bits = 0;
    let mut out = Vec::new();
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return None,
        };
        buf = (buf << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hexdecode(s: &str) -> Option<String> {
    let h: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !h.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::new();
    for p in h.chunks(2) {
        let hi = (p[0] as char).to_digit(16)?;
        let lo = (p[1] as char).to_digit(16)?;
        out.push((hi * 16 + lo) as u8);
    }
    String::from_utf8(out).ok()
}

fn is_rot13(a: &str, b: &str) -> bool {
    let a = a.replace(['[', ']', '\''], "");
    let b = b.replace(['[', ']', '\''], "");
    matches!(
        (a.as_str(), b.as_str()),
        ("A-Za-z", "N-ZA-Mn-za-m")
            | ("a-zA-Z", "n-za-mN-ZA-M")
            | ("a-z", "n-za-m")
            | ("A-Z", "N-ZA-M")
    )
}

fn rot13(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' => (((c as u8 - b'a') + 13) % 26 + b'a') as char,
            'A'..='Z' => (((c as u8 - b'A') + 13) % 26 + b'A') as char,
            _ => c,
        })
        .collect()
}

/// Byte ranges of the contents of '…' and "…" literals in interpreter code.
fn string_literals(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() && out.len() < 64 {
        let q = b[i];
        if q == b'\'' || q == b'"' || q == b'`' {
            let s = i + 1;
            let mut j = s;
            while j < b.len() && b[j] != q {
                if b[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            if j >= b.len() {
                break;
            }
            if code.is_char_boundary(s) && code.is_char_boundary(j) {
                out.push((s, j));
            }
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

fn shell_quote(w: &str) -> String {
    if !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%~".contains(&b))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

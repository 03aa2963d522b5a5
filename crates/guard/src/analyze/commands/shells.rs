//! Shells, interpreters, `eval` and `source`: what they run, and interpreter
//! one-liners (reverse shells, fork bombs, shell commands in strings, tree deletion).

use super::Cmd;
use crate::analyze::code::{Call, CallKind, Code, Lang, Val};
use crate::analyze::decode::{shell_quote, string_literals};
use crate::analyze::names::looks_like_path;
use crate::analyze::{Analyzer, Arg, Map, Origin, Stage};
use crate::types::FileOp;

impl Analyzer<'_> {
    pub(super) fn shell(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let (args, span, inv, depth) = (c.args, c.span, c.inv, c.depth);
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
                Origin::Plain => {
                    let t = a.text.clone();
                    self.file_op(FileOp::Exec, &t, false, span)
                }
                o => self.emit_origin(o, span, "runs a script"),
            },
            _ => {
                stage.shell = true;
                self.stdin_exec(inv, depth, "a shell", true);
            }
        }
        stage.shell |= interactive;
        true
    }

    pub(super) fn interpreter(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let name = c.name;
        let shell_name = name.strip_suffix(".exe").unwrap_or(name);
        let (args, span, inv, depth) = (c.args, c.span, c.inv, c.depth);
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
            // `-le`, `-ne`: combined letters ending in the code flag; not an option
            // that takes its value attached (`-MFile::Path=remove_tree`, `-Mre`).
            if code_flags.contains(&t)
                || (t.starts_with('-')
                    && !t.starts_with("--")
                    && t.len() > 2
                    && t[1..].bytes().all(|b| b.is_ascii_alphabetic())
                    && !matches!(t.as_bytes()[1], b'M' | b'm' | b'I' | b'W' | b'X')
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
        if let Some(code) = code {
            let code = code.clone();
            if code.origin != Origin::Network {
                self.emit_origin(code.origin, span, "runs interpreter code");
            }
            let map = self.arg_map(&code);
            // The interpreter's own arguments after the code (`sys.argv[1]`, …).
            let rest: Vec<String> = args.iter().skip(i + 2).map(|a| a.text.clone()).collect();
            self.interp_code(&code.text, Lang::of(shell_name), &rest, map, span, depth);
        } else if let Some(s) = script {
            match s.origin {
                Origin::Remote => self.emit_origin(s.origin, span, "runs a script"),
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
        true
    }

    pub(super) fn eval(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span, depth) = (c.args, c.span, c.depth);
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
        true
    }

    pub(super) fn source(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span, inv, depth) = (c.args, c.span, c.inv, c.depth);
        if let Some(a) = args.first() {
            match a.origin {
                o @ (Origin::Remote | Origin::Decoded) => {
                    self.emit_origin(o, span, "sources a script")
                }
                _ if a.text == "/dev/stdin" || a.text == "-" => {
                    self.stdin_exec(inv, depth, "source", true)
                }
                _ => self.file_op(FileOp::Exec, &a.text.clone(), false, span),
            }
        }
        true
    }

    /// Interpreter one-liners: reverse shells, fork bombs, shell commands in strings,
    /// tree deletion, credential paths.
    pub(in crate::analyze) fn interp_code(
        &mut self,
        code: &str,
        lang: Lang,
        argv: &[String],
        map: Map,
        span: (usize, usize),
        depth: usize,
    ) {
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
        // The calls that matter, read with their arguments' values (see `code`).
        let reader = Code::new(code, lang, argv);
        let calls = reader.calls();
        let tree_calls = calls.iter().filter(|c| c.kind == CallKind::Tree).count();
        // A tree-deleting name that is never called where we can read it (passed
        // around, aliased in a way the reader does not follow): any protected literal.
        let tree = tree_calls == 0
            && [
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
        for call in calls {
            self.interp_call(&reader, call, lang, argv, span, depth);
        }
        let plain_lits: Vec<&str> = lits.iter().map(|(s, e)| &code[*s..*e]).collect();
        if plain_lits.iter().any(|l| l.starts_with("/dev/tcp/")) {
            self.emit(
                "cmd.reverse_shell",
                span,
                "interpreter code opens /dev/tcp".into(),
            );
        }
    }

    /// One call of interpreter code whose argument's value is known: a recursive
    /// delete of a protected tree, a shell command (analysed as a command line), code
    /// handed to `eval` (analysed again), a walk over a protected tree that deletes.
    fn interp_call(
        &mut self,
        reader: &Code<'_>,
        call: Call,
        lang: Lang,
        argv: &[String],
        span: (usize, usize),
        depth: usize,
    ) {
        let Val::Str { text, decoded } = call.arg else {
            return;
        };
        if decoded {
            self.emit(
                "cmd.decode_exec",
                span,
                format!(
                    "interpreter code hands `{}` a value it decodes at run time",
                    call.name
                ),
            );
        }
        match call.kind {
            CallKind::Tree => {
                if let Some(p) = self.protected(&text, true) {
                    self.emit(
                        "cmd.delete_root",
                        span,
                        format!("interpreter code deletes {p} recursively"),
                    );
                }
            }
            CallKind::Walk => {
                if let Some(p) = self.protected(&text, true)
                    && reader.deletes()
                {
                    self.emit(
                        "cmd.delete_root",
                        span,
                        format!("interpreter code walks {p} and deletes what it finds"),
                    );
                }
            }
            // A single literal was analysed above already.
            CallKind::Run if !call.literal || decoded => {
                if depth < self.limits.max_depth {
                    self.analyze_text(&text, Map::Whole(span.0, span.1), depth + 1);
                }
            }
            CallKind::Run => {}
            CallKind::Eval => {
                if depth < self.limits.max_depth {
                    let m = Map::Whole(span.0, span.1);
                    self.interp_code(&text, lang, argv, m, span, depth + 1);
                }
            }
        }
    }
}

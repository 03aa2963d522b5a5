//! One argv about to run: markers in any argument (metadata endpoints, mining pools),
//! the origin of the program name, wrappers unwrapped (`sudo`, `env`, `nice`,
//! `timeout`, `xargs`, `busybox`, `su -c`, …), then [`super::commands`]. Also the
//! re-analysis of shell strings and of what a shell or interpreter reads on stdin.

use super::eval::origin_of;
use super::names::{METADATA, MINER_MARKERS, basename, is_name};
use super::{Analyzer, Arg, Inv, Map, Origin, Out, Stage, UNK, UNK_SET, has_unk, origin_rule};
use crate::types::FileOp;

impl Analyzer<'_> {
    pub(crate) fn run_argv_top(&mut self, argv: Vec<Arg>, span: (usize, usize)) {
        let mut inv = Inv {
            span,
            stdin: Out::Unknown,
            pipeline_span: span,
            net_redirect: false,
            dup_stdin: false,
            nest: 0,
            stdout_to: None,
        };
        self.run_argv(argv, &mut inv, 0);
    }

    pub(super) fn run_argv(&mut self, argv: Vec<Arg>, inv: &mut Inv, depth: usize) -> Stage {
        self.run_argv_as(argv, inv, depth, true)
    }

    /// [`Self::run_argv`]; with `follow`, a program the line copied or linked earlier
    /// is also judged as what it is a copy of. The name is judged too: the copy may
    /// have failed, leaving whatever was at that path before.
    fn run_argv_as(
        &mut self,
        mut argv: Vec<Arg>,
        inv: &mut Inv,
        depth: usize,
        mut follow: bool,
    ) -> Stage {
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
        if argv[0].origin != Origin::Network {
            self.emit_origin(argv[0].origin, span, "runs a command name");
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
            if follow && let Some(program) = self.program_of(&a0) {
                follow = false;
                self.run_argv_as(argv.clone(), &mut inv.clone(), depth, false);
                // A multi-call binary runs the applet it is called as, unless it is
                // called by its own name.
                if matches!(program.as_str(), "busybox" | "toybox") && !name.starts_with(&program) {
                    let applet = Arg {
                        text: name.clone(),
                        ..argv[0].clone()
                    };
                    argv.insert(1, applet);
                }
                argv[0].text = program;
                continue;
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
                        // `command -v rm` prints where rm is.
                        return Stage {
                            out: rest.get(1).and_then(|a| which(&a.text)),
                            ..Stage::default()
                        };
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
        self.dispatch(&name, &args, inv, depth)
    }

    pub(super) fn unwrap_env(&mut self, rest: &[Arg], span: (usize, usize)) -> Option<Vec<Arg>> {
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

    pub(super) fn arg_map(&self, a: &Arg) -> Map {
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
    pub(super) fn shell_string(&mut self, a: &Arg, map: Map, span: (usize, usize), depth: usize) {
        self.emit_origin(a.origin, span, "runs shell text");
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

    /// A shell or interpreter (`what`) that runs what it reads on stdin: the origin of
    /// that text, and the text itself when the line determines it.
    pub(super) fn stdin_exec(&mut self, inv: &Inv, depth: usize, what: &str, shell: bool) {
        let ps = inv.pipeline_span;
        let o = origin_of(&inv.stdin);
        if let Some((rule, _)) = origin_rule(o) {
            let why = match o {
                Origin::Remote => format!("pipes downloaded content straight into {what}"),
                Origin::Network => format!("feeds a network connection into {what}"),
                _ => format!("pipes decoded (hidden) text into {what}"),
            };
            self.emit(rule, ps, why);
        }
        if let Out::Known { text, .. } = &inv.stdin {
            let t = text.clone();
            if shell {
                self.analyze_text(&t, Map::Whole(ps.0, ps.1), depth + 1);
            } else {
                let lang = super::code::Lang::of(what);
                self.interp_code(&t, lang, &[], Map::Whole(ps.0, ps.1), inv.span, depth);
            }
        }
    }
}

/// What `which NAME` / `command -v NAME` prints, for a program name: its path in the
/// usual place (the line does not say where it is; any bin directory would do, since
/// what matters is the name at its end).
pub(super) fn which(name: &str) -> Option<Out> {
    (!name.is_empty() && !name.contains('/') && !name.starts_with('-') && !has_unk(name)).then(
        || Out::Known {
            text: format!("/usr/bin/{name}\n"),
            decoded: false,
        },
    )
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

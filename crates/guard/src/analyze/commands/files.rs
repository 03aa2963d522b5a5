//! Commands that delete, move, copy, link, write or read files, `chmod`/`chown`,
//! `find` (its `-delete` and `-exec`), and `cd` (which later relative paths resolve
//! against).

use super::Cmd;
use crate::analyze::names::{INTERPS, SHELLS, basename, is_block_device};
use crate::analyze::{Analyzer, Arg, Inv, Out, Stage, UNK, UNK_SET, has_unk};
use crate::paths::normalize;
use crate::types::FileOp;

impl Analyzer<'_> {
    pub(super) fn rm(&mut self, c: &Cmd<'_>) -> bool {
        let (name, flags, span) = (c.name, c.flags, c.span);
        let recursive =
            flags.has(&["r", "R", "recursive"]) || name == "rmdir" && flags.has(&["p", "parents"]);
        for a in &flags.operands {
            self.delete(a, recursive, span, "deletes");
        }
        true
    }

    pub(super) fn shred(&mut self, c: &Cmd<'_>) -> bool {
        let (name, args, flags, span) = (c.name, c.args, c.flags, c.span);
        let remove = flags.has(&["u", "remove", "zero"]) || name == "wipe";
        for a in flags.operands_skipping(args, b"ns", &["iterations", "size", "random-source"]) {
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
        true
    }

    pub(super) fn mv(&mut self, c: &Cmd<'_>) -> bool {
        let (args, flags, span) = (c.args, c.flags, c.span);
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
            if srcs.len() == 1 && !flags.has(&["t", "target-directory"]) {
                self.note_copy(&srcs[0].text, &dst[0].text);
            }
        }
        true
    }

    pub(super) fn cp(&mut self, c: &Cmd<'_>) -> bool {
        let (name, args, flags, span) = (c.name, c.args, c.flags, c.span);
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
            if srcs.len() == 1 && !flags.has(&["t", "target-directory"]) {
                self.note_copy(&srcs[0].text, &dst[0].text);
            }
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
        true
    }

    pub(super) fn ln(&mut self, c: &Cmd<'_>) -> bool {
        let (args, flags, span) = (c.args, c.flags, c.span);
        let ops = flags.operands_skipping(args, b"tS", &["target-directory", "suffix"]);
        if ops.len() >= 2 {
            self.file_op(FileOp::Write, &ops[ops.len() - 1].text, false, span);
            if ops.len() == 2 && !flags.has(&["t", "target-directory"]) {
                self.note_copy(&ops[0].text, &ops[1].text);
            }
        }
        true
    }

    pub(super) fn tee(&mut self, c: &Cmd<'_>, stage: &mut Stage) -> bool {
        let (flags, span, inv) = (c.flags, c.span, c.inv);
        for a in &flags.operands {
            self.file_op(FileOp::Write, &a.text, false, span);
        }
        stage.out = Some(inv.stdin.clone());
        true
    }

    pub(super) fn dd(&mut self, c: &Cmd<'_>) -> bool {
        let (args, span) = (c.args, c.span);
        let (mut from, mut to) = (None, c.inv.stdout_to.clone());
        for a in args {
            if let Some(p) = a.text.strip_prefix("of=") {
                self.file_op(FileOp::Write, p, false, span);
                to = Some(p.to_string());
            } else if let Some(p) = a.text.strip_prefix("if=") {
                self.file_op(FileOp::Read, p, false, span);
                from = Some(p.to_string());
            }
        }
        if let (Some(f), Some(t)) = (from, to) {
            self.note_copy(&f, &t);
        }
        true
    }

    pub(super) fn truncate(&mut self, c: &Cmd<'_>) -> bool {
        let (args, flags, span) = (c.args, c.flags, c.span);
        for a in flags.operands_skipping(args, b"srdt", &["size", "reference", "date"]) {
            self.file_op(FileOp::Write, &a.text, false, span);
        }
        true
    }

    pub(super) fn sed(&mut self, c: &Cmd<'_>) -> bool {
        let (args, flags, span) = (c.args, c.flags, c.span);
        let inplace = flags.has(&["i", "in-place"])
            || args
                .iter()
                .any(|a| a.text.starts_with("-i") || a.text.starts_with("--in-place"));
        let has_script = args
            .iter()
            .any(|a| a.text == "-e" || a.text == "-f" || a.text.starts_with("--expression"));
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
        true
    }

    pub(super) fn grep(&mut self, c: &Cmd<'_>) -> bool {
        let (name, args, flags, span) = (c.name, c.args, c.flags, c.span);
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
        true
    }

    pub(super) fn cd(&mut self, c: &Cmd<'_>) -> bool {
        let flags = c.flags;
        self.cwd = match flags.operands.first() {
            None => Some("~".into()),
            Some(a) if !has_unk(&a.text) && a.text != "-" => {
                Some(normalize(&self.resolve(&a.text)))
            }
            _ => None,
        };
        false
    }

    /// Deletes one operand: the whole of a protected tree is `cmd.delete_root`, one
    /// that is protected only if a variable is empty `cmd.delete_maybe_root`.
    pub(super) fn delete(&mut self, a: &Arg, recursive: bool, span: (usize, usize), verb: &str) {
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

    /// `chmod`, `chown`, `chgrp`: loosened modes and setuid bits on system trees and
    /// programs.
    pub(super) fn chmod(&mut self, c: &Cmd<'_>) -> bool {
        let (name, flags, args, span) = (c.name, c.flags, c.args, c.span);
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
        true
    }

    /// `find ROOT… EXPR`: `-delete` and `-exec` over the roots (every path under a root
    /// when no filter narrows them); its output when it only lists.
    pub(super) fn find(&mut self, c: &Cmd<'_>) -> Option<Out> {
        let (args, inv, depth) = (c.args, c.inv, c.depth);
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
                                stdout_to: None,
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
}

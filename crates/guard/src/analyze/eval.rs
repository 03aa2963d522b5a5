//! The evaluator: walks the parsed program (lists, pipelines, compound commands,
//! simple commands, redirections, assignments) and hands each argv to [`super::exec`];
//! text the parser rejects is checked word by word instead.

use brush_parser::ast::{self, SourceLocation};

use super::names::basename;
use super::{Analyzer, Arg, Cx, Inv, Map, Origin, Out, Stage, UNK, has_unk};
use crate::paths::normalize;
use crate::types::FileOp;

impl Analyzer<'_> {
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

    pub(super) fn list(&mut self, l: &ast::CompoundList, cx: &Cx) -> Out {
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

    pub(super) fn pipeline(&mut self, p: &ast::Pipeline, bg: bool, cx: &Cx) -> Out {
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

    pub(super) fn command(
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
                    stdout_to: None,
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

    pub(super) fn compound(&mut self, cc: &ast::CompoundCommand, cx: &Cx) -> Out {
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

    pub(super) fn simple(
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
            stdout_to: None,
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

    pub(super) fn prefix_item(
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

    pub(super) fn assignment(&mut self, a: &ast::Assignment, cx: &Cx) -> (String, String) {
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

    pub(super) fn set_var(&mut self, name: &str, value: String, span: (usize, usize)) {
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

    pub(super) fn redirect(&mut self, r: &ast::IoRedirect, inv: &mut Inv, cx: &Cx) {
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
                            if fd.is_none_or(|f| f == 1) && !matches!(kind, K::DuplicateOutput) {
                                inv.stdout_to = Some(text.clone());
                            }
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

    // ------------------------------------------------------------ fallback

    /// Word-by-word check of text the parser rejected: split at unquoted `;&|` and
    /// newlines, strip quotes, and run each piece as a command.
    pub(super) fn fallback(&mut self, text: &str, cx: &Cx) {
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
                stdout_to: None,
            };
            let st = self.run_argv(argv, &mut inv, cx.depth);
            stdin = st.out.unwrap_or(Out::Unknown);
        }
    }
}

pub(super) fn redirect_loc(r: &ast::IoRedirect) -> Option<brush_parser::SourceSpan> {
    use ast::IoFileRedirectTarget as T;
    match r {
        ast::IoRedirect::File(_, _, T::Filename(w) | T::Duplicate(w)) => w.loc.clone(),
        ast::IoRedirect::File(_, _, T::ProcessSubstitution(_, s)) => Some(s.loc.clone()),
        ast::IoRedirect::HereString(_, w) | ast::IoRedirect::OutputAndError(w, _) => w.loc.clone(),
        ast::IoRedirect::HereDocument(_, d) => d.here_end.loc.clone(),
        _ => None,
    }
}

pub(super) fn origin_of(o: &Out) -> Origin {
    match o {
        Out::Remote => Origin::Remote,
        Out::Network => Origin::Network,
        Out::Decoded | Out::Known { decoded: true, .. } => Origin::Decoded,
        _ => Origin::Plain,
    }
}

/// Maximum bracket nesting, counted naively (quotes ignored): an over-estimate.
/// Deepest `(` nesting allowed before the text is parsed at all.
const MAX_PAREN_DEPTH: usize = 12;

/// How deep `(` nest in `text`, ignoring other brackets.
pub(super) fn paren_nesting(text: &str) -> usize {
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

pub(super) fn nesting(text: &str) -> usize {
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

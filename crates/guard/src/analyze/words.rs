//! One shell word: quoting, escapes, `~`, parameters, command substitution (analysed
//! in turn), field splitting and brace expansion.

use brush_parser::ast;
use brush_parser::word::{
    Parameter, ParameterExpr, SpecialParameter, TildeExpr, WordPiece, WordPieceWithSource,
};

use super::decode::unescape;
use super::eval::origin_of;
use super::{Analyzer, Arg, Cx, Map, Origin, Out, UNK, UNK_SET, has_unk};

impl Analyzer<'_> {
    // ------------------------------------------------------------ words

    pub(super) fn word_joined(&mut self, w: &ast::Word, cx: &Cx) -> (String, Origin) {
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

    pub(super) fn word(&mut self, w: &ast::Word, cx: &Cx) -> Vec<Arg> {
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
    pub(super) fn pieces(
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

    pub(super) fn param(&mut self, e: &ParameterExpr, cx: &Cx) -> String {
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

    pub(super) fn text_word(&mut self, s: &str, cx: &Cx) -> String {
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

    pub(super) fn lookup(&self, p: &Parameter) -> String {
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
}

pub(super) struct WordState {
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
pub(super) fn brace_expand(s: &str) -> Vec<String> {
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

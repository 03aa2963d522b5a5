//! A small glob matcher, linear in `pattern × text` (an NFA simulation, no
//! backtracking), for policy paths, shell globs and allow-list patterns.
//!
//! Path mode: `*` and `?` do not match `/`; `**` matches anything; `**/` matches zero
//! or more whole directories. Text mode: `*` matches anything. Both: `[abc]`, `[a-z]`,
//! `[!x]` / `[^x]` classes, `\x` escapes.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(u8),
    Any,
    Star,
    DStar,
    DStarSlash,
    Class { neg: bool, items: Vec<(u8, u8)> },
}

/// A compiled glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    toks: Vec<Tok>,
    text: String,
    path_mode: bool,
    prefix: String,
}

impl Glob {
    /// Compiles `pattern`; `path_mode` keeps `*` inside one path segment.
    pub fn new(pattern: &str, path_mode: bool) -> Result<Glob, String> {
        let b = pattern.as_bytes();
        let mut toks = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'*' => {
                    if i + 1 < b.len() && b[i + 1] == b'*' {
                        if !path_mode {
                            toks.push(Tok::Star);
                        } else if i + 2 < b.len() && b[i + 2] == b'/' {
                            toks.push(Tok::DStarSlash);
                            i += 1;
                        } else {
                            toks.push(Tok::DStar);
                        }
                        i += 2;
                        while i < b.len() && b[i] == b'*' {
                            i += 1;
                        }
                        continue;
                    }
                    toks.push(if path_mode { Tok::Star } else { Tok::DStar });
                }
                b'?' => toks.push(Tok::Any),
                b'\\' if i + 1 < b.len() => {
                    i += 1;
                    toks.push(Tok::Lit(b[i]));
                }
                b'[' => {
                    let mut j = i + 1;
                    let neg = j < b.len() && (b[j] == b'!' || b[j] == b'^');
                    if neg {
                        j += 1;
                    }
                    let mut items = Vec::new();
                    let mut first = true;
                    while j < b.len() && (b[j] != b']' || first) {
                        first = false;
                        let lo = b[j];
                        if j + 2 < b.len() && b[j + 1] == b'-' && b[j + 2] != b']' {
                            items.push((lo, b[j + 2]));
                            j += 3;
                        } else {
                            items.push((lo, lo));
                            j += 1;
                        }
                    }
                    if j >= b.len() {
                        return Err(format!(
                            "unclosed `[` at byte {i} in pattern `{pattern}`; escape it as `\\[`"
                        ));
                    }
                    toks.push(Tok::Class { neg, items });
                    i = j;
                }
                c => toks.push(Tok::Lit(c)),
            }
            i += 1;
        }
        let mut prefix = Vec::new();
        for t in &toks {
            match t {
                Tok::Lit(c) => prefix.push(*c),
                _ => break,
            }
        }
        Ok(Glob {
            toks,
            text: pattern.to_string(),
            path_mode,
            prefix: String::from_utf8_lossy(&prefix).into_owned(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the pattern has no wildcard.
    pub fn is_literal(&self) -> bool {
        self.toks.iter().all(|t| matches!(t, Tok::Lit(_)))
    }

    /// The leading literal part of the pattern, up to the first wildcard.
    pub fn literal_prefix(&self) -> String {
        self.prefix.clone()
    }

    /// The leading literal part, borrowed.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the whole of `text` matches.
    pub fn matches(&self, text: &str) -> bool {
        if !text.as_bytes().starts_with(self.prefix.as_bytes()) {
            return false;
        }
        if self.toks.len() < 128 {
            return self.matches_bits(text);
        }
        self.matches_vec(text)
    }

    /// The NFA simulation on a 128-bit state set (no allocation).
    fn matches_bits(&self, text: &str) -> bool {
        let n = self.toks.len();
        let closure = |mut v: u128| {
            for i in 0..n {
                if v >> i & 1 == 1
                    && matches!(self.toks[i], Tok::Star | Tok::DStar | Tok::DStarSlash)
                {
                    v |= 1 << (i + 1);
                }
            }
            v
        };
        let mut cur: u128 = closure(1);
        for &c in text.as_bytes() {
            let mut next: u128 = 0;
            let mut bits = cur;
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i >= n {
                    continue;
                }
                match &self.toks[i] {
                    Tok::Lit(l) => {
                        if *l == c {
                            next |= 1 << (i + 1);
                        }
                    }
                    Tok::Any => {
                        if !(self.path_mode && c == b'/') {
                            next |= 1 << (i + 1);
                        }
                    }
                    Tok::Class { neg, items } => {
                        let hit = items.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                        if hit != *neg && !(self.path_mode && c == b'/') {
                            next |= 1 << (i + 1);
                        }
                    }
                    Tok::Star => {
                        if c != b'/' {
                            next |= 1 << i;
                        }
                    }
                    Tok::DStar => next |= 1 << i,
                    Tok::DStarSlash => {
                        next |= 1 << i;
                        if c == b'/' {
                            next |= 1 << (i + 1);
                        }
                    }
                }
            }
            cur = closure(next);
            if cur == 0 {
                return false;
            }
        }
        cur >> n & 1 == 1
    }

    fn matches_vec(&self, text: &str) -> bool {
        let n = self.toks.len();
        let mut cur = vec![false; n + 1];
        let mut next = vec![false; n + 1];
        cur[0] = true;
        self.closure(&mut cur);
        for &c in text.as_bytes() {
            next.iter_mut().for_each(|x| *x = false);
            let mut any = false;
            for i in 0..n {
                if !cur[i] {
                    continue;
                }
                match &self.toks[i] {
                    Tok::Lit(l) => {
                        if *l == c {
                            next[i + 1] = true;
                        }
                    }
                    Tok::Any => {
                        if !(self.path_mode && c == b'/') {
                            next[i + 1] = true;
                        }
                    }
                    Tok::Class { neg, items } => {
                        let hit = items.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                        if hit != *neg && !(self.path_mode && c == b'/') {
                            next[i + 1] = true;
                        }
                    }
                    Tok::Star => {
                        if c != b'/' {
                            next[i] = true;
                        }
                    }
                    Tok::DStar => next[i] = true,
                    Tok::DStarSlash => {
                        next[i] = true;
                        if c == b'/' {
                            next[i + 1] = true;
                        }
                    }
                }
            }
            std::mem::swap(&mut cur, &mut next);
            self.closure(&mut cur);
            for x in cur.iter() {
                any |= *x;
            }
            if !any {
                return false;
            }
        }
        cur[n]
    }

    fn closure(&self, v: &mut [bool]) {
        for i in 0..self.toks.len() {
            if v[i] && matches!(self.toks[i], Tok::Star | Tok::DStar | Tok::DStarSlash) {
                v[i + 1] = true;
            }
        }
    }
}

/// Whether `s` contains an unescaped shell glob character.
pub fn has_glob_chars(s: &str) -> bool {
    s.bytes().any(|c| matches!(c, b'*' | b'?' | b'['))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        Glob::new(p, true).unwrap().matches(t)
    }

    #[test]
    fn path_globs() {
        assert!(m("~/.ssh/id_*", "~/.ssh/id_rsa"));
        assert!(!m("~/.ssh/id_*", "~/.ssh/keys/id_rsa"));
        assert!(m("**/.env", ".env"));
        assert!(m("**/.env", "a/b/.env"));
        assert!(m("**/.env", "/srv/app/.env"));
        assert!(!m("**/.env", "/srv/app/.env.example"));
        assert!(m("/etc/cron.*/**", "/etc/cron.d/job"));
        assert!(m("/e?c", "/etc"));
        assert!(m("/[a-f]tc", "/etc"));
        assert!(!m("/[!e]tc", "/etc"));
        assert!(m("/*", "/etc"));
        assert!(!m("/*", "/etc/passwd"));
        assert!(Glob::new("[abc", true).is_err());
        assert!(Glob::new("*x*", false).unwrap().matches("a/b/x/y"));
    }
}

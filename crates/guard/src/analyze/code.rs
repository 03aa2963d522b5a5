//! Interpreter code (`python -c`, `perl -e`, `ruby -e`, `node -e`, `php -r`, `lua -e`):
//! a small, tolerant reader for the calls that matter — recursive deletes, commands
//! handed to a shell, code handed to `eval`/`exec`, tree walks that delete — and the
//! value of their path or command argument, as far as the code itself determines it:
//! string literals, `+` / `.` concatenation, path joins, `pathlib` `/`, the user's home
//! (`os.homedir()`, `Path.home()`, `Dir.home`, `$ENV{HOME}`, …), `os.sep`, simple
//! assignments earlier in the code, the interpreter's own arguments (`sys.argv[1]`), and
//! base64 / hex decoding of a literal. Anything else is unknown, never a guess.
//!
//! This is syntax, not execution: code that builds names at run time, reads them from
//! files or the network, or hides them behind its own encodings stays out of reach (see
//! docs/guard.md).

use std::collections::BTreeMap;

use super::decode::{b64decode, hexdecode};

/// What a call does with its first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallKind {
    /// Deletes the tree at that path (`shutil.rmtree`, `FileUtils.rm_rf`, …).
    Tree,
    /// Runs that text as a shell command (`os.system`, `subprocess.run(…, shell=True)`).
    Run,
    /// Runs that text as code of the same language (`eval`, `exec`).
    Eval,
    /// Walks the tree at that path (`os.walk`, `rglob`); a delete elsewhere in the code
    /// makes it a recursive delete.
    Walk,
}

/// A call found in the code: its kind and its first argument's value.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub kind: CallKind,
    pub name: String,
    pub arg: Val,
    /// The argument is one plain string literal (already seen by the literal checks).
    pub literal: bool,
}

/// The value of an expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Val {
    Str { text: String, decoded: bool },
    Unknown,
}

impl Val {
    fn s(text: impl Into<String>) -> Val {
        Val::Str {
            text: text.into(),
            decoded: false,
        }
    }
}

const TREE: &[&str] = &[
    "rmtree",
    "rm_rf",
    "rm_r",
    "remove_tree",
    "rimraf",
    "remove_dir_all",
    "remove_dir",
    "remove_entry",
    "remove_entry_secure",
    "delete_tree",
];
/// Deletes a tree only with a recursive option (`fs.rmSync(p, {recursive: true})`,
/// `Deno.remove(p, {recursive: true})`, `Remove-Item -Recurse`).
const TREE_IF_RECURSIVE: &[&str] = &[
    "rm",
    "rmsync",
    "rmdir",
    "rmdirsync",
    "remove",
    "remove-item",
];
const RUN: &[&str] = &[
    "system",
    "popen",
    "execsync",
    "shell_exec",
    "passthru",
    "proc_open",
    "getoutput",
    "getstatusoutput",
    "check_output",
    "check_call",
    "call",
    "run",
    "execute",
    "capture2",
    "capture2e",
    "capture3",
    "spawnsync",
    "exec",
];
const EVAL: &[&str] = &["eval", "instance_eval", "class_eval", "runinthiscontext"];
/// Walks: `os.walk(ROOT)`, `Path(ROOT).rglob(…)`, Perl's `find(sub {…}, ROOT)`.
const WALK: &[&str] = &["walk", "rglob", "walkdir", "find"];
/// Deletes one file or directory (inside a walk, a recursive delete).
const DELETE: &[&str] = &[
    "remove",
    "unlink",
    "rmdir",
    "unlinksync",
    "rmdirsync",
    "rmsync",
    "rmtree",
    "rm_rf",
];

/// The home directory, written as code (lowercase, spaces removed).
const HOME: &[&str] = &[
    "os.homedir()",
    "require('os').homedir()",
    "require(\"os\").homedir()",
    "path.home()",
    "pathlib.path.home()",
    "dir.home",
    "dir.home()",
    "env['home']",
    "env[\"home\"]",
    "$env{home}",
    "$env{'home'}",
    "$env{\"home\"}",
    "os.environ['home']",
    "os.environ[\"home\"]",
    "os.environ.get('home')",
    "os.environ.get(\"home\")",
    "os.getenv('home')",
    "os.getenv(\"home\")",
    "getenv('home')",
    "getenv(\"home\")",
    "process.env.home",
    "process.env['home']",
    "process.env[\"home\"]",
    "deno.env.get('home')",
    "deno.env.get(\"home\")",
    "os.path.expanduser('~')",
    "os.path.expanduser(\"~\")",
    "file.expand_path('~')",
    "file.expand_path(\"~\")",
    "$home",
    "$env:home",
    "$env:userprofile",
];
/// The root directory, written as code.
const ROOT: &[&str] = &[
    "os.sep",
    "path.sep",
    "os.path.sep",
    "file::separator",
    "file::spec->rootdir()",
    "file::spec->rootdir",
    "path.parse(process.cwd()).root",
    "directory_separator",
];
/// Calls whose value is their (first) argument's, as a path or string.
const SAME: &[&str] = &[
    "expanduser",
    "expand_path",
    "abspath",
    "realpath",
    "normpath",
    "resolve",
    "path",
    "purepath",
    "pathname",
    "new",
    "str",
    "string",
    "fspath",
    "strip",
    "to_s",
    "tostring",
    "decode",
    "to_str",
    "chomp",
];
const JOIN: &[&str] = &["join", "catfile", "catdir", "joinpath"];
const B64: &[&str] = &[
    "b64decode",
    "decodebytes",
    "standard_b64decode",
    "urlsafe_b64decode",
    "decode_base64",
    "decode64",
    "strict_decode64",
    "atob",
    "base64_decode",
];
const HEX: &[&str] = &["fromhex", "unhexlify", "a2b_hex", "hex2bin"];

/// The interpreter a piece of code is for, for `sys.argv` and friends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lang {
    Python,
    Perl,
    Ruby,
    Node,
    Other,
}

impl Lang {
    pub(super) fn of(name: &str) -> Lang {
        if name.starts_with("python") {
            Lang::Python
        } else if name == "perl" {
            Lang::Perl
        } else if name == "ruby" || name == "irb" {
            Lang::Ruby
        } else if matches!(name, "node" | "nodejs" | "deno" | "bun") {
            Lang::Node
        } else {
            Lang::Other
        }
    }
}

/// One piece of interpreter code, read once.
pub(super) struct Code<'c> {
    src: &'c str,
    /// `NAME = EXPR` assignments, first one wins.
    vars: BTreeMap<String, &'c str>,
    /// Names bound to a tree-deleting function (`from shutil import rmtree as nuke`).
    tree_alias: Vec<String>,
    lang: Lang,
    /// The interpreter's arguments after the code (`sys.argv[1]` is `argv[0]`).
    argv: &'c [String],
}

fn ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The end (exclusive) of the string literal opening at `i`, or `None` if unclosed.
fn lit_end(b: &[u8], i: usize) -> Option<usize> {
    let q = b[i];
    let mut j = i + 1;
    while j < b.len() {
        if b[j] == b'\\' {
            j += 2;
            continue;
        }
        if b[j] == q {
            return Some(j + 1);
        }
        j += 1;
    }
    None
}

fn is_quote(c: u8) -> bool {
    c == b'\'' || c == b'"' || c == b'`'
}

/// The index of the bracket closing the one at `open`, skipping string literals.
fn closing(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut j = open;
    while j < b.len() {
        let c = b[j];
        if is_quote(c) {
            j = lit_end(b, j)?;
            continue;
        }
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

/// The index of the bracket opening the one closing at `close`, skipping string
/// literals (read backwards: a quote is matched by the same quote before it).
fn opening(b: &[u8], close: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut j = close + 1;
    while j > 0 {
        j -= 1;
        let c = b[j];
        if is_quote(c) && (j == 0 || b[j - 1] != b'\\') {
            // Skip back to the opening quote.
            let mut k = j;
            loop {
                if k == 0 {
                    return None;
                }
                k -= 1;
                if b[k] == c && (k == 0 || b[k - 1] != b'\\') {
                    break;
                }
            }
            j = k;
            continue;
        }
        match c {
            b')' | b']' | b'}' => depth += 1,
            b'(' | b'[' | b'{' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits `s` at `sep` where it is outside brackets and string literals.
fn split_top<'s>(s: &'s str, sep: &str) -> Vec<&'s str> {
    let b = s.as_bytes();
    let sb = sep.as_bytes();
    let mut out = Vec::new();
    let (mut depth, mut start, mut j) = (0usize, 0usize, 0usize);
    while j < b.len() {
        let c = b[j];
        if is_quote(c) {
            match lit_end(b, j) {
                Some(e) => {
                    j = e;
                    continue;
                }
                None => break,
            }
        }
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0 && b[j..].starts_with(sb) && s.is_char_boundary(j) {
            out.push(&s[start..j]);
            j += sb.len();
            start = j;
            continue;
        }
        j += 1;
    }
    out.push(&s[start.min(s.len())..]);
    out
}

/// A plain string literal (optionally with a Python `r`/`b`/`u` prefix): its text.
fn literal(e: &str) -> Option<&str> {
    let t = e.trim();
    let t = t
        .strip_prefix(['r', 'b', 'u', 'R', 'B', 'U'])
        .filter(|r| r.starts_with(['\'', '"']))
        .unwrap_or(t);
    let b = t.as_bytes();
    if b.len() < 2 || !is_quote(b[0]) || lit_end(b, 0) != Some(b.len()) {
        return None;
    }
    let inner = &t[1..t.len() - 1];
    // Interpolation: the value is not the text.
    let interpolates = match b[0] {
        b'`' => inner.contains("${"),
        b'"' => inner.contains("#{") || inner.contains('$'),
        _ => false,
    };
    (!interpolates).then_some(inner)
}

/// Undoes the escapes of a literal's text (`\\`, `\'`, `\"`, `\n`).
fn unquote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(o) => out.push(o),
            None => out.push('\\'),
        }
    }
    out
}

fn squash(e: &str) -> String {
    e.bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .map(|b| b.to_ascii_lowercase() as char)
        .collect()
}

/// The callee and argument list of `callee(args)` spanning all of `e`. The callee may
/// be a method on a receiver that is itself a call (`Buffer.from(x).toString`).
fn as_call(e: &str) -> Option<(&str, &str)> {
    let t = e.trim();
    let b = t.as_bytes();
    if b.last() != Some(&b')') {
        return None;
    }
    // Forward, skipping literals: the '(' that opens the group the final ')' closes.
    let (mut depth, mut open, mut j) = (0usize, None, 0usize);
    while j < b.len() {
        let c = b[j];
        if is_quote(c) {
            j = lit_end(b, j)?;
            continue;
        }
        match c {
            b'(' | b'[' | b'{' => {
                if depth == 0 {
                    open = (c == b'(').then_some(j);
                }
                depth += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 && j + 1 != b.len() {
                    open = None;
                }
            }
            _ => {}
        }
        j += 1;
    }
    let open = open.filter(|_| depth == 0)?;
    let callee = t[..open].trim_end();
    let tail_start = callee.rfind(')').map(|k| k + 1).unwrap_or(0);
    let tail = &callee[tail_start..];
    let ok = !tail.is_empty()
        && tail.bytes().all(|c| ident_byte(c) || b".:$>-".contains(&c))
        && (tail_start == 0 || tail.starts_with('.'));
    ok.then(|| (callee, &t[open + 1..t.len() - 1]))
}

/// The last name of a dotted callee, lowercased (`os.path.join` -> `join`).
fn last_name(callee: &str) -> String {
    callee
        .rsplit(['.', ':', '>'])
        .next()
        .unwrap_or(callee)
        .to_ascii_lowercase()
}

impl<'c> Code<'c> {
    pub(super) fn new(src: &'c str, lang: Lang, argv: &'c [String]) -> Code<'c> {
        let mut c = Code {
            src,
            vars: BTreeMap::new(),
            tree_alias: Vec::new(),
            lang,
            argv,
        };
        for stmt in split_top(src, ";")
            .into_iter()
            .flat_map(|s| s.split('\n'))
            .take(64)
        {
            let s = stmt.trim();
            let s = ["my ", "our ", "local ", "const ", "let ", "var "]
                .iter()
                .find_map(|p| s.strip_prefix(p))
                .unwrap_or(s)
                .trim_start();
            // `from shutil import rmtree as nuke`
            if let Some(imp) = s.split(" import ").nth(1) {
                for part in imp.split(',') {
                    let mut w = part.split_whitespace();
                    if let (Some(n), Some("as"), Some(a)) = (w.next(), w.next(), w.next())
                        && TREE.contains(&n.to_ascii_lowercase().as_str())
                    {
                        c.tree_alias.push(a.to_string());
                    }
                }
                continue;
            }
            let Some(eq) = s.find('=') else { continue };
            let (lhs, rhs) = (s[..eq].trim(), s[eq + 1..].trim());
            if rhs.starts_with('=') || lhs.ends_with(['!', '<', '>', '=']) {
                continue;
            }
            let name = lhs.trim_start_matches(['$', '@']);
            if name.is_empty() || !name.bytes().all(ident_byte) || c.vars.len() >= 32 {
                continue;
            }
            // `nuke = shutil.rmtree`
            if rhs.bytes().all(|b| ident_byte(b) || b == b'.' || b == b':')
                && TREE.contains(&last_name(rhs).as_str())
            {
                c.tree_alias.push(name.to_string());
                continue;
            }
            c.vars.entry(name.to_string()).or_insert(rhs);
        }
        c
    }

    /// The calls that matter, in order, at most 32.
    pub(super) fn calls(&self) -> Vec<Call> {
        let b = self.src.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() && out.len() < 32 {
            let c = b[i];
            if is_quote(c) {
                match lit_end(b, i) {
                    Some(e) => {
                        i = e;
                        continue;
                    }
                    None => break,
                }
            }
            if !ident_byte(c) || i > 0 && ident_byte(b[i - 1]) {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < b.len() && (ident_byte(b[j]) || b[j] == b'-' && j > i) {
                j += 1;
            }
            let word = &self.src[i..j];
            let low = word.to_ascii_lowercase();
            let tree = TREE.contains(&low.as_str())
                || TREE_IF_RECURSIVE.contains(&low.as_str())
                || self.tree_alias.iter().any(|a| a == word);
            let kind = if tree {
                Some(CallKind::Tree)
            } else if EVAL.contains(&low.as_str()) || low == "exec" && self.lang == Lang::Python {
                Some(CallKind::Eval)
            } else if RUN.contains(&low.as_str()) {
                Some(CallKind::Run)
            } else if WALK.contains(&low.as_str()) {
                Some(CallKind::Walk)
            } else {
                None
            };
            if let Some(kind) = kind
                && let Some(first) = self.operand(kind, &low, i, j)
            {
                out.push(Call {
                    kind,
                    name: low,
                    literal: literal(first).is_some(),
                    arg: self.eval(first, 0),
                });
            }
            i = j.max(i + 1);
        }
        out
    }

    /// Whether the code deletes files anywhere (for walks).
    pub(super) fn deletes(&self) -> bool {
        let low = self.src.to_ascii_lowercase();
        DELETE.iter().any(|d| {
            low.match_indices(d).any(|(k, _)| {
                let after = low.as_bytes().get(k + d.len()).copied();
                let before = k.checked_sub(1).map(|p| low.as_bytes()[p]);
                !before.is_some_and(ident_byte) && !after.is_some_and(ident_byte)
            })
        })
    }

    /// The operand that matters of the call whose name spans `i..j`, or `None` when
    /// the name is not called there (`import rmtree`, `rmtree as r`, `s.find(x)`).
    fn operand(&self, kind: CallKind, name: &str, i: usize, j: usize) -> Option<&'c str> {
        let args = self.args_after(j);
        let recv = self.receiver(i);
        if TREE_IF_RECURSIVE.contains(&name)
            && !args.is_some_and(|a| a.to_ascii_lowercase().contains("recurs"))
        {
            return None;
        }
        let first = || args.map(|a| split_top(a, ",")[0]);
        match (kind, name) {
            // `Path(ROOT).rglob("*")`: the root is the receiver.
            (CallKind::Walk, "rglob") => recv,
            // Perl's File::Find: `find(sub { … }, ROOT)`; anything else called find
            // (`s.find(x)`, `arr.find(f)`) is a search, not a walk.
            (CallKind::Walk, "find") => {
                let a = split_top(args?, ",");
                let f = a[0].trim_start();
                (recv.is_none() && (f.starts_with("sub") || f.starts_with('\\')))
                    .then(|| a.get(1).copied())
                    .flatten()
            }
            // `Pathname.new("/").rmtree`, `Path("/").rmtree()`: the receiver.
            (CallKind::Tree, _) if args.is_none_or(|a| a.trim().is_empty()) => recv,
            // Remove-Item -Recurse -Force PATH: the word that is not an option.
            (CallKind::Tree, "remove-item") => {
                first()?.split_whitespace().find(|w| !w.starts_with('-'))
            }
            _ => first(),
        }
    }

    /// The expression before `.NAME` for the name starting at `i`: an identifier path,
    /// optionally with calls (`Pathname.new("/")`, `pathlib.Path("/")`).
    fn receiver(&self, i: usize) -> Option<&'c str> {
        let b = self.src.as_bytes();
        if i < 2 || b[i - 1] != b'.' {
            return None;
        }
        // `p`: the receiver is `src[p..i - 1]`, grown leftwards.
        let mut p = i - 1;
        for _ in 0..16 {
            if p > 0 && b[p - 1] == b')' {
                p = opening(b, p - 1)?;
            }
            let mut q = p;
            while q > 0 && (ident_byte(b[q - 1]) || b[q - 1] == b'.') {
                q -= 1;
            }
            let more = q < p && q > 0 && b[q - 1] == b')';
            p = q;
            if !more {
                break;
            }
        }
        let r = self.src[p..i - 1].trim_start_matches('.');
        (!r.is_empty()).then_some(r)
    }

    /// The argument text after the name ending at `j`: `(ARGS)`, or a paren-less
    /// `NAME ARGS` (Ruby, Perl).
    fn args_after(&self, j: usize) -> Option<&'c str> {
        let b = self.src.as_bytes();
        let mut k = j;
        while k < b.len() && b[k] == b' ' {
            k += 1;
        }
        if k < b.len() && b[k] == b'(' {
            let close = closing(b, k)?;
            return Some(&self.src[k + 1..close]);
        }
        // Paren-less: `system "rm -rf /"`, `FileUtils.rm_r Dir.home`, `rmtree "/"`.
        if k > j && k < b.len() && (is_quote(b[k]) || b[k] == b'$' || b[k].is_ascii_alphabetic()) {
            let rest = &self.src[k..];
            let end = split_top(rest, ";")
                .into_iter()
                .next()
                .map(|s| s.split('\n').next().unwrap_or(s))
                .unwrap_or(rest);
            let end = end.trim_end_matches([')', ' ']);
            // `import rmtree`, `rmtree as r`, `rm_rf if x`: not a call.
            let w0 = end.split_whitespace().next().unwrap_or("");
            if matches!(
                w0,
                "as" | "if" | "unless" | "and" | "or" | "in" | "for" | "do"
            ) {
                return None;
            }
            return Some(end);
        }
        None
    }

    /// The value of an expression, as far as the code determines it.
    pub(super) fn eval(&self, e: &str, depth: usize) -> Val {
        let e = e.trim();
        if e.is_empty() || depth > 8 {
            return Val::Unknown;
        }
        if let Some(t) = literal(e) {
            return Val::s(unquote(t));
        }
        let sq = squash(e);
        if HOME.contains(&sq.as_str()) {
            return Val::s("~");
        }
        if ROOT.contains(&sq.as_str()) {
            return Val::s("/");
        }
        if let Some(v) = self.argv_ref(&sq) {
            return v;
        }
        // Concatenation: `a + b` (Python, Ruby, JS), `a . b` (Perl, PHP).
        for sep in ["+", " . "] {
            let parts = split_top(e, sep);
            if parts.len() > 1 {
                return self.concat(&parts, depth, "");
            }
        }
        // pathlib: `Path("/") / "etc"`.
        let parts = split_top(e, "/");
        if parts.len() > 1 && !parts[0].trim().is_empty() {
            return self.concat(&parts, depth, "/");
        }
        // Ruby `Pathname.new("/")`, JS `new String("/")`.
        if let Some(rest) = e.strip_prefix("new ") {
            return self.eval(rest, depth + 1);
        }
        if let Some((callee, args)) = as_call(e) {
            let name = last_name(callee);
            let args = split_top(args, ",");
            let first = args.first().copied().unwrap_or("");
            // `x.decode()`, `x.to_s`, `Buffer.from(x, "base64").toString()`.
            if let Some(recv) = callee
                .rfind('.')
                .map(|d| &callee[..d])
                .filter(|r| r.ends_with(')'))
                && SAME.contains(&name.as_str())
                && (first.trim().is_empty() || name == "decode" || name == "tostring")
            {
                return self.eval(recv, depth + 1);
            }
            if B64.contains(&name.as_str())
                || name == "from"
                    && args
                        .get(1)
                        .is_some_and(|a| literal(a).is_some_and(|t| t == "base64"))
            {
                return match self.eval(first, depth + 1) {
                    Val::Str { text, .. } => match b64decode(text.trim()) {
                        Some(t) => Val::Str {
                            text: t,
                            decoded: true,
                        },
                        None => Val::Unknown,
                    },
                    Val::Unknown => Val::Unknown,
                };
            }
            if HEX.contains(&name.as_str()) {
                return match self.eval(first, depth + 1) {
                    Val::Str { text, .. } => match hexdecode(text.trim()) {
                        Some(t) => Val::Str {
                            text: t,
                            decoded: true,
                        },
                        None => Val::Unknown,
                    },
                    Val::Unknown => Val::Unknown,
                };
            }
            if JOIN.contains(&name.as_str()) && !callee.ends_with(')') {
                return self.concat(&args, depth, "/");
            }
            if SAME.contains(&name.as_str()) {
                return self.eval(first, depth + 1);
            }
            return Val::Unknown;
        }
        // `x.to_s`, `x.strip` without parentheses.
        if let Some((recv, m)) = e.rsplit_once('.')
            && SAME.contains(&m.trim().to_ascii_lowercase().as_str())
        {
            return self.eval(recv, depth + 1);
        }
        let name = e.trim_start_matches(['$', '@']);
        if name.bytes().all(ident_byte)
            && let Some(v) = self.vars.get(name)
        {
            return self.eval(v, depth + 1);
        }
        Val::Unknown
    }

    /// `sys.argv[N]`, `process.argv[N]`, `ARGV[N]`, `$ARGV[N]`.
    fn argv_ref(&self, sq: &str) -> Option<Val> {
        let (prefix, shift): (&str, usize) = match self.lang {
            Lang::Python => ("sys.argv[", 1),
            Lang::Node => ("process.argv[", 1),
            Lang::Ruby => ("argv[", 0),
            Lang::Perl => ("$argv[", 0),
            Lang::Other => return None,
        };
        let n: usize = sq.strip_prefix(prefix)?.strip_suffix(']')?.parse().ok()?;
        let k = n.checked_sub(shift)?;
        Some(match self.argv.get(k) {
            Some(a) => Val::s(a.clone()),
            None => Val::Unknown,
        })
    }

    fn concat(&self, parts: &[&str], depth: usize, sep: &str) -> Val {
        let mut out = String::new();
        let mut decoded = false;
        for (k, p) in parts.iter().enumerate() {
            match self.eval(p, depth + 1) {
                Val::Str { text, decoded: d } => {
                    decoded |= d;
                    if k > 0 && !sep.is_empty() {
                        if text.starts_with('/') {
                            out.clear();
                        } else if !out.ends_with('/') {
                            out.push('/');
                        }
                    }
                    out.push_str(&text);
                }
                Val::Unknown => return Val::Unknown,
            }
        }
        Val::Str { text: out, decoded }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(code: &str, lang: Lang) -> Vec<(CallKind, Val)> {
        Code::new(code, lang, &[])
            .calls()
            .into_iter()
            .map(|c| (c.kind, c.arg))
            .collect()
    }

    #[test]
    fn values_of_common_forms() {
        let s = |t: &str| Val::s(t);
        assert_eq!(
            first("import shutil; shutil.rmtree('/')", Lang::Python),
            vec![(CallKind::Tree, s("/"))]
        );
        assert_eq!(
            first("shutil.rmtree(pathlib.Path.home())", Lang::Python),
            vec![(CallKind::Tree, s("~"))]
        );
        assert_eq!(
            first("shutil.rmtree('/' + 'usr')", Lang::Python),
            vec![(CallKind::Tree, s("/usr"))]
        );
        assert_eq!(
            first("p = os.sep; shutil.rmtree(p)", Lang::Python),
            vec![(CallKind::Tree, s("/"))]
        );
        assert_eq!(
            first(
                "shutil.rmtree(os.path.join(os.path.expanduser('~'), '.cache'))",
                Lang::Python
            ),
            vec![(CallKind::Tree, s("~/.cache"))]
        );
        assert_eq!(
            first("FileUtils.rm_r Dir.home", Lang::Ruby),
            vec![(CallKind::Tree, s("~"))]
        );
        assert_eq!(
            first("Pathname.new('/etc').rmtree", Lang::Ruby),
            vec![(CallKind::Tree, s("/etc"))]
        );
        assert_eq!(
            first("require('fs').rmSync('/', {recursive: true})", Lang::Node),
            vec![(CallKind::Tree, s("/"))]
        );
        assert_eq!(
            first("require('fs').rmSync('/tmp/x.txt')", Lang::Node),
            vec![]
        );
        assert_eq!(
            first("os.system('rm -rf ' + '/')", Lang::Python),
            vec![(CallKind::Run, s("rm -rf /"))]
        );
        assert_eq!(
            first("from shutil import rmtree as nuke; nuke('/')", Lang::Python),
            vec![(CallKind::Tree, s("/"))]
        );
        assert_eq!(
            first(
                "system(base64.b64decode('cm0gLXJmIC8=').decode())",
                Lang::Python
            ),
            vec![(
                CallKind::Run,
                Val::Str {
                    text: "rm -rf /".into(),
                    decoded: true
                }
            )]
        );
        assert_eq!(
            first("shutil.rmtree(sys.argv[1])", Lang::Python),
            vec![(CallKind::Tree, Val::Unknown)]
        );
        let argv = vec!["/".to_string()];
        let calls = Code::new("shutil.rmtree(sys.argv[1])", Lang::Python, &argv).calls();
        assert_eq!(calls[0].arg, s("/"));
        assert_eq!(
            first("shutil.rmtree(f'/{x}')", Lang::Python),
            vec![(CallKind::Tree, Val::Unknown)]
        );
    }

    #[test]
    fn hostile_code_is_bounded() {
        let deep = "(".repeat(5000) + &")".repeat(5000);
        let _ = Code::new(&deep, Lang::Python, &[]).calls();
        let many = "rmtree(rmtree(".repeat(2000);
        assert!(Code::new(&many, Lang::Python, &[]).calls().len() <= 32);
        let quotes = "'\"`".repeat(3000);
        let _ = Code::new(&quotes, Lang::Node, &[]).calls();
        let plus = "'a'+".repeat(3000) + "'b'";
        let _ = Code::new(&format!("system({plus})"), Lang::Python, &[]).calls();
    }
}

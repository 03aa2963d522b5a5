//! Path normalisation and file-access rules.

use crate::policy::Effective;
use crate::types::{FileOp, Finding, Verdict};

/// Lexical normalisation: collapses `//` and `/./`, resolves `..` (never above `/`),
/// drops a trailing `/`. `~` and `~/x` stay as they are (home, whatever it is); a path
/// under `/root` or `/home/<user>` is also known in home form by [`home_forms`].
pub fn normalize(path: &str) -> String {
    if path.is_empty() {
        return String::new();
    }
    let (root, rest) = if let Some(r) = path.strip_prefix('/') {
        ("/", r)
    } else if path == "~" {
        ("~", "")
    } else if let Some(r) = path.strip_prefix("~/") {
        ("~/", r)
    } else {
        ("", path)
    };
    let mut parts: Vec<&str> = Vec::new();
    for seg in rest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if matches!(parts.last(), Some(p) if *p != "..") {
                    parts.pop();
                } else if root.is_empty() {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    match root {
        "/" => format!("/{joined}"),
        "~" | "~/" => {
            if joined.is_empty() {
                "~".into()
            } else {
                format!("~/{joined}")
            }
        }
        _ => {
            if joined.is_empty() {
                ".".into()
            } else {
                joined
            }
        }
    }
}

/// The forms of a normalised path that policy globs are matched against: the path
/// itself, its home form (`/root/x`, `/home/u/x` -> `~/x`), and for a relative path
/// also `~/path` (a sandbox's working directory may be home).
pub(crate) fn home_forms(norm: &str) -> Vec<String> {
    let mut out = vec![norm.to_string()];
    if norm == "/root" {
        out.push("~".into());
    } else if let Some(r) = norm.strip_prefix("/root/") {
        out.push(format!("~/{r}"));
    } else if let Some(r) = norm.strip_prefix("/home/") {
        match r.find('/') {
            Some(i) => out.push(format!("~/{}", &r[i + 1..])),
            None => out.push("~".into()),
        }
    } else if !norm.starts_with('/')
        && !norm.starts_with('~')
        && norm != "."
        && !norm.starts_with("..")
    {
        out.push(format!("~/{norm}"));
    }
    out
}

/// A file-rule hit: rule index in `eff.paths`.
pub(crate) fn path_hits(eff: &Effective, op: FileOp, path: &str, recursive: bool) -> Vec<usize> {
    let norm = normalize(path);
    if norm.is_empty() {
        return Vec::new();
    }
    let forms = home_forms(&norm);
    let mut out = Vec::new();
    for (i, r) in eff.paths.iter().enumerate() {
        if !r.ops.contains(&op) {
            continue;
        }
        let hit = forms.iter().any(|f| {
            r.matches.iter().any(|g| g.matches(f)) && !r.except.iter().any(|g| g.matches(f))
        }) || (recursive
            && !(op == FileOp::Read && matches!(norm.as_str(), "/" | "~" | "/root" | "/home"))
            && forms.iter().any(|f| {
                r.matches.iter().any(|g| {
                    let p = g.literal_prefix();
                    (p.starts_with('/') || p.starts_with('~'))
                        && (f == "/"
                            || p.starts_with(&format!("{f}/"))
                            || (p == *f && !g.is_literal()))
                })
            }));
        // A shell glob in the path (`cat /etc/shad*`): does it cover a file the rule
        // names? Test the glob against a representative path of each rule pattern.
        let hit = hit
            || crate::glob::has_glob_chars(&norm)
                && crate::glob::Glob::new(&norm, true).is_ok_and(|sg| {
                    r.matches.iter().any(|g| {
                        let probe = probe_of(g.as_str());
                        home_forms(&probe)
                            .iter()
                            .any(|p| sg.matches(p) || home_glob_matches(&norm, p))
                            && !r.except.iter().any(|e| e.matches(&probe))
                    })
                });
        if hit {
            out.push(i);
            // First match wins: rules are listed most specific first.
            break;
        }
    }
    out
}

/// A path a policy glob matches: wildcards replaced by `x`.
fn probe_of(glob: &str) -> String {
    let mut out = String::new();
    let g = glob.replace("**/", "").replace("**", "x");
    let mut chars = g.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' | '?' => out.push('x'),
            '[' => {
                let first = chars.next().unwrap_or('x');
                out.push(if first == '!' || first == '^' {
                    'x'
                } else {
                    first
                });
                for d in chars.by_ref() {
                    if d == ']' {
                        break;
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// A shell glob under a home form (`/root/.ssh/id*`) against a `~/…` probe.
fn home_glob_matches(shell_glob: &str, probe: &str) -> bool {
    let Some(rest) = probe.strip_prefix("~/") else {
        return false;
    };
    for home in ["/root/"] {
        if let Ok(g) = crate::glob::Glob::new(shell_glob, true) {
            if g.matches(&format!("{home}{rest}")) {
                return true;
            }
        }
    }
    false
}

/// `check_path` without tenant lookup, for use by the command checker too.
pub(crate) fn path_findings(
    eff: &Effective,
    op: FileOp,
    path: &str,
    recursive: bool,
    span: (usize, usize),
    out: &mut Vec<(Finding, crate::types::Decision)>,
) {
    for i in path_hits(eff, op, path, recursive) {
        let r = &eff.paths[i];
        let Some((sev, dec)) = eff.resolve(&r.id, r.severity) else {
            continue;
        };
        if excepted_path(eff, &r.id, path) {
            continue;
        }
        out.push((
            Finding {
                rule: r.id.clone(),
                severity: sev,
                span,
                explanation: format!("{} ({} {})", r.explanation, op.as_str(), normalize(path)),
            },
            dec,
        ));
    }
}

fn excepted_path(eff: &Effective, rule: &str, path: &str) -> bool {
    let norm = normalize(path);
    let forms = home_forms(&norm);
    eff.exceptions.iter().any(|e| {
        (e.rule == "*" || e.rule == rule)
            && matches!(&e.kind, crate::policy::ExceptionKind::Path(g) if forms.iter().any(|f| g.matches(f)))
    })
}

/// Checks one file operation against the file-access rules of the policy.
pub fn check_path(policy: &crate::Policy, tenant: Option<&str>, op: FileOp, path: &str) -> Verdict {
    let eff = policy.effective(tenant);
    let mut raw = Vec::new();
    let path = if path.len() > 4096 {
        &path[..floor_char(path, 4096)]
    } else {
        path
    };
    path_findings(eff, op, path, false, (0, path.len()), &mut raw);
    crate::rules::finish(raw)
}

pub(crate) fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises() {
        assert_eq!(normalize("//etc/./passwd"), "/etc/passwd");
        assert_eq!(normalize("/usr/.."), "/");
        assert_eq!(normalize("/../../"), "/");
        assert_eq!(normalize("~/.ssh//id_rsa"), "~/.ssh/id_rsa");
        assert_eq!(normalize("~"), "~");
        assert_eq!(normalize("~/"), "~");
        assert_eq!(normalize("./build/"), "build");
        assert_eq!(normalize("../x"), "../x");
        assert_eq!(normalize("/etc/"), "/etc");
        assert_eq!(home_forms("/home/bob/.ssh/id_rsa")[1], "~/.ssh/id_rsa");
    }
}

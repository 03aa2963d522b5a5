//! Options of one command: short flags split into letters, long flags by name, and the
//! operands left over.

use super::Arg;

/// Options of one command: short flags split into letters, long flags by name.
pub(super) struct Flags {
    short: Vec<u8>,
    long: Vec<String>,
    pub(super) operands: Vec<Arg>,
}

impl Flags {
    pub(super) fn parse(args: &[Arg]) -> Flags {
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
    pub(super) fn has(&self, names: &[&str]) -> bool {
        names.iter().any(|n| {
            if n.len() == 1 {
                self.short.contains(&n.as_bytes()[0])
            } else {
                self.long.iter().any(|l| l == n)
            }
        })
    }
    pub(super) fn long_prefix(&self, p: &str) -> bool {
        self.long.iter().any(|l| l.starts_with(p))
    }
    /// Operands, skipping the values of options that take one.
    pub(super) fn operands_skipping<'b>(
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

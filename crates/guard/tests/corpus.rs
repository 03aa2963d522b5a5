//! Data-driven tests: every row of `tests/corpus/*.tsv` through the default policy.

use std::collections::BTreeSet;

use tessera_guard::{Decision, Policy, RuleKind, Scanner, check_command};

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn decision(s: &str) -> Decision {
    match s {
        "allow" => Decision::Allow,
        "alert" => Decision::Alert,
        "block" => Decision::Block,
        other => panic!("bad decision {other}"),
    }
}

#[test]
fn command_corpus() {
    let policy = Policy::default();
    let text = include_str!("corpus/commands.tsv");
    let mut failures = Vec::new();
    let (mut dangerous, mut harmless) = (0, 0);
    let mut triggered: BTreeSet<String> = BTreeSet::new();
    let mut lookalike: BTreeSet<String> = BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut cols = line.splitn(3, '\t');
        let (Some(dec), Some(rule), Some(cmd)) = (cols.next(), cols.next(), cols.next()) else {
            panic!("line {}: want 3 tab-separated columns", n + 1);
        };
        let cmd = unescape(cmd);
        let want = decision(dec);
        let v = check_command(&policy, None, &cmd);
        let rules: Vec<&str> = v.findings.iter().map(|f| f.rule.as_str()).collect();
        let ok = if want == Decision::Allow {
            harmless += 1;
            lookalike.insert(rule.to_string());
            v.decision == Decision::Allow
        } else {
            dangerous += 1;
            triggered.insert(rule.to_string());
            v.decision == want && (rule == "-" || rules.contains(&rule))
        };
        for f in &v.findings {
            assert!(
                f.span.0 <= f.span.1 && f.span.1 <= cmd.len(),
                "line {}: span {:?} outside the command",
                n + 1,
                f.span
            );
        }
        if !ok {
            failures.push(format!(
                "line {}: want {dec} {rule}, got {:?} {:?}: {cmd}",
                n + 1,
                v.decision,
                rules
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} corpus failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(dangerous >= 300, "only {dangerous} dangerous commands");
    assert!(harmless >= 300, "only {harmless} harmless look-alikes");
    // Every command rule and every file rule of the default policy has both sides.
    let mut ids: Vec<String> = tessera_guard::BUILTIN_RULES
        .iter()
        .filter(|r| r.kind == RuleKind::Command)
        .map(|r| r.id.to_string())
        .collect();
    ids.extend(policy.path_rule_ids());
    for id in ids {
        assert!(
            triggered.contains(&id),
            "rule {id} has no dangerous case in the corpus"
        );
        assert!(
            lookalike.contains(&id),
            "rule {id} has no harmless look-alike in the corpus"
        );
    }
}

#[test]
fn scan_corpus() {
    let policy = Policy::default();
    let scanner = Scanner::new(&policy);
    let text = include_str!("corpus/secrets.tsv");
    let mut failures = Vec::new();
    let mut pos: BTreeSet<String> = BTreeSet::new();
    let mut neg: BTreeSet<String> = BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut cols = line.splitn(3, '\t');
        let (Some(want), Some(rule), Some(sample)) = (cols.next(), cols.next(), cols.next()) else {
            panic!("line {}: want 3 tab-separated columns", n + 1);
        };
        let sample = unescape(sample);
        let ms = scanner.scan(sample.as_bytes());
        let hit = ms.iter().any(|m| m.rule == rule);
        match want {
            "match" => {
                pos.insert(rule.to_string());
                // The match must cover the marked part: the sample's `⟦…⟧` is not used;
                // instead, redaction must remove the secret's text entirely.
                if !hit {
                    failures.push(format!(
                        "line {}: want {rule}, got {:?}: {sample}",
                        n + 1,
                        ms
                    ));
                }
                let red = String::from_utf8(scanner.redact(sample.as_bytes())).unwrap();
                if !red.contains(&format!("[REDACTED:{rule}]")) {
                    failures.push(format!(
                        "line {}: redaction lacks label {rule}: {red}",
                        n + 1
                    ));
                }
            }
            "clean" => {
                neg.insert(rule.to_string());
                if hit {
                    failures.push(format!(
                        "line {}: want no {rule}, got {:?}: {sample}",
                        n + 1,
                        ms
                    ));
                }
            }
            other => panic!("line {}: bad expectation {other}", n + 1),
        }
    }
    assert!(
        failures.is_empty(),
        "{} scan corpus failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for r in tessera_guard::BUILTIN_RULES
        .iter()
        .filter(|r| r.kind == RuleKind::Scan)
    {
        assert!(
            pos.contains(r.id),
            "scan rule {} has no positive case",
            r.id
        );
        assert!(neg.contains(r.id), "scan rule {} has no look-alike", r.id);
    }
}

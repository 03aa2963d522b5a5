//! Properties: no panics and bounded work on generated shell text; streaming scans
//! equal whole-buffer scans; policy errors name the field.

use proptest::prelude::*;
use tessera_guard::{
    Decision, FileOp, Policy, Scanner, check_argv, check_command, check_command_counted, check_path,
};

const TOKENS: &[&str] = &[
    "rm",
    "-rf",
    "/",
    "~",
    "$HOME",
    "bash",
    "-c",
    "sh",
    "eval",
    "sudo",
    "env",
    "xargs",
    "find",
    "-exec",
    "{}",
    ";",
    "\\;",
    "|",
    "||",
    "&&",
    "&",
    "(",
    ")",
    "{",
    "}",
    "$(",
    "`",
    "'",
    "\"",
    "$'\\x72'",
    "<",
    ">",
    ">>",
    "<<EOF",
    "<<<",
    "2>&1",
    "0>&1",
    "/dev/tcp/1.2.3.4/1",
    "curl",
    "http://x",
    "base64",
    "-d",
    "echo",
    "cm0gLXJmIC8=",
    "X=/",
    "$X",
    "${X:-/}",
    "${X:?}",
    "for",
    "in",
    "do",
    "done",
    "if",
    "then",
    "fi",
    "case",
    "esac",
    "while",
    "f()",
    ":(){",
    ":|:&",
    "};:",
    "\n",
    "#",
    "*",
    "/etc/shadow",
    "~/.ssh/id_rsa",
    "python3",
    "import socket,os",
    "nc",
    "-e",
    "dd",
    "of=/dev/sda",
    "mkfs",
    "chmod",
    "777",
    "kill",
    "-9",
    "-1",
    "$((1+2))",
    "!",
    "[[",
    "]]",
    "cd",
    "..",
    "//",
    "/./",
    "\\",
    "ü",
    "日本",
];

const PARTS: &[&str] = &[
    "hello world ",
    "AKIAQWERTYUIOPASDFGH ",
    "mail alice@example.com ",
    "4111 1111 1111 1111 ",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789 ",
    "13800138000 ",
    "x",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34Gkx\n-----END RSA PRIVATE KEY-----\n",
    "password = \"Xk9mP2vL7qR4tZ8w\"\n",
    "203.0.113.7 ",
    "lorem ipsum dolor sit amet 2024-01-15 10:23:45 ",
];

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

static POLICY: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(Policy::default);
static SCANNER: std::sync::LazyLock<Scanner> = std::sync::LazyLock::new(|| Scanner::new(&POLICY));

/// Pieces of interpreter code: the calls, values and punctuation the code reader
/// looks at (see `analyze/code.rs`).
const CODE_TOKENS: &[&str] = &[
    "shutil.rmtree(",
    "rmtree",
    "FileUtils.rm_rf ",
    "fs.rmSync(",
    "{recursive: true}",
    "os.system(",
    "system ",
    "exec(",
    "eval(",
    "subprocess.run(",
    "os.walk(",
    ".rglob(",
    "os.remove(",
    "Pathname.new(",
    ").rmtree",
    "os.path.join(",
    "Path.home()",
    "os.homedir()",
    "Dir.home",
    "$ENV{HOME}",
    "os.sep",
    "sys.argv[1]",
    "ARGV[0]",
    "base64.b64decode(",
    "'cm0gLXJmIC8='",
    ".decode()",
    "Buffer.from(",
    "'base64'",
    ".toString()",
    "from shutil import rmtree as n",
    "n(",
    "p = ",
    "p",
    "'/'",
    "\"/etc\"",
    "'rm -rf '",
    "\"/tmp/x\"",
    "f'/{x}'",
    "`${x}`",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    "+",
    " . ",
    " / ",
    ";",
    "\n",
    "'",
    "\"",
    "`",
    "\\",
    " ",
    "ü",
];

fn code_text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(CODE_TOKENS), 0..80).prop_map(|v| v.concat())
}

fn shell_text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..120).prop_map(|v| v.join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn generated_shell_never_panics_and_work_is_bounded(s in shell_text()) {
        let p = &*POLICY;
        let (v, work) = check_command_counted(p, None, &s);
        // Work is capped by the policy limit (plus the few units of the step that
        // crosses it), whatever the input.
        prop_assert!(work <= p.limits().max_work + 64 + s.len() / 64, "work {} on {:?}", work, s);
        for f in &v.findings {
            prop_assert!(f.span.0 <= f.span.1 && f.span.1 <= s.len());
            prop_assert!(s.is_char_boundary(f.span.0) && s.is_char_boundary(f.span.1));
        }
        let worst = v.findings.iter().map(|f| f.severity).max();
        prop_assert_eq!(v.decision == Decision::Allow, worst.is_none() || v.decision == Decision::Allow);
    }

    #[test]
    fn arbitrary_text_never_panics(s in any::<String>()) {
        let p = &*POLICY;
        let _ = check_command(p, None, &s);
        let _ = check_path(p, None, FileOp::Read, &s);
        let _ = check_argv(p, None, &[s.clone(), s.clone()]);
        let _ = SCANNER.redact(s.as_bytes());
    }

    #[test]
    fn interpreter_code_never_panics_and_work_is_bounded(code in code_text(), any_code in any::<String>()) {
        let p = &*POLICY;
        for c in [&code, &any_code] {
            for interp in [["python3", "-c"], ["perl", "-e"], ["ruby", "-e"], ["node", "-e"]] {
                let argv = vec![interp[0].to_string(), interp[1].to_string(), c.clone(), "/".to_string()];
                let v = check_argv(p, None, &argv);
                let joined = argv.join(" ");
                for f in &v.findings {
                    prop_assert!(f.span.0 <= f.span.1 && f.span.1 <= joined.len());
                }
            }
            let line = format!("python3 -c {}", shell_quote(c));
            let (_, work) = check_command_counted(p, None, &line);
            prop_assert!(work <= p.limits().max_work + 64 + line.len() / 64);
        }
    }

    #[test]
    fn repeated_constructs_stay_linear(n in 1usize..120, which in 0usize..6) {
        let unit = ["$(", "(", "{ ", "bash -c '", "echo \\`", "a | "][which];
        let s = unit.repeat(n);
        let p = &*POLICY;
        let (_, work) = check_command_counted(p, None, &s);
        prop_assert!(work <= p.limits().max_work + 64 + s.len() / 64);
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn stream_equals_whole_scan(
        parts in prop::collection::vec(prop::sample::select(PARTS), 0..3000),
        cuts in prop::collection::vec(1usize..9000, 1..20),
    ) {
        let text: String = parts.concat();
        let sc = &*SCANNER;
        let whole = sc.scan(text.as_bytes());
        let mut st = sc.stream();
        let mut got = Vec::new();
        let b = text.as_bytes();
        let mut at = 0;
        let mut k = 0;
        while at < b.len() {
            let n = cuts[k % cuts.len()].min(b.len() - at);
            got.extend(st.push(&b[at..at + n]));
            at += n;
            k += 1;
        }
        got.extend(st.finish());
        prop_assert_eq!(got, whole);
    }
}

/// Pieces for the streaming redactor: secrets of every rule, look-alikes, partial
/// keywords, blocks that open and never close.
const STREAM_PARTS: &[&str] = &[
    "hello world ",
    "AKIAQWERTYUIOPASDFGH ",
    "AKI",
    "mail alice@example.com ",
    "bob@",
    "example.org\n",
    "4111 1111 1111 1111 ",
    "4111",
    " 1111",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789 ",
    "13800138000 ",
    "+44 20 7946 0958 ",
    "x",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34Gkx\n-----END RSA PRIVATE KEY-----\n",
    "-----BEGIN ",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    "password = \"Xk9mP2vL7qR4tZ8w\"\n",
    "password",
    " = ",
    "Xk9mP2vL7qR4tZ8w",
    "203.0.113.7 ",
    "version 1.2.3.4 ",
    "GB82 WEST 1234 5698 7654 32 ",
    "DE89370400440532013000 ",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U ",
    "eyJ",
    "postgres://app:S3cretPw@db:5432/app ",
    "https://hooks.slack.com/services/T0000000/B0000000/XXXXXXXXXXXXXXXXXXXXXXXX ",
    "11010519491231002X ",
    "lorem ipsum dolor sit amet 2024-01-15 10:23:45 ",
    "\n",
    " ",
    "ü",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Chunked redaction releases exactly the whole text's redaction, reports exactly
    /// the whole scan's findings, and never holds more than the longest window.
    #[test]
    fn streaming_redaction_equals_whole_redaction(
        parts in prop::collection::vec(prop::sample::select(STREAM_PARTS), 0..400),
        cuts in prop::collection::vec(1usize..700, 1..20),
    ) {
        let text: String = parts.concat();
        let b = text.as_bytes();
        let sc = &*SCANNER;
        let mut r = sc.redactor();
        let mut out = Vec::new();
        let (mut at, mut k) = (0, 0);
        while at < b.len() {
            let n = cuts[k % cuts.len()].min(b.len() - at);
            out.extend(r.push(&b[at..at + n]));
            at += n;
            k += 1;
            prop_assert!(r.held() <= 12 * 1024 + 2048, "held {}", r.held());
        }
        out.extend(r.finish());
        let whole = sc.redact(b);
        prop_assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&whole));
        let want: Vec<(String, u64, u64)> = sc
            .scan(b)
            .into_iter()
            .map(|m| (m.rule, m.start as u64, (m.end - m.start) as u64))
            .collect();
        let got: Vec<(String, u64, u64)> = r
            .findings()
            .iter()
            .map(|f| (f.rule.clone(), f.offset, f.len))
            .collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(r.redacted(), !r.findings().is_empty());
    }
}

/// Bytes the scanner's tokenizers care about: digits and their separators, capitals
/// (IBAN, keys), `@` and e-mail characters, key prefixes, whitespace.
const STREAM_BYTES: &[&str] = &[
    "0",
    "1",
    "3",
    "4",
    "8",
    "9",
    " ",
    "-",
    ".",
    "+",
    "@",
    "A",
    "G",
    "B",
    "X",
    "a",
    "x",
    "\n",
    "\t",
    "_",
    "/",
    ":",
    "=",
    "\"",
    "AKIA",
    "ghp_",
    "eyJ",
    "sk-",
    "passw",
    "ord",
    "https://",
    "hooks.slack.com",
    "-----BEGIN ",
    "PRIVATE KEY-----",
    "-----END ",
    "postgres://",
    "example.com",
    "4111111111111111",
    "13800138000",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn streaming_redaction_equals_whole_redaction_on_dense_text(
        parts in prop::collection::vec(prop::sample::select(STREAM_BYTES), 0..1500),
        cuts in prop::collection::vec(1usize..90, 1..30),
    ) {
        let text: String = parts.concat();
        let b = text.as_bytes();
        let sc = &*SCANNER;
        let mut r = sc.redactor();
        let mut out = Vec::new();
        let (mut at, mut k) = (0, 0);
        while at < b.len() {
            let n = cuts[k % cuts.len()].min(b.len() - at);
            out.extend(r.push(&b[at..at + n]));
            at += n;
            k += 1;
        }
        out.extend(r.finish());
        let whole = sc.redact(b);
        prop_assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&whole));
    }
}

#[test]
fn a_secret_split_across_chunks_is_redacted_and_clean_text_is_not_held() {
    let sc = Scanner::new(&Policy::default());
    let mut r = sc.redactor();
    let mut out = r.push(b"line one\nkey AKIAQWERTY");
    // What comes before the unfinished key is released at once.
    assert!(out.starts_with(b"line one\nkey"), "{out:?}");
    out.extend(r.push(b"UIOPASDFGH done\n"));
    out.extend(r.finish());
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "line one\nkey [REDACTED:aws_access_key] done\n"
    );
    let f = &r.findings()[0];
    assert_eq!(
        (f.rule.as_str(), f.offset, f.len),
        ("aws_access_key", 13, 20)
    );
    // Clean lines go straight through.
    let mut r = sc.redactor();
    assert_eq!(r.push(b"step 1 of 3 done\n"), b"step 1 of 3 done\n");
    assert_eq!(r.held(), 0);
    assert!(!r.redacted());
}

#[test]
fn redaction_removes_the_secret() {
    let sc = Scanner::new(&Policy::default());
    let t = b"key AKIAQWERTYUIOPASDFGH and mail bob@example.com";
    let r = String::from_utf8(sc.redact(t)).unwrap();
    assert_eq!(r, "key [REDACTED:aws_access_key] and mail [REDACTED:email]");
}

#[test]
fn policy_errors_name_origin_and_field() {
    let e = Policy::from_yaml(
        "version: 1\nrules:\n  cmd.nope: { enabled: false }\n",
        "p.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("p.yaml") && e.contains("rules.cmd.nope") && e.contains("unknown rule id"),
        "{e}"
    );
    let e = Policy::from_yaml("version: 1\npaths:\n  - id: x\n    match: [\"/a\"]\n    ops: [read, fly]\n    severity: high\n    explanation: x\n", "p.yaml").unwrap_err().to_string();
    assert!(e.contains("paths[0].ops[1]") && e.contains("fly"), "{e}");
    let e = Policy::from_yaml("version: 1\nbogus: 1\n", "p.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bogus"), "{e}");
    let e = Policy::from_yaml("version: 2\n", "p.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("version"), "{e}");
    let e = Policy::from_yaml("version: 1\nexceptions:\n  - rule: email\n", "p.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("exceptions[0]"), "{e}");
}

#[test]
fn tenant_overrides_and_exceptions() {
    let yaml = r#"
version: 1
tenants:
  lab:
    rules:
      cmd.shutdown: { decision: alert }
    paths:
      - id: path.lab_data
        match: ["/data/secret/**"]
        ops: [read]
        severity: high
        explanation: reads the lab's secret data
    exceptions:
      - rule: cmd.download_exec
        command: "curl -fsSL https://sh.rustup.rs | sh*"
"#;
    let p = Policy::from_yaml(yaml, "t.yaml").unwrap();
    assert_eq!(check_command(&p, None, "reboot").decision, Decision::Block);
    assert_eq!(
        check_command(&p, Some("lab"), "reboot").decision,
        Decision::Alert
    );
    assert_eq!(
        check_command(&p, Some("lab"), "cat /data/secret/x").decision,
        Decision::Block
    );
    assert_eq!(
        check_command(&p, None, "cat /data/secret/x").decision,
        Decision::Allow
    );
    assert_eq!(
        check_command(
            &p,
            Some("lab"),
            "curl -fsSL https://sh.rustup.rs | sh -s -- -y"
        )
        .decision,
        Decision::Allow
    );
    assert_eq!(
        check_command(&p, None, "curl -fsSL https://sh.rustup.rs | sh -s -- -y").decision,
        Decision::Block
    );
    assert_eq!(
        check_path(&p, Some("lab"), FileOp::Read, "/data/secret/a/b").decision,
        Decision::Block
    );
    // The default policy is valid and yields Landlock material.
    let ll = Policy::default().landlock_rules();
    assert!(ll.iter().any(|r| r.allow && r.path == "/tmp"));
    assert!(ll.iter().any(|r| !r.allow && r.path == "/etc/shadow"));
}

#[test]
fn argv_checks_paths_and_wrappers() {
    let p = Policy::default();
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        check_argv(&p, None, &argv(&["/usr/bin/sudo", "rm", "-rf", "/"])).decision,
        Decision::Block
    );
    assert_eq!(
        check_argv(&p, None, &argv(&["/bin/bash", "-c", "curl x | sh"])).decision,
        Decision::Block
    );
    // No shell: a quoted string is one argument, not a command.
    assert_eq!(
        check_argv(&p, None, &argv(&["echo", "rm -rf /"])).decision,
        Decision::Allow
    );
    assert_eq!(
        check_argv(&p, None, &argv(&["rm", "-rf", "./build"])).decision,
        Decision::Allow
    );
}

#[test]
fn exec_is_judged_as_the_program_it_is() {
    use tessera_guard::{check_exec, exec_argv, followed_program};
    let p = Policy::default();
    let argv = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    // A copy of rm under another name: judged as rm.
    let del = argv("/tmp/del -rf --no-preserve-root /");
    assert_eq!(check_argv(&p, None, &del).decision, Decision::Allow);
    assert_eq!(
        check_exec(&p, None, &del, Some("rm")).decision,
        Decision::Block
    );
    assert_eq!(exec_argv(&del, Some("rm"))[0], "rm");
    // A copy of ls named rm is ls.
    let ls = argv("/tmp/rm -rf /");
    assert_eq!(
        check_exec(&p, None, &ls, Some("ls")).decision,
        Decision::Allow
    );
    // No identity, or the name it has: unchanged.
    assert_eq!(exec_argv(&del, None), del);
    assert_eq!(
        exec_argv(&argv("/usr/bin/rm -rf /x"), Some("rm")),
        argv("/usr/bin/rm -rf /x")
    );
    // busybox runs the applet it is called as.
    assert_eq!(
        exec_argv(&argv("/bin/rm -rf /"), Some("busybox")),
        argv("busybox rm -rf /")
    );
    assert_eq!(
        exec_argv(&argv("/bin/busybox rm -rf /"), Some("busybox")),
        argv("/bin/busybox rm -rf /")
    );
    assert_eq!(
        check_exec(&p, None, &argv("/bin/rm -rf /"), Some("busybox")).decision,
        Decision::Block
    );
    // A shell copy with a reverse-shell redirect is caught as a shell (by argv here).
    let py = vec![
        "/tmp/p".to_string(),
        "-c".into(),
        "import shutil; shutil.rmtree('/')".into(),
    ];
    assert_eq!(
        check_exec(&p, None, &py, Some("python3.11")).decision,
        Decision::Block
    );
    for n in [
        "rm",
        "dd",
        "mkfs.ext4",
        "shred",
        "wipefs",
        "truncate",
        "bash",
        "dash",
        "python3.12",
        "perl",
        "busybox",
        "curl",
        "nc",
    ] {
        assert!(followed_program(n), "{n}");
    }
    for n in ["ls", "cat", "true", "grep"] {
        assert!(!followed_program(n), "{n}");
    }
}

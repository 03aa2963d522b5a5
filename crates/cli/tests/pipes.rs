//! `tessera … | head`: output into a closed pipe ends the command quietly with
//! status 0 (it used to panic with "failed printing to stdout" and exit 101),
//! whether the command prints with `println!` or writes stdout itself.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};

use common::BIN;

/// Runs `tessera ARGS` on `input`, reads the first line of its output and closes
/// the pipe: (exit code, that line, stderr).
fn into_head(args: &[&str], input: &std::path::Path) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .arg(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        first.push(b[0]);
    }
    // The reader goes, as `head -1` does; the command has far more to print.
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&first).into_owned(),
        err,
    )
}

#[test]
fn a_closed_pipe_ends_a_command_quietly_with_status_0() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tokens.txt");
    // 100,000 findings: several MiB of output, far past any pipe's buffer.
    let line = "token ghp_abcdefghijklmnopqrstuvwxyz0123456789\n";
    std::fs::write(&input, line.repeat(100_000)).unwrap();
    // One line per finding, printed with println!.
    let (code, first, err) = into_head(&["guard", "scan"], &input);
    assert_eq!((code, err.as_str()), (0, ""), "{first}");
    assert!(first.contains("github_token"), "{first}");
    // The input redacted, written to stdout in one piece.
    let (code, first, err) = into_head(&["guard", "scan", "--redact"], &input);
    assert_eq!((code, err.as_str()), (0, ""), "{first}");
    assert!(first.contains("[REDACTED:"), "{first}");
}

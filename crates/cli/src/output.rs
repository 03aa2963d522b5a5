//! Shared helpers for printing: errors on stderr with an exit status, JSON on stdout.

use std::fmt::Display;

/// Exit status for bad input (a file, a field, a flag).
pub const EXIT_BAD_INPUT: i32 = 2;
/// Exit status for a failure at run time.
pub const EXIT_FAILURE: i32 = 1;

/// Prints `error: {msg}` on stderr and returns `code`, for `return fail(..)`.
pub fn fail(code: i32, msg: impl Display) -> i32 {
    eprintln!("error: {msg}");
    code
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(v: &T) -> i32 {
    match serde_json::to_string_pretty(v) {
        Ok(s) => print_text(&format!("{s}\n")),
        Err(e) => fail(EXIT_FAILURE, format!("could not render JSON: {e}")),
    }
}

/// Writes text to stdout; a closed pipe (`| head`) ends quietly instead of panicking.
pub fn print_text(s: &str) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => fail(EXIT_FAILURE, format!("cannot write to stdout: {e}")),
    }
}

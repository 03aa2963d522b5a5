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

/// Makes output into a closed pipe (`tessera … | head`) end the command quietly
/// with status 0, wherever it is printed: what the reader wanted, it got. Code
/// that writes with `print!`/`println!` panics on a closed pipe; this hook turns
/// that one panic into exit 0 and leaves every other panic as it was. Called first
/// thing in `main`.
pub fn quiet_broken_pipes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_closed_pipe_panic(msg) {
            std::process::exit(0);
        }
        default(info)
    }));
}

/// The message std's `print!` family panics with on a closed stdout or stderr.
fn is_closed_pipe_panic(msg: &str) -> bool {
    (msg.starts_with("failed printing to stdout") || msg.starts_with("failed printing to stderr"))
        && msg.contains("Broken pipe")
}

/// A time the server gives as milliseconds (`per_second` 1000) or seconds (1) since
/// the epoch, for people: `2026-12-03 11:20:07 UTC`; `-` when absent.
pub fn time_cell(v: &serde_json::Value, per_second: i64) -> String {
    let Some(n) = v.as_i64() else {
        return match v {
            serde_json::Value::Null => "-".into(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
    };
    let (secs, ms) = (
        n.div_euclid(per_second),
        n.rem_euclid(per_second) * (1000 / per_second),
    );
    chrono::DateTime::from_timestamp(secs, (ms * 1_000_000) as u32)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| n.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_closed_pipe_panic_is_quiet() {
        assert!(super::is_closed_pipe_panic(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!super::is_closed_pipe_panic(
            "failed printing to stdout: No space left on device (os error 28)"
        ));
        assert!(!super::is_closed_pipe_panic("index out of bounds"));
    }

    use super::time_cell;
    use serde_json::json;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(time_cell(&json!(0), 1000), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            time_cell(&json!(1_796_296_790_620u64), 1000),
            "2026-12-03 11:19:50 UTC"
        );
        assert_eq!(
            time_cell(&json!(1_796_296_790), 1),
            "2026-12-03 11:19:50 UTC"
        );
        assert_eq!(time_cell(&json!(null), 1000), "-");
        assert_eq!(time_cell(&json!("soon"), 1000), "soon");
    }
}

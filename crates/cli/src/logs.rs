//! Where the library crates' `tracing` events go: stderr, as text (for people) or
//! one JSON object a line (for log pipelines), at the level `-v` or `RUST_LOG` sets.
//! The server's access log and the ids of sessions, agents, tool calls and model
//! requests are fields of those events.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal unless NO_COLOR is set).
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, the event's fields
    /// flattened, and the fields of the spans it happened in (`spans`).
    Json,
}

/// Installs the subscriber. `RUST_LOG` wins when set; otherwise Tessera's own
/// events from `quiet` up (`info` for servers, `warn` for one-shot commands), one
/// level more per `-v`, and other crates' warnings.
pub fn init(format: LogFormat, verbose: u8, quiet: tracing::Level) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!("tessera: RUST_LOG={v:?} is not a filter ({e}); using the defaults");
            default_filter(verbose, quiet)
        }),
        _ => default_filter(verbose, quiet),
    };
    let colour = std::env::var_os("NO_COLOR").is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    };
}

fn default_filter(verbose: u8, quiet: tracing::Level) -> EnvFilter {
    use tracing::Level;
    let levels = [
        Level::ERROR,
        Level::WARN,
        Level::INFO,
        Level::DEBUG,
        Level::TRACE,
    ];
    let at = levels.iter().position(|l| *l == quiet).unwrap_or(1);
    let ours = levels[(at + usize::from(verbose)).min(levels.len() - 1)];
    EnvFilter::new(format!(
        "warn,tessera={lvl},tessera_server={lvl},tessera_agent={lvl},tessera_node={lvl},tessera_gateway={lvl},tessera_k8s={lvl}",
        lvl = ours.as_str().to_ascii_lowercase()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_v_is_one_level_more() {
        let f = |v, q| default_filter(v, q).to_string();
        assert!(f(0, tracing::Level::INFO).contains("tessera_server=info"));
        assert!(f(1, tracing::Level::INFO).contains("tessera_server=debug"));
        assert!(f(5, tracing::Level::INFO).contains("tessera_server=trace"));
        assert!(f(0, tracing::Level::WARN).contains("tessera_agent=warn"));
        // Other crates stay at warnings whatever -v says.
        let f2 = f(2, tracing::Level::INFO);
        assert!(f2.split(',').any(|d| d == "warn"), "{f2}");
    }
}

//! `tessera bench tools`: the tool gateway alone — overhead per call with the
//! tool's own time excluded, per class of tool, replays, and ledger writes per
//! second, on an embedded store in a scratch folder (`--dir` picks the disk)
//! with local HTTP tools. The same figures appear in `tessera bench
//! agent-platform`.

use std::path::PathBuf;

use tessera_agent::tools::Completion;
use tessera_agent::tools::bench::{BenchConfig, bench};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Calls measured per tool class (sequentially, for latency).
    #[arg(long, default_value_t = 2000)]
    pub calls: usize,
    /// Callers at once in the throughput phase.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Folder for the scratch store (default: the system temp folder).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write each outcome before replying instead of in the background.
    #[arg(long)]
    pub outcome_before_reply: bool,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> i32 {
    if a.calls == 0 || a.concurrency == 0 {
        return fail(
            EXIT_BAD_INPUT,
            "--calls and --concurrency must be at least 1",
        );
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    let cfg = BenchConfig {
        calls: a.calls,
        concurrency: a.concurrency,
        dir: a.dir.clone(),
        completion: if a.outcome_before_reply {
            Completion::BeforeReply
        } else {
            Completion::Background
        },
    };
    match rt.block_on(bench(cfg)) {
        Ok(r) if a.json => print_json(&r),
        Ok(r) => {
            println!(
                "tessera bench tools ({} calls per class, {} callers for throughput, outcome {})",
                r.calls,
                r.concurrency,
                if a.outcome_before_reply {
                    "before reply"
                } else {
                    "in background"
                }
            );
            println!(
                "{:<34} {:>7} {:>9} {:>9} {:>9}",
                "gateway overhead (tool excluded)", "writes", "p50 us", "p99 us", "max us"
            );
            for c in &r.classes {
                println!(
                    "{:<34} {:>7} {:>9} {:>9} {:>9}",
                    c.class, c.writes_before_reply, c.p50_us, c.p99_us, c.max_us
                );
            }
            println!(
                "{:<34} {:>7} {:>9} {:>9}",
                "replay (repeated key)", 0, r.replay_p50_us, r.replay_p99_us
            );
            println!(
                "{:<34} {:>27.0}",
                "ledger writes/s", r.ledger_writes_per_sec
            );
            println!(
                "{:<34} {:>27.0}",
                "calls/s (side-effect class)", r.calls_per_sec
            );
            0
        }
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

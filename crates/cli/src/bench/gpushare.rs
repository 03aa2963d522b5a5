//! `tessera bench gpushare`: the GPU-sharing interposer on the CI fake driver —
//! interception overhead per allocation and per launch (direct vs interposed,
//! side by side), caps held, shares achieved on the fake clock. See
//! `tessera_gpushare::bench` for what is and is not measured.

use std::path::PathBuf;

use tessera_gpushare::bench::{BenchConfig, run as bench};
use tessera_gpushare::setup::find_interposer;

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The interposer, libtessera_cuda.so (default: next to this binary, then
    /// /usr/lib/tessera; build it with `cargo build -p tessera-gpushare-cuda`).
    #[arg(long)]
    pub interposer: Option<PathBuf>,
    /// Timed calls per entry point and path.
    #[arg(long, default_value_t = 20_000)]
    pub iterations: usize,
    /// Simulated ticks (2 ms of fake time each) of the two-task share run.
    #[arg(long, default_value_t = 1500)]
    pub ticks: u64,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> i32 {
    if a.iterations == 0 || a.ticks < 100 {
        return fail(
            EXIT_BAD_INPUT,
            "--iterations must be at least 1 and --ticks at least 100",
        );
    }
    let interposer = match a.interposer {
        Some(p) if !p.is_file() => {
            return fail(
                EXIT_BAD_INPUT,
                format!(
                    "--interposer {}: no such file; build it with `cargo build -p tessera-gpushare-cuda`",
                    p.display()
                ),
            );
        }
        Some(p) => p,
        None => match find_interposer() {
            Ok(p) => p,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        },
    };
    eprintln!(
        "building the fake driver, then {} calls per path and {} simulated ticks ...",
        a.iterations, a.ticks
    );
    let r = match bench(&BenchConfig {
        interposer,
        iterations: a.iterations,
        ticks: a.ticks,
    }) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    if a.json {
        return print_json(&r);
    }
    println!(
        "tessera bench gpushare (fake CUDA driver, {} calls per path; µs)",
        r.iterations
    );
    println!(
        "{:<10} {:>10} {:>12} {:>10} {:>10}",
        "call", "direct p50", "through p50", "ovh p50", "ovh p99"
    );
    println!(
        "{:<10} {:>10.3} {:>12.3} {:>10.3} {:>10.3}",
        "alloc",
        r.alloc_direct_p50_us,
        r.alloc_interposed_p50_us,
        r.alloc_overhead_p50_us,
        r.alloc_overhead_p99_us
    );
    println!(
        "{:<10} {:>10} {:>12} {:>10.3} {:>10.3}",
        "free", "", "", r.free_overhead_p50_us, r.free_overhead_p99_us
    );
    println!(
        "{:<10} {:>10.3} {:>12.3} {:>10.3} {:>10.3}",
        "launch",
        r.launch_direct_p50_us,
        r.launch_interposed_p50_us,
        r.launch_overhead_p50_us,
        r.launch_overhead_p99_us
    );
    println!(
        "caps held: {} ({} of {} MiB attempted; device peak {} MiB; {} allocations refused)",
        r.caps_held,
        r.cap_bytes >> 20,
        r.cap_attempted_bytes >> 20,
        r.cap_peak_bytes >> 20,
        r.cap_refused_allocations
    );
    println!(
        "shares (target {:?} %): achieved {:.1} / {:.1} %, max error {:.2} points, device busy {:.1} %; alone: {:.1} % ({} ticks, {} ms)",
        r.share_target_pct,
        r.share_achieved_pct[0],
        r.share_achieved_pct[1],
        r.share_error_max_pct,
        r.share_utilization_pct,
        r.alone_share_pct,
        r.share_ticks,
        r.share_wall_ms
    );
    0
}

//! `tessera sched …`: the batch scheduler on scenario files.

use std::path::PathBuf;

use crate::output::{EXIT_BAD_INPUT, fail, print_json, print_text};

#[derive(Debug, clap::Subcommand)]
pub enum SchedCommand {
    /// Plan a scenario file: print the bindings, evictions and pending reasons.
    ///
    /// The file format is documented in docs/scenario-format.md. Exit status 2
    /// when the file is invalid, with the field path and what is wrong.
    Plan {
        /// Scenario file (YAML).
        file: PathBuf,
        /// Scheduler configuration file (actions and plugin tiers); overrides
        /// the scenario's `config`. Volcano's spelling is accepted.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(c: SchedCommand) -> i32 {
    match c {
        SchedCommand::Plan { file, config, json } => {
            let sc = match tessera_sim::scenario::load(&file) {
                Ok(s) => s,
                Err(e) => return fail(EXIT_BAD_INPUT, e),
            };
            let cfg = match config {
                Some(path) => match tessera_sim::scenario::load_config(&path) {
                    Ok(c) => c,
                    Err(e) => return fail(EXIT_BAD_INPUT, e),
                },
                None => sc.config,
            };
            let plan = tessera_sched::schedule(&sc.snapshot, &cfg);
            if json {
                print_json(&plan)
            } else {
                print_text(&plan.to_string())
            }
        }
    }
}

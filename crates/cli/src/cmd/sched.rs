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
    /// Explain one task: where it went or why it waits, and every node's
    /// verdict for it — the nodes it fits ranked by the scoring rules (best
    /// first, the chosen one marked), then the others with the rule that drops
    /// each (cordoned, predicates, resources, GPUs, topology, reservation) and
    /// the numbers. Judged on the cluster as the plan leaves it, without the
    /// task itself.
    Explain {
        /// Scenario file (YAML).
        file: PathBuf,
        /// The task, as `group/task` (as the plan names it).
        task: String,
        /// Scheduler configuration file; overrides the scenario's `config`.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print the explanation as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn load(
    file: &std::path::Path,
    config: Option<PathBuf>,
) -> Result<(tessera_model::Snapshot, tessera_sched::Config), i32> {
    let sc = tessera_sim::scenario::load(file).map_err(|e| fail(EXIT_BAD_INPUT, e))?;
    let cfg = match config {
        Some(path) => {
            tessera_sim::scenario::load_config(&path).map_err(|e| fail(EXIT_BAD_INPUT, e))?
        }
        None => sc.config,
    };
    Ok((sc.snapshot, cfg))
}

pub fn run(c: SchedCommand) -> i32 {
    match c {
        SchedCommand::Explain {
            file,
            task,
            config,
            json,
        } => {
            let (snap, cfg) = match load(&file, config) {
                Ok(x) => x,
                Err(code) => return code,
            };
            let Some((group, name)) = task.split_once('/') else {
                return fail(
                    EXIT_BAD_INPUT,
                    format!("task `{task}`: name it as group/task, as the plan does"),
                );
            };
            let id = tessera_model::TaskId {
                group: group.into(),
                task: name.into(),
            };
            match tessera_sched::explain(&snap, &cfg, &id) {
                None => fail(
                    EXIT_BAD_INPUT,
                    format!(
                        "{}: no task {task}; `tessera sched plan {}` lists the tasks",
                        file.display(),
                        file.display()
                    ),
                ),
                Some(e) if json => print_json(&e),
                Some(e) => print_text(&e.to_string()),
            }
        }
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

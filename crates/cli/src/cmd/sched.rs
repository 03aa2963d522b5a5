//! `tessera sched …` (not built yet).

#[derive(Debug, clap::Subcommand)]
pub enum SchedCommand {
    /// Not built yet.
    Todo,
}

pub fn run(_c: SchedCommand) -> i32 {
    crate::output::fail(
        crate::output::EXIT_FAILURE,
        "`tessera sched` is not built yet",
    )
}

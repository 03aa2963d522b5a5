//! `tessera guard …` (not built yet).

#[derive(Debug, clap::Subcommand)]
pub enum GuardCommand {
    /// Not built yet.
    Todo,
}

pub fn run(_c: GuardCommand) -> i32 {
    crate::output::fail(
        crate::output::EXIT_FAILURE,
        "`tessera guard` is not built yet",
    )
}

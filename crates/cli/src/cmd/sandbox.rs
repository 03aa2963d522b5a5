//! `tessera sandbox …` (not built yet).

#[derive(Debug, clap::Subcommand)]
pub enum SandboxCommand {
    /// Not built yet.
    Todo,
}

pub fn run(_c: SandboxCommand) -> i32 {
    crate::output::fail(
        crate::output::EXIT_FAILURE,
        "`tessera sandbox` is not built yet",
    )
}

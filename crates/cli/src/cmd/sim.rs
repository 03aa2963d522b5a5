//! `tessera sim` (not built yet).

#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: SimArgs) -> i32 {
    crate::output::fail(
        crate::output::EXIT_FAILURE,
        "`tessera sim` is not built yet",
    )
}

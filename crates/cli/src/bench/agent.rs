//! `tessera bench agent` (not built yet).

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: Args) -> i32 {
    crate::output::fail(
        crate::output::EXIT_FAILURE,
        "`tessera bench agent` is not built yet",
    )
}

//! The agent scheduler: parallel workers with optimistic concurrency (being built).

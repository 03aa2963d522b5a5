//! Warm pool (being built).

//! tessera-guard (being built).

//! tessera-sandbox (being built).

//! `tessera bench node` (filled in below).

//! The tool gateway: a registry of tools, per-tenant grants, and the ledger
//! that makes every call happen at most once per idempotency key.

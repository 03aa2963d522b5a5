//! Tessera's agent platform.
//!
//! Runtimes and their immutable versions, sessions bound to sandboxes with
//! memory and checkpoints kept in the store, the tool gateway and its
//! exactly-once ledger (`tools`), durable events, metering and traces.
//! State lives in `tessera-store`; the server only translates HTTP to calls
//! on this crate.

pub mod error;
pub mod events;
pub mod host;
pub mod meter;
pub mod runtimes;
pub mod sessions;
pub mod tools;
pub mod trace;
pub mod unixhttp;

pub use error::AgentError;

/// A small agent (Python standard library only) that serves the agent
/// contract on `$TESSERA_AGENT_SOCKET` and echoes its payload: for tests,
/// benchmarks and the docs' first steps.
pub const ECHO_AGENT_PY: &str = include_str!("../tests/agents/echo_agent.py");

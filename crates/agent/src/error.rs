//! The agent platform's error type. Messages name the object, field or value
//! that failed and what to do; the server maps each variant to a status code.

use tessera_store::StoreError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// A request field is wrong (`field` is its path, e.g. `spec.command[0]`).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A concurrent writer won; retry.
    #[error("{0}")]
    Conflict(String),
    /// A quota (runtimes per tenant, versions per runtime) would be exceeded.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// A session or tenant budget is spent.
    #[error("budget exceeded: {0}")]
    Budget(String),
    /// The session is not in a state that allows this (ended, killed, failed).
    #[error("{0}")]
    State(String),
    /// The agent inside the sandbox did not answer, or the sandbox failed.
    #[error("agent unavailable: {0}")]
    Unavailable(String),
    #[error("store: {0}")]
    Store(StoreError),
}

impl AgentError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AgentError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<StoreError> for AgentError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(k) => AgentError::NotFound(k.to_string()),
            StoreError::AlreadyExists(k) => AgentError::AlreadyExists(k.to_string()),
            c @ StoreError::Conflict { .. } => AgentError::Conflict(c.to_string()),
            other => AgentError::Store(other),
        }
    }
}

/// Checks a name used as a key part: 1..=`max` of `a-z A-Z 0-9 . _ -`.
pub fn check_token(field: &str, s: &str, max: usize) -> Result<(), AgentError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(AgentError::invalid(
            field,
            format!("{s:?} is not a valid name: use 1 to {max} of a-z, A-Z, 0-9, '.', '_', '-'"),
        ))
    }
}

/// Milliseconds since the Unix epoch (the one clock helper, `tessera-sandbox`'s).
pub use tessera_sandbox::now_ms;

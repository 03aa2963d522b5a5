//! Tool gateway: registry, grants, the exactly-once ledger, the MCP endpoint (issue 8).
//!
//! This module owns its state ([`ToolsState`]), its configuration
//! ([`ToolsConfig`], a field of [`crate::ServerConfig`]), its routes and its
//! OpenAPI schemas; handlers only translate between HTTP and the crate that
//! owns the behaviour.

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::StartError;
use crate::plane::ControlPlane;

/// Settings for this module, from `tessera up` flags.
#[derive(Clone, Debug, Default)]
pub struct ToolsConfig {}

/// What the handlers of this module share.
#[derive(Clone, Debug, Default)]
pub struct ToolsState {}

impl ToolsState {
    /// Starts this module: its state and any background tasks, which end when
    /// `stop` turns true.
    pub(crate) async fn start(
        _plane: &ControlPlane,
        _cfg: &ToolsConfig,
        _stop: &watch::Receiver<bool>,
    ) -> Result<(Self, Vec<JoinHandle<()>>), StartError> {
        Ok((Self::default(), Vec::new()))
    }
}

crate::api::routes! {
    ROUTES, routes;
}

/// Request-body schemas this module's routes name, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    Vec::new()
}

//! `tessera-gateway`: the inference pool gateway. An OpenAI-compatible endpoint
//! in front of pools of OpenAI-compatible engines (vLLM, SGLang, llama.cpp
//! server, …), gateway-side queueing with per-tenant fairness, and routing by
//! KV-cache prefix, session and tenant.
//!
//! [`route`] is the pure routing core (no I/O, no clock), shared with the
//! simulator; everything else needs the `http` feature.

#[cfg(feature = "http")]
pub mod bench;
#[cfg(feature = "http")]
pub mod http;
pub mod route;

#[cfg(feature = "http")]
pub use http::{
    InferenceCaller, InferenceGateway, InferenceGatewayConfig, PoolSpec, PoolStatus, Refusal,
    Usage, UsageSink,
};
#[cfg(feature = "http")]
pub mod mock;

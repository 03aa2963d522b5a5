//! `tessera-k8s`: Tessera on Kubernetes. A secondary scheduler (pods with
//! `spec.schedulerName: tessera`) and its controllers over the same pure core
//! Tessera runs everywhere else: watch and translate into the model
//! ([`translate`], [`state`]), decide with the batch and agent schedulers, apply
//! through the API ([`controller`]): bindings, evictions, device assignments,
//! pending reasons, PodGroup status. The Kubernetes API is the only store.
//! Tessera's, Volcano's and scheduler-plugins' PodGroups (and Queues) are one
//! trait to all three stages ([`gang`]).
//!
//! The only crate that knows Kubernetes types, and it does not re-export
//! `kube` or `k8s-openapi`: a caller gets a client from [`client()`] and hands
//! it back to [`run`] without naming its type. See `docs/k8s.md`.

pub mod agent;
pub mod bench;
mod client;
pub mod controller;
pub mod crd;
pub mod dra;
pub mod gang;
pub mod leader;
pub mod manifests;
pub mod network;
pub mod state;
pub mod testenv;
pub mod translate;

pub use client::{ClientError, client};
pub use controller::{Metrics, RunConfig, RunError, run};
pub use leader::LeaseConfig;

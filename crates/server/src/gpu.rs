//! GPU discovery for the local node: the node runtime's (`tessera_node::gpu`),
//! re-exported where the server's callers have always found it.

pub use tessera_node::gpu::*;

//! `tessera-sim`: loaders (scenario files, GPU-cluster traces), discrete-event
//! replay, metrics and plots. Depends on the pure scheduler; does file I/O.

pub mod mixed;
pub mod replay;
pub mod rng;
pub mod routing;
pub mod scenario;
pub mod trace;

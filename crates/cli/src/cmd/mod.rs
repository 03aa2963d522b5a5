pub mod client;
pub mod cluster;
pub mod guard;
pub mod mixed;
pub mod sandbox;
pub mod sched;
pub mod sim;
pub mod up;

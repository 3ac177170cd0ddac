//! The generic raft layer, free of engine types: a node's groups ([`node::Node`]), each an
//! openraft instance whose state machine ([`sm::StateMachine`]) hands committed commands
//! to a [`sm::GroupState`]; the durable log every group of a node writes through one file
//! ([`log`]); the node-to-node network, one multiplexed TCP connection per peer ([`net`]);
//! and the commands and type configuration ([`types`]).

pub(crate) mod log;
pub(crate) mod net;
pub(crate) mod node;
pub(crate) mod sm;
pub(crate) mod types;

//! Sluice cluster: partition logs replicated with openraft, wired to the engine.
//!
//! Table data is split into shards; each shard's log is one raft group, and one metadata
//! group holds the catalog, the topology (nodes and shard placement) and the manifests of
//! Parquet files in the shared object store. A [`Cluster`] is this node's part of it: the
//! engine's [`sluice_engine::WriteLog`] (a write's rows go to their shards' leaders, here or
//! forwarded, and are acknowledged once committed and applied) and its
//! [`sluice_engine::ClusterAdmin`] (nodes added and removed, leaderships moved).
//!
//! Where to read, following a write: `writes.rs` (shard routing, write ids, batches shipped
//! as raft entries) -> `raft/` (the generic layer: a node's groups, the durable log every
//! group writes through one file, the node-to-node network) -> `shard.rs` (a shard's state
//! machine: copies dropped by write id, rows applied to the engine's buffers, snapshots that
//! are positions in the shared store's files) and `meta.rs` (the metadata group's state
//! machine: catalog, files, topology). `cluster.rs` starts a node and flushes the shards it
//! leads, `reconcile.rs` brings replicas in line with the topology ([`placement`]),
//! `admin.rs` and `tables.rs` are what operators see.
//!
//! # Why openraft 0.10 (a pinned pre-release) and not 0.9
//!
//! The 0.9 line takes bug fixes only, and its storage API (v2) is sealed behind a feature;
//! every storage signature changes in 0.10, so code written against 0.9 would be rewritten.
//! 0.10 has what the cluster needs and 0.9 lacks: leadership transfer
//! (`trigger().transfer_leader`, for moving shard leaders and for leaving politely), Pre-Vote
//! (a node coming back from a partition does not depose a healthy leader), an async storage
//! test suite, and `clap` as an optional dependency. The price is an API still moving
//! between alphas, so the version is pinned exactly (`=0.10.0-alpha.37`, its `openraft-rt*`
//! and `openraft-macros` companions by `Cargo.lock`), and upgrading is a deliberate change.
//! Log records are openraft's own types in CBOR: an upgrade that changes their serde form
//! needs a log conversion, which the storage suite would show.

mod admin;
mod cluster;
mod error;
mod meta;
pub mod placement;
mod raft;
mod reads;
mod reconcile;
mod relay;
mod shard;
mod tables;
mod topology;
mod writes;

pub use cluster::Cluster;

/// The `tracing` target of the raft library's events (it reports every vote and election at
/// info level).
pub const RAFT_LOG_TARGET: &str = "openraft";
pub use error::{Error, Result};
pub use placement::{ShardPlacement, place, rebalance, shard_of};
pub use raft::log::{LogStore, LogWriter};
pub use raft::net::{CallError, GroupNetwork, GroupPeer, Handler, Pool, serve};
pub use raft::node::{
    DynGroupState, GroupMachine, GroupRaft, Node, WRITE_DEADLINE, WriteError, raft_config,
};
pub use raft::sm::{GroupState, StateMachine};
pub use raft::types::{Command, GroupId, Response, Tc, from_cbor, to_cbor};

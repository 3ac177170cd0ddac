//! Sluice cluster: partition logs replicated with openraft.
//!
//! Table data is split into shards; each shard's log is one raft group, and one metadata
//! group holds the catalog, shard placement and the manifests of Parquet files in the shared
//! object store. Every group of a node writes through one [`LogWriter`] into one file (one
//! group commit and one sync for them all, like the single-node WAL) and talks to other nodes over one connection pool.
//!
//! Built so far: the durable raft log ([`LogStore`], passing openraft's storage test suite),
//! the state machine ([`StateMachine`] over an [`Apply`]), the node-to-node network (one
//! multiplexed TCP connection per peer for every group: [`Pool`], [`serve`]), a node's
//! groups ([`Node`], with [`Node::write`] committing a command through its group's leader
//! wherever it is) and shard placement ([`place`], [`rebalance`] when nodes come and go,
//! [`shard_of`]). The server wires them to
//! the engine (`src/cluster.rs`). A snapshot may stand for fewer entries than were applied
//! ([`Apply::snapshot`]): a data shard's snapshot is the position up to which its rows are
//! in Parquet files on the shared store, and the log is purged behind it.
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

mod log;
mod net;
mod node;
mod placement;
mod sm;
mod types;

pub use log::{LogStore, LogWriter};
pub use net::{CallError, GroupNetwork, GroupPeer, Handler, Pool, serve};
pub use node::{DynApply, GroupMachine, GroupRaft, Node, WRITE_DEADLINE, WriteError, raft_config};
pub use placement::{ShardPlacement, place, rebalance, shard_of};
pub use sm::{Apply, StateMachine};
pub use types::{Command, GroupId, Response, Tc, from_cbor, to_cbor};

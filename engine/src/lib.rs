//! The Sluice storage engine: everything below the protocols, grouped by the data path.
//!
//! A write comes in through the ingest port ([`IngestPort`], what the MQTT broker and its
//! bridges call) or the query port ([`QueryPort`], what HTTP calls). [`ingest`] decodes the
//! payload against its table into rows (or keeps it as a dead letter); the rows become one
//! [`WriteRecord`] that goes to the engine's one [`WriteLog`] ([`log`]): the local
//! write-ahead log with group commit on a single node, the shard groups' raft logs in a
//! cluster (the `sluice-cluster` crate implements the same trait). Once durable, the record
//! is applied to per-partition Arrow buffers ([`store`]), where SQL sees it, and only then is
//! the write acknowledged. In the background buffers become sorted Parquet files on an
//! object store, a new manifest names them, and the log is truncated behind them.
//!
//! Queries ([`query`]) go through DataFusion: databases are schemas, tables are providers that
//! union Parquet files with buffers, pruning partitions by the partition key and `WHERE
//! PARTS`; aggregates over whole partitions are answered from synopses. [`alerts`] runs named
//! queries on a schedule.
//!
//! Start reading at [`ports`] (what the other crates call) and [`Engine`] (how it is done):
//! `engine.rs` opens and wires the parts, `engine/` holds the background work and the
//! cluster-facing half.

pub mod access;
pub mod alerts;
mod engine;
pub mod error;
pub mod hex;
pub(crate) mod ingest;
pub(crate) mod log;
pub mod ports;
pub(crate) mod query;
pub mod relay;
pub(crate) mod store;
pub mod types;

pub use alerts::{AlertDef, AlertSink, AlertStatus, Condition};
pub use engine::{
    Engine, ExpiredPartition, FileChange, MergedFiles, RollupFile, ShardFile, now_micros,
};
pub use error::{Error, ErrorKind, Result};
pub use ingest::decode::Format;
pub use ingest::origin::Origin;
pub use ingest::sparkplug;
pub use log::WriteLog;
pub use log::wal::record::{WriteRecord, encode_record};
pub use log::wal::{Journal, JournalTap, Then, patiently};
pub use ports::{
    ClusterAdmin, DeadLetter, Described, Health, IngestPort, LatestRows, LeaderMoveError,
    LineProtocolWrite, Logins, NodeChangeError, Publication, QueryOptions, QueryOutput, QueryPort,
    RejectedLine, SystemRows, WriteReceipt,
};
pub use relay::{ClaimedWills, Relay, RelaySink, Relaying, RouteChange};
pub use store::catalog::{ApiBridges, CatalogData, CatalogLog, DEFAULT_DATABASE, TableDef};
pub use store::files::{read_state, replace_file};
pub use store::remote::{
    PartialAnswer, PartialQuery, RemotePart, RowsAnswer, RowsRequest, ShardReader, SummaryAnswer,
};

/// Bytes this process sent to other nodes of its cluster (the cluster's connections count
/// every frame they write; `/metrics`: `sluice_node_bytes_sent_total`).
pub static NODE_BYTES_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Engine parts that the criterion benches and `raft_load` measure directly (the
/// write-ahead log, one partition's buffer, the payload decoders). Not an interface: servers
/// use the ports.
#[doc(hidden)]
pub mod internals {
    pub use crate::ingest::decode::decode_message;
    pub use crate::log::wal::{RecordSink, Wal};
    pub use crate::store::buffer::PartitionBuffer;
    pub use crate::store::catalog::ColumnDef;
    pub use crate::store::partition::PartitionFn;
}

//! Where rows live: the catalog of databases and tables ([`catalog`]), each table's live
//! partitions ([`state`]) with their in-memory buffers ([`buffer`], in sorted [`chunk`]s)
//! and Parquet files on an object store ([`storage`], the manifest naming them), the
//! partition functions ([`partition`]), the hot cache of decoded files ([`hot`]) and the
//! small state files written whole ([`files`]).

pub(crate) mod buffer;
pub(crate) mod catalog;
pub(crate) mod chunk;
pub(crate) mod files;
pub(crate) mod hot;
pub(crate) mod latest;
pub(crate) mod partition;
pub(crate) mod remote;
pub(crate) mod rollup;
pub(crate) mod state;
pub(crate) mod storage;

use std::sync::Arc;

/// The engine's stores, as writes, queries and maintenance share them: the catalog, the
/// live tables, the object store and hot cache, refused messages and bridge origins.
#[derive(Debug)]
pub(crate) struct Store {
    /// The catalog.
    pub(crate) catalog: crate::store::catalog::Catalog,
    /// Live state.
    pub(crate) tables: Arc<state::Tables>,
    /// Object store.
    pub(crate) storage: storage::Storage,
    /// Refused messages.
    pub(crate) dead_letters: crate::ingest::dead_letter::DeadLetters,
    /// Decoded Parquet files.
    pub(crate) hot: crate::store::hot::HotCache,
    /// The last stored message per bridge and packet id.
    pub(crate) origins: Arc<crate::ingest::origin::Origins>,
    /// `system` tables other layers serve (the broker's `system.bridges`).
    pub(crate) extra_system:
        parking_lot::RwLock<std::collections::HashMap<String, crate::ports::SystemRows>>,
    /// On a cluster node: the shards it holds no replica of, and reading their rows.
    pub(crate) reader: std::sync::OnceLock<Arc<dyn remote::ShardReader>>,
    /// Rows queries read from other nodes' replicas.
    pub(crate) remote_rows: std::sync::atomic::AtomicU64,
    /// Rows other nodes' replicas aggregated for queries here (`crate::query::split`,
    /// `crate::query::summaries`).
    pub(crate) remote_aggregated: std::sync::atomic::AtomicU64,
    /// The statements run here and the parts of other nodes' queries (`system.queries`).
    pub(crate) queries: Arc<crate::query::log::QueryLog>,
}

impl Store {
    /// The reader of the shards this node holds no replica of (none on a single node).
    pub(crate) fn reader(&self) -> Option<&Arc<dyn remote::ShardReader>> {
        self.reader.get()
    }

    /// Whether some shard's rows are not held here. Queries then read them from the
    /// shard's replicas; what is kept from this node's rows alone (synopses of buffered
    /// rows, the last-value cache, kept results) cannot answer.
    pub(crate) fn partial(&self) -> bool {
        (self.reader.get()).is_some_and(|r| !r.remote_shards().is_empty())
    }
}

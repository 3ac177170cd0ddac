//! The engine as one node of a cluster: writes are committed by the shard groups' raft logs
//! instead of the local log, and come back, in each shard's log order, through
//! [`Engine::apply_replicated`] on every replica (log -> apply -> ack, with the raft log as
//! the log). Catalog changes are committed by the metadata group and installed on every node
//! by [`Engine::install_catalog`].
//!
//! Not yet: persisting replicated rows as Parquet on the shared store (a shard's snapshot),
//! so in a cluster the buffers are not flushed and a node rebuilds them from its raft logs
//! when it starts.

use super::Engine;
use crate::catalog::TableDef;
use crate::error::{Error, Result};
use crate::state::TableState;
use crate::wal::Applier;
use crate::wal::record::WriteRecord;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a shard's apply waits for the catalog change that created its table, when the
/// shard's log got ahead of the metadata group's on this node.
const CATALOG_WAIT: Duration = Duration::from_secs(30);

/// Where writes go in a cluster.
#[async_trait]
pub trait Replicator: Send + Sync {
    /// Commits `records` (rows of `def`), each to the shard its rows belong to, and returns
    /// once every one is committed by a quorum of its shard's replicas and applied by its
    /// leader; an error means none of them may be acknowledged.
    async fn commit(&self, def: &TableDef, records: Vec<Arc<WriteRecord>>) -> Result<()>;

    /// Returns once this node has applied every write acknowledged (by any node) before
    /// the call, so that a query run next sees them.
    async fn read_barrier(&self) -> Result<()>;

    /// Whether this node evaluates the alerts now (one node of the cluster does).
    fn evaluates_alerts(&self) -> bool;
}

impl std::fmt::Debug for dyn Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Replicator")
    }
}

/// Appends a record as a shard's log carries it to `out`: its kind, then its payload.
pub fn encode_record(record: &WriteRecord, out: &mut Vec<u8>) {
    out.push(record.kind());
    record.encode_into(out);
}

impl Engine {
    /// Makes this engine a cluster node: writes go to `replicator`, catalog changes to
    /// `catalog`. Set once, before the listeners open.
    pub fn join_cluster(
        &self,
        replicator: Arc<dyn Replicator>,
        catalog: Arc<dyn crate::catalog::CatalogLog>,
    ) {
        let r = replicator.clone();
        self.alerts
            .set_active(Arc::new(move || r.evaluates_alerts()));
        let _ = self.replicator.set(replicator);
        self.shared.catalog.replicate_through(catalog);
    }

    /// The catalog's version (it grows by one with every change).
    pub fn catalog_version(&self) -> u64 {
        self.shared.catalog.snapshot().version
    }

    /// Whether this engine is a cluster node.
    pub fn clustered(&self) -> bool {
        self.replicator.get().is_some()
    }

    /// Applies a write committed by a shard group (`payload` made by [`encode_record`]) and
    /// returns the rows applied. Every replica applies the same entries in the same order.
    /// Rows of a table this node's catalog does not have yet wait for it (the metadata group
    /// may be behind the shard here); rows of a dropped table are skipped.
    pub fn apply_replicated(&self, payload: &[u8]) -> Result<u64> {
        let record = payload
            .split_first()
            .and_then(|(kind, body)| WriteRecord::decode(*kind, body))
            .ok_or_else(|| Error::Corrupt {
                what: "write from a shard log".into(),
                reason: "the record does not decode".into(),
            })?;
        let started = Instant::now();
        while self.shared.tables.get(record.table_id).is_none()
            && !self.shared.catalog.snapshot().allocated(record.table_id)
        {
            if started.elapsed() > CATALOG_WAIT {
                return Err(Error::invalid(format!(
                    "table {} is not in this node's catalog after {} s",
                    record.table_id,
                    CATALOG_WAIT.as_secs()
                )));
            }
            let wait = || std::thread::sleep(Duration::from_millis(5));
            match tokio::runtime::Handle::try_current() {
                Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                    tokio::task::block_in_place(wait)
                }
                _ => wait(),
            }
        }
        let lsn = self.cluster_lsn.fetch_add(1, Ordering::Relaxed) + 1;
        self.shared.tables.apply(lsn, &record);
        Ok(record.rows.len() as u64)
    }

    /// Installs a catalog change committed at `raft_index` of the metadata group, bringing
    /// the live table states and the alerts in line with it. `Ok(false)`: already installed.
    pub fn install_catalog(&self, raft_index: u64, next: &[u8]) -> Result<bool> {
        if !self.shared.catalog.install(raft_index, next)? {
            return Ok(false);
        }
        let cat = self.shared.catalog.snapshot();
        let mut live: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for def in cat.tables() {
            live.insert(def.id);
            match self.shared.tables.get(def.id) {
                None => {
                    (self.shared.tables.by_id.write())
                        .insert(def.id, Arc::new(TableState::new(def.clone())));
                }
                Some(t) if t.def() != *def => t.alter(def.clone()),
                Some(_) => {}
            }
        }
        for t in self.shared.tables.all() {
            let id = t.def().id;
            if !live.contains(&id) {
                self.shared.tables.remove(id);
            }
        }
        self.alerts.sync(cat.alerts.values());
        Ok(true)
    }
}

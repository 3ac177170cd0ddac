//! The log seam: every write becomes durable through one [`WriteLog`] before it is applied
//! and acknowledged. On a single node that is the local write-ahead log ([`wal`], group
//! commit into segment files); in a cluster, the shard groups' raft logs (implemented by the
//! `sluice-cluster` crate). Either way the committed records come back to the same apply step
//! ([`wal::RecordSink`] locally, `Engine::apply_replicated` on a cluster's replicas).

pub(crate) mod metrics;
pub(crate) mod wal;

use crate::error::Result;
use crate::log::wal::Wal;
use crate::log::wal::record::WriteRecord;
use crate::store::catalog::TableDef;
use async_trait::async_trait;
use std::sync::Arc;

/// Where a write is made durable: the engine's one append call site goes through it.
#[async_trait]
pub trait WriteLog: Send + Sync + 'static {
    /// Makes `records` durable and applied, together where the log can (one group commit);
    /// an error means none of them may be acknowledged. `def` is the table of the records (a
    /// cluster routes each row by its shard key; a single node may take records of several
    /// tables at once). `wait`: wait for room in a full queue instead of refusing with
    /// `overloaded`. Returns the log position of the last record where the log has one
    /// position for all writes (the local WAL), `None` where each shard counts its own.
    async fn append(
        &self,
        def: &TableDef,
        records: Vec<Arc<WriteRecord>>,
        wait: bool,
    ) -> Result<Option<u64>>;

    /// Returns once this node has applied every write acknowledged (by any node) before the
    /// call, so that a query run next sees them.
    async fn read_barrier(&self) -> Result<()>;

    /// [`WriteLog::read_barrier`] taken alongside a query instead of before it: notes what
    /// this node has applied now and returns a future that says whether that already held
    /// every write acknowledged (by any node) before this call; then a query that reads this
    /// node's state from now on needs no barrier. `None` where that cannot be told now (a
    /// replica here not caught up) or there is no barrier to save: take the barrier.
    fn read_ahead(&self) -> Option<futures::future::BoxFuture<'_, bool>> {
        None
    }

    /// Returns once this node's catalog holds every change committed (on any node) before
    /// the call: a write to a table this node does not know yet looks again after it, so
    /// that a table created on another node a moment ago is not taken for a missing one.
    /// A single node's catalog always does.
    async fn catalog_barrier(&self) -> Result<()> {
        Ok(())
    }

    /// Whether this node evaluates the alerts now (one node of a cluster does).
    fn evaluates_alerts(&self) -> bool;

    /// The node that runs a cluster's once-per-cluster work (alerts, bridges): `None` on a
    /// single node, or while no node is known to.
    fn singletons_node(&self) -> Option<u64> {
        None
    }

    /// Delivery across a cluster's nodes (`None` on a single node).
    fn relay(&self) -> Option<Arc<dyn crate::Relay>> {
        None
    }

    /// `FLUSH TABLE` on a cluster: every node writes the buffered rows of table `table_id`
    /// in the shards it leads as files and commits them; returns the files written.
    async fn flush_table(&self, _table_id: u64) -> Result<u64> {
        Err(crate::Error::invalid(
            "FLUSH TABLE through the log is a cluster's",
        ))
    }
}

impl std::fmt::Debug for dyn WriteLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteLog")
    }
}

#[async_trait]
impl WriteLog for Wal {
    async fn append(
        &self,
        _def: &TableDef,
        records: Vec<Arc<WriteRecord>>,
        wait: bool,
    ) -> Result<Option<u64>> {
        self.append_all(records, wait).await.map(Some)
    }

    async fn read_barrier(&self) -> Result<()> {
        // Every acknowledged write was applied here before its acknowledgement.
        Ok(())
    }

    fn evaluates_alerts(&self) -> bool {
        true
    }
}

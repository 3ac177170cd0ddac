//! The query side's ports: [`Logins`] and [`QueryPort`] for the engine (the HTTP API, the
//! PostgreSQL listener, the console and alerts call these).

use super::{Engine, now_micros};
use crate::alerts::{AlertDef, AlertStatus};
use crate::error::Result;
use crate::ingest::decode::{Format, decode};
use crate::ports::{
    Described, Health, LatestRows, Logins, QueryOptions, QueryOutput, QueryPort, WriteReceipt,
};
use async_trait::async_trait;
use datafusion::arrow::compute::concat_batches;
use futures::TryStreamExt;

impl Engine {
    /// [`crate::IngestPort::latest_rows`]: a `LATEST ON` query, which the last-value cache
    /// answers (after the read barrier, from every shard on a cluster).
    pub(crate) async fn latest_rows_of(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Option<LatestRows>> {
        let Ok(def) = self.table(database, table) else {
            return Ok(None);
        };
        let Some((keys, time)) = crate::store::latest::shape(&def) else {
            return Ok(None);
        };
        let quote = |s: &str| crate::query::gapfill::quote(s.to_string());
        let keys: Vec<String> = keys.iter().map(|&k| def.columns[k].name.clone()).collect();
        let sql = format!(
            "SELECT * FROM {}.{} LATEST ON {} PARTITION BY {}",
            quote(database),
            quote(table),
            quote(&def.columns[time].name),
            keys.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ")
        );
        let out = QueryPort::query(self, &sql, &QueryOptions::default()).await?;
        let batches: Vec<_> = out.stream.try_collect().await?;
        let rows = concat_batches(&out.schema, &batches)?;
        Ok(Some(LatestRows { keys, rows }))
    }
}

impl Logins for Engine {
    fn password_hash(&self, user: &str) -> Option<String> {
        (self.access).password_hash(&self.store.catalog.snapshot(), user)
    }

    fn has_users(&self) -> bool {
        self.access.required(&self.store.catalog.snapshot())
    }

    fn authorize(&self, user: Option<&str>, need: crate::access::Need<'_>) -> Result<()> {
        (self.access).check(|| self.store.catalog.snapshot(), user, need)
    }

    fn is_admin(&self, user: Option<&str>) -> bool {
        user.is_none() || self.access.is_admin(&self.store.catalog.snapshot(), user)
    }

    fn has_rules(&self) -> bool {
        self.access.has_rules()
    }

    fn logins(&self) -> &crate::access::LoginFailures {
        &self.access.logins
    }
}

#[async_trait]
impl QueryPort for Engine {
    async fn query(&self, sql: &str, options: &QueryOptions) -> Result<QueryOutput> {
        // Logged in `system.queries` until its result is read or dropped.
        let running = self.store.queries.begin(crate::query::log::Begin {
            // Only alerts run `small` queries.
            kind: if options.small { "alert" } else { "query" },
            asked_by: None,
            user: options.user.as_deref(),
            database: (options.database.as_deref()).unwrap_or(crate::DEFAULT_DATABASE),
            text: sql,
        });
        let run = async {
            if let Some(log) = self.log.get() {
                // Every write acknowledged anywhere before this query is applied here first,
                // or was already when a query that only reads began (`query_ahead`).
                if super::read_ahead::only_reads(sql)
                    && self.may_read_ahead()
                    && let Some(ahead) = log.read_ahead()
                {
                    return self.query_ahead(sql, options, ahead, &**log).await;
                }
                log.read_barrier().await?;
            }
            Engine::query(self, sql, options).await
        };
        match crate::query::log::within(running.clone(), run).await {
            Ok(out) => Ok(QueryOutput {
                stream: crate::query::log::recorded(out.stream, running),
                schema: out.schema,
            }),
            Err(e) => {
                running.end(Err(e.to_string()));
                Err(e)
            }
        }
    }

    async fn describe(&self, sql: &str, options: &QueryOptions) -> Result<Described> {
        Engine::describe(self, sql, options).await
    }

    async fn write(
        &self,
        user: Option<&str>,
        database: &str,
        table: &str,
        format: Format,
        payload: &[u8],
    ) -> Result<WriteReceipt> {
        self.authorize(user, crate::access::Need::Insert { database, table })?;
        let def = self.table_to_write(database, table).await?;
        let rows = decode(&def, format, payload, now_micros())?;
        self.append_rows(&def, rows).await
    }

    async fn write_line_protocol(
        &self,
        user: Option<&str>,
        database: &str,
        text: &str,
        ns_per_unit: i64,
        partial: bool,
    ) -> Result<crate::ports::LineProtocolWrite> {
        Engine::write_line_protocol(self, user, database, text, ns_per_unit, partial).await
    }

    fn alerts(&self) -> Vec<AlertStatus> {
        self.alerts.status()
    }

    async fn create_alert(&self, def: AlertDef, if_not_exists: bool) -> Result<()> {
        Engine::create_alert(self, def, if_not_exists).await
    }

    async fn drop_alert(&self, name: &str, if_exists: bool, user: Option<&str>) -> Result<()> {
        Engine::drop_alert(self, name, if_exists, user)
    }

    fn metrics(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        // In a cluster the local log is idle: the shard groups' logs carry the writes.
        self.wal.render_metrics(&mut out);
        self.access.render_metrics(&mut out);
        let h = QueryPort::health(self);
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let figures: [(&str, &str, &str, u64); 12] = [
            (
                "sluice_shard_rows_applied_total",
                "counter",
                "Rows applied from the shard logs this cluster node replicates.",
                load(&self.shard_rows_applied),
            ),
            (
                "sluice_queries_read_ahead_total",
                "counter",
                "Cluster queries run while their read barrier was asked, which found this node up to date.",
                load(&self.reads_ahead),
            ),
            (
                "sluice_queries_read_again_total",
                "counter",
                "Cluster queries run while their read barrier was asked that found this node behind, so ran again after it.",
                load(&self.reads_again),
            ),
            (
                "sluice_remote_rows_read_total",
                "counter",
                "Unflushed rows queries read from replicas on other nodes (shards not held here).",
                load(&self.store.remote_rows),
            ),
            (
                "sluice_remote_rows_aggregated_total",
                "counter",
                "Unflushed rows other nodes' replicas aggregated for queries here (partial aggregates, synopses).",
                load(&self.store.remote_aggregated),
            ),
            (
                "sluice_node_bytes_sent_total",
                "counter",
                "Bytes sent to other cluster nodes (forwarded writes, replication, reads).",
                load(&crate::NODE_BYTES_SENT),
            ),
            (
                "sluice_flushes_total",
                "counter",
                "Buffers written to Parquet since start.",
                h.flushes,
            ),
            (
                "sluice_buffered_rows",
                "gauge",
                "Rows in memory, not yet in Parquet.",
                h.buffered_rows,
            ),
            (
                "sluice_buffered_bytes",
                "gauge",
                "Bytes of the rows in memory.",
                h.buffered_bytes,
            ),
            (
                "sluice_flushing_partitions",
                "gauge",
                "Partitions being written to Parquet now.",
                h.flushing,
            ),
            (
                "sluice_partitions",
                "gauge",
                "Partitions of every table.",
                h.partitions,
            ),
            (
                "sluice_parquet_files",
                "gauge",
                "Parquet files of every table.",
                h.files,
            ),
        ];
        for (name, kind, help, v) in figures {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        out
    }

    fn health(&self) -> Health {
        self.health_now()
    }
}

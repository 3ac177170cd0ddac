//! The ports: what the layers above the engine call, one trait per caller. The MQTT broker
//! and its bridges store messages through [`IngestPort`]; the HTTP API, the console and
//! the alert evaluator run SQL and writes through [`QueryPort`]; both check logins through
//! [`Logins`]. [`crate::Engine`] implements them on a single node and on a cluster node (where
//! its [`crate::WriteLog`] is the cluster's shard logs). [`ClusterAdmin`] is what the HTTP API
//! calls to manage a cluster; the `sluice-cluster` crate implements it.

use crate::error::Result;
use crate::ingest::decode::Format;
use crate::ingest::origin::Origin;
use crate::log::wal::Journal;
use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

/// A statement's result: rows as they are produced, so a large result is never held whole.
pub struct QueryOutput {
    /// Result schema (empty for statements without rows).
    pub schema: SchemaRef,
    /// Result rows.
    pub stream: SendableRecordBatchStream,
}

impl std::fmt::Debug for QueryOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryOutput")
            .field("schema", &self.schema)
            .finish()
    }
}

impl QueryOutput {
    /// A result already in memory (statements, SHOW, DESCRIBE).
    pub fn from_batches(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        let stream = futures::stream::iter(batches.into_iter().map(Ok));
        Self {
            schema: schema.clone(),
            stream: Box::pin(RecordBatchStreamAdapter::new(schema, stream)),
        }
    }
}

/// How to run a statement.
#[derive(Debug, Clone, Default)]
pub struct QueryOptions {
    /// The database of names written without one (`default` when `None`).
    pub database: Option<String>,
    /// Values of `$1`, `$2`, ... in order.
    pub params: Vec<datafusion::common::ScalarValue>,
    /// Compute the answer even if a kept result of the same query is still valid (and keep
    /// none): for measuring.
    pub no_result_cache: bool,
    /// The query reads little and runs often (an alert): plan it as one partition, which
    /// costs less to plan and start than splitting it over the cores.
    pub small: bool,
    /// Who runs it (`None`: the server itself, or anyone on a server without users): its
    /// role, grants and the `[[acl]]` rules decide what it may read, write and change.
    pub user: Option<String>,
    /// A PostgreSQL client asks: a query about the schema (`pg_catalog`,
    /// `information_schema`, `format_type`, ...) is answered from PostgreSQL's catalogs.
    pub postgres: bool,
}

/// What a statement takes and returns, known before it runs ([`QueryPort::describe`]).
#[derive(Debug, Clone)]
pub struct Described {
    /// The types of `$1`, `$2`, ... in order (`None`: not inferred from the query).
    pub params: Vec<Option<datafusion::arrow::datatypes::DataType>>,
    /// The result's columns; `None` for a statement that returns no rows.
    pub schema: Option<SchemaRef>,
    /// For a statement that returns no rows: what it does (`CREATE TABLE`, `INSERT`, ...).
    pub statement: Option<&'static str>,
}

/// An acknowledged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteReceipt {
    /// Rows stored.
    pub rows: usize,
    /// Log position of the write.
    pub lsn: u64,
}

/// What a line protocol write stored, and the lines it did not (partial writes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineProtocolWrite {
    /// Rows stored.
    pub rows: usize,
    /// Lines refused, in order.
    pub rejected: Vec<RejectedLine>,
    /// Per table written (the measurement's name), its stored lines as sent, in order.
    pub stored: Vec<(String, String)>,
}

/// A line of a partial write that was not stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedLine {
    /// Its number in the request (from 1).
    pub line: usize,
    /// The line as sent.
    pub text: String,
    /// Why.
    pub error: String,
}

/// Health as `/health` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Health {
    /// Last applied log position.
    pub applied_lsn: u64,
    /// WAL segment files on disk.
    pub wal_segments: usize,
    /// Rows in memory, not yet in Parquet.
    pub buffered_rows: u64,
    /// Bytes of those rows.
    pub buffered_bytes: u64,
    /// Partitions being written to Parquet right now.
    pub flushing: u64,
    /// Buffers written to Parquet since the server started.
    pub flushes: u64,
    /// Partitions of every table.
    pub partitions: u64,
    /// Parquet files of every table.
    pub files: u64,
    /// Messages kept in `system.dead_letters` (in memory, the newest 100,000).
    pub dead_letters: u64,
}

/// A message to store in a table, as the broker hands it over.
#[derive(Debug, Clone, Copy)]
pub struct Publication<'a> {
    /// Database name.
    pub database: &'a str,
    /// Table name.
    pub table: &'a str,
    /// Payload format.
    pub format: Format,
    /// The message payload.
    pub payload: &'a [u8],
    /// Column values taken from the topic: (column name, text), set in every row.
    pub fixed: &'a [(String, String)],
    /// Create the table from this (JSON) message if it does not exist, and add columns for
    /// new fields.
    pub auto_create: bool,
    /// Where a bridged message came from; logged with its rows (see [`crate::ingest::origin`]).
    pub origin: Option<&'a Origin>,
}

/// Builds the rows of a `system` table another layer serves (the broker's bridges), fresh
/// for each query.
#[derive(Clone)]
pub struct SystemRows(pub std::sync::Arc<dyn Fn() -> RecordBatch + Send + Sync>);

impl std::fmt::Debug for SystemRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemRows")
    }
}

/// A message that could not be stored, kept whole for inspection and replay.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// Arrival time, microseconds since the epoch.
    pub time_micros: i64,
    /// Publishing client.
    pub client_id: String,
    /// Topic it was published to.
    pub topic: String,
    /// The payload, unchanged.
    pub payload: Vec<u8>,
    /// Why it was refused.
    pub reason: String,
    /// The MQTT reason code it was refused with.
    pub reason_code: u8,
}

/// Who may log in and what each may do (both ports ask): users from `[[user]]` and
/// `CREATE USER`, their roles and grants, and the `[[acl]]` rules ([`crate::access`]).
pub trait Logins: Send + Sync + 'static {
    /// A user's argon2 password hash, if there is such a user.
    fn password_hash(&self, user: &str) -> Option<String>;

    /// Whether any user exists, so that every caller must log in.
    fn has_users(&self) -> bool;

    /// Whether `user` (`None`: anonymous, on a server without users) may do what `need`
    /// says: the one authorization decision. A refusal (`Error::Denied`, naming the missing
    /// right or the rule) is logged and counted.
    fn authorize(&self, user: Option<&str>, need: crate::access::Need<'_>) -> Result<()>;

    /// Whether `user` is an administrator.
    fn is_admin(&self, user: Option<&str>) -> bool;

    /// Whether any `[[acl]]` rule exists (without, topics are open to every user).
    fn has_rules(&self) -> bool;

    /// Failed logins by source address, counted and slowed down ([`crate::access::LoginFailures`]).
    fn logins(&self) -> &crate::access::LoginFailures;
}

/// The ingest port: what the MQTT broker and its bridges call to store messages.
#[async_trait]
pub trait IngestPort: Logins {
    /// Stores one message as one durable append: returns only once the rows are durable and
    /// visible to queries, all rows or none. `Ok(None)`: no such table (and not created), so
    /// the message is not stored.
    async fn publish(&self, publication: Publication<'_>) -> Result<Option<WriteReceipt>> {
        self.publish_journaled(publication, None).await
    }

    /// [`IngestPort::publish`] with a journal record (the broker's record of the message,
    /// for the sessions it is queued for) logged in the same group commit as the rows, or
    /// alone when the topic's table does not exist. On an error neither is logged.
    async fn publish_journaled(
        &self,
        publication: Publication<'_>,
        journal: Option<Journal>,
    ) -> Result<Option<WriteReceipt>>;

    /// Whether a cluster's once-per-cluster work (bridges, alerts) runs on this node now:
    /// always on a single node; on the metadata group's leader in a cluster.
    fn runs_singletons(&self) -> bool;

    /// The node that runs it (`None` on a single node, or while no leader is known).
    fn singletons_node(&self) -> Option<u64>;

    /// Whether journal records are kept in a log here: the local WAL, on a single node and
    /// on a cluster node alike (a cluster node's sessions live on that node; a standby copy
    /// of them on another node is kept through [`IngestPort::set_journal_tap`]).
    fn journals(&self) -> bool;

    /// Journal records committed from now on also go to `tap` (a cluster node's standby
    /// copy), and logging them returns once they are shipped. Set once.
    fn set_journal_tap(&self, _tap: std::sync::Arc<dyn crate::JournalTap>) {}

    /// Logs journal records in one group commit (each `then` runs in log order once
    /// durable); returns the LSN of the last. `wait`: wait for room in a full queue.
    async fn journal(&self, entries: Vec<Journal>, wait: bool) -> Result<u64>;

    /// The journal records the log held at start, in LSN order (once: they are handed over).
    fn take_journal(&self) -> Vec<(u64, Vec<u8>)>;

    /// Runs `f` with the last applied LSN while nothing commits, so that state built by
    /// journal records is exactly that of the log up to it (for a snapshot).
    fn journal_checkpoint(&self, f: &mut dyn FnMut(u64));

    /// The journal records from `lsn` on are still needed (not in a snapshot): the log keeps
    /// them.
    fn keep_journal_from(&self, lsn: u64);

    /// Stores many messages with one log submission (one group commit, one completion), for
    /// a caller holding many at once (a bridge). Returns, for each publication in order, its
    /// receipt, or `None` when it was not stored here (no such table, a table to create or
    /// widen, a payload that does not decode, buffers full): the caller stores those one by
    /// one with [`IngestPort::publish`], which creates, widens or says why. `Err`: the log
    /// failed, and none of the batch is acknowledged.
    async fn publish_batch(
        &self,
        publications: Vec<Publication<'_>>,
    ) -> Result<Vec<Option<WriteReceipt>>>;

    /// Whether to ask a Sparkplug B edge node of `group` for its BIRTH messages now (its
    /// DATA named an alias no BIRTH announced); at most once per node every 10 s.
    fn ask_rebirth(&self, _group: &str, _edge: &str) -> bool {
        false
    }

    /// Keeps a refused message durably in `system.dead_letters`.
    async fn dead_letter(&self, letter: DeadLetter) -> Result<()>;

    /// Whether `origin` is the last message its bridge stored with its packet id: a
    /// redelivery of it must be acknowledged, not stored again.
    fn is_stored(&self, origin: &Origin) -> bool;

    /// Forgets what a removed bridge stored (its packet ids mean nothing any more).
    fn forget_origins(&self, source: &str) -> Result<()>;

    /// In a cluster: the bridges the admin API added and removed, as the metadata group
    /// holds them (`None` on a single node, whose broker keeps its own).
    fn api_bridges(&self) -> Option<crate::ApiBridges>;

    /// Changes them, through the metadata group (a catalog change).
    fn change_api_bridges(&self, change: &mut dyn FnMut(&mut crate::ApiBridges)) -> Result<()>;

    /// Serves `system.<name>` from `rows` (replacing an earlier one of that name): the
    /// broker's own tables (bridges, sessions).
    fn add_system_table(&self, name: &str, rows: SystemRows);

    /// Delivery across a cluster's nodes (`None` on a single node).
    fn relay(&self) -> Option<std::sync::Arc<dyn crate::Relay>> {
        None
    }

    /// The newest row of each key of `database.table`'s last-value cache, read as a query
    /// reads it (every acknowledged row; on a cluster, every shard). `None`: no such table,
    /// or it keeps no cache.
    async fn latest_rows(&self, _database: &str, _table: &str) -> Result<Option<LatestRows>> {
        Ok(None)
    }
}

/// The newest row of each key of a table ([`IngestPort::latest_rows`]).
#[derive(Debug, Clone)]
pub struct LatestRows {
    /// The names of the cache's key columns.
    pub keys: Vec<String>,
    /// One row per key, with every column of the table.
    pub rows: RecordBatch,
}

/// The query and admin port: what the HTTP API, the console and the alerts call.
#[async_trait]
pub trait QueryPort: Logins {
    /// Executes one SQL statement.
    async fn execute(&self, sql: &str) -> Result<QueryOutput> {
        self.query(sql, &QueryOptions::default()).await
    }

    /// Executes one SQL statement with options: the database of unqualified names, and
    /// values for `$1`, `$2`, ... placeholders.
    async fn query(&self, sql: &str, options: &QueryOptions) -> Result<QueryOutput>;

    /// What `sql` takes and returns without running it, for clients that prepare statements
    /// (the PostgreSQL protocol): its parameters' types and its result's columns. Read-only
    /// statements other than queries (`SHOW ...`, `DESCRIBE`) are run to learn their columns;
    /// others are only parsed.
    async fn describe(&self, sql: &str, options: &QueryOptions) -> Result<Described>;

    /// Decodes `payload` for `database.table` and stores it as one durable append; returns
    /// only once the rows are durable and visible to queries. All rows or none.
    async fn write(
        &self,
        user: Option<&str>,
        database: &str,
        table: &str,
        format: Format,
        payload: &[u8],
    ) -> Result<WriteReceipt>;

    /// Stores InfluxDB line protocol as InfluxDB's write API does (each measurement a
    /// table; see [`crate::Engine::write_line_protocol`]), as `user`, timestamps in units of
    /// `ns_per_unit` nanoseconds.
    /// With `partial`, lines that cannot be stored (they do not parse, or a value does not
    /// fit its column) are reported and the rest stored, as InfluxDB does; without it one
    /// such line refuses the whole request.
    async fn write_line_protocol(
        &self,
        user: Option<&str>,
        database: &str,
        text: &str,
        ns_per_unit: i64,
        partial: bool,
    ) -> Result<LineProtocolWrite>;

    /// Every alert with its state.
    fn alerts(&self) -> Vec<crate::alerts::AlertStatus>;

    /// Makes an alert (its query must plan); `AlreadyExists` unless `if_not_exists`.
    async fn create_alert(&self, def: crate::alerts::AlertDef, if_not_exists: bool) -> Result<()>;

    /// Removes an alert, as `user` (a plain user only its own); `UnknownAlert` unless
    /// `if_exists`.
    async fn drop_alert(&self, name: &str, if_exists: bool, user: Option<&str>) -> Result<()>;

    /// Current health figures.
    fn health(&self) -> Health;

    /// The engine's own figures in Prometheus text format, for `/metrics`: the log's
    /// appends, group commits, fdatasync and apply latencies, and the buffers and files.
    fn metrics(&self) -> String;
}

/// A cluster as its operators manage it over HTTP (`/v1/cluster`): this node's view, nodes
/// added and removed, shard leaderships moved.
#[async_trait]
pub trait ClusterAdmin: Send + Sync + 'static {
    /// This node's id.
    fn node_id(&self) -> u64;

    /// The cluster's nodes.
    fn node_ids(&self) -> Vec<u64>;

    /// `system.nodes`: every node, whether it is this one, and what it leads as seen here.
    fn nodes_table(&self) -> RecordBatch;

    /// `system.shards`: every group this node has a replica of, as this node sees it.
    fn shards_table(&self) -> RecordBatch;

    /// Adds node `id` at `address` (`Some`) or removes it (`None`), then waits up to `wait`
    /// for the shards and the metadata group to have moved (the move goes on after that).
    /// Returns the topology seen at the end (as JSON) and whether it has settled.
    async fn change_node(
        &self,
        id: u64,
        address: Option<String>,
        wait: std::time::Duration,
    ) -> Result<(serde_json::Value, bool), NodeChangeError>;

    /// Makes `node` the preferred leader of data shard `shard` and waits up to `wait` for
    /// the leadership to move there. Returns the leader seen at the end (`None` if this node
    /// has no replica of the shard and cannot tell).
    async fn move_leader(
        &self,
        shard: u32,
        node: u64,
        wait: std::time::Duration,
    ) -> Result<Option<u64>, LeaderMoveError>;
}

/// Why a node could not be added or removed.
#[derive(Debug, thiserror::Error)]
pub enum NodeChangeError {
    /// The request contradicts the cluster (an id taken, or used before).
    #[error("{0}")]
    Conflict(String),
    /// The request cannot be done (the last node).
    #[error("{0}")]
    Invalid(String),
    /// The metadata group did not commit the change.
    #[error("the metadata group did not commit the change: {0}")]
    NotCommitted(String),
}

/// Why a shard's leadership could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum LeaderMoveError {
    /// No such shard.
    #[error("no shard {shard}: there are {shards}, numbered from 0")]
    NoShard {
        /// The shard asked for.
        shard: u32,
        /// How many the cluster has.
        shards: usize,
    },
    /// The node holds no voting replica of the shard.
    #[error("node {node} holds no replica of shard {shard} (its replicas: {replicas:?})")]
    NotReplica {
        /// The shard.
        shard: u32,
        /// The node asked for.
        node: u64,
        /// The shard's voting replicas.
        replicas: Vec<u64>,
    },
    /// The metadata group did not commit the move.
    #[error("the metadata group did not commit the move: {0}")]
    NotCommitted(String),
}

//! Engine errors. Each variant says what a client did wrong or what failed underneath, and
//! knows its [`ErrorKind`] ([`Error::kind`]): the one classification every protocol edge
//! maps to its wire code (HTTP status, MQTT reason code) in one exhaustive match.

use std::path::PathBuf;

/// Everything the engine can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQL that does not parse or plan.
    #[error("{message}")]
    Sql {
        /// What was expected and where (line:column when known).
        message: String,
    },
    /// The database does not exist.
    #[error("database '{database}' does not exist")]
    UnknownDatabase {
        /// Database name.
        database: String,
    },
    /// The table does not exist.
    #[error("table '{database}.{table}' does not exist")]
    UnknownTable {
        /// Database name.
        database: String,
        /// Table name.
        table: String,
    },
    /// The alert does not exist.
    #[error("alert '{name}' does not exist")]
    UnknownAlert {
        /// Alert name.
        name: String,
    },
    /// Creating something that already exists.
    #[error("{message}")]
    Denied {
        /// Who, what, and the missing right or the rule that refused it.
        message: String,
    },
    #[error("{what} '{name}' already exists")]
    AlreadyExists {
        /// "database", "table", "column".
        what: &'static str,
        /// Its name.
        name: String,
    },
    /// A DDL statement that is well-formed but invalid (bad type, bad partition function...).
    #[error("{message}")]
    InvalidDefinition {
        /// Why.
        message: String,
    },
    /// A row that does not fit its table. `line` is 1-based within the request body.
    #[error("line {line}, column '{column}': {reason}")]
    BadRow {
        /// 1-based line of the body (row index for JSON arrays).
        line: usize,
        /// The column (or field) at fault.
        column: String,
        /// What was wrong.
        reason: String,
    },
    /// A payload that is not valid CSV/JSON at all.
    #[error("line {line}: {reason}")]
    BadPayload {
        /// 1-based line.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// A Sparkplug B DATA message with a metric alias that no BIRTH announced.
    #[error("alias {alias} of {node} was announced by no BIRTH message")]
    NoBirth {
        /// The edge node (and device) that sent it.
        node: String,
        /// The unknown alias.
        alias: u64,
    },
    /// A write or definition past a hard limit.
    #[error("too large: {what}")]
    TooLarge {
        /// What exceeded which limit.
        what: String,
    },
    /// Too many writes already waiting for the WAL.
    #[error("overloaded: {pending} writes are waiting for the log; retry later")]
    Overloaded {
        /// The configured limit that was reached.
        pending: usize,
    },
    /// Too many rows wait in memory because persisting them keeps failing (object store
    /// unreachable, disk full) or lags far behind: writes wait for room, and are refused
    /// when none comes in time.
    #[error(
        "{bytes} bytes are still waiting to be persisted (limit {limit}): flushes to the object store or disk are failing or far behind, see the server log"
    )]
    BuffersFull {
        /// Bytes in buffers.
        bytes: u64,
        /// The refusal threshold (twice `buffer.total_max_bytes`).
        limit: u64,
    },
    /// The server is shutting down.
    #[error("shutting down")]
    ShuttingDown,
    /// A cluster's shard or metadata group did not commit a write (no leader in time, a
    /// group stopped); it was not acknowledged and may be sent again.
    #[error("not committed by the cluster: {reason}")]
    Replication {
        /// What went wrong.
        reason: String,
    },
    /// The WAL could not write or sync; nothing of the failed group was acknowledged.
    #[error("write-ahead log failure at {path}: {source}")]
    Wal {
        /// Segment file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The WAL refused writes after an earlier sync failure (data already acknowledged is safe).
    #[error("write-ahead log is read-only after an earlier failure: {reason}")]
    WalPoisoned {
        /// The failure that poisoned it.
        reason: String,
    },
    /// Local file I/O (catalog, data directory).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A stored file (catalog, manifest) is unreadable.
    #[error("corrupt {what}: {reason}")]
    Corrupt {
        /// Which file.
        what: String,
        /// Why.
        reason: String,
    },
    /// The object store failed.
    #[error("object store: {source}")]
    ObjectStore {
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// Query planning or execution failed inside DataFusion.
    #[error("{source}")]
    DataFusion {
        /// DataFusion's error.
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },
    /// Arrow or Parquet encoding failed.
    #[error("encoding: {source}")]
    Parquet {
        /// The Parquet error.
        #[source]
        source: datafusion::parquet::errors::ParquetError,
    },
    /// Arrow kernels failed.
    #[error("arrow: {source}")]
    Arrow {
        /// The Arrow error.
        #[source]
        source: datafusion::arrow::error::ArrowError,
    },
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        use datafusion::error::DataFusionError as D;
        // Classify by the innermost error: DataFusion wraps plan errors in context layers.
        match e.find_root() {
            D::SQL(..) | D::Plan(..) | D::SchemaError(..) | D::NotImplemented(..) => Error::Sql {
                message: e.strip_backtrace(),
            },
            _ => Error::DataFusion {
                source: Box::new(e),
            },
        }
    }
}

impl From<object_store::Error> for Error {
    fn from(source: object_store::Error) -> Self {
        Error::ObjectStore { source }
    }
}

impl From<datafusion::parquet::errors::ParquetError> for Error {
    fn from(source: datafusion::parquet::errors::ParquetError) -> Self {
        Error::Parquet { source }
    }
}

impl From<datafusion::arrow::error::ArrowError> for Error {
    fn from(source: datafusion::arrow::error::ArrowError) -> Self {
        Error::Arrow { source }
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn sql(message: impl Into<String>) -> Self {
        Error::Sql {
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidDefinition {
            message: message.into(),
        }
    }

    /// What kind of failure this is: the one classification the protocol edges map to
    /// their wire codes.
    pub fn kind(&self) -> ErrorKind {
        use datafusion::error::DataFusionError as D;
        match self {
            Error::Sql { .. } => ErrorKind::BadSql,
            Error::InvalidDefinition { .. } => ErrorKind::InvalidDefinition,
            Error::UnknownDatabase { .. } => ErrorKind::UnknownDatabase,
            Error::UnknownTable { .. } => ErrorKind::UnknownTable,
            Error::UnknownAlert { .. } => ErrorKind::UnknownAlert,
            Error::AlreadyExists { .. } => ErrorKind::AlreadyExists,
            Error::Denied { .. } => ErrorKind::Denied,
            Error::BadRow { .. } => ErrorKind::BadRow,
            Error::BadPayload { .. } | Error::NoBirth { .. } => ErrorKind::BadPayload,
            Error::TooLarge { .. } => ErrorKind::TooLarge,
            Error::Overloaded { .. } => ErrorKind::Overloaded,
            Error::BuffersFull { .. } => ErrorKind::BuffersFull,
            Error::ShuttingDown => ErrorKind::ShuttingDown,
            Error::Replication { .. } => ErrorKind::NotCommitted,
            Error::Wal { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
                ErrorKind::DiskFull
            }
            Error::Wal { .. } | Error::WalPoisoned { .. } => ErrorKind::LogUnavailable,
            Error::DataFusion { source } => match source.find_root() {
                D::ResourcesExhausted(_) => ErrorKind::ResourcesExhausted,
                D::ArrowError(..) | D::Execution(_) => ErrorKind::QueryFailed,
                _ => ErrorKind::Internal,
            },
            Error::Io { .. } | Error::ObjectStore { .. } => ErrorKind::StorageFailed,
            Error::Corrupt { .. } | Error::Parquet { .. } | Error::Arrow { .. } => {
                ErrorKind::Internal
            }
        }
    }

    /// Whether the same write can succeed later (the log or buffers are full, the disk or
    /// object store failed, the server is stopping), as opposed to one that never will (a
    /// payload that does not fit its table).
    pub fn is_transient(&self) -> bool {
        self.kind().is_transient()
    }
}

/// What kind of failure an [`Error`] is, for the protocol edges: each maps every kind to
/// its wire code (an HTTP status, an MQTT reason code) without a catch-all, so a new kind
/// must be placed on every edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// SQL that does not parse or plan.
    BadSql,
    /// A well-formed but invalid definition.
    InvalidDefinition,
    /// No such database.
    UnknownDatabase,
    /// No such table.
    UnknownTable,
    /// No such alert.
    UnknownAlert,
    /// It exists already.
    AlreadyExists,
    /// The caller lacks a right, or an `[[acl]]` rule refuses it.
    Denied,
    /// A row that does not fit its table.
    BadRow,
    /// A payload that does not parse at all.
    BadPayload,
    /// Past a hard size limit.
    TooLarge,
    /// Too many writes waiting for the log.
    Overloaded,
    /// Too many rows waiting to be persisted.
    BuffersFull,
    /// The server is stopping.
    ShuttingDown,
    /// A cluster group did not commit the write.
    NotCommitted,
    /// The log's disk is full.
    DiskFull,
    /// The log cannot write or sync.
    LogUnavailable,
    /// A query ran out of its memory.
    ResourcesExhausted,
    /// A query failed while running (a cast, a division by zero).
    QueryFailed,
    /// Local files or the object store failed.
    StorageFailed,
    /// Something that should not happen (a corrupt file, an encoder's failure).
    Internal,
}

impl ErrorKind {
    /// The stable machine-readable code (the `code` of an HTTP error body).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BadSql => "bad_sql",
            ErrorKind::InvalidDefinition => "invalid_definition",
            ErrorKind::UnknownDatabase => "unknown_database",
            ErrorKind::UnknownTable => "unknown_table",
            ErrorKind::UnknownAlert => "unknown_alert",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Denied => "forbidden",
            ErrorKind::BadRow => "bad_row",
            ErrorKind::BadPayload => "bad_payload",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::BuffersFull => "buffers_full",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::NotCommitted => "not_committed",
            ErrorKind::DiskFull => "disk_full",
            ErrorKind::LogUnavailable => "log_unavailable",
            ErrorKind::ResourcesExhausted => "resources_exhausted",
            ErrorKind::QueryFailed => "query_failed",
            ErrorKind::StorageFailed | ErrorKind::Internal => "internal",
        }
    }

    /// Whether the same request can succeed later (something is full, failing or
    /// stopping), as opposed to one that never will.
    pub fn is_transient(self) -> bool {
        match self {
            ErrorKind::Overloaded
            | ErrorKind::BuffersFull
            | ErrorKind::ShuttingDown
            | ErrorKind::NotCommitted
            | ErrorKind::DiskFull
            | ErrorKind::LogUnavailable
            | ErrorKind::StorageFailed => true,
            ErrorKind::BadSql
            | ErrorKind::InvalidDefinition
            | ErrorKind::UnknownDatabase
            | ErrorKind::UnknownTable
            | ErrorKind::UnknownAlert
            | ErrorKind::AlreadyExists
            | ErrorKind::Denied
            | ErrorKind::BadRow
            | ErrorKind::BadPayload
            | ErrorKind::TooLarge
            | ErrorKind::ResourcesExhausted
            | ErrorKind::QueryFailed
            | ErrorKind::Internal => false,
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

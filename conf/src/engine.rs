//! The storage engine's sections: `[wal]`, `[buffer]`, `[storage]`, `[compaction]`,
//! `[retention]` and `[query]`.

use serde::{Deserialize, Serialize};

/// How appends reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Acknowledge after `fdatasync`: nothing acknowledged is lost by a crash or power cut.
    Fsync,
    /// Acknowledge after `write(2)` only, without fdatasync. For measuring; a power cut
    /// loses acknowledged rows (a process crash does not).
    None,
}

/// Write-ahead log settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WalConfig {
    /// `"fsync"` (default) or `"none"` (no fdatasync; for measuring only).
    pub durability: Durability,
    /// A WAL segment is closed and a new one started past this many bytes.
    pub segment_bytes: u64,
    /// Most bytes one group commit writes before syncing; appends beyond wait for the next.
    pub max_group_bytes: usize,
    /// The longest a group commit waits for more records before its sync when records come
    /// one at a time with the log idle in between (a fleet of devices each publishing now
    /// and then): one sync then stores several. Only for a patient record (a device's
    /// message long after its last was acknowledged). `"0"`: never wait.
    pub max_commit_delay: String,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            segment_bytes: 64 * 1024 * 1024,
            max_group_bytes: 8 * 1024 * 1024,
            max_commit_delay: "2ms".into(),
        }
    }
}

/// When in-memory buffers are written out as Parquet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BufferConfig {
    /// A partition's buffer is persisted once it holds this many rows.
    pub partition_max_rows: usize,
    /// All buffers together: past this many bytes the largest are persisted.
    pub total_max_bytes: usize,
    /// A buffer is persisted once its oldest row has waited this long.
    pub max_age: String,
    /// How often the flusher looks at the buffers.
    pub check_interval: String,
}

impl Default for BufferConfig {
    fn default() -> Self {
        Self {
            partition_max_rows: 1_000_000,
            total_max_bytes: 512 * 1024 * 1024,
            max_age: "10m".into(),
            check_interval: "1s".into(),
        }
    }
}

/// Object storage for Parquet files and manifests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Empty: the local directory `<data_dir>/objects`. Otherwise `file:///abs/path` or
    /// `s3://bucket/prefix` (an S3-compatible store, configured by the `s3_*` keys).
    pub url: String,
    /// S3 endpoint, e.g. `http://127.0.0.1:9000` for MinIO; empty for AWS.
    pub s3_endpoint: String,
    /// S3 region.
    pub s3_region: String,
    /// S3 access key id (the `AWS_ACCESS_KEY_ID` environment variable also works).
    pub s3_access_key_id: String,
    /// S3 secret access key (the `AWS_SECRET_ACCESS_KEY` environment variable also works).
    pub s3_secret_access_key: String,
    /// Allow plain-HTTP endpoints.
    pub s3_allow_http: bool,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            s3_endpoint: String::new(),
            s3_region: "us-east-1".into(),
            s3_access_key_id: String::new(),
            s3_secret_access_key: String::new(),
            s3_allow_http: false,
            row_group_rows: 128 * 1024,
        }
    }
}

/// Merging a partition's small files into large ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    /// Off: files are never merged.
    pub enabled: bool,
    /// A partition is compacted once it has this many files smaller than `target_file_bytes`.
    pub min_files: usize,
    /// Files at least this large are left alone.
    pub target_file_bytes: u64,
    /// How often the compactor looks for work.
    pub interval: String,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_files: 4,
            target_file_bytes: 128 * 1024 * 1024,
            interval: "30s".into(),
        }
    }
}

/// Dropping expired partitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// How often partitions are checked against their table's TTL.
    pub interval: String,
    /// In a cluster: a file on the shared store that no live table's manifest names (a
    /// dropped table's, or a flush whose commit failed) is deleted once it is this old.
    pub orphan_grace: String,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            interval: "1m".into(),
            orphan_grace: "1h".into(),
        }
    }
}

/// Query execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueryConfig {
    /// Memory for decoded Parquet files (the hot cache): files written by flushes and
    /// compactions stay here, least recently used first out, so queries on recent partitions
    /// never read Parquet. Bytes, or a share of the machine's memory (`"25%"`: of the
    /// physical memory, or of the cgroup's limit when lower). 0 turns the cache off.
    pub hot_cache_bytes: MemoryBudget,
    /// Memory one query may hold for its operators (sorts and aggregations spill to disk
    /// past it, others fail with `resources_exhausted`); other queries go on. Queries run
    /// often and planned small (alerts) share one such budget.
    pub max_memory_bytes: usize,
    /// Longest a query may run, from planning to its last row (`"30s"`, `"5m"`); past it the
    /// query is stopped with a clear error.
    pub timeout: String,
    /// In a cluster, on a node holding only some shards: an aggregate's partial part runs
    /// on the other shards' replicas (only its states travel, not the rows), each also
    /// reading a share of the files, when about this many of their unflushed rows and of
    /// those files' rows would be read (estimated from the shards held here); fewer are
    /// read here, which costs less than planning the query on each replica.
    pub split_min_rows: u64,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            hot_cache_bytes: MemoryBudget::Share("25%".into()),
            max_memory_bytes: 1024 * 1024 * 1024,
            timeout: "5m".into(),
            split_min_rows: 100_000,
        }
    }
}

/// An amount of memory: bytes, or a share of the machine's (`"25%"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MemoryBudget {
    /// Bytes.
    Bytes(usize),
    /// `"N%"` of the memory this process may use, or bytes as text.
    Share(String),
}

impl MemoryBudget {
    /// The budget in bytes on this machine.
    pub fn bytes(&self) -> Result<usize, String> {
        let text = match self {
            Self::Bytes(n) => return Ok(*n),
            Self::Share(t) => t.trim(),
        };
        let Some(pct) = text.strip_suffix('%') else {
            return (text.parse::<usize>())
                .map_err(|_| format!("'{text}' is neither bytes nor a share such as '25%'"));
        };
        let pct: f64 = (pct.trim().parse().ok())
            .filter(|p: &f64| (0.0..=100.0).contains(p))
            .ok_or_else(|| format!("'{text}' is not a share of 0% to 100%"))?;
        Ok((machine_memory() as f64 * pct / 100.0) as usize)
    }
}

/// The memory this process may use: the physical memory (`/proc/meminfo`), or the cgroup's
/// limit when lower; 8 GiB when neither can be read.
pub fn machine_memory() -> u64 {
    let physical = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    let limit = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok());
    match (physical, limit) {
        (Some(p), Some(l)) => p.min(l),
        (Some(p), None) => p,
        (None, Some(l)) => l,
        (None, None) => 8 << 30,
    }
}

//! The catalog: databases, tables, columns, partitioning, TTL.
//!
//! It is one JSON document (`<data_dir>/catalog.json`) carrying a format number and a
//! version that grows with every change. A change is made on a copy, written to a temporary
//! file, fsynced and renamed over the old one, so a crash leaves either the old catalog or
//! the new one. Table ids are never reused, so WAL records of a dropped table are recognised
//! and skipped on replay even when a table of the same name exists again.

use crate::error::{Error, Result};
use crate::store::partition::PartitionFn;
use crate::types::ColumnType;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The on-disk format number of `catalog.json`.
const CATALOG_FORMAT: u32 = 1;
/// The database that always exists.
pub const DEFAULT_DATABASE: &str = "default";
/// The read-only database of system tables.
pub(crate) const SYSTEM_DATABASE: &str = "system";

/// One column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// Column name.
    pub name: String,
    /// Column type.
    #[serde(rename = "type")]
    pub ty: ColumnType,
    /// Whether NULL is allowed; a NOT NULL column missing from a row gets its type's default.
    pub nullable: bool,
}

/// One table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableDef {
    /// Never reused, even after DROP.
    pub id: u64,
    /// Database name.
    pub database: String,
    /// Table name.
    pub name: String,
    /// Columns in order; columns are only ever appended.
    pub columns: Vec<ColumnDef>,
    /// Partition function.
    pub partition: PartitionFn,
    /// Index of the column the partition function reads.
    pub partition_column: usize,
    /// Retention, in seconds; partitions whose newest row is older are dropped.
    pub ttl_secs: Option<u64>,
    /// Other `WITH (...)` options, kept verbatim for later features.
    pub options: BTreeMap<String, String>,
}

impl TableDef {
    /// The Arrow schema of the table. Every field is nullable in Arrow so that rows written
    /// before an `ADD COLUMN` read as NULL; NOT NULL is enforced when rows are decoded.
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| Field::new(&c.name, c.ty.arrow(), true))
                .collect::<Vec<_>>(),
        ))
    }

    /// The column rows are sorted by in Parquet and whose range `system.partitions` shows:
    /// the partition column when it is a time, else the first time column.
    pub fn time_column(&self) -> Option<usize> {
        if self.columns[self.partition_column].ty.is_time() {
            return Some(self.partition_column);
        }
        self.columns.iter().position(|c| c.ty.is_time())
    }

    /// Index of a column by (case-insensitive) name.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.name == name)
            .or_else(|| {
                self.columns
                    .iter()
                    .position(|c| c.name.eq_ignore_ascii_case(name))
            })
    }

    /// `CREATE TABLE` text that recreates this table.
    pub fn create_sql(&self) -> String {
        let cols = self
            .columns
            .iter()
            .map(|c| {
                let null = if c.nullable { "" } else { " NOT NULL" };
                format!("  {} {}{null}", c.name, c.ty.name())
            })
            .collect::<Vec<_>>()
            .join(",\n");
        let mut sql = format!(
            "CREATE TABLE {}.{} (\n{cols}\n) PARTITION BY {}",
            self.database,
            self.name,
            self.partition
                .sql(&self.columns[self.partition_column].name)
        );
        let mut opts: Vec<String> = self
            .options
            .iter()
            .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
            .collect();
        if let Some(ttl) = self.ttl_secs {
            opts.insert(0, format!("ttl = '{ttl}s'"));
        }
        if !opts.is_empty() {
            sql.push_str(&format!(" WITH ({})", opts.join(", ")));
        }
        sql
    }
}

/// The persisted catalog document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CatalogData {
    format: u32,
    /// Grows by one with every change.
    pub version: u64,
    next_table_id: u64,
    /// Database -> table name -> table.
    pub databases: BTreeMap<String, BTreeMap<String, Arc<TableDef>>>,
    /// User name -> argon2 password hash (PHC string), from `CREATE USER`.
    #[serde(default)]
    pub users: BTreeMap<String, String>,
    /// Users made with `CREATE USER ... ADMIN`.
    #[serde(default)]
    pub admins: std::collections::BTreeSet<String>,
    /// User -> database -> rights, from `GRANT` and `REVOKE`.
    #[serde(default)]
    pub grants: BTreeMap<String, BTreeMap<String, crate::access::Rights>>,
    /// Alert name -> definition, from `CREATE ALERT` and the HTTP API.
    #[serde(default)]
    pub alerts: BTreeMap<String, crate::alerts::AlertDef>,
    /// In a cluster: the bridges the admin API added and removed (a single node keeps its
    /// own, in `broker/bridges.json`).
    #[serde(default, skip_serializing_if = "ApiBridges::is_empty")]
    pub bridges: ApiBridges,
    /// Rollup table id -> what it keeps ([`crate::store::rollup`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rollups: BTreeMap<u64, crate::store::rollup::RollupDef>,
    /// In a cluster: the metadata group's log index of the change this is (0 on a single
    /// node). Entries at or below it are already here when the log is replayed.
    #[serde(default)]
    pub raft_index: u64,
}

/// Bridges the admin API added (`POST /v1/bridges`), and configured ones it removed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiBridges {
    pub added: Vec<sluice_conf::BridgeConfig>,
    pub removed: Vec<String>,
    /// Bridge -> how many times it was asked to restart (`POST /v1/bridges/{name}/restart`
    /// through any node): the node running it restarts it when this moves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub restarts: BTreeMap<String, u64>,
}

impl ApiBridges {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.restarts.is_empty()
    }
}

impl Default for CatalogData {
    fn default() -> Self {
        Self {
            format: CATALOG_FORMAT,
            version: 1,
            next_table_id: 1,
            databases: BTreeMap::from([(DEFAULT_DATABASE.to_string(), BTreeMap::new())]),
            users: BTreeMap::new(),
            admins: Default::default(),
            grants: BTreeMap::new(),
            alerts: BTreeMap::new(),
            bridges: ApiBridges::default(),
            rollups: BTreeMap::new(),
            raft_index: 0,
        }
    }
}

impl CatalogData {
    /// A table by database and name.
    pub fn table(&self, database: &str, table: &str) -> Result<&Arc<TableDef>> {
        let db = self
            .databases
            .get(database)
            .ok_or_else(|| Error::UnknownDatabase {
                database: database.into(),
            })?;
        db.get(table).ok_or_else(|| Error::UnknownTable {
            database: database.into(),
            table: table.into(),
        })
    }

    /// Every table, in name order.
    pub fn tables(&self) -> impl Iterator<Item = &Arc<TableDef>> {
        self.databases.values().flat_map(|t| t.values())
    }

    /// The rollups kept from table `source`: each one's id and definition.
    pub fn rollups_of(&self, source: u64) -> Vec<(u64, &crate::store::rollup::RollupDef)> {
        (self.rollups.iter())
            .filter(|(_, r)| r.source == source)
            .map(|(id, r)| (*id, r))
            .collect()
    }

    /// Whether table `id` was ever created here (it may have been dropped since): ids are
    /// handed out in order and never reused.
    pub fn allocated(&self, id: u64) -> bool {
        id < self.next_table_id
    }
}

/// Where catalog changes are committed in a cluster (the metadata group).
pub trait CatalogLog: Send + Sync {
    /// Commits `next` (the whole catalog after one change, its `version` one past the
    /// current) and returns once it is installed here ([`Catalog::install`]), or why not.
    /// Called from a multi-threaded tokio runtime's worker; it may block.
    fn commit(&self, next: &CatalogData) -> Result<()>;
}

/// The catalog, shared by readers, changed by one writer at a time.
#[derive(Debug)]
pub(crate) struct Catalog {
    path: PathBuf,
    data: RwLock<Arc<CatalogData>>,
    write: parking_lot::Mutex<()>,
    /// Set in a cluster: changes are committed there, not written here directly.
    log: std::sync::OnceLock<Arc<dyn CatalogLog>>,
    /// Whether any rollup exists: writes ask [`Catalog::is_rollup`] of every append, which
    /// then costs one load while there is none.
    any_rollups: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for dyn CatalogLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CatalogLog")
    }
}

impl Catalog {
    /// Opens `<dir>/catalog.json`, creating it (with the `default` database) if absent.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("catalog.json");
        let data = match std::fs::read(&path) {
            Ok(bytes) => {
                let data: CatalogData =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                        what: path.display().to_string(),
                        reason: e.to_string(),
                    })?;
                if data.format != CATALOG_FORMAT {
                    return Err(Error::Corrupt {
                        what: path.display().to_string(),
                        reason: format!("unsupported catalog format {}", data.format),
                    });
                }
                data
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let data = CatalogData::default();
                write_atomic(
                    &path,
                    &serde_json::to_vec_pretty(&data).expect("serialisable"),
                )?;
                data
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        Ok(Self {
            path,
            any_rollups: (!data.rollups.is_empty()).into(),
            data: RwLock::new(Arc::new(data)),
            write: parking_lot::Mutex::new(()),
            log: std::sync::OnceLock::new(),
        })
    }

    /// The current catalog (a cheap snapshot).
    pub(crate) fn snapshot(&self) -> Arc<CatalogData> {
        self.data.read().clone()
    }

    /// Whether table `id` is a rollup (whose rows only its source's flushes write).
    pub(crate) fn is_rollup(&self, id: u64) -> bool {
        self.any_rollups.load(std::sync::atomic::Ordering::Acquire)
            && self.data.read().rollups.contains_key(&id)
    }

    /// Makes `next` the current catalog.
    fn publish(&self, next: CatalogData) {
        let any = !next.rollups.is_empty();
        self.any_rollups
            .store(any, std::sync::atomic::Ordering::Release);
        *self.data.write() = Arc::new(next);
    }

    /// Applies `change` to a copy, persists it, then publishes it. The change returns a value
    /// for the caller; when it fails nothing is written.
    pub(crate) fn change<T>(
        &self,
        change: impl FnOnce(&mut CatalogData) -> Result<T>,
    ) -> Result<T> {
        let _guard = self.write.lock();
        let mut next = (*self.snapshot()).clone();
        let out = change(&mut next)?;
        next.version += 1;
        if let Some(log) = self.log.get() {
            log.commit(&next)?;
            return Ok(out);
        }
        write_atomic(
            &self.path,
            &serde_json::to_vec_pretty(&next).expect("serialisable"),
        )?;
        self.publish(next);
        Ok(out)
    }

    /// From now on, changes are committed through `log` (a cluster's metadata group).
    pub(crate) fn replicate_through(&self, log: Arc<dyn CatalogLog>) {
        let _ = self.log.set(log);
    }

    /// Installs a change committed at `raft_index` of the metadata group (on every node, in
    /// log order). `Ok(false)`: it was installed before (the log is being replayed). A
    /// change made from an older version than the current one (another node changed the
    /// catalog meanwhile) is refused, on every node alike.
    pub(crate) fn install(&self, raft_index: u64, next: &[u8]) -> Result<bool> {
        let next: CatalogData = serde_json::from_slice(next).map_err(|e| Error::Corrupt {
            what: "catalog change from the metadata group".into(),
            reason: e.to_string(),
        })?;
        let cur = self.snapshot();
        if raft_index <= cur.raft_index {
            return Ok(false);
        }
        if next.version != cur.version + 1 {
            return Err(Error::invalid(format!(
                "the catalog changed on another node meanwhile (version {} is now {}); \
                 run the statement again",
                next.version - 1,
                cur.version
            )));
        }
        self.replace(raft_index, next)
    }

    /// Replaces the catalog with `next` (the metadata group's snapshot at `raft_index`),
    /// whatever its version; `Ok(false)`: this node has it already.
    pub(crate) fn replace(&self, raft_index: u64, mut next: CatalogData) -> Result<bool> {
        if raft_index <= self.snapshot().raft_index {
            return Ok(false);
        }
        next.raft_index = raft_index;
        write_atomic(
            &self.path,
            &serde_json::to_vec_pretty(&next).expect("serialisable"),
        )?;
        self.publish(next);
        Ok(true)
    }

    /// Allocates a table id inside a change.
    pub(crate) fn allocate_id(data: &mut CatalogData) -> u64 {
        let id = data.next_table_id;
        data.next_table_id += 1;
        id
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old or the new content, never a mix.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::store::files::replace_file(path, bytes).map_err(|e| Error::io(path, e))
}

/// fsyncs a directory so a rename or a new file in it survives a power cut.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists_and_versions() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::open(dir.path()).unwrap();
        let v0 = cat.snapshot().version;
        cat.change(|d| {
            d.databases.insert("iot".into(), BTreeMap::new());
            Ok(())
        })
        .unwrap();
        assert_eq!(cat.snapshot().version, v0 + 1);
        let again = Catalog::open(dir.path()).unwrap();
        assert!(again.snapshot().databases.contains_key("iot"));
        assert!(again.snapshot().databases.contains_key(DEFAULT_DATABASE));
        // A failed change writes nothing.
        let r: Result<()> = cat.change(|d| {
            d.databases.clear();
            Err(Error::invalid("no"))
        });
        assert!(r.is_err());
        assert!(
            Catalog::open(dir.path())
                .unwrap()
                .snapshot()
                .databases
                .contains_key("iot")
        );
    }
}

//! Rollups kept by the engine ([`crate::store::rollup`]): made by `CREATE ROLLUP` (with the
//! partial rows of the source's files already persisted), extended by every flush of the
//! source, folded again by compaction, dropped by `DROP ROLLUP`.

use super::Engine;
use super::maintenance::blocking;
use crate::error::{Error, Result};
use crate::query::ddl::{RollupSpec, TableRef};
use crate::store::buffer::widen;
use crate::store::catalog::{Catalog, TableDef};
use crate::store::partition::PartitionFn;
use crate::store::rollup::{Fold, RollupDef};
use crate::store::state::TableState;
use crate::store::storage::{FileMeta, Manifest, Storage};
use datafusion::arrow::record_batch::RecordBatch;
use std::sync::Arc;

/// A rollup's file written for rows of its source, not yet in the manifest.
pub(crate) struct RolledUp {
    pub table: Arc<TableState>,
    pub key: u64,
    pub file: FileMeta,
}

impl Engine {
    /// Writes, for each rollup of `source`, the partial rows of `batches` (rows of
    /// `source`) as its files; the caller commits them with the source's change. Returns
    /// the rollups folded (some may have no file: no rows had a time) and the files.
    pub(crate) async fn roll_up(
        &self,
        source: &TableState,
        batches: &[RecordBatch],
        stem: &str,
    ) -> Result<(Vec<u64>, Vec<RolledUp>)> {
        let cat = self.store.catalog.snapshot();
        let rollups = cat.rollups_of(source.def().id);
        let mut out = Vec::new();
        for &(id, def) in &rollups {
            let Some(table) = self.store.tables.get(id) else {
                continue;
            };
            let parts = fold_raw(def.clone(), source, table.def(), batches.to_vec()).await?;
            for (key, batch) in parts {
                let file = self.write_file(&table, key, stem, vec![batch]).await?;
                out.push(RolledUp {
                    table: table.clone(),
                    key,
                    file,
                });
            }
        }
        Ok((rollups.iter().map(|(id, _)| *id).collect(), out))
    }

    /// `CREATE ROLLUP`: the rollup table, with the partial rows of the source's files (its
    /// rows in memory are folded by queries until they are flushed, and then by the flush).
    /// Made under the manifest lock, so no flush moves rows between the two meanwhile.
    pub(crate) async fn create_rollup(&self, spec: RollupSpec) -> Result<()> {
        crate::query::statements::valid_name("rollup", &spec.name.table)?;
        // In a cluster the catalog change waits for the metadata group, whose apply takes
        // the manifest lock: not held there (and nothing is backfilled, see below).
        let mut m = match self.clustered() {
            true => None,
            false => Some(self.manifest.lock().await),
        };
        let cat = self.store.catalog.snapshot();
        // Named as queries name it: `readings` finds `fleet.readings` when only one
        // database has a table of that name.
        let (db, table) = (&spec.source.database, &spec.source.table);
        let src = match crate::query::provider::resolve(&cat, db, table) {
            Some(def) => def.clone(),
            None => cat.table(db, table)?.clone(),
        };
        if cat.rollups.contains_key(&src.id) {
            return Err(Error::invalid(format!(
                "{} is a rollup; a rollup reads a table",
                spec.source.table
            )));
        }
        if cat.table(&spec.name.database, &spec.name.table).is_ok() {
            return match spec.if_not_exists {
                true => Ok(()),
                false => Err(Error::AlreadyExists {
                    what: "table",
                    name: format!("{}.{}", spec.name.database, spec.name.table),
                }),
            };
        }
        cat.databases
            .get(&spec.name.database)
            .ok_or_else(|| Error::UnknownDatabase {
                database: spec.name.database.clone(),
            })?;
        let def = RollupDef {
            source: src.id,
            ..spec.def
        };
        let columns = def.stored_columns(&src)?;
        let mut seen = std::collections::HashSet::new();
        for c in &columns {
            crate::query::statements::valid_name("column", &c.name)?;
            if !seen.insert(c.name.to_ascii_lowercase()) {
                return Err(Error::invalid(format!(
                    "the rollup has two columns named '{}'",
                    c.name
                )));
            }
        }
        let id = self.store.catalog.change(|d| Ok(Catalog::allocate_id(d)))?;
        let rdef = Arc::new(TableDef {
            id,
            database: spec.name.database.clone(),
            name: spec.name.table.clone(),
            columns,
            partition: PartitionFn::Yyyymmdd { days: 1 },
            partition_column: 0,
            ttl_secs: spec.ttl_secs,
            options: Default::default(),
        });
        let table = Arc::new(TableState::new(rdef.clone()));
        let source = self
            .store
            .tables
            .get(src.id)
            .ok_or_else(|| Error::invalid("the source table has no state"))?;
        let written = match &m {
            Some(_) => self.backfill(&source, &def, &table).await?,
            // Shard leaders elsewhere persist rows without this node's lock: from the
            // rollup's catalog change on, each of their flushes must fold its rows into it
            // (the metadata group refuses one that does not), but files persisted before
            // are not folded here.
            None if source.parts.read().values().any(|p| !p.files.is_empty()) => {
                return Err(Error::invalid(format!(
                    "on a cluster a rollup is made before its table has files; {} has some (make the rollup on a new table, or on a single node)",
                    spec.source.table
                )));
            }
            None => Vec::new(),
        };
        let made =
            (self.register_rollup(m.as_deref_mut(), &spec.name, &table, def, &written)).await;
        if made.is_err() {
            self.store.tables.remove(id);
            let paths = written.iter().map(|(_, f)| f.path.clone()).collect();
            self.retire(paths);
        }
        made
    }

    /// The partial rows of every file `source` has now, as files of the rollup `table`.
    async fn backfill(
        &self,
        source: &TableState,
        def: &RollupDef,
        table: &Arc<TableState>,
    ) -> Result<Vec<(u64, FileMeta)>> {
        let by_part: Vec<(u64, Vec<FileMeta>)> = (source.parts.read().iter())
            .filter(|(_, p)| !p.files.is_empty())
            .map(|(k, p)| (*k, p.files.clone()))
            .collect();
        let mut written = Vec::new();
        // One source partition at a time: memory is bounded by a partition's groups.
        for (key, files) in by_part {
            let mut batches = Vec::new();
            for f in files {
                match self.store.hot.get(&f.path) {
                    Some(chunks) => batches.extend(chunks.into_iter().map(|c| c.batch)),
                    None => {
                        let bytes = self.store.storage.get(&f.path).await?;
                        batches.extend(blocking(move || Storage::decode_parquet(bytes)).await?);
                    }
                }
            }
            let parts = fold_raw(def.clone(), source, table.def(), batches).await?;
            for (rkey, batch) in parts {
                let stem = format!("{key:020}");
                let file = self.write_file(table, rkey, &stem, vec![batch]).await?;
                written.push((rkey, file));
            }
        }
        Ok(written)
    }

    /// Puts the backfilled files in the manifest and the rollup in the catalog.
    async fn register_rollup(
        &self,
        mut m: Option<&mut Manifest>,
        name: &TableRef,
        table: &Arc<TableState>,
        def: RollupDef,
        written: &[(u64, FileMeta)],
    ) -> Result<()> {
        let rdef = table.def();
        let id = rdef.id;
        if let Some(m) = m.as_deref_mut()
            && !written.is_empty()
        {
            self.change_manifest(m, |next| {
                for (key, file) in written {
                    next.partition(id, *key).files.push(file.clone());
                }
            })
            .await?;
        }
        {
            let mut parts = table.parts.write();
            for (key, file) in written {
                table
                    .partition_mut(&mut parts, *key)
                    .files
                    .push(file.clone());
            }
        }
        self.store.tables.by_id.write().insert(id, table.clone());
        let made = self.store.catalog.change(|d| {
            let db = d
                .databases
                .get_mut(&name.database)
                .ok_or_else(|| Error::UnknownDatabase {
                    database: name.database.clone(),
                })?;
            if db.contains_key(&name.table) {
                return Err(Error::AlreadyExists {
                    what: "table",
                    name: format!("{}.{}", name.database, name.table),
                });
            }
            db.insert(name.table.clone(), rdef.clone());
            d.rollups.insert(id, def.clone());
            Ok(())
        });
        if let Some(m) = m
            && made.is_err()
            && !written.is_empty()
        {
            self.change_manifest(m, |next| {
                next.tables.remove(&id);
            })
            .await?;
        }
        made
    }

    /// `DROP ROLLUP`: like `DROP TABLE`, for a rollup only.
    pub(crate) async fn drop_rollup(&self, name: &TableRef, if_exists: bool) -> Result<()> {
        let cat = self.store.catalog.snapshot();
        match cat.table(&name.database, &name.table) {
            Ok(def) if cat.rollups.contains_key(&def.id) => {}
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "{} is a table, not a rollup (DROP TABLE drops it)",
                    name.table
                )));
            }
            Err(_) if if_exists => return Ok(()),
            Err(e) => return Err(e),
        }
        self.drop_table(name, if_exists).await
    }
}

/// Folds raw rows of `source` into partial rows of the rollup `rollup`, off the runtime.
async fn fold_raw(
    def: RollupDef,
    source: &TableState,
    rollup: Arc<TableDef>,
    batches: Vec<RecordBatch>,
) -> Result<Vec<(u64, RecordBatch)>> {
    let (sdef, schema) = (source.def(), source.schema());
    blocking(move || {
        let mut fold = Fold::new(&def, &sdef)?;
        for b in &batches {
            fold.raw(&widen(b, &schema))?;
        }
        fold.finish(&rollup)
    })
    .await
}

/// Folds partial rows of the rollup `rollup` (its files' rows, merged by compaction).
pub(crate) fn fold_partials(
    def: &RollupDef,
    rollup: &TableDef,
    batches: &[RecordBatch],
) -> Result<Vec<RecordBatch>> {
    let mut fold = Fold::of_partials(def, rollup)?;
    for b in batches {
        fold.partial(&widen(b, &rollup.arrow_schema()))?;
    }
    Ok(fold.finish(rollup)?.into_iter().map(|(_, b)| b).collect())
}

//! `system.tables`, `system.partitions`, `system.files`, `system.rollups`,
//! `system.dead_letters` and `system.queries` (`crate::query::log`): the catalog, storage
//! state, refused messages and statements as SQL tables, built fresh for each query;
//! plus tables other layers serve through [`crate::IngestPort::add_system_table`].

use crate::query::provider::mem_table;
use crate::store::Store;
use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BinaryArray, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableProvider;
use datafusion::error::Result as DfResult;
use std::sync::Arc;

const NAMES: [&str; 6] = [
    "tables",
    "partitions",
    "files",
    "rollups",
    "dead_letters",
    "queries",
];

/// The `system` schema.
#[derive(Debug)]
pub(crate) struct SystemSchema {
    /// Engine state.
    pub store: Arc<Store>,
}

/// Column builder for a system table.
#[derive(Default)]
struct Cols {
    fields: Vec<Field>,
    arrays: Vec<ArrayRef>,
}

impl Cols {
    fn str(mut self, name: &str, v: Vec<String>) -> Self {
        self.fields.push(Field::new(name, DataType::Utf8, false));
        self.arrays.push(Arc::new(StringArray::from(v)));
        self
    }
    fn u64(mut self, name: &str, v: Vec<u64>) -> Self {
        self.fields.push(Field::new(name, DataType::UInt64, false));
        self.arrays.push(Arc::new(UInt64Array::from(v)));
        self
    }
    fn opt_u64(mut self, name: &str, v: Vec<Option<u64>>) -> Self {
        self.fields.push(Field::new(name, DataType::UInt64, true));
        self.arrays.push(Arc::new(UInt64Array::from(v)));
        self
    }
    fn time(mut self, name: &str, v: Vec<Option<i64>>) -> Self {
        self.fields.push(Field::new(
            name,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ));
        self.arrays
            .push(Arc::new(TimestampMicrosecondArray::from(v)));
        self
    }
    fn batch(self) -> DfResult<RecordBatch> {
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(self.fields)),
            self.arrays,
        )?)
    }
}

struct PartRow {
    db: String,
    table: String,
    key: u64,
    rows: u64,
    buffered: u64,
    bytes: u64,
    files: Vec<crate::store::storage::FileMeta>,
    range: Option<(i64, i64)>,
}

impl SystemSchema {
    /// Whether `system.<name>` exists (built in, or served by another layer).
    pub(crate) fn has(store: &Store, name: &str) -> bool {
        NAMES.contains(&name) || store.extra_system.read().contains_key(name)
    }

    fn partitions(&self) -> Vec<PartRow> {
        let cat = self.store.catalog.snapshot();
        let mut out = Vec::new();
        for def in cat.tables() {
            let Some(state) = self.store.tables.get(def.id) else {
                continue;
            };
            for (k, p) in state.parts.read().iter() {
                let rows = p.rows();
                if rows == 0 {
                    continue;
                }
                out.push(PartRow {
                    db: def.database.clone(),
                    table: def.name.clone(),
                    key: *k,
                    rows,
                    buffered: p.buffered_rows(),
                    bytes: p.files.iter().map(|f| f.bytes).sum::<u64>() + p.buffered_bytes() as u64,
                    files: p.files.clone(),
                    range: p.time_range(),
                });
            }
        }
        out
    }

    fn build(&self, name: &str) -> DfResult<RecordBatch> {
        if let Some(rows) = self.store.extra_system.read().get(name).cloned() {
            return Ok((rows.0)());
        }
        if name == "queries" {
            let node = self.store.reader().map_or(0, |r| r.me());
            return self.store.queries.table(node);
        }
        let parts = self.partitions();
        match name {
            "tables" => {
                let cat = self.store.catalog.snapshot();
                let defs: Vec<_> = cat.tables().cloned().collect();
                let sum =
                    |id: &crate::store::catalog::TableDef, f: &dyn Fn(&PartRow) -> u64| -> u64 {
                        parts
                            .iter()
                            .filter(|p| p.db == id.database && p.table == id.name)
                            .map(f)
                            .sum()
                    };
                Cols::default()
                    .str(
                        "database_name",
                        defs.iter().map(|d| d.database.clone()).collect(),
                    )
                    .str("table_name", defs.iter().map(|d| d.name.clone()).collect())
                    .u64("table_id", defs.iter().map(|d| d.id).collect())
                    .u64(
                        "columns",
                        defs.iter().map(|d| d.columns.len() as u64).collect(),
                    )
                    .str(
                        "partition_by",
                        defs.iter()
                            .map(|d| d.partition.sql(&d.columns[d.partition_column].name))
                            .collect(),
                    )
                    .opt_u64("ttl_seconds", defs.iter().map(|d| d.ttl_secs).collect())
                    .u64("rows", defs.iter().map(|d| sum(d, &|p| p.rows)).collect())
                    .u64("bytes", defs.iter().map(|d| sum(d, &|p| p.bytes)).collect())
                    .u64("partitions", defs.iter().map(|d| sum(d, &|_| 1)).collect())
                    .u64(
                        "files",
                        defs.iter()
                            .map(|d| sum(d, &|p| p.files.len() as u64))
                            .collect(),
                    )
                    .batch()
            }
            "partitions" => Cols::default()
                .str(
                    "database_name",
                    parts.iter().map(|p| p.db.clone()).collect(),
                )
                .str(
                    "table_name",
                    parts.iter().map(|p| p.table.clone()).collect(),
                )
                .u64("partition", parts.iter().map(|p| p.key).collect())
                .u64("rows", parts.iter().map(|p| p.rows).collect())
                .u64("buffered_rows", parts.iter().map(|p| p.buffered).collect())
                .u64("bytes", parts.iter().map(|p| p.bytes).collect())
                .u64(
                    "files",
                    parts.iter().map(|p| p.files.len() as u64).collect(),
                )
                .time(
                    "min_time",
                    parts.iter().map(|p| p.range.map(|r| r.0)).collect(),
                )
                .time(
                    "max_time",
                    parts.iter().map(|p| p.range.map(|r| r.1)).collect(),
                )
                .batch(),
            "rollups" => {
                let cat = self.store.catalog.snapshot();
                let rollups: Vec<_> = (cat.tables())
                    .filter_map(|t| Some((t, cat.rollups.get(&t.id)?)))
                    .collect();
                let source = |id: u64| cat.tables().find(|t| t.id == id).map(|t| t.name.clone());
                let of = |t: &crate::store::catalog::TableDef, f: &dyn Fn(&PartRow) -> u64| {
                    (parts.iter())
                        .filter(|p| p.db == t.database && p.table == t.name)
                        .map(f)
                        .sum::<u64>()
                };
                let aggs = |r: &crate::store::rollup::RollupDef| {
                    let each = r.aggregates.iter().map(|a| {
                        let arg = a.column.as_deref().unwrap_or("*");
                        format!("{}({arg}) AS {}", a.func.name(), a.name)
                    });
                    each.collect::<Vec<_>>().join(", ")
                };
                Cols::default()
                    .str(
                        "database_name",
                        rollups.iter().map(|(t, _)| t.database.clone()).collect(),
                    )
                    .str(
                        "rollup_name",
                        rollups.iter().map(|(t, _)| t.name.clone()).collect(),
                    )
                    .str(
                        "source_table",
                        rollups
                            .iter()
                            .map(|(_, r)| source(r.source).unwrap_or_default())
                            .collect(),
                    )
                    .u64(
                        "bucket_seconds",
                        rollups
                            .iter()
                            .map(|(_, r)| (r.stride_micros / 1_000_000) as u64)
                            .collect(),
                    )
                    .str(
                        "keys",
                        rollups.iter().map(|(_, r)| r.keys.join(", ")).collect(),
                    )
                    .str("aggregates", rollups.iter().map(|(_, r)| aggs(r)).collect())
                    .opt_u64(
                        "ttl_seconds",
                        rollups.iter().map(|(t, _)| t.ttl_secs).collect(),
                    )
                    .u64(
                        "stored_rows",
                        rollups.iter().map(|(t, _)| of(t, &|p| p.rows)).collect(),
                    )
                    .u64(
                        "files",
                        rollups
                            .iter()
                            .map(|(t, _)| of(t, &|p| p.files.len() as u64))
                            .collect(),
                    )
                    .str(
                        "query",
                        rollups.iter().map(|(_, r)| r.sql.clone()).collect(),
                    )
                    .batch()
            }
            "dead_letters" => {
                let letters = self.store.dead_letters.snapshot();
                let text = |p: &[u8]| std::str::from_utf8(p).ok().map(str::to_string);
                let mut cols = Cols::default()
                    .time(
                        "time",
                        letters.iter().map(|l| Some(l.time_micros)).collect(),
                    )
                    .str(
                        "client_id",
                        letters.iter().map(|l| l.client_id.clone()).collect(),
                    )
                    .str("topic", letters.iter().map(|l| l.topic.clone()).collect());
                cols.fields
                    .push(Field::new("payload", DataType::Binary, false));
                cols.arrays.push(Arc::new(BinaryArray::from_iter_values(
                    letters.iter().map(|l| l.payload.as_slice()),
                )));
                cols.fields
                    .push(Field::new("payload_text", DataType::Utf8, true));
                cols.arrays.push(Arc::new(StringArray::from(
                    letters.iter().map(|l| text(&l.payload)).collect::<Vec<_>>(),
                )));
                cols.str("reason", letters.iter().map(|l| l.reason.clone()).collect())
                    .u64(
                        "reason_code",
                        letters.iter().map(|l| u64::from(l.reason_code)).collect(),
                    )
                    .batch()
            }
            _ => {
                let files: Vec<_> = parts
                    .iter()
                    .flat_map(|p| p.files.iter().map(move |f| (p, f)))
                    .collect();
                Cols::default()
                    .str(
                        "database_name",
                        files.iter().map(|(p, _)| p.db.clone()).collect(),
                    )
                    .str(
                        "table_name",
                        files.iter().map(|(p, _)| p.table.clone()).collect(),
                    )
                    .u64("partition", files.iter().map(|(p, _)| p.key).collect())
                    .str("path", files.iter().map(|(_, f)| f.path.clone()).collect())
                    .u64("rows", files.iter().map(|(_, f)| f.rows).collect())
                    .u64("bytes", files.iter().map(|(_, f)| f.bytes).collect())
                    .time("min_time", files.iter().map(|(_, f)| f.min_time).collect())
                    .time("max_time", files.iter().map(|(_, f)| f.max_time).collect())
                    .batch()
            }
        }
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
        names.extend(self.store.extra_system.read().keys().cloned());
        names
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if !Self::has(&self.store, name) {
            return Ok(None);
        }
        Ok(Some(mem_table(self.build(name)?)?))
    }

    fn table_exist(&self, name: &str) -> bool {
        Self::has(&self.store, name)
    }
}

//! The last-value cache: per table, the newest row of each key (a device), kept as rows are
//! applied, so that "the latest reading of every device" is answered without a scan
//! ([`crate::query::latest`]).
//!
//! - **Key**: the columns named by the table option `last_value_key` (comma-separated;
//!   `'none'`: no cache), or else the table's first text column; a table with neither keeps
//!   no cache.
//! - **Newest**: the row with the greatest time (the table's time column); a row without
//!   a time counts as newest, as `ORDER BY ts DESC` (NULLS FIRST) puts it first. Rows
//!   arriving late or out of order replace a row only when newer, so the cache is a maximum
//!   over every row applied, whatever their order; among rows of equal time, any one (as a
//!   query's tie).
//! - **Complete**: rows applied are only part of the table after a start (replay skips what
//!   files hold). The first query that needs the cache then runs on the rows, and fills it
//!   from the whole table in the background ([`Latest::fill`]); rows applied meanwhile are
//!   kept too, and the maximum of both is exact.
//! - **Forgotten** when rows leave the table (a partition expired or replaced by a metadata
//!   snapshot): a key's newest row may be gone, so the cache starts over (incomplete).
//! - **Bounded**: beyond [`MAX_KEYS`] keys the table keeps no cache (queries scan).

use crate::store::buffer::PartitionBuffer;
use crate::store::catalog::TableDef;
use crate::types::{ColumnType, Value};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use parking_lot::Mutex;
use std::collections::HashMap;

/// The table option naming the key columns.
pub(crate) const LAST_VALUE_KEY: &str = "last_value_key";

/// Keys a table's cache holds at most.
pub(crate) const MAX_KEYS: usize = 1_000_000;

/// The state of a table's cache (see the module docs).
#[derive(Debug, Default)]
pub struct Latest {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The key columns and the time column; `None`: the table keeps no cache.
    shape: Option<(Vec<usize>, usize)>,
    /// Encoded key -> its slot in `rows`.
    index: HashMap<Box<[u8]>, usize>,
    /// Per key: (time, row); a row without a time has `i64::MAX`.
    rows: Vec<(i64, Vec<Value>)>,
    /// Every row of the table was seen (a fill finished since the last start or forget).
    complete: bool,
    /// A fill runs.
    filling: bool,
    /// Bumped by [`Latest::forget`]: a fill that began before does not count.
    generation: u64,
    /// Too many keys: no cache until forgotten.
    overflow: bool,
    scratch: Vec<u8>,
    /// The rows as a batch, row `i` slot `i`, as they were when it was made...
    built: Option<RecordBatch>,
    /// ... and the slots changed since (new slots are those past the batch's rows).
    changed: Vec<usize>,
    is_changed: Vec<bool>,
}

/// The key and time columns of `def`'s cache, if it keeps one.
pub(crate) fn shape(def: &TableDef) -> Option<(Vec<usize>, usize)> {
    key_columns(def).ok().flatten()
}

/// The key and time columns of `def`'s cache (`None`: it keeps none: no time column, no
/// text column to default to, or `last_value_key = 'none'`); an error names a declared key
/// that is not a column of a key type (text, integer, boolean).
pub(crate) fn key_columns(def: &TableDef) -> Result<Option<(Vec<usize>, usize)>, String> {
    let declared = def.options.get(LAST_VALUE_KEY).map(|s| s.trim());
    if declared.is_some_and(|d| d.is_empty() || d.eq_ignore_ascii_case("none")) {
        return Ok(None);
    }
    let Some(time) = def.time_column() else {
        return match declared {
            Some(_) => Err(format!("{LAST_VALUE_KEY}: the table has no time column")),
            None => Ok(None),
        };
    };
    let keyable = |i: usize| {
        use ColumnType::*;
        let ty = def.columns[i].ty;
        let keyable_type = matches!(
            ty,
            String | Bool | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64
        );
        i != time && keyable_type
    };
    let Some(names) = declared else {
        let first = (def.columns.iter()).position(|c| c.ty == ColumnType::String);
        return Ok(first.map(|k| (vec![k], time)));
    };
    let mut keys = Vec::new();
    for name in names.split(',').map(str::trim) {
        match def.column_index(name) {
            Some(i) if keyable(i) && !keys.contains(&i) => keys.push(i),
            Some(_) => {
                return Err(format!(
                    "{LAST_VALUE_KEY}: {name:?} is the time column, repeated, or not text, an integer or a boolean"
                ));
            }
            None => return Err(format!("{LAST_VALUE_KEY}: no column {name:?}")),
        }
    }
    Ok(Some((keys, time)))
}

fn encode(out: &mut Vec<u8>, row: &[Value], keys: &[usize]) {
    out.clear();
    for k in keys {
        match row.get(*k).unwrap_or(&Value::Null) {
            Value::Str(s) => {
                out.push(1);
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            Value::Int(i) => {
                out.push(2);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Value::UInt(u) => {
                out.push(3);
                out.extend_from_slice(&u.to_le_bytes());
            }
            Value::Bool(b) => out.extend_from_slice(&[4, u8::from(*b)]),
            _ => out.push(0),
        }
    }
}

impl Inner {
    fn clear(&mut self) {
        self.index.clear();
        self.rows.clear();
        self.built = None;
        self.changed.clear();
        self.is_changed.clear();
        self.complete = false;
        self.generation += 1;
    }

    fn touch(&mut self, slot: usize) {
        if self.built.as_ref().is_some_and(|b| slot < b.num_rows()) && !self.is_changed[slot] {
            self.is_changed[slot] = true;
            self.changed.push(slot);
        }
    }

    /// The rows as a batch of `schema`: the last one made, with the rows changed since
    /// replaced and the new ones added.
    fn build(&mut self, schema: &SchemaRef, types: &[ColumnType]) -> RecordBatch {
        let fresh = |rows: &mut dyn Iterator<Item = &Vec<Value>>| {
            let mut buffer = PartitionBuffer::new(schema.clone(), types);
            for row in rows {
                buffer.push(1, row, None);
            }
            datafusion::arrow::compute::concat_batches(schema, &buffer.snapshot(schema))
                .expect("batches of one schema")
        };
        let batch = match self.built.take().filter(|b| b.schema() == *schema) {
            None => fresh(&mut self.rows.iter().map(|r| &r.1)),
            Some(old) if self.changed.is_empty() && old.num_rows() == self.rows.len() => old,
            Some(old) => {
                let n = old.num_rows();
                let added = self.changed.iter().copied().chain(n..self.rows.len());
                let slots: Vec<usize> = added.collect();
                let new = fresh(&mut slots.iter().map(|s| &self.rows[*s].1));
                let mut at: Vec<(usize, usize)> = (0..self.rows.len()).map(|i| (0, i)).collect();
                for (j, s) in slots.iter().enumerate() {
                    at[*s] = (1, j);
                }
                let columns = (0..schema.fields().len())
                    .map(|c| {
                        let parts = [old.column(c).as_ref(), new.column(c).as_ref()];
                        datafusion::arrow::compute::interleave(&parts, &at)
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .expect("columns of one type");
                RecordBatch::try_new(schema.clone(), columns).expect("columns of the schema")
            }
        };
        for s in self.changed.drain(..) {
            self.is_changed[s] = false;
        }
        self.is_changed.resize(batch.num_rows(), false);
        self.built = Some(batch.clone());
        batch
    }

    fn observe(&mut self, row: &[Value]) {
        let Some((keys, time)) = &self.shape else {
            return;
        };
        if self.overflow {
            return;
        }
        let t = row
            .get(*time)
            .and_then(Value::as_micros)
            .unwrap_or(i64::MAX);
        let mut key = std::mem::take(&mut self.scratch);
        encode(&mut key, row, keys);
        let full = self.rows.len() >= MAX_KEYS;
        match self.index.get(key.as_slice()) {
            Some(&slot) => {
                let (at, kept) = &mut self.rows[slot];
                if t >= *at {
                    *at = t;
                    kept.clone_from_slice_or_vec(row);
                    self.touch(slot);
                }
            }
            None if full => {
                self.overflow = true;
                self.index = HashMap::new();
                self.rows = Vec::new();
                self.built = None;
                tracing::warn!(
                    keys = MAX_KEYS,
                    "a table's last-value cache has too many keys; latest-row queries scan"
                );
            }
            None => {
                self.index.insert(key.as_slice().into(), self.rows.len());
                self.rows.push((t, row.to_vec()));
            }
        }
        self.scratch = key;
    }
}

/// Replaces a row's values, reusing its allocations when the lengths match.
trait CloneInto {
    fn clone_from_slice_or_vec(&mut self, row: &[Value]);
}

impl CloneInto for Vec<Value> {
    fn clone_from_slice_or_vec(&mut self, row: &[Value]) {
        if self.len() != row.len() {
            *self = row.to_vec();
            return;
        }
        for (kept, new) in self.iter_mut().zip(row) {
            match (kept, new) {
                // A device's key, the same text message after message: into the kept
                // buffer, not a new one.
                (Value::Str(kept), Value::Str(new)) => kept.clone_from(new),
                (kept, new) => *kept = new.clone(),
            }
        }
    }
}

impl Latest {
    /// The cache of a table defined by `def`.
    pub fn new(def: &TableDef) -> Self {
        let latest = Self::default();
        latest.inner.lock().shape = shape(def);
        latest
    }

    /// The table's definition changed: a cache of another shape starts over.
    pub fn redefine(&self, def: &TableDef) {
        let shape = shape(def);
        let mut inner = self.inner.lock();
        if inner.shape != shape {
            inner.shape = shape;
            inner.clear();
        }
    }

    /// Rows applied to the table.
    pub fn observe<'a>(&self, rows: impl Iterator<Item = &'a [Value]>) {
        let mut inner = self.inner.lock();
        if inner.shape.is_none() {
            return;
        }
        for row in rows {
            inner.observe(row);
        }
    }

    /// Rows left the table: the cache starts over.
    pub fn forget(&self) {
        let mut inner = self.inner.lock();
        inner.clear();
        inner.overflow = false;
    }

    /// The key and time columns, when the table keeps a cache.
    pub fn shape(&self) -> Option<(Vec<usize>, usize)> {
        self.inner.lock().shape.clone()
    }

    /// The rows as a batch of `schema` (the table's, of column types `types`), when the
    /// cache is complete; else an error, with the generation to fill for
    /// ([`Latest::filled`]) for the first caller to find it incomplete.
    pub fn snapshot(
        &self,
        schema: &SchemaRef,
        types: &[ColumnType],
    ) -> Result<RecordBatch, Option<u64>> {
        let mut inner = self.inner.lock();
        if inner.shape.is_none() || inner.overflow {
            return Err(None);
        }
        if !inner.complete {
            let start = !inner.filling;
            inner.filling = true;
            return Err(start.then_some(inner.generation));
        }
        Ok(inner.build(schema, types))
    }

    /// A fill begun at `generation` found these rows (the newest of each key in the whole
    /// table), or failed (`None`): complete unless forgotten meanwhile.
    pub fn filled(&self, generation: u64, rows: Option<Vec<Vec<Value>>>) {
        let mut inner = self.inner.lock();
        inner.filling = false;
        let Some(rows) = rows else {
            return;
        };
        if inner.generation != generation {
            return;
        }
        for row in &rows {
            inner.observe(row);
        }
        inner.complete = !inner.overflow;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::decode::testutil::table_of;
    use crate::types::ColumnType as T;
    use datafusion::arrow::util::pretty::pretty_format_batches;

    fn sorted(b: &RecordBatch) -> Vec<String> {
        let text = pretty_format_batches(std::slice::from_ref(b))
            .unwrap()
            .to_string();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    }

    /// A kept row takes a new row's values whatever their types, in place or not.
    #[test]
    fn kept_rows_take_new_values() {
        let mut kept = vec![Value::Str("abc".into()), Value::Int(1), Value::Null];
        let new = [
            Value::Str("a longer text".into()),
            Value::Str("x".into()),
            Value::Int(2),
        ];
        kept.clone_from_slice_or_vec(&new);
        assert_eq!(kept, new);
        kept.clone_from_slice_or_vec(&new[..1]);
        assert_eq!(kept, new[..1]);
    }

    /// The newest row per key whatever the order rows come in; a batch made again after
    /// changes (replacing changed rows, adding new keys) equals one made from scratch.
    #[test]
    fn newest_per_key_in_any_order() {
        let def = table_of(
            1,
            &[
                ("ts", T::Timestamp, false),
                ("device", T::String, false),
                ("v", T::Int64, true),
            ],
        );
        let schema = def.arrow_schema();
        let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
        let row = |t: i64, d: &str, v: i64| {
            vec![Value::Timestamp(t), Value::Str(d.into()), Value::Int(v)]
        };
        let latest = Latest::new(&def);
        let mut rows = vec![
            row(5, "a", 1),
            row(3, "b", 2),
            row(1, "a", 3),
            row(9, "c", 4),
        ];
        latest.observe(rows.iter().map(Vec::as_slice));
        // Not complete until filled: the first caller fills.
        assert_eq!(latest.snapshot(&schema, &types).unwrap_err(), Some(0));
        assert_eq!(latest.snapshot(&schema, &types).unwrap_err(), None);
        latest.filled(0, Some(vec![row(7, "b", 5), row(2, "c", 6)]));
        let first = latest.snapshot(&schema, &types).unwrap();
        assert_eq!(first.num_rows(), 3);
        // Late (ignored), newer (replacing) and new rows, then an incremental batch.
        let more = vec![
            row(4, "a", 7),
            row(8, "b", 8),
            row(1, "d", 9),
            row(9, "c", 10),
        ];
        latest.observe(more.iter().map(Vec::as_slice));
        let incremental = latest.snapshot(&schema, &types).unwrap();
        rows.extend(more);
        let fresh = Latest::new(&def);
        fresh.observe(rows.iter().map(Vec::as_slice));
        fresh.filled(
            fresh.snapshot(&schema, &types).unwrap_err().unwrap(),
            Some(vec![row(7, "b", 5), row(2, "c", 6)]),
        );
        let want = fresh.snapshot(&schema, &types).unwrap();
        assert_eq!(sorted(&incremental), sorted(&want));
        let text = sorted(&want).join("\n");
        for newest in [
            "| a      | 1  |",
            "| b      | 8  |",
            "| c      | 10 |",
            "| d      | 9  |",
        ] {
            assert!(text.contains(newest), "{newest} in\n{text}");
        }
        // Forgotten: incomplete again, and a fill begun before does not complete it.
        let generation = latest.snapshot(&schema, &types).map(|_| 0);
        assert!(generation.is_ok());
        latest.forget();
        let g = latest.snapshot(&schema, &types).unwrap_err().unwrap();
        latest.filled(g - 1, Some(Vec::new()));
        assert!(latest.snapshot(&schema, &types).is_err());
    }
}

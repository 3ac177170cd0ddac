//! Chunks: immutable slices of a table's in-memory rows (a buffer's sealed chunk, a slice of
//! a hot-cache file) with an index built on first use, so that the queries run most often on
//! recent data, one device's readings (`device = 'd-17'`) or the last seconds
//! (`ts > now() - INTERVAL '30 seconds'`), read only the rows they need instead of filtering
//! every buffered row.
//!
//! For each string column a chunk keeps, once a query asks, where each value occurs (when
//! the column has few distinct values: tags such as device, site or sensor kind; an id column
//! is not indexed); for each timestamp column its range. A scan then skips the chunks that
//! cannot match and takes only the matching rows of the others. The filters stay on the
//! rows too (pushdown is inexact), so an index only ever removes rows that could not match.

use crate::query::groups::{Answer, GroupKey, Groups};
use crate::query::synopsis::{ColumnSynopsis, Num};
use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::array::{BooleanArray, PrimitiveArray};
use datafusion::arrow::compute::{interleave_record_batch, take};
use datafusion::arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};
use datafusion::logical_expr::Operator;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

/// A column is indexed only while it has at most one distinct value per this many rows (and
/// at least [`MIN_DISTINCT`] are allowed): beyond that a lookup saves little and the index
/// costs more than it gives.
const ROWS_PER_VALUE: usize = 8;
/// Distinct values always allowed, whatever the chunk's size.
const MIN_DISTINCT: usize = 1024;
/// Values per chunk whose synopses are kept once asked for (see [`Chunk::per_value`]).
const KEPT_VALUES: usize = 1024;
/// Filters with number comparisons per chunk whose synopses are kept once asked for.
const KEPT_FILTERS: usize = 64;

/// Where each value of a string column occurs in a chunk (row positions, ascending).
#[derive(Debug)]
struct ValueIndex(HashMap<Box<str>, Vec<u32>>);

impl ValueIndex {
    /// The index of `array`, or `None` when it is not a string column or has too many
    /// distinct values.
    fn build(array: &ArrayRef) -> Option<Self> {
        if array.data_type() != &DataType::Utf8 {
            return None;
        }
        let strings = array.as_string::<i32>();
        let limit = MIN_DISTINCT.max(strings.len() / ROWS_PER_VALUE);
        let mut map: HashMap<&str, Vec<u32>> = HashMap::new();
        for (i, v) in strings.iter().enumerate() {
            let Some(v) = v else { continue };
            let distinct = map.len();
            match map.entry(v) {
                std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().push(i as u32),
                std::collections::hash_map::Entry::Vacant(_) if distinct >= limit => return None,
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(vec![i as u32]);
                }
            }
        }
        Some(Self(
            map.into_iter()
                .map(|(k, rows)| (Box::from(k), rows))
                .collect(),
        ))
    }

    /// Positions of rows holding any of `values`, ascending.
    fn rows(&self, values: &[String]) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for v in values {
            if let Some(rows) = self.0.get(v.as_str()) {
                out.extend_from_slice(rows);
            }
        }
        if values.len() > 1 {
            out.sort_unstable();
            out.dedup();
        }
        out
    }
}

/// What is known of one column of a chunk, computed on first use.
#[derive(Debug, Default)]
struct ColumnIndex {
    values: OnceLock<Option<ValueIndex>>,
    range: OnceLock<Option<(i64, i64)>>,
    synopsis: OnceLock<ColumnSynopsis>,
    /// For an indexed string column: (value, other column) -> that column's synopsis over
    /// the rows holding the value.
    per_value: parking_lot::Mutex<HashMap<Box<str>, HashMap<usize, ColumnSynopsis>>>,
}

/// Rows a filter admits, and the synopses of the columns asked over them (by column).
type Filtered = (u64, HashMap<usize, ColumnSynopsis>);

/// What is known of a sealed chunk, computed on first use.
#[derive(Debug, Default)]
struct ChunkIndex {
    columns: Vec<ColumnIndex>,
    /// Filters with number comparisons (their text) -> rows they admit, and the synopses of
    /// the columns asked over those rows: an alert asking `temp > 90` every second sums a
    /// chunk's matching rows once.
    filtered: parking_lot::Mutex<HashMap<String, Filtered>>,
    /// The same for `GROUP BY` answers: filter, grouping and columns (their text) -> the
    /// groups of the rows it admits ([`Groups::by`]).
    filtered_groups: parking_lot::Mutex<HashMap<String, Vec<crate::query::groups::Group>>>,
    /// Group synopses over the chunk's few-valued columns ([`Groups::of`]).
    groups: OnceLock<Option<Groups>>,
}

/// Rows kept in memory, immutable, with their index.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The rows.
    pub batch: RecordBatch,
    /// Built column by column as queries ask; `None` for rows still changing (a buffer's
    /// unsealed tail), which are always read whole.
    index: Option<Arc<ChunkIndex>>,
}

impl Chunk {
    /// Rows that will not change: indexed on demand.
    pub fn sealed(batch: RecordBatch) -> Self {
        let columns = (0..batch.num_columns())
            .map(|_| ColumnIndex::default())
            .collect();
        Self {
            batch,
            index: Some(Arc::new(ChunkIndex {
                columns,
                ..Default::default()
            })),
        }
    }

    /// Rows read whole, never indexed.
    pub fn plain(batch: RecordBatch) -> Self {
        Self { batch, index: None }
    }

    /// The same rows with `batch`'s columns (a chunk widened or narrowed to a query's
    /// schema: columns keep their positions, so the index still holds).
    pub fn with_batch(&self, batch: RecordBatch) -> Self {
        Self {
            batch,
            index: self.index.clone(),
        }
    }

    fn column(&self, col: usize) -> Option<(&ColumnIndex, &ArrayRef)> {
        let index = self.index.as_ref()?.columns.get(col)?;
        Some((index, self.batch.columns().get(col)?))
    }

    /// Range of a microsecond timestamp column (`None` if not one, or all NULL): kept for a
    /// sealed chunk, computed each time for rows still changing.
    fn range(&self, col: usize) -> Option<(i64, i64)> {
        let of = |array: &ArrayRef| {
            let DataType::Timestamp(TimeUnit::Microsecond, _) = array.data_type() else {
                return None;
            };
            let ts = array.as_primitive::<TimestampMicrosecondType>();
            let lo = datafusion::arrow::compute::min(ts)?;
            let hi = datafusion::arrow::compute::max(ts)?;
            Some((lo, hi))
        };
        match self.column(col) {
            Some((index, array)) => *index.range.get_or_init(|| of(array)),
            None => of(self.batch.columns().get(col)?),
        }
    }

    /// Column `col` when it is a microsecond timestamp column.
    fn timestamps(&self, col: usize) -> Option<&PrimitiveArray<TimestampMicrosecondType>> {
        let array = self.batch.columns().get(col)?;
        let DataType::Timestamp(TimeUnit::Microsecond, _) = array.data_type() else {
            return None;
        };
        Some(array.as_primitive::<TimestampMicrosecondType>())
    }

    /// The synopsis of column `col` (kept for a sealed chunk).
    pub fn synopsis(&self, col: usize) -> ColumnSynopsis {
        match self.column(col) {
            Some((index, array)) => index
                .synopsis
                .get_or_init(|| ColumnSynopsis::of(array))
                .clone(),
            None => self
                .batch
                .columns()
                .get(col)
                .map(ColumnSynopsis::of)
                .unwrap_or_default(),
        }
    }

    /// Row count and the synopses of `columns` over the rows `filter` admits. A chunk wholly
    /// inside its time bounds and filtered by one indexed string column is answered from
    /// synopses kept per value (one device's readings: computed once per chunk); one wholly
    /// outside gives nothing; a number comparison that the synopsis shows every row (or no
    /// row) meets is decided for the whole chunk; otherwise the matching rows are taken and
    /// summarized, and for a sealed chunk wholly inside its time bounds, the answer to a
    /// filter with number comparisons is kept. `None` when a bound is on a column that is
    /// not a microsecond timestamp, an equality on one that is not a string, or a
    /// comparison between a column and a number of another kind (see [`comparable`]).
    pub fn synopsis_where(
        &self,
        columns: &[usize],
        filter: &RowFilter,
    ) -> Option<(u64, Vec<ColumnSynopsis>)> {
        let none = || (0, vec![ColumnSynopsis::default(); columns.len()]);
        let mut mask: Option<BooleanArray> = None;
        for &(col, lo, hi) in &filter.time {
            let ts = self.timestamps(col)?;
            let Some((min, max)) = self.range(col) else {
                // Every time NULL: no row compares true.
                return Some(none());
            };
            if max < lo || min > hi {
                return Some(none());
            }
            if lo <= min && max <= hi && ts.null_count() == 0 {
                continue;
            }
            and_into(&mut mask, within(ts, lo, hi));
        }
        // Number comparisons the synopsis (of the rows one indexed equality picks) decides
        // for every row are left out; the others are checked row by row below.
        let mut compare = Vec::new();
        for &(col, op, v) in &filter.value {
            let array = self.batch.columns().get(col)?;
            if !comparable(array.data_type(), v) {
                return None;
            }
            match filter.decide(self, col, op, v) {
                Some(false) => return Some(none()),
                Some(true) => {}
                None => compare.push((col, op, v)),
            }
        }
        // One equality on an indexed column, no time mask: from the per-value synopses.
        if let ([(col, values)], None, []) = (&filter.equal[..], &mask, &compare[..])
            && self.indexed(*col)
        {
            return Some(self.per_value(columns, *col, values));
        }
        // Kept answers: a sealed chunk wholly inside the time bounds.
        let kept = match (&self.index, &mask, compare.is_empty()) {
            (Some(index), None, false) => Some((index, format!("{:?} {compare:?}", filter.equal))),
            _ => None,
        };
        if let Some((index, key)) = &kept
            && let Some((n, syn)) = index.filtered.lock().get(key)
            && let Some(syn) = columns.iter().map(|c| syn.get(c).cloned()).collect()
        {
            return Some((*n, syn));
        }
        for &(col, op, v) in &compare {
            let array = self.batch.columns().get(col)?;
            and_into(&mut mask, compared(array, op, v)?);
        }
        let mut rows: Option<Vec<u32>> = None;
        for (col, values) in &filter.equal {
            if let Some(found) = self.rows(*col, values) {
                rows = Some(match rows {
                    Some(before) => intersect(&before, &found),
                    None => found,
                });
                continue;
            }
            and_into(&mut mask, equal(self.batch.columns().get(*col)?, values)?);
        }
        let rows: Vec<u32> = match (rows, &mask) {
            (None, None) => {
                let syn = columns.iter().map(|c| self.synopsis(*c)).collect();
                return Some((self.batch.num_rows() as u64, syn));
            }
            (Some(rows), None) => rows,
            (Some(rows), Some(m)) => rows.into_iter().filter(|r| m.value(*r as usize)).collect(),
            (None, Some(m)) => (0..m.len() as u32)
                .filter(|r| m.value(*r as usize))
                .collect(),
        };
        let syn = self.synopses_at(columns, &rows);
        if let Some((index, key)) = kept {
            let mut filtered = index.filtered.lock();
            if filtered.len() < KEPT_FILTERS || filtered.contains_key(&key) {
                let entry = filtered.entry(key).or_default();
                entry.0 = rows.len() as u64;
                entry
                    .1
                    .extend(columns.iter().copied().zip(syn.iter().cloned()));
            }
        }
        Some((rows.len() as u64, syn))
    }

    /// Adds the rows `filter` admits to a `GROUP BY` answer: a sealed chunk wholly inside
    /// the time bounds from its kept group synopses when they have the columns asked,
    /// others from their rows. `None` when the filter or a grouped column cannot be
    /// checked here (see [`Chunk::synopsis_where`], and [`Groups::by`]).
    pub fn groups_into(&self, answer: &mut Answer, filter: &RowFilter) -> Option<()> {
        let mut inside = true;
        for &(col, lo, hi) in &filter.time {
            match self.range(col) {
                Some((min, max)) if max < lo || min > hi => return Some(()),
                Some((min, max)) => {
                    let nulls = self.batch.columns().get(col)?.null_count();
                    inside &= lo <= min && max <= hi && nulls == 0;
                }
                // Every time NULL: no row compares true.
                None => return Some(()),
            }
        }
        if let (true, Some(index)) = (inside, &self.index)
            && let Some(groups) = index.groups.get_or_init(|| Groups::of(&self.batch))
            && answer.add(groups, filter)
        {
            return Some(());
        }
        // A grouping of the whole chunk (no time bound to check) is kept: the chunk is
        // immutable, and a dashboard asks the same again.
        let kept = match (inside, &self.index) {
            (true, Some(index)) => {
                let (f, keys, columns) = (filter, &answer.keys, &answer.columns);
                Some((
                    index,
                    format!("{:?} {:?} {keys:?} {columns:?}", f.value, f.equal),
                ))
            }
            _ => None,
        };
        if let Some((index, key)) = &kept
            && let Some(groups) = index.filtered_groups.lock().get(key)
        {
            answer.add_rows(groups.clone());
            return Some(());
        }
        if kept.is_some() {
            let n = self.batch.num_rows() as u64;
            if answer.budget < n {
                answer.over_budget = true;
                return None;
            }
            answer.budget -= n;
        }
        let rows = self.admitted(filter)?;
        let keys = (answer.keys.iter())
            .map(|k| match *k {
                GroupKey::Column(c) => self.batch.columns().get(c).cloned(),
                GroupKey::Day(c) => {
                    crate::query::functions::to_date(self.batch.columns().get(c)?).ok()
                }
            })
            .collect::<Option<Vec<_>>>()?;
        let groups = Groups::by(&self.batch, &keys, rows.as_deref(), &answer.columns)?;
        if let Some((index, key)) = kept {
            let mut filtered = index.filtered_groups.lock();
            if filtered.len() < KEPT_FILTERS {
                filtered.insert(key, groups.clone());
            }
        }
        answer.add_rows(groups);
        Some(())
    }

    /// Positions of the rows `filter` admits (`None` inside: every row), or `None` when a
    /// filter cannot be checked here.
    fn admitted(&self, filter: &RowFilter) -> Option<Option<Vec<u32>>> {
        let mut mask: Option<BooleanArray> = None;
        for &(col, lo, hi) in &filter.time {
            and_into(&mut mask, within(self.timestamps(col)?, lo, hi));
        }
        for &(col, op, v) in &filter.value {
            let array = self.batch.columns().get(col)?;
            if !comparable(array.data_type(), v) {
                return None;
            }
            and_into(&mut mask, compared(array, op, v)?);
        }
        for (col, values) in &filter.equal {
            and_into(&mut mask, equal(self.batch.columns().get(*col)?, values)?);
        }
        Some(mask.map(|m| {
            (0..m.len() as u32)
                .filter(|r| m.value(*r as usize))
                .collect()
        }))
    }

    /// The synopses of `columns` over the rows at `positions`.
    fn synopses_at(&self, columns: &[usize], positions: &[u32]) -> Vec<ColumnSynopsis> {
        let at = UInt32Array::from(positions.to_vec());
        (columns.iter())
            .map(|c| match self.batch.columns().get(*c) {
                Some(a) => ColumnSynopsis::of(&take(a.as_ref(), &at, None).expect("rows in range")),
                None => ColumnSynopsis::default(),
            })
            .collect()
    }

    /// Row count and synopses of `columns` over the rows whose indexed string column `col`
    /// is one of `values`, from the synopses kept per value (computed on first use).
    fn per_value(
        &self,
        columns: &[usize],
        col: usize,
        values: &[String],
    ) -> (u64, Vec<ColumnSynopsis>) {
        let mut out = (0, vec![ColumnSynopsis::default(); columns.len()]);
        let (Some((index, _)), Some(values_index)) = (self.column(col), self.value_index(col))
        else {
            return out;
        };
        let mut kept = index.per_value.lock();
        // Each value once, as an IN list may name one twice.
        let mut seen: HashSet<&str> = HashSet::with_capacity(values.len());
        for v in values {
            if !seen.insert(v.as_str()) {
                continue;
            }
            let Some(rows) = values_index.0.get(v.as_str()) else {
                continue;
            };
            out.0 += rows.len() as u64;
            // Looked up by `&str`: a key is allocated only the first time. Past
            // `KEPT_VALUES` values a chunk computes the others each time instead of keeping
            // them (memory stays bounded however many devices are asked for).
            if !kept.contains_key(v.as_str()) {
                if kept.len() >= KEPT_VALUES {
                    for (o, syn) in out.1.iter_mut().zip(self.synopses_at(columns, rows)) {
                        o.merge(&syn);
                    }
                    continue;
                }
                kept.insert(Box::from(v.as_str()), HashMap::new());
            }
            let of_value = kept.get_mut(v.as_str()).expect("just inserted");
            for (o, c) in out.1.iter_mut().zip(columns) {
                let syn = of_value
                    .entry(*c)
                    .or_insert_with(|| self.synopses_at(&[*c], rows).remove(0));
                o.merge(syn);
            }
        }
        out
    }

    /// The value index of string column `col` (built now if not yet), or `None` when the
    /// column is not indexed.
    fn value_index(&self, col: usize) -> Option<&ValueIndex> {
        let (index, array) = self.column(col)?;
        index
            .values
            .get_or_init(|| ValueIndex::build(array))
            .as_ref()
    }

    /// Whether string column `col` has a value index.
    fn indexed(&self, col: usize) -> bool {
        self.value_index(col).is_some()
    }

    /// Positions of the rows whose `col` is one of `values`, or `None` when that column is
    /// not indexed.
    fn rows(&self, col: usize, values: &[String]) -> Option<Vec<u32>> {
        Some(self.value_index(col)?.rows(values))
    }
}

/// Which rows of `ts` lie within `lo..=hi` (a NULL time does not).
fn within(ts: &PrimitiveArray<TimestampMicrosecondType>, lo: i64, hi: i64) -> BooleanArray {
    let inside = BooleanArray::from_unary(ts, |t| lo <= t && t <= hi);
    null_is_false(inside, ts.nulls())
}

/// Which rows of a string column hold one of `values` (`None` if not a string column).
fn equal(array: &ArrayRef, values: &[String]) -> Option<BooleanArray> {
    if array.data_type() != &DataType::Utf8 {
        return None;
    }
    let wanted: HashSet<&str> = values.iter().map(String::as_str).collect();
    let strings = array.as_string::<i32>();
    Some(BooleanArray::from_iter(
        (strings.iter()).map(|s| Some(s.is_some_and(|s| wanted.contains(s)))),
    ))
}

/// `mask` narrowed by `m` (rows in both).
fn and_into(mask: &mut Option<BooleanArray>, m: BooleanArray) {
    *mask = Some(match mask.take() {
        Some(before) => datafusion::arrow::compute::and(&before, &m).expect("same length"),
        None => m,
    });
}

/// Predicates a scan can answer from chunk indexes: string columns equal to one of a few
/// values, and bounds on timestamp columns. Taken from the conjunction of a query's filters,
/// so each narrows the rows on its own.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RowFilter {
    /// `(column, values)`: the column equals one of the values.
    pub equal: Vec<(usize, Vec<String>)>,
    /// `(column, lo, hi)`: microseconds, inclusive.
    pub time: Vec<(usize, i64, i64)>,
    /// `(column, op, value)`: a number column compared with a number (`<`, `<=`, `>`,
    /// `>=`, `=`). Rows are not picked by it, but a chunk whose synopsis (of the rows an
    /// equality picks) rules it out is skipped: `device = 'd-7' AND temp < -40` reads
    /// nothing while that device has no such reading.
    pub value: Vec<(usize, Operator, Num)>,
}

impl RowFilter {
    /// True when the filter admits every row.
    pub fn is_empty(&self) -> bool {
        self.equal.is_empty() && self.time.is_empty() && self.value.is_empty()
    }

    /// Whether the synopsis of the rows of `chunk` that the equalities pick shows that no
    /// row meets a number comparison.
    fn rules_out(&self, chunk: &Chunk) -> bool {
        (self.value.iter()).any(|&(col, op, v)| self.decide(chunk, col, op, v) == Some(false))
    }

    /// Whether every row (`Some(true)`) or no row (`Some(false)`) of `chunk` that the
    /// equalities pick meets `col op v`, as far as their synopsis shows.
    fn decide(&self, chunk: &Chunk, col: usize, op: Operator, v: Num) -> Option<bool> {
        let (rows, syn) = match &self.equal[..] {
            [(eq, values)] if chunk.indexed(*eq) => {
                let (rows, mut syn) = chunk.per_value(&[col], *eq, values);
                (rows, syn.remove(0))
            }
            _ => (chunk.batch.num_rows() as u64, chunk.synopsis(col)),
        };
        decide(&syn, rows, op, v)
    }

    /// Which rows of `chunk` may match, with the columns of `projection` (all when `None`).
    /// Rows still changing, and columns without an index, are passed on whole.
    pub fn pick(&self, chunk: &Chunk, projection: Option<&[usize]>) -> Pick {
        let projected = || match projection {
            Some(p) => (chunk.batch)
                .project(p)
                .expect("projection within the schema"),
            None => chunk.batch.clone(),
        };
        if self.is_empty() || chunk.index.is_none() {
            return Pick::Whole(projected());
        }
        for &(col, lo, hi) in &self.time {
            if let Some((min, max)) = chunk.range(col)
                && (max < lo || min > hi)
            {
                return Pick::Nothing;
            }
        }
        if self.rules_out(chunk) {
            return Pick::Nothing;
        }
        let mut rows: Option<Vec<u32>> = None;
        for (col, values) in &self.equal {
            let Some(found) = chunk.rows(*col, values) else {
                continue;
            };
            rows = Some(match rows {
                None => found,
                Some(before) => intersect(&before, &found),
            });
            if rows.as_ref().is_some_and(Vec::is_empty) {
                return Pick::Nothing;
            }
        }
        match rows {
            Some(rows) if rows.len() < chunk.batch.num_rows() => Pick::Rows(projected(), rows),
            _ => Pick::Whole(projected()),
        }
    }
}

/// What [`RowFilter::pick`] found in a chunk.
#[derive(Debug)]
pub enum Pick {
    /// No row can match.
    Nothing,
    /// Every row may match.
    Whole(RecordBatch),
    /// These rows (ascending positions) of the batch may match.
    Rows(RecordBatch, Vec<u32>),
}

/// One batch of the given `(batch, row)` rows of `batches` (all of one schema), copied once:
/// a scan gathers the rows it picked from many chunks with a single allocation per column.
pub(crate) fn gather(
    batches: &[RecordBatch],
    rows: &[(usize, usize)],
) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let schema = batches[0].schema();
    match schema.fields().len() {
        // No column asked for (only a count): just as many rows.
        0 => RecordBatch::try_new_with_options(
            schema,
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(rows.len())),
        ),
        _ => interleave_record_batch(&batches.iter().collect::<Vec<_>>(), rows),
    }
}

/// The positions in both ascending lists.
fn intersect(a: &[u32], b: &[u32]) -> Vec<u32> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Whether every value (`Some(true)`) or none (`Some(false)`) of a column whose synopsis
/// over `rows` rows is `syn` meets `value op v`, as far as the synopsis shows. NULLs meet
/// no comparison.
pub(crate) fn decide(syn: &ColumnSynopsis, rows: u64, op: Operator, v: Num) -> Option<bool> {
    if syn.count == 0 {
        return Some(false);
    }
    let (Some(min), Some(max), true) = (syn.min, syn.max, syn.ordered) else {
        return None;
    };
    // Synopses do not tell -0.0 from 0.0, which the filter's comparison orders: no decision
    // between a zero and a zero.
    let zero = |n: Num| matches!(n, Num::Float(f) if f == 0.0);
    if zero(v) && (zero(min) || zero(max)) {
        return None;
    }
    let less = |a: Num, b: Num| match (a, b) {
        (Num::Int(a), Num::Int(b)) => a < b,
        _ => a.as_f64() < b.as_f64(),
    };
    let (none, all) = match op {
        Operator::Lt => (!less(min, v), less(max, v)),
        Operator::LtEq => (less(v, min), !less(v, max)),
        Operator::Gt => (!less(v, max), less(v, min)),
        Operator::GtEq => (less(max, v), !less(min, v)),
        Operator::Eq => (less(v, min) || less(max, v), !less(min, v) && !less(v, max)),
        _ => (false, false),
    };
    if none {
        Some(false)
    } else if all && syn.count == rows {
        Some(true)
    } else {
        None
    }
}

/// Whether a column of type `ty` compared with `v` is checked exactly here: integers with
/// an integer, floats with a float (a query's comparison is between values of one type once
/// DataFusion has coerced it; any other pairing is left to DataFusion).
pub(crate) fn comparable(ty: &DataType, v: Num) -> bool {
    match v {
        Num::Int(_) => ty.is_integer(),
        Num::Float(_) => matches!(ty, DataType::Float32 | DataType::Float64),
    }
}

/// Which values of `array` meet `value op v` (NULL: false), as DataFusion compares them:
/// integers exactly, floats in IEEE total order with -0.0 taken as 0.0 (so NaN is above
/// every number). `None` for a pairing [`comparable`] refuses.
fn compared(array: &ArrayRef, op: Operator, v: Num) -> Option<BooleanArray> {
    use datafusion::arrow::datatypes::{
        Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
        UInt32Type, UInt64Type,
    };
    use std::cmp::Ordering;
    let meets = move |o: Ordering| match op {
        Operator::Lt => o.is_lt(),
        Operator::LtEq => o.is_le(),
        Operator::Gt => o.is_gt(),
        Operator::GtEq => o.is_ge(),
        Operator::Eq => o.is_eq(),
        _ => false,
    };
    macro_rules! ints {
        ($t:ty) => {{
            let Num::Int(v) = v else { return None };
            BooleanArray::from_unary(array.as_primitive::<$t>(), |x| meets(i128::from(x).cmp(&v)))
        }};
    }
    macro_rules! floats {
        ($t:ty) => {{
            let Num::Float(v) = v else { return None };
            let norm = |x: f64| if x == 0.0 { 0.0 } else { x };
            let v = norm(v);
            BooleanArray::from_unary(array.as_primitive::<$t>(), |x| {
                meets(norm(f64::from(x)).total_cmp(&v))
            })
        }};
    }
    let m = match array.data_type() {
        DataType::Int8 => ints!(Int8Type),
        DataType::Int16 => ints!(Int16Type),
        DataType::Int32 => ints!(Int32Type),
        DataType::Int64 => ints!(Int64Type),
        DataType::UInt8 => ints!(UInt8Type),
        DataType::UInt16 => ints!(UInt16Type),
        DataType::UInt32 => ints!(UInt32Type),
        DataType::UInt64 => ints!(UInt64Type),
        DataType::Float32 => floats!(Float32Type),
        DataType::Float64 => floats!(Float64Type),
        _ => return None,
    };
    Some(null_is_false(m, array.nulls()))
}

/// `mask` with the rows NULL in `nulls` false (a comparison with NULL matches nothing).
fn null_is_false(
    mask: BooleanArray,
    nulls: Option<&datafusion::arrow::buffer::NullBuffer>,
) -> BooleanArray {
    match nulls {
        Some(n) => BooleanArray::new(mask.values() & n.inner(), None),
        None => mask,
    }
}

#[cfg(test)]
mod tests;

//! Rollups (continuous aggregates, `CREATE ROLLUP`): a table Sluice keeps from another
//! table's rows, one row per time bucket and key with each aggregate's partial state (an
//! average as its sum and count), so that partial rows of the same bucket merge.
//!
//! - **Maintained at flush.** When a partition of the source table is written to Parquet,
//!   the rows it writes are folded ([`Fold::raw`]) into partial rows, written as the
//!   rollup's own files in the same manifest change (one crash-safe step: both or neither).
//!   A late row lands in a later flush and adds a partial row to its old bucket.
//! - **Answered with the unflushed rows.** A query of the rollup merges its files' partial
//!   rows with those of the source's rows still in memory, folded when it runs, under both
//!   tables' locks (`crate::query::rollup`), so it is exact from the moment a row is acked.
//! - **Kept apart from the source.** The rollup's files have their own partitions (a day of
//!   buckets each) and TTL: raw data can expire after a week, its rollups live for years.
//!   Compaction folds a partition's partial rows again ([`Fold::partial`]): one row per
//!   bucket and key.

use crate::error::{Error, Result};
use crate::store::catalog::{ColumnDef, TableDef};
use crate::types::{ColumnType, Value};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// An aggregate function a rollup keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AggFn {
    /// `avg(x)`, kept as sum and count.
    Avg,
    /// `sum(x)`.
    Sum,
    /// `min(x)`.
    Min,
    /// `max(x)`.
    Max,
    /// `count(x)`, or `count(*)` without a column.
    Count,
}

impl AggFn {
    /// The function of a SQL name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "avg" | "mean" => Self::Avg,
            "sum" => Self::Sum,
            "min" => Self::Min,
            "max" => Self::Max,
            "count" => Self::Count,
            _ => return None,
        })
    }

    /// The SQL name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avg => "avg",
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
            Self::Count => "count",
        }
    }
}

/// One aggregate column of a rollup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// The function.
    pub func: AggFn,
    /// The source column it reads (`None`: `count(*)`).
    pub column: Option<String>,
    /// The column's name in the rollup.
    pub name: String,
}

/// A rollup: which table it reads, its buckets, keys and aggregates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollupDef {
    /// The source table's id.
    pub source: u64,
    /// The source's time column the buckets are taken from.
    pub time_column: String,
    /// Bucket width, in microseconds.
    pub stride_micros: i64,
    /// A bucket boundary, in microseconds since the epoch.
    pub origin_micros: i64,
    /// The bucket column's name.
    pub bucket: String,
    /// The key columns (same names and types as in the source).
    pub keys: Vec<String>,
    /// The aggregates.
    pub aggregates: Vec<Aggregate>,
    /// The defining query, as written.
    pub sql: String,
}

/// How an aggregate's values are held.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Float,
    Int,
    Time,
}

fn kind(ty: ColumnType) -> Option<Kind> {
    use ColumnType::*;
    match ty {
        Float32 | Float64 => Some(Kind::Float),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => Some(Kind::Int),
        Timestamp => Some(Kind::Time),
        _ => None,
    }
}

impl Kind {
    fn column_type(self) -> ColumnType {
        match self {
            Kind::Float => ColumnType::Float64,
            Kind::Int => ColumnType::Int64,
            Kind::Time => ColumnType::Timestamp,
        }
    }
}

/// Suffixes of an average's two stored columns.
pub(crate) const SUM_SUFFIX: &str = "__sum";
pub(crate) const COUNT_SUFFIX: &str = "__count";

impl RollupDef {
    /// The bucket of a time.
    pub fn bucket_of(&self, micros: i64) -> i64 {
        let off = micros.wrapping_sub(self.origin_micros);
        self.origin_micros + off.div_euclid(self.stride_micros) * self.stride_micros
    }

    /// Each aggregate's kind; an error names an aggregate the source cannot give.
    fn kinds(&self, source: &TableDef) -> Result<Vec<Kind>> {
        let mut out = Vec::new();
        for a in &self.aggregates {
            let Some(col) = &a.column else {
                out.push(Kind::Int);
                continue;
            };
            let i = source.column_index(col).ok_or_else(|| {
                Error::invalid(format!(
                    "{}({col}): no column '{col}' in {}",
                    a.func.name(),
                    source.name
                ))
            })?;
            let ty = source.columns[i].ty;
            let k = match (a.func, kind(ty)) {
                (AggFn::Count, _) => Kind::Int,
                (AggFn::Avg | AggFn::Sum, Some(k @ (Kind::Float | Kind::Int))) => k,
                (AggFn::Min | AggFn::Max, Some(k)) => k,
                _ => {
                    return Err(Error::invalid(format!(
                        "{}({col}): a rollup cannot keep this of a {} column",
                        a.func.name(),
                        ty.name()
                    )));
                }
            };
            out.push(k);
        }
        Ok(out)
    }

    /// The rollup table's stored columns: the bucket, the keys, then each aggregate's
    /// partial state. Checks the definition against the source.
    pub fn stored_columns(&self, source: &TableDef) -> Result<Vec<ColumnDef>> {
        if self.stride_micros <= 0 {
            return Err(Error::invalid("a rollup's bucket width must be positive"));
        }
        let time = source.column_index(&self.time_column);
        if !time.is_some_and(|i| source.columns[i].ty.is_time()) {
            return Err(Error::invalid(format!(
                "'{}' is not a time column of {}",
                self.time_column, source.name
            )));
        }
        let mut cols = vec![ColumnDef {
            name: self.bucket.clone(),
            ty: ColumnType::Timestamp,
            nullable: false,
        }];
        for k in &self.keys {
            let i = source.column_index(k).ok_or_else(|| {
                Error::invalid(format!("GROUP BY {k}: no column '{k}' in {}", source.name))
            })?;
            cols.push(ColumnDef {
                name: source.columns[i].name.clone(),
                ty: source.columns[i].ty,
                nullable: true,
            });
        }
        let col = |name: String, ty| ColumnDef {
            name,
            ty,
            nullable: true,
        };
        for (a, k) in self.aggregates.iter().zip(self.kinds(source)?) {
            match a.func {
                AggFn::Avg => {
                    cols.push(col(format!("{}{SUM_SUFFIX}", a.name), ColumnType::Float64));
                    cols.push(col(format!("{}{COUNT_SUFFIX}", a.name), ColumnType::Int64));
                }
                AggFn::Count => cols.push(col(a.name.clone(), ColumnType::Int64)),
                _ => cols.push(col(a.name.clone(), k.column_type())),
            }
        }
        Ok(cols)
    }
}

impl RollupDef {
    /// The columns a query of the rollup answers with (its stored columns but with each
    /// average as one `Float64`), for `DESCRIBE`.
    pub fn answer_columns(&self, rollup: &TableDef) -> Vec<ColumnDef> {
        let mut cols: Vec<ColumnDef> = rollup.columns[..1 + self.keys.len()].to_vec();
        for a in &self.aggregates {
            let ty = match a.func {
                AggFn::Avg => Some(ColumnType::Float64),
                _ => (rollup.column_index(&a.name)).map(|i| rollup.columns[i].ty),
            };
            cols.push(ColumnDef {
                name: a.name.clone(),
                ty: ty.unwrap_or(ColumnType::Float64),
                nullable: true,
            });
        }
        cols
    }

    /// `CREATE ROLLUP` text that makes `rollup` again.
    pub fn create_sql(&self, rollup: &TableDef) -> String {
        let ttl = rollup.ttl_secs.map(|s| format!(" WITH (ttl = '{s}s')"));
        format!(
            "CREATE ROLLUP {}.{} AS {}{}",
            rollup.database,
            rollup.name,
            self.sql,
            ttl.unwrap_or_default()
        )
    }
}

/// One aggregate's state in one group.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Sum and count of the values.
    Avg(f64, i64),
    Float(Option<f64>),
    Int(Option<i64>),
    Count(i64),
}

/// One aggregate's input column, read from raw rows or from partial rows.
enum Input {
    Float(Float64Array),
    Int(Int64Array),
    /// Raw `count(x)`: the column, counted where not NULL.
    Present(ArrayRef),
    /// Raw `count(*)`.
    Rows,
    /// Partial `avg`: sum and count.
    Avg(Float64Array, Int64Array),
}

fn floats(a: &ArrayRef) -> Result<Float64Array> {
    Ok(cast(a, &DataType::Float64)?
        .as_primitive::<Float64Type>()
        .clone())
}

fn ints(a: &ArrayRef) -> Result<Int64Array> {
    Ok(cast(a, &DataType::Int64)?
        .as_primitive::<Int64Type>()
        .clone())
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::invalid(format!("rollup input lacks column '{name}'")))
}

/// Folds rows into a rollup's partial rows: raw rows of the source ([`Fold::raw`]) or
/// partial rows of the rollup itself ([`Fold::partial`]), then [`Fold::finish`]. Groups are
/// found by the bytes of their bucket and key values in Arrow's row format; each
/// aggregate's states lie in one vector, updated a column at a time.
pub(crate) struct Fold<'a> {
    def: &'a RollupDef,
    kinds: Vec<Kind>,
    /// The key columns as rows (`None`: no keys).
    rows: Option<RowConverter>,
    /// Bucket (8 bytes) and key row -> group number.
    index: foldhash::HashMap<Box<[u8]>, u32>,
    /// Each group's bucket.
    buckets: Vec<i64>,
    /// Group `g`'s state of aggregate `j` at `g * aggregates + j`.
    states: Vec<State>,
}

/// A row converter for the key columns `keys` of `table`.
fn key_rows(keys: &[String], table: &TableDef) -> Result<Option<RowConverter>> {
    let fields = (keys.iter())
        .map(|k| {
            let i = (table.column_index(k))
                .ok_or_else(|| Error::invalid(format!("no key column '{k}' in {}", table.name)))?;
            Ok(SortField::new(table.columns[i].ty.arrow()))
        })
        .collect::<Result<Vec<_>>>()?;
    match fields.is_empty() {
        true => Ok(None),
        false => Ok(Some(RowConverter::new(fields)?)),
    }
}

impl<'a> Fold<'a> {
    /// An empty fold for `def` over `source`.
    pub(crate) fn new(def: &'a RollupDef, source: &TableDef) -> Result<Self> {
        Self::with(def, def.kinds(source)?, key_rows(&def.keys, source)?)
    }

    fn with(def: &'a RollupDef, kinds: Vec<Kind>, rows: Option<RowConverter>) -> Result<Self> {
        Ok(Self {
            def,
            kinds,
            rows,
            index: Default::default(),
            buckets: Vec::new(),
            states: Vec::new(),
        })
    }

    /// An empty fold of partial rows of the rollup table `rollup` (as compaction merges
    /// them; the kinds are read from its stored columns).
    pub(crate) fn of_partials(def: &'a RollupDef, rollup: &TableDef) -> Result<Self> {
        let kinds = (def.aggregates.iter())
            .map(|a| match a.func {
                AggFn::Avg | AggFn::Count => Ok(Kind::Int),
                _ => (rollup.column_index(&a.name))
                    .and_then(|i| kind(rollup.columns[i].ty))
                    .ok_or_else(|| Error::invalid(format!("rollup lacks column '{}'", a.name))),
            })
            .collect::<Result<_>>()?;
        Self::with(def, kinds, key_rows(&def.keys, rollup)?)
    }

    fn initial(&self) -> Vec<State> {
        (self.def.aggregates.iter().zip(&self.kinds))
            .map(|(a, k)| match (a.func, k) {
                (AggFn::Avg, _) => State::Avg(0.0, 0),
                (AggFn::Count, _) => State::Count(0),
                (_, Kind::Float) => State::Float(None),
                _ => State::Int(None),
            })
            .collect()
    }

    /// Adds raw rows of the source table (its columns by name; rows with no time skipped).
    pub(crate) fn raw(&mut self, batch: &RecordBatch) -> Result<()> {
        let time = cast(column(batch, &self.def.time_column)?, &DataType::Int64)?;
        let time = time.as_primitive::<Int64Type>();
        // A date column counts in days.
        let per = match batch
            .schema()
            .field_with_name(&self.def.time_column)?
            .data_type()
        {
            DataType::Date32 => 86_400_000_000,
            _ => 1,
        };
        let mut inputs = Vec::new();
        for (a, k) in self.def.aggregates.iter().zip(&self.kinds) {
            let Some(c) = &a.column else {
                inputs.push(Input::Rows);
                continue;
            };
            let arr = column(batch, c)?;
            inputs.push(match (a.func, k) {
                (AggFn::Count, _) => Input::Present(arr.clone()),
                (AggFn::Avg, _) | (_, Kind::Float) => Input::Float(floats(arr)?),
                _ => Input::Int(ints(arr)?),
            });
        }
        let times = (0..batch.num_rows()).map(|r| {
            time.is_valid(r)
                .then(|| self.def.bucket_of(time.value(r).saturating_mul(per)))
        });
        let times: Vec<Option<i64>> = times.collect();
        self.add(batch, &times, &inputs, false)
    }

    /// Adds partial rows of the rollup table (its stored columns).
    pub(crate) fn partial(&mut self, batch: &RecordBatch) -> Result<()> {
        let bucket = cast(column(batch, &self.def.bucket)?, &DataType::Int64)?;
        let bucket = bucket.as_primitive::<Int64Type>();
        let mut inputs = Vec::new();
        for (a, k) in self.def.aggregates.iter().zip(&self.kinds) {
            inputs.push(match (a.func, k) {
                (AggFn::Avg, _) => Input::Avg(
                    floats(column(batch, &format!("{}{SUM_SUFFIX}", a.name))?)?,
                    ints(column(batch, &format!("{}{COUNT_SUFFIX}", a.name))?)?,
                ),
                (_, Kind::Float) => Input::Float(floats(column(batch, &a.name)?)?),
                _ => Input::Int(ints(column(batch, &a.name)?)?),
            });
        }
        let times: Vec<Option<i64>> = (0..batch.num_rows())
            .map(|r| bucket.is_valid(r).then(|| bucket.value(r)))
            .collect();
        self.add(batch, &times, &inputs, true)
    }

    fn add(
        &mut self,
        batch: &RecordBatch,
        buckets: &[Option<i64>],
        inputs: &[Input],
        partial: bool,
    ) -> Result<()> {
        let keys: Vec<ArrayRef> = (self.def.keys.iter())
            .map(|k| column(batch, k).cloned())
            .collect::<Result<_>>()?;
        let rows = match &self.rows {
            Some(c) => Some(c.convert_columns(&keys)?),
            None => None,
        };
        let initial = self.initial();
        let n = initial.len();
        let mut scratch = Vec::with_capacity(64);
        let mut group_of = Vec::with_capacity(buckets.len());
        for (r, bucket) in buckets.iter().enumerate() {
            let Some(bucket) = *bucket else {
                group_of.push(u32::MAX);
                continue;
            };
            scratch.clear();
            scratch.extend_from_slice(&bucket.to_le_bytes());
            if let Some(rows) = &rows {
                scratch.extend_from_slice(rows.row(r).as_ref());
            }
            let g = match self.index.get(scratch.as_slice()) {
                Some(g) => *g,
                None => {
                    let g = self.buckets.len() as u32;
                    self.index.insert(scratch.as_slice().into(), g);
                    self.buckets.push(bucket);
                    self.states.extend_from_slice(&initial);
                    g
                }
            };
            group_of.push(g);
        }
        for (j, (input, a)) in inputs.iter().zip(&self.def.aggregates).enumerate() {
            for (r, g) in group_of.iter().enumerate() {
                if *g != u32::MAX {
                    update(
                        &mut self.states[*g as usize * n + j],
                        input,
                        r,
                        a.func,
                        partial,
                    );
                }
            }
        }
        Ok(())
    }

    /// The partial rows, by the rollup table's partition key, as batches of its schema.
    pub(crate) fn finish(self, rollup: &TableDef) -> Result<Vec<(u64, RecordBatch)>> {
        let schema = rollup.arrow_schema();
        let n = self.def.aggregates.len();
        let mut key_of: Vec<&[u8]> = vec![&[]; self.buckets.len()];
        for (k, g) in &self.index {
            key_of[*g as usize] = &k[8..];
        }
        let part = |g: u32| {
            rollup
                .partition
                .key(&Value::Timestamp(self.buckets[g as usize]))
        };
        let mut order: Vec<u32> = (0..self.buckets.len() as u32).collect();
        order.sort_unstable_by_key(|g| (part(*g), self.buckets[*g as usize]));
        let mut out = Vec::new();
        for run in order.chunk_by(|a, b| part(*a) == part(*b)) {
            let bucket = run.iter().map(|g| self.buckets[*g as usize]);
            let mut cols: Vec<ArrayRef> = vec![Arc::new(
                TimestampMicrosecondArray::from_iter_values(bucket),
            )];
            if let Some(c) = &self.rows {
                let parser = c.parser();
                let rows = run.iter().map(|g| parser.parse(key_of[*g as usize]));
                cols.extend(c.convert_rows(rows)?);
            }
            for (j, (a, k)) in self.def.aggregates.iter().zip(&self.kinds).enumerate() {
                let states = run.iter().map(|g| self.states[*g as usize * n + j]);
                match a.func {
                    AggFn::Avg => {
                        let (s, n): (Vec<_>, Vec<_>) = states
                            .map(|s| match s {
                                State::Avg(sum, n) => ((n > 0).then_some(sum), n),
                                _ => (None, 0),
                            })
                            .unzip();
                        cols.push(Arc::new(Float64Array::from(s)));
                        cols.push(Arc::new(Int64Array::from(n)));
                    }
                    AggFn::Count => cols.push(Arc::new(Int64Array::from_iter_values(
                        states.map(|s| if let State::Count(n) = s { n } else { 0 }),
                    ))),
                    _ if *k == Kind::Float => cols.push(Arc::new(Float64Array::from_iter(
                        states.map(|s| if let State::Float(v) = s { v } else { None }),
                    ))),
                    _ => {
                        let v = Int64Array::from_iter(
                            states.map(|s| if let State::Int(v) = s { v } else { None }),
                        );
                        let ty = match k {
                            Kind::Time => DataType::Timestamp(TimeUnit::Microsecond, None),
                            _ => DataType::Int64,
                        };
                        cols.push(cast(&(Arc::new(v) as ArrayRef), &ty)?);
                    }
                }
            }
            let first = run.first().copied().unwrap_or_default();
            out.push((part(first), RecordBatch::try_new(schema.clone(), cols)?));
        }
        Ok(out)
    }
}

/// Folds row `r` of `input` into `s`.
fn update(s: &mut State, input: &Input, r: usize, func: AggFn, partial: bool) {
    let float = |a: &Float64Array| a.is_valid(r).then(|| a.value(r));
    let int = |a: &Int64Array| a.is_valid(r).then(|| a.value(r));
    match (s, input) {
        (State::Avg(sum, n), Input::Float(a)) => {
            if let Some(v) = float(a) {
                *sum += v;
                *n += 1;
            }
        }
        (State::Avg(sum, n), Input::Avg(a, c)) => {
            *sum += float(a).unwrap_or(0.0);
            *n += int(c).unwrap_or(0);
        }
        (State::Count(n), Input::Rows) => *n += 1,
        (State::Count(n), Input::Present(a)) => *n += i64::from(a.is_valid(r)),
        (State::Count(n), Input::Int(a)) if partial => *n += int(a).unwrap_or(0),
        (State::Float(acc), Input::Float(a)) => {
            if let Some(v) = float(a) {
                *acc = Some(match (*acc, func) {
                    (None, _) => v,
                    (Some(x), AggFn::Sum) => x + v,
                    (Some(x), AggFn::Min) => x.min(v),
                    (Some(x), _) => x.max(v),
                });
            }
        }
        (State::Int(acc), Input::Int(a)) => {
            if let Some(v) = int(a) {
                *acc = Some(match (*acc, func) {
                    (None, _) => v,
                    (Some(x), AggFn::Sum) => x.saturating_add(v),
                    (Some(x), AggFn::Min) => x.min(v),
                    (Some(x), _) => x.max(v),
                });
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::partition::PartitionFn;

    fn table(name: &str, columns: Vec<ColumnDef>) -> TableDef {
        TableDef {
            id: 1,
            database: "default".into(),
            name: name.into(),
            columns,
            partition: PartitionFn::Yyyymmdd { days: 1 },
            partition_column: 0,
            ttl_secs: None,
            options: Default::default(),
        }
    }

    fn col(name: &str, ty: ColumnType) -> ColumnDef {
        ColumnDef {
            name: name.into(),
            ty,
            nullable: true,
        }
    }

    #[test]
    fn raw_rows_fold_and_partials_merge() {
        let source = table(
            "t",
            vec![
                col("time", ColumnType::Timestamp),
                col("device", ColumnType::String),
                col("temp", ColumnType::Float64),
            ],
        );
        let agg = |func, column: Option<&str>, name: &str| Aggregate {
            func,
            column: column.map(str::to_string),
            name: name.into(),
        };
        let def = RollupDef {
            source: 1,
            time_column: "time".into(),
            stride_micros: 60_000_000,
            origin_micros: 0,
            bucket: "bucket".into(),
            keys: vec!["device".into()],
            aggregates: vec![
                agg(AggFn::Avg, Some("temp"), "avg_temp"),
                agg(AggFn::Max, Some("temp"), "max_temp"),
                agg(AggFn::Count, None, "count"),
                agg(AggFn::Count, Some("temp"), "count_temp"),
            ],
            sql: String::new(),
        };
        let rollup = table("r", def.stored_columns(&source).unwrap());
        let names: Vec<_> = rollup.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "bucket",
                "device",
                "avg_temp__sum",
                "avg_temp__count",
                "max_temp",
                "count",
                "count_temp"
            ]
        );
        let batch = |t: Vec<i64>, d: Vec<&str>, v: Vec<Option<f64>>| {
            RecordBatch::try_new(
                source.arrow_schema(),
                vec![
                    Arc::new(TimestampMicrosecondArray::from(t)),
                    Arc::new(datafusion::arrow::array::StringArray::from(d)),
                    Arc::new(Float64Array::from(v)),
                ],
            )
            .unwrap()
        };
        let mut a = Fold::new(&def, &source).unwrap();
        a.raw(&batch(
            vec![1, 2, 60_000_001],
            vec!["x", "x", "x"],
            vec![Some(1.0), None, Some(5.0)],
        ))
        .unwrap();
        let first = a.finish(&rollup).unwrap();
        let mut b = Fold::new(&def, &source).unwrap();
        b.raw(&batch(vec![3], vec!["x"], vec![Some(3.0)])).unwrap();
        let second = b.finish(&rollup).unwrap();
        let mut m = Fold::new(&def, &source).unwrap();
        for (_, p) in first.iter().chain(&second) {
            m.partial(p).unwrap();
        }
        let merged = m.finish(&rollup).unwrap();
        assert_eq!(merged.len(), 1);
        let out = &merged[0].1;
        assert_eq!(out.num_rows(), 2);
        let f = |c: usize| out.column(c).as_primitive::<Float64Type>().clone();
        let i = |c: usize| out.column(c).as_primitive::<Int64Type>().clone();
        assert_eq!(f(2).values(), &[4.0, 5.0]);
        assert_eq!(i(3).values(), &[2, 1]);
        assert_eq!(f(4).values(), &[3.0, 5.0]);
        assert_eq!(i(5).values(), &[3, 1]);
        assert_eq!(i(6).values(), &[2, 1]);
        assert_eq!(def.bucket_of(-1), -60_000_000);
    }
}

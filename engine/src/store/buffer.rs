//! In-memory partition buffers: rows applied from the log, as Arrow columns.
//!
//! Rows go into typed Arrow builders; every [`TAIL_ROWS`] rows the builders are sealed into an
//! immutable chunk, and every [`SEAL_ROWS`] rows those small chunks are merged into one, so a
//! query's snapshot costs a few `Arc` clones plus a copy of fewer than [`TAIL_ROWS`] unsealed
//! rows, and scans see few, large chunks ([`Chunk`], indexed on demand). A buffer remembers the LSN range it holds so that a flush
//! can say exactly which log records are persisted for its partition.

use crate::store::chunk::Chunk;
use crate::types::{ColumnType, Value};
use datafusion::arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder,
    Int8Builder, Int16Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder, UInt8Builder, UInt16Builder, UInt32Builder, UInt64Builder,
    new_null_array,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use std::sync::Arc;
use std::time::Instant;

/// Rows per sealed chunk.
pub(crate) const SEAL_ROWS: usize = 8192;
/// Rows per small chunk: the most a scan copies of a buffer's unsealed rows, plus one.
pub(crate) const TAIL_ROWS: usize = 1024;

#[derive(Debug)]
enum Col {
    Bool(BooleanBuilder),
    I8(Int8Builder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    U8(UInt8Builder),
    U16(UInt16Builder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Str(StringBuilder),
    Bin(BinaryBuilder),
    Ts(TimestampMicrosecondBuilder),
    Date(Date32Builder),
}

impl Col {
    fn new(ty: ColumnType) -> Self {
        use ColumnType as T;
        match ty {
            T::Bool => Col::Bool(BooleanBuilder::with_capacity(0)),
            T::Int8 => Col::I8(Int8Builder::with_capacity(0)),
            T::Int16 => Col::I16(Int16Builder::with_capacity(0)),
            T::Int32 => Col::I32(Int32Builder::with_capacity(0)),
            T::Int64 => Col::I64(Int64Builder::with_capacity(0)),
            T::UInt8 => Col::U8(UInt8Builder::with_capacity(0)),
            T::UInt16 => Col::U16(UInt16Builder::with_capacity(0)),
            T::UInt32 => Col::U32(UInt32Builder::with_capacity(0)),
            T::UInt64 => Col::U64(UInt64Builder::with_capacity(0)),
            T::Float32 => Col::F32(Float32Builder::with_capacity(0)),
            T::Float64 => Col::F64(Float64Builder::with_capacity(0)),
            T::String => Col::Str(StringBuilder::with_capacity(0, 0)),
            T::Binary => Col::Bin(BinaryBuilder::with_capacity(0, 0)),
            T::Timestamp => Col::Ts(TimestampMicrosecondBuilder::with_capacity(0)),
            T::Date => Col::Date(Date32Builder::with_capacity(0)),
        }
    }

    /// Appends one value. The decoder has already converted values to the column's type and
    /// range; anything else (only possible for a corrupt log) is stored as NULL.
    fn push(&mut self, v: &Value) {
        // Narrowing casts below cannot truncate: decode range-checked them.
        match (self, v) {
            (Col::Bool(b), Value::Bool(x)) => b.append_value(*x),
            (Col::I8(b), Value::Int(x)) => b.append_value(*x as i8),
            (Col::I16(b), Value::Int(x)) => b.append_value(*x as i16),
            (Col::I32(b), Value::Int(x)) => b.append_value(*x as i32),
            (Col::I64(b), Value::Int(x)) => b.append_value(*x),
            (Col::U8(b), Value::UInt(x)) => b.append_value(*x as u8),
            (Col::U16(b), Value::UInt(x)) => b.append_value(*x as u16),
            (Col::U32(b), Value::UInt(x)) => b.append_value(*x as u32),
            (Col::U64(b), Value::UInt(x)) => b.append_value(*x),
            (Col::F32(b), Value::Float(x)) => b.append_value(*x as f32),
            (Col::F64(b), Value::Float(x)) => b.append_value(*x),
            (Col::Str(b), Value::Str(x)) => b.append_value(x),
            (Col::Bin(b), Value::Bytes(x)) => b.append_value(x),
            (Col::Ts(b), Value::Timestamp(x)) => b.append_value(*x),
            (Col::Date(b), Value::Date(x)) => b.append_value(*x),
            (col, _) => col.push_null(),
        }
    }

    fn push_null(&mut self) {
        match self {
            Col::Bool(b) => b.append_null(),
            Col::I8(b) => b.append_null(),
            Col::I16(b) => b.append_null(),
            Col::I32(b) => b.append_null(),
            Col::I64(b) => b.append_null(),
            Col::U8(b) => b.append_null(),
            Col::U16(b) => b.append_null(),
            Col::U32(b) => b.append_null(),
            Col::U64(b) => b.append_null(),
            Col::F32(b) => b.append_null(),
            Col::F64(b) => b.append_null(),
            Col::Str(b) => b.append_null(),
            Col::Bin(b) => b.append_null(),
            Col::Ts(b) => b.append_null(),
            Col::Date(b) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        macro_rules! fin {
            ($b:expr) => {
                Arc::new($b.finish()) as ArrayRef
            };
        }
        match self {
            Col::Bool(b) => fin!(b),
            Col::I8(b) => fin!(b),
            Col::I16(b) => fin!(b),
            Col::I32(b) => fin!(b),
            Col::I64(b) => fin!(b),
            Col::U8(b) => fin!(b),
            Col::U16(b) => fin!(b),
            Col::U32(b) => fin!(b),
            Col::U64(b) => fin!(b),
            Col::F32(b) => fin!(b),
            Col::F64(b) => fin!(b),
            Col::Str(b) => fin!(b),
            Col::Bin(b) => fin!(b),
            Col::Ts(b) => fin!(b),
            Col::Date(b) => fin!(b),
        }
    }
}

/// One partition's rows that are not yet in Parquet.
#[derive(Debug)]
pub struct PartitionBuffer {
    schema: SchemaRef,
    cols: Vec<Col>,
    active_rows: usize,
    sealed: Vec<Chunk>,
    /// How many of the last sealed chunks are small ones, to be merged.
    small: usize,
    /// Rows held (sealed and active).
    pub rows: usize,
    /// Approximate bytes held.
    pub bytes: usize,
    /// LSN of the first record applied here (0 when empty).
    pub min_lsn: u64,
    /// LSN of the last record applied here.
    pub max_lsn: u64,
    /// When the first row arrived.
    pub since: Option<Instant>,
    /// Time range of the rows (microseconds), when the table has a time column.
    pub time_range: Option<(i64, i64)>,
    /// Where each LSN's rows start, `(lsn, rows before it, arrival)`, kept only by buffers
    /// made with [`PartitionBuffer::with_marks`]: what lets [`PartitionBuffer::drop_through`]
    /// remove the rows a shard's flush persisted while later ones stay (and their age go
    /// with them).
    marks: Option<std::collections::VecDeque<(u64, usize, Instant)>>,
}

impl PartitionBuffer {
    /// An empty buffer for a table of this schema and these column types. Builders start
    /// with no capacity, so idle partitions cost almost nothing.
    pub fn new(schema: SchemaRef, types: &[ColumnType]) -> Self {
        Self {
            schema,
            cols: types.iter().map(|t| Col::new(*t)).collect(),
            active_rows: 0,
            sealed: Vec::new(),
            small: 0,
            rows: 0,
            bytes: 0,
            min_lsn: 0,
            max_lsn: 0,
            since: None,
            time_range: None,
            marks: None,
        }
    }

    /// An empty buffer that remembers which rows each LSN added (a shard's rows in a
    /// cluster, where the LSN is the shard's raft index).
    pub fn with_marks(schema: SchemaRef, types: &[ColumnType]) -> Self {
        Self {
            marks: Some(Default::default()),
            ..Self::new(schema, types)
        }
    }

    /// Removes the rows of every LSN up to `lsn` (they are persisted) and returns the
    /// approximate bytes they held. Only for buffers made [`PartitionBuffer::with_marks`]
    /// (others drop everything when `lsn` covers their last LSN, and nothing otherwise).
    pub fn drop_through(&mut self, lsn: u64) -> usize {
        if self.rows == 0 || lsn < self.min_lsn {
            return 0;
        }
        let keep_from = match &mut self.marks {
            Some(marks) => {
                let cut = marks.partition_point(|(l, ..)| *l <= lsn);
                let first_kept = marks.get(cut).map_or(self.rows, |m| m.1);
                marks.drain(..cut);
                for m in marks.iter_mut() {
                    m.1 -= first_kept;
                }
                first_kept
            }
            None if lsn >= self.max_lsn => self.rows,
            None => 0,
        };
        if keep_from == 0 {
            return 0;
        }
        if keep_from == self.rows {
            let bytes = self.bytes;
            self.seal();
            self.sealed.clear();
            self.reset();
            return bytes;
        }
        self.seal();
        let mut skip = keep_from;
        let mut kept = Vec::with_capacity(self.sealed.len());
        for c in self.sealed.drain(..) {
            let n = c.batch.num_rows();
            if skip >= n {
                skip -= n;
                continue;
            }
            kept.push(match skip {
                0 => c,
                // Positions shift: the rest is indexed afresh.
                _ => Chunk::sealed(c.batch.slice(skip, n - skip)),
            });
            skip = 0;
        }
        self.sealed = kept;
        // The small chunks left at the end still merge (the first one may be cut short).
        let small = self.sealed.iter().rev();
        self.small = small.take_while(|c| c.batch.num_rows() < SEAL_ROWS).count();
        // Bytes are kept per buffer, not per row: the dropped rows' share.
        let bytes = self.bytes * keep_from / self.rows;
        self.bytes -= bytes;
        self.rows -= keep_from;
        let first = self.marks.as_ref().and_then(|m| m.front().copied());
        self.min_lsn = first.map_or(self.max_lsn, |m| m.0);
        // The buffer is as old as its oldest kept row, not the dropped ones.
        if let Some((_, _, arrived)) = first {
            self.since = Some(arrived);
        }
        bytes
    }

    /// Where each LSN's rows start, `(lsn, rows before it)`, in order: empty for a buffer
    /// made without marks.
    pub fn lsn_starts(&self) -> Vec<(u64, u64)> {
        let marks = self.marks.iter().flatten();
        marks.map(|(lsn, at, _)| (*lsn, *at as u64)).collect()
    }

    /// Widens the buffer after `ALTER TABLE ... ADD COLUMN`: new columns are NULL for the
    /// rows already held.
    pub fn widen(&mut self, schema: SchemaRef, types: &[ColumnType]) {
        if types.len() <= self.cols.len() {
            return;
        }
        for t in &types[self.cols.len()..] {
            let mut c = Col::new(*t);
            for _ in 0..self.active_rows {
                c.push_null();
            }
            self.cols.push(c);
        }
        self.schema = schema;
    }

    /// Appends one row (shorter rows, written before an ADD COLUMN, are padded with NULL);
    /// returns the bytes it added.
    pub fn push(&mut self, lsn: u64, row: &[Value], time_col: Option<usize>) -> usize {
        for (i, col) in self.cols.iter_mut().enumerate() {
            match row.get(i) {
                Some(v) => col.push(v),
                None => col.push_null(),
            }
        }
        let size = row.iter().map(Value::size).sum::<usize>();
        self.bytes += size;
        if self.min_lsn == 0 {
            self.min_lsn = lsn;
            self.since = Some(Instant::now());
        }
        if let Some(marks) = &mut self.marks
            && marks.back().is_none_or(|m| m.0 != lsn)
        {
            marks.push_back((lsn, self.rows, Instant::now()));
        }
        self.max_lsn = lsn;
        if let Some(t) = time_col.and_then(|i| row.get(i)).and_then(Value::as_micros) {
            self.time_range = Some(match self.time_range {
                Some((lo, hi)) => (lo.min(t), hi.max(t)),
                None => (t, t),
            });
        }
        self.rows += 1;
        self.active_rows += 1;
        if self.active_rows >= TAIL_ROWS {
            self.seal();
        }
        size
    }

    fn seal(&mut self) {
        if self.active_rows == 0 {
            return;
        }
        let arrays = self.cols.iter_mut().map(|c| c.finish()).collect();
        let batch =
            RecordBatch::try_new(self.schema.clone(), arrays).expect("builders match schema");
        self.sealed.push(Chunk::sealed(batch));
        self.active_rows = 0;
        self.small += 1;
        if self.small >= SEAL_ROWS / TAIL_ROWS {
            let at = self.sealed.len() - self.small;
            // Widened: an ADD COLUMN may have come between them.
            let smalls: Vec<RecordBatch> = (self.sealed.drain(at..))
                .map(|c| widen(&c.batch, &self.schema))
                .collect();
            let merged = datafusion::arrow::compute::concat_batches(&self.schema, &smalls)
                .expect("chunks of one schema");
            self.sealed.push(Chunk::sealed(merged));
            self.small = 0;
        }
    }

    /// The rows as batches of `schema` (the table's current schema), without taking them.
    pub fn snapshot(&self, schema: &SchemaRef) -> Vec<RecordBatch> {
        self.chunks(schema).into_iter().map(|c| c.batch).collect()
    }

    /// The rows as chunks of `schema`, for a scan: the sealed ones with their indexes, the
    /// unsealed tail copied.
    pub fn chunks(&self, schema: &SchemaRef) -> Vec<Chunk> {
        let mut out: Vec<Chunk> = (self.sealed.iter())
            .map(|c| c.with_batch(widen(&c.batch, schema)))
            .collect();
        if self.active_rows > 0 {
            let batch = self.active_clone();
            out.push(Chunk::plain(widen(&batch, schema)));
        }
        out
    }

    fn active_clone(&self) -> RecordBatch {
        // Builders' `finish_cloned` takes `&self`.
        let arrays: Vec<ArrayRef> = self
            .cols
            .iter()
            .map(|c| match c {
                Col::Bool(b) => Arc::new(b.finish_cloned()) as ArrayRef,
                Col::I8(b) => Arc::new(b.finish_cloned()),
                Col::I16(b) => Arc::new(b.finish_cloned()),
                Col::I32(b) => Arc::new(b.finish_cloned()),
                Col::I64(b) => Arc::new(b.finish_cloned()),
                Col::U8(b) => Arc::new(b.finish_cloned()),
                Col::U16(b) => Arc::new(b.finish_cloned()),
                Col::U32(b) => Arc::new(b.finish_cloned()),
                Col::U64(b) => Arc::new(b.finish_cloned()),
                Col::F32(b) => Arc::new(b.finish_cloned()),
                Col::F64(b) => Arc::new(b.finish_cloned()),
                Col::Str(b) => Arc::new(b.finish_cloned()),
                Col::Bin(b) => Arc::new(b.finish_cloned()),
                Col::Ts(b) => Arc::new(b.finish_cloned()),
                Col::Date(b) => Arc::new(b.finish_cloned()),
            })
            .collect();
        RecordBatch::try_new(self.schema.clone(), arrays).expect("builders match schema")
    }

    /// Takes every row out (for a flush), leaving the buffer empty.
    pub fn take(&mut self) -> Vec<Chunk> {
        self.seal();
        let schema = self.schema.clone();
        let sealed = std::mem::take(&mut self.sealed);
        self.reset();
        sealed
            .into_iter()
            .map(|c| c.with_batch(widen(&c.batch, &schema)))
            .collect()
    }

    /// Empty again (the sealed batches already taken or dropped).
    fn reset(&mut self) {
        self.small = 0;
        self.rows = 0;
        self.bytes = 0;
        self.min_lsn = 0;
        self.since = None;
        self.time_range = None;
        if let Some(m) = &mut self.marks {
            m.clear();
        }
    }

    /// True when no rows are held.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

/// Fits a batch to `schema`: pads a batch written before columns were added with NULL
/// columns, and drops columns added after `schema` was taken (a query planned before an
/// ALTER sees the table as it was).
pub(crate) fn widen(batch: &RecordBatch, schema: &SchemaRef) -> RecordBatch {
    let want = schema.fields().len();
    if batch.num_columns() == want {
        return batch.clone();
    }
    let mut cols = batch.columns().to_vec();
    cols.truncate(want);
    for f in &schema.fields()[cols.len()..] {
        cols.push(new_null_array(f.data_type(), batch.num_rows()));
    }
    RecordBatch::try_new(schema.clone(), cols).expect("padded batch matches schema")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn rows_seal_widen_and_take() {
        let types = [ColumnType::Timestamp, ColumnType::Float64];
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", types[0].arrow(), true),
            Field::new("v", types[1].arrow(), true),
        ]));
        let mut b = PartitionBuffer::new(schema.clone(), &types);
        for i in 0..(SEAL_ROWS as i64 + 10) {
            b.push(
                i as u64 + 1,
                &[Value::Timestamp(i), Value::Float(i as f64)],
                Some(0),
            );
        }
        let snap = b.snapshot(&schema);
        assert_eq!(
            snap.iter().map(|b| b.num_rows()).sum::<usize>(),
            SEAL_ROWS + 10
        );
        assert_eq!(b.time_range, Some((0, SEAL_ROWS as i64 + 9)));
        // Small chunks were merged into one; only the last 10 rows are copied by a scan.
        let sizes = |b: &PartitionBuffer, s: &SchemaRef| -> Vec<usize> {
            b.chunks(s).iter().map(|c| c.batch.num_rows()).collect()
        };
        assert_eq!(sizes(&b, &schema), vec![SEAL_ROWS, 10]);
        let types3 = [
            ColumnType::Timestamp,
            ColumnType::Float64,
            ColumnType::String,
        ];
        let mut fields = schema.fields().to_vec();
        fields.push(Arc::new(Field::new("s", types3[2].arrow(), true)));
        let schema3 = Arc::new(Schema::new(fields));
        b.widen(schema3.clone(), &types3);
        b.push(
            99_999,
            &[
                Value::Timestamp(1),
                Value::Float(1.0),
                Value::Str("x".into()),
            ],
            Some(0),
        );
        let snap = b.snapshot(&schema3);
        assert!(snap.iter().all(|b| b.num_columns() == 3));
        assert_eq!((b.min_lsn, b.max_lsn), (1, 99_999));
        let taken = b.take();
        assert_eq!(
            taken.iter().map(|c| c.batch.num_rows()).sum::<usize>(),
            SEAL_ROWS + 11
        );
        assert!(b.is_empty() && b.snapshot(&schema3).is_empty());

        // An ADD COLUMN between small chunks: they merge widened.
        let mut b = PartitionBuffer::new(schema.clone(), &types);
        let row = |i: i64| {
            [
                Value::Timestamp(i),
                Value::Float(0.0),
                Value::Str("y".into()),
            ]
        };
        for i in 0..TAIL_ROWS as i64 {
            b.push(i as u64 + 1, &row(i)[..2], Some(0));
        }
        b.widen(schema3.clone(), &types3);
        for i in TAIL_ROWS as i64..SEAL_ROWS as i64 + 1 {
            b.push(i as u64 + 1, &row(i), Some(0));
        }
        assert_eq!(sizes(&b, &schema3), vec![SEAL_ROWS, 1]);
        let chunks = b.chunks(&schema3);
        let s = chunks[0].batch.column(2);
        assert_eq!((s.null_count(), s.len()), (TAIL_ROWS, SEAL_ROWS));
    }

    #[test]
    fn drop_through_removes_the_rows_of_persisted_lsns_only() {
        let types = [ColumnType::Int64];
        let schema = Arc::new(Schema::new(vec![Field::new("v", types[0].arrow(), true)]));
        let mut b = PartitionBuffer::with_marks(schema.clone(), &types);
        // LSN 10 adds rows 0..5000, LSN 11 rows 5000..9000 (crossing a seal), LSN 12 one row.
        for i in 0..5000 {
            b.push(10, &[Value::Int(i)], None);
        }
        let eleven = Instant::now();
        let rows = (5000..9000).map(|i| (11, i));
        for (lsn, i) in rows.chain([(12, 9000)]) {
            b.push(lsn, &[Value::Int(i)], None);
        }
        let values = |b: &PartitionBuffer| -> Vec<i64> {
            (b.snapshot(&schema).iter())
                .flat_map(|batch| {
                    let a = batch.column(0).as_any();
                    let a = a.downcast_ref::<datafusion::arrow::array::Int64Array>();
                    a.expect("int64").values().to_vec()
                })
                .collect()
        };
        assert_eq!(b.drop_through(9), 0, "nothing that old");
        assert!(b.drop_through(10) > 0);
        assert_eq!(values(&b), (5000..=9000).collect::<Vec<_>>());
        assert_eq!((b.rows, b.min_lsn), (4001, 11));
        assert!(
            b.since.is_some_and(|t| t >= eleven),
            "the buffer's age is its oldest kept row's"
        );
        b.push(13, &[Value::Int(9001)], None);
        b.drop_through(12);
        assert_eq!(values(&b), vec![9001]);
        assert_eq!(b.min_lsn, 13);
        b.drop_through(13);
        assert!(b.is_empty() && b.bytes == 0);
        b.push(14, &[Value::Int(1)], None);
        assert_eq!((b.rows, b.min_lsn), (1, 14));
    }
}

//! Group synopses: for the rows of a Parquet file (or of a buffered chunk), the synopsis of
//! every column per combination of values of its few-valued columns (a vendor, a payment
//! type, a passenger count, a device's site). They answer `GROUP BY` aggregates over such
//! columns (`select payment_type, avg(passenger_count) from trips group by payment_type`)
//! by adding a few hundred synopses per file instead of reading its rows
//! ([`crate::query::optimizer`]).
//!
//! A file's key columns are chosen when it is written: the columns of string, integer or
//! boolean type with at most [`KEY_DISTINCT`] distinct values in the file, fewest first, as
//! long as the product of their counts stays within [`MAX_GROUPS`] and a sixteenth of the
//! file's rows (so a group synopsis stays much smaller than the rows it stands for; a small
//! file may always have [`MIN_GROUPS`]).
//! Grouping by a column that is not a key of every file, or filtering by one, is left to
//! the scan.

use crate::query::synopsis::{ColumnSynopsis, Num};
use crate::store::chunk::decide;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use datafusion::arrow::record_batch::RecordBatch;
use std::collections::HashMap;
use std::sync::Arc;

use crate::store::chunk::RowFilter;

/// Distinct values a column may have in a file and still be a key column.
const KEY_DISTINCT: usize = 64;
/// Most combinations of key values a file keeps synopses for.
const MAX_GROUPS: usize = 1024;
/// A file keeps at most one group per this many rows.
const ROWS_PER_GROUP: usize = 16;
/// Combinations a file may always keep, however few its rows.
const MIN_GROUPS: usize = 16;
/// Combinations counted in a dense table (above: a hash map).
const DENSE: u64 = 1 << 16;

/// One value of a key column.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// NULL: a group of its own, as in SQL's GROUP BY.
    Null,
    Bool(bool),
    /// Every integer type.
    Int(i128),
    /// Shared: a value is in many groups and answers.
    Str(Arc<str>),
}

/// The rows holding one combination of key values.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// One value per key column.
    pub key: Vec<Key>,
    pub rows: u64,
    /// Every column's synopsis over these rows (key columns included).
    pub synopsis: Vec<ColumnSynopsis>,
}

/// Group synopses of some rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Groups {
    /// The key columns (positions in the table), ascending.
    pub keys: Vec<usize>,
    /// Ordered by key.
    pub groups: Vec<Group>,
}

/// Whether a column of type `ty` can be a key column.
pub(crate) fn keyable(ty: &DataType) -> bool {
    ty.is_integer() || matches!(ty, DataType::Utf8 | DataType::Boolean | DataType::Date32)
}

/// A [`Key`] as it travels between nodes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum WireKey {
    Null,
    Bool(bool),
    Int(i128),
    Str(String),
}

impl From<&Key> for WireKey {
    fn from(k: &Key) -> Self {
        match k {
            Key::Null => Self::Null,
            Key::Bool(b) => Self::Bool(*b),
            Key::Int(i) => Self::Int(*i),
            Key::Str(s) => Self::Str(s.to_string()),
        }
    }
}

impl From<WireKey> for Key {
    fn from(k: WireKey) -> Self {
        match k {
            WireKey::Null => Self::Null,
            WireKey::Bool(b) => Self::Bool(b),
            WireKey::Int(i) => Self::Int(i),
            WireKey::Str(s) => Self::Str(s.into()),
        }
    }
}

/// What a `GROUP BY` groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GroupKey {
    /// A column's values.
    Column(usize),
    /// The UTC day of a microsecond timestamp column (`date(ts)`): known for a group whose
    /// times all fall in one day (a file of a daily or finer partition).
    Day(usize),
}

const MICROS_PER_DAY: i128 = 86_400_000_000;

/// The day of every row of a group whose time column has synopsis `syn`: NULL when every
/// time is NULL, `None` when the rows span days or some times are NULL.
fn day_of(syn: &ColumnSynopsis, rows: u64) -> Option<Key> {
    if syn.count == 0 {
        return Some(Key::Null);
    }
    match (syn.count == rows, syn.min?, syn.max?) {
        (true, Num::Int(lo), Num::Int(hi)) => {
            let day = lo.div_euclid(MICROS_PER_DAY);
            (day == hi.div_euclid(MICROS_PER_DAY)).then_some(Key::Int(day))
        }
        _ => None,
    }
}

/// A column's values as small codes, with the value of each code.
struct Coded {
    codes: Vec<u32>,
    values: Vec<Key>,
}

impl Coded {
    /// `None` when the column cannot be a key (floats, times, binary) or has more than
    /// `limit` distinct values (NULL counts as one).
    fn of(a: &ArrayRef, limit: usize) -> Option<Self> {
        fn code<T: std::hash::Hash + Eq>(
            values: impl Iterator<Item = Option<T>>,
            len: usize,
            limit: usize,
            key: impl Fn(T) -> Key,
        ) -> Option<Coded> {
            let mut seen: foldhash::HashMap<Option<T>, u32> = HashMap::default();
            let mut out = Coded {
                codes: Vec::with_capacity(len),
                values: Vec::new(),
            };
            for v in values {
                let next = seen.len() as u32;
                let code = match seen.get(&v) {
                    Some(c) => *c,
                    None if seen.len() >= limit => return None,
                    None => {
                        seen.insert(v, next);
                        next
                    }
                };
                out.codes.push(code);
            }
            let mut values: Vec<(u32, Key)> = (seen.into_iter())
                .map(|(v, c)| (c, v.map_or(Key::Null, &key)))
                .collect();
            values.sort_unstable_by_key(|(c, _)| *c);
            out.values = values.into_iter().map(|(_, k)| k).collect();
            Some(out)
        }
        macro_rules! ints {
            ($t:ty) => {
                code(a.as_primitive::<$t>().iter(), a.len(), limit, |v| {
                    Key::Int(i128::from(v))
                })
            };
        }
        match a.data_type() {
            DataType::Utf8 => code(a.as_string::<i32>().iter(), a.len(), limit, |s| {
                Key::Str(Arc::from(s))
            }),
            DataType::Boolean => code(a.as_boolean().iter(), a.len(), limit, Key::Bool),
            DataType::Int8 => ints!(Int8Type),
            DataType::Int16 => ints!(Int16Type),
            DataType::Int32 => ints!(Int32Type),
            DataType::Int64 => ints!(Int64Type),
            DataType::UInt8 => ints!(UInt8Type),
            DataType::UInt16 => ints!(UInt16Type),
            DataType::UInt32 => ints!(UInt32Type),
            DataType::UInt64 => ints!(UInt64Type),
            DataType::Date32 => ints!(Date32Type),
            _ => None,
        }
    }
}

impl Groups {
    /// The group synopses of a file being written, over key columns chosen by their
    /// distinct values (see the module docs); `None` when no column qualifies.
    pub fn of(batch: &RecordBatch) -> Option<Self> {
        let limit = MAX_GROUPS
            .min(batch.num_rows() / ROWS_PER_GROUP)
            .max(MIN_GROUPS);
        let mut candidates: Vec<(usize, Coded)> = (0..batch.num_columns())
            .filter_map(|c| Some((c, Coded::of(batch.column(c), KEY_DISTINCT)?)))
            .collect();
        // Fewest values first; columns in schema order among equals.
        candidates.sort_by_key(|(c, coded)| (coded.values.len(), *c));
        let mut product = 1;
        let mut chosen = Vec::new();
        for (c, coded) in candidates {
            if product * coded.values.len() > limit {
                break;
            }
            product *= coded.values.len();
            chosen.push((c, coded));
        }
        if chosen.is_empty() {
            return None;
        }
        chosen.sort_by_key(|(c, _)| *c);
        let (keys, coded): (Vec<usize>, Vec<Coded>) = chosen.into_iter().unzip();
        let groups = grouped(batch, &coded, None, |_| true)?;
        Some(Self { keys, groups })
    }

    /// The groups of the rows of `batch` at `rows` (all when `None`) by the values of
    /// `keys` (arrays as long as the batch: its columns, or values made from them), with the
    /// synopses of `columns` only (the others left empty); `None` when a key cannot be one,
    /// or there are too many combinations.
    pub fn by(
        batch: &RecordBatch,
        keys: &[ArrayRef],
        rows: Option<&[u32]>,
        columns: &[usize],
    ) -> Option<Vec<Group>> {
        let coded = (keys.iter())
            .map(|a| Coded::of(a, usize::MAX))
            .collect::<Option<Vec<_>>>()?;
        grouped(batch, &coded, rows, |c| columns.contains(&c))
    }
}

/// First bytes of an encoded [`Groups`] (format 1).
const MAGIC: &[u8] = b"SLGRP1";

impl Groups {
    /// The bytes of a file's sidecar object: key columns, then per group its key, rows and
    /// synopses (integers as LEB128 varints, zigzagged when signed; floats as 8 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let mut uint = |out: &mut Vec<u8>, mut v: u128| loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        };
        let int = |out: &mut Vec<u8>, v: i128, uint: &mut dyn FnMut(&mut Vec<u8>, u128)| {
            uint(out, ((v << 1) ^ (v >> 127)) as u128)
        };
        uint(&mut out, self.keys.len() as u128);
        for k in &self.keys {
            uint(&mut out, *k as u128);
        }
        uint(&mut out, self.groups.len() as u128);
        for g in &self.groups {
            for k in &g.key {
                match k {
                    Key::Null => out.push(0),
                    Key::Bool(b) => out.push(1 + u8::from(*b)),
                    Key::Int(i) => {
                        out.push(3);
                        int(&mut out, *i, &mut uint);
                    }
                    Key::Str(s) => {
                        out.push(4);
                        uint(&mut out, s.len() as u128);
                        out.extend_from_slice(s.as_bytes());
                    }
                }
            }
            uint(&mut out, u128::from(g.rows));
            uint(&mut out, g.synopsis.len() as u128);
            for syn in &g.synopsis {
                uint(&mut out, u128::from(syn.count));
                let tag = |n: Option<Num>| match n {
                    None => 0u8,
                    Some(Num::Int(_)) => 1,
                    Some(Num::Float(_)) => 2,
                };
                out.push(
                    tag(syn.sum)
                        | tag(syn.min) << 2
                        | tag(syn.max) << 4
                        | u8::from(syn.ordered) << 6,
                );
                for n in [syn.sum, syn.min, syn.max].into_iter().flatten() {
                    match n {
                        Num::Int(i) => int(&mut out, i, &mut uint),
                        Num::Float(f) => out.extend_from_slice(&f.to_le_bytes()),
                    }
                }
            }
        }
        out
    }

    /// The groups [`Groups::encode`] wrote, or `None` when the bytes are not such (a torn or
    /// foreign object: the file is then answered by the scan).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut at = bytes.strip_prefix(MAGIC)?;
        let mut byte = || -> Option<u8> {
            let (b, rest) = at.split_first()?;
            at = rest;
            Some(*b)
        };
        fn uint(byte: &mut dyn FnMut() -> Option<u8>) -> Option<u128> {
            let mut v = 0u128;
            for shift in (0..128).step_by(7) {
                let b = byte()?;
                v |= u128::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    return Some(v);
                }
            }
            None
        }
        let int = |byte: &mut dyn FnMut() -> Option<u8>| {
            let v = uint(byte)?;
            Some((v >> 1) as i128 ^ -((v & 1) as i128))
        };
        let small = |byte: &mut dyn FnMut() -> Option<u8>| usize::try_from(uint(byte)?).ok();
        let keys: Vec<usize> = (0..small(&mut byte)?)
            .map(|_| small(&mut byte))
            .collect::<Option<_>>()?;
        let n = small(&mut byte)?;
        let mut groups = Vec::with_capacity(n.min(MAX_GROUPS));
        for _ in 0..n {
            let mut key = Vec::with_capacity(keys.len());
            for _ in &keys {
                key.push(match byte()? {
                    0 => Key::Null,
                    1 => Key::Bool(false),
                    2 => Key::Bool(true),
                    3 => Key::Int(int(&mut byte)?),
                    4 => {
                        let len = small(&mut byte)?;
                        let text: Vec<u8> = (0..len).map(|_| byte()).collect::<Option<_>>()?;
                        Key::Str(Arc::from(String::from_utf8(text).ok()?))
                    }
                    _ => return None,
                });
            }
            let rows = u64::try_from(uint(&mut byte)?).ok()?;
            let columns = small(&mut byte)?;
            let mut synopsis = Vec::with_capacity(columns.min(4096));
            for _ in 0..columns {
                let count = u64::try_from(uint(&mut byte)?).ok()?;
                let tags = byte()?;
                let mut num = |tag: u8| -> Option<Option<Num>> {
                    Some(match tag & 3 {
                        0 => None,
                        1 => Some(Num::Int(int(&mut byte)?)),
                        2 => {
                            let b: Vec<u8> = (0..8).map(|_| byte()).collect::<Option<_>>()?;
                            Some(Num::Float(f64::from_le_bytes(b.try_into().ok()?)))
                        }
                        _ => return None,
                    })
                };
                let (sum, min, max) = (num(tags)?, num(tags >> 2)?, num(tags >> 4)?);
                synopsis.push(ColumnSynopsis {
                    count,
                    sum,
                    min,
                    max,
                    ordered: tags & 0x40 != 0,
                });
            }
            groups.push(Group {
                key,
                rows,
                synopsis,
            });
        }
        at.is_empty().then_some(Self { keys, groups })
    }
}

/// The groups of the rows at `rows` (all when `None`) by the coded keys, each with the
/// synopses of the columns `wanted` picks, ordered by key.
fn grouped(
    batch: &RecordBatch,
    coded: &[Coded],
    rows: Option<&[u32]>,
    wanted: impl Fn(usize) -> bool,
) -> Option<Vec<Group>> {
    let mut radix: u64 = 1;
    for c in coded {
        radix = radix.checked_mul(c.values.len().max(1) as u64)?;
    }
    let id = |r: usize| {
        (coded.iter()).fold(0u64, |id, c| {
            id * c.values.len() as u64 + u64::from(c.codes[r])
        })
    };
    // Each row's group, in order of first appearance.
    let mut members: Vec<Vec<u32>> = Vec::new();
    let mut dense: Vec<u32> = Vec::new();
    let mut sparse: foldhash::HashMap<u64, u32> = HashMap::default();
    if radix <= DENSE {
        dense = vec![u32::MAX; radix as usize];
    }
    let mut place = |r: u32| {
        let i = id(r as usize);
        let slot = match radix <= DENSE {
            true => &mut dense[i as usize],
            false => sparse.entry(i).or_insert(u32::MAX),
        };
        if *slot == u32::MAX {
            *slot = members.len() as u32;
            members.push(Vec::new());
        }
        members[*slot as usize].push(r);
    };
    match rows {
        Some(rows) => rows.iter().for_each(|r| place(*r)),
        None => (0..batch.num_rows() as u32).for_each(place),
    }
    let mut groups: Vec<Group> = (members.iter())
        .map(|m| Group {
            key: (coded.iter())
                .map(|c| c.values[c.codes[m[0] as usize] as usize].clone())
                .collect(),
            rows: m.len() as u64,
            synopsis: Vec::with_capacity(batch.num_columns()),
        })
        .collect();
    // One gather per column, the rows of each group together.
    let at = UInt32Array::from(members.concat());
    for (c, column) in batch.columns().iter().enumerate() {
        if !wanted(c) {
            groups
                .iter_mut()
                .for_each(|g| g.synopsis.push(ColumnSynopsis::default()));
            continue;
        }
        if !ColumnSynopsis::summed(column.data_type()) {
            // Only counted: no gather (of text, say) for that.
            let nulls = column.null_count() > 0;
            for (g, m) in groups.iter_mut().zip(&members) {
                let count = match nulls {
                    true => m.iter().filter(|r| column.is_valid(**r as usize)).count(),
                    false => m.len(),
                };
                g.synopsis.push(ColumnSynopsis {
                    count: count as u64,
                    ..Default::default()
                });
            }
            continue;
        }
        let taken = take(column.as_ref(), &at, None).ok()?;
        let mut offset = 0;
        for g in &mut groups {
            let n = g.rows as usize;
            g.synopsis.push(ColumnSynopsis::of(&taken.slice(offset, n)));
            offset += n;
        }
    }
    groups.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    Some(groups)
}

/// A `GROUP BY` answer being added up: per combination of values of the grouped columns,
/// the rows and the synopses of the aggregated columns.
#[derive(Debug)]
pub struct Answer {
    /// What it groups by.
    pub keys: Vec<GroupKey>,
    /// The aggregated columns.
    pub columns: Vec<usize>,
    pub groups: foldhash::HashMap<Vec<Key>, (u64, Vec<ColumnSynopsis>)>,
    /// Rows of sealed chunks that may still be grouped from their rows (and kept) while
    /// adding up this answer...
    pub budget: u64,
    /// ... and whether a chunk was left because the budget ran out.
    pub over_budget: bool,
}

impl Answer {
    pub fn new(keys: Vec<GroupKey>, columns: Vec<usize>) -> Self {
        Self {
            keys,
            columns,
            groups: Default::default(),
            budget: u64::MAX,
            over_budget: false,
        }
    }

    /// Adds the groups of `groups` that `filter`'s equalities and number comparisons admit
    /// (its time bounds are the caller's), or nothing and `false` when that cannot be told
    /// group by group: a grouped or equality column that is not a key of `groups`, or a
    /// comparison that a group's synopsis does not decide, a group whose rows span days
    /// for a [`GroupKey::Day`].
    pub fn add(&mut self, groups: &Groups, filter: &RowFilter) -> bool {
        let at = |c: usize| groups.keys.iter().position(|k| *k == c);
        let Some(keys) = (self.keys.iter())
            .map(|k| match *k {
                GroupKey::Column(c) => Some(GroupKey::Column(at(c)?)),
                day => Some(day),
            })
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let Some(equal) = (filter.equal.iter())
            .map(|(c, values)| Some((at(*c)?, values)))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let none = ColumnSynopsis::default();
        // Each admitted group and its key here, all decided before any is added (a group
        // that cannot be decided leaves the answer as it was); the keys side by side.
        let mut admitted = Vec::with_capacity(groups.groups.len());
        let mut admitted_keys = Vec::with_capacity(groups.groups.len() * keys.len());
        'groups: for g in &groups.groups {
            for (k, values) in &equal {
                let Key::Str(s) = &g.key[*k] else {
                    continue 'groups;
                };
                if !values.iter().any(|v| v.as_str() == &**s) {
                    continue 'groups;
                }
            }
            for &(c, op, v) in &filter.value {
                match decide(g.synopsis.get(c).unwrap_or(&none), g.rows, op, v) {
                    Some(true) => {}
                    Some(false) => continue 'groups,
                    None => return false,
                }
            }
            for k in &keys {
                let key = match *k {
                    GroupKey::Column(at) => Some(g.key[at].clone()),
                    GroupKey::Day(c) => day_of(g.synopsis.get(c).unwrap_or(&none), g.rows),
                };
                let Some(key) = key else {
                    return false;
                };
                admitted_keys.push(key);
            }
            admitted.push(g);
        }
        let width = keys.len();
        for (i, g) in admitted.into_iter().enumerate() {
            let key = &admitted_keys[i * width..(i + 1) * width];
            self.add_group(key, g.rows, |_, c| g.synopsis.get(c).unwrap_or(&none));
        }
        true
    }

    /// Adds groups keyed as this answer is ([`Groups::by`] by its keys).
    pub fn add_rows(&mut self, groups: Vec<Group>) {
        let none = ColumnSynopsis::default();
        for mut g in groups {
            let key = std::mem::take(&mut g.key);
            self.add_group(key, g.rows, |_, c| g.synopsis.get(c).unwrap_or(&none));
        }
    }

    /// Adds groups of another answer with the same keys and columns (another node's).
    pub fn add_answered(&mut self, groups: &[crate::store::remote::SummaryGroup]) {
        let none = ColumnSynopsis::default();
        for (key, rows, syn) in groups {
            let key: Vec<Key> = key.iter().cloned().map(Key::from).collect();
            self.add_group(key, *rows, |i, _| syn.get(i).unwrap_or(&none));
        }
    }

    /// Adds `rows` rows of group `key` (a borrowed key is copied only for a group not met
    /// before; an owned one is moved in); `syn` gives the synopsis of each of this answer's
    /// columns (by its place here and its position in the table).
    fn add_group<'a, K: AsRef<[Key]> + Into<Vec<Key>>>(
        &mut self,
        key: K,
        rows: u64,
        syn: impl Fn(usize, usize) -> &'a ColumnSynopsis,
    ) {
        let columns = &self.columns;
        let add = |n: &mut u64, out: &mut [ColumnSynopsis]| {
            *n += rows;
            for (i, (o, c)) in out.iter_mut().zip(columns).enumerate() {
                o.merge(syn(i, *c));
            }
        };
        if let Some((n, out)) = self.groups.get_mut(key.as_ref()) {
            return add(n, out);
        }
        let (mut n, mut out) = (0, vec![ColumnSynopsis::default(); columns.len()]);
        add(&mut n, &mut out);
        self.groups.insert(key.into(), (n, out));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int8Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn batch(n: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("site", DataType::Utf8, true),
            Field::new("kind", DataType::Int8, true),
            Field::new("id", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
        ]));
        let site: ArrayRef = Arc::new(StringArray::from_iter(
            (0..n).map(|i| (i % 7 != 0).then(|| ["a", "b", "c"][i % 3])),
        ));
        let kind: ArrayRef = Arc::new(Int8Array::from_iter_values((0..n).map(|i| (i % 5) as i8)));
        let id: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("d{i}")),
        ));
        let v: ArrayRef = Arc::new(Float64Array::from_iter_values(
            (0..n).map(|i| i as f64 * 0.5),
        ));
        RecordBatch::try_new(schema, vec![site, kind, id, v]).unwrap()
    }

    /// Each group's synopses equal those of its rows picked one by one.
    #[test]
    fn groups_hold_the_synopses_of_their_rows() {
        let b = batch(2_000);
        let g = Groups::of(&b).unwrap();
        // `id` has a value per row: not a key.
        assert_eq!(g.keys, vec![0, 1]);
        assert_eq!(g.groups.len(), 4 * 5, "three sites and NULL, five kinds");
        let mut total = 0;
        for group in &g.groups {
            let rows: Vec<u32> = (0..b.num_rows() as u32)
                .filter(|r| {
                    let r = *r as usize;
                    let site = match r % 7 {
                        0 => Key::Null,
                        _ => Key::Str(["a", "b", "c"][r % 3].into()),
                    };
                    site == group.key[0] && Key::Int((r % 5) as i128) == group.key[1]
                })
                .collect();
            assert_eq!(group.rows, rows.len() as u64);
            let at = UInt32Array::from(rows);
            for (c, syn) in group.synopsis.iter().enumerate() {
                let want = ColumnSynopsis::of(&take(b.column(c).as_ref(), &at, None).unwrap());
                assert_eq!(*syn, want, "{:?} column {c}", group.key);
            }
            total += group.rows;
        }
        assert_eq!(total, 2_000);
        // Through the sidecar's bytes and back; a torn one is refused.
        let bytes = g.encode();
        assert_eq!(Groups::decode(&bytes), Some(g.clone()));
        assert_eq!(Groups::decode(&bytes[..bytes.len() - 1]), None);
        let odd = Groups {
            keys: vec![0, 7],
            groups: vec![Group {
                key: vec![Key::Int(i128::MIN), Key::Bool(true)],
                rows: u64::MAX,
                synopsis: vec![ColumnSynopsis {
                    count: 3,
                    sum: Some(Num::Int(-5)),
                    min: Some(Num::Float(-0.0)),
                    max: Some(Num::Float(f64::INFINITY)),
                    ordered: false,
                }],
            }],
        };
        assert_eq!(Groups::decode(&odd.encode()), Some(odd));
        // Too few rows for 20 groups at 16 rows each: the site alone.
        assert_eq!(Groups::of(&batch(300)).unwrap().keys, vec![0]);
        // Chosen keys, some rows: the answer is over those rows only.
        let some = Groups::by(&b, &[b.column(2).clone()], Some(&[5, 9, 9]), &[3]).unwrap();
        assert_eq!(some.len(), 2);
        assert_eq!(some[1].rows, 2);
        assert_eq!(some[1].synopsis[3].sum, Some(Num::Float(9.0)));
        assert_eq!(some[1].synopsis[1].count, 0, "not asked for");
        assert_eq!(
            Groups::by(&b, &[b.column(3).clone()], None, &[]),
            None,
            "a float is no key"
        );
        let day = |lo: i128, hi: i128, count| ColumnSynopsis {
            count,
            min: Some(Num::Int(lo)),
            max: Some(Num::Int(hi)),
            ordered: true,
            ..Default::default()
        };
        let d = MICROS_PER_DAY;
        assert_eq!(day_of(&day(-1, 0, 2), 2), None, "two days");
        assert_eq!(day_of(&day(-d, -1, 2), 2), Some(Key::Int(-1)));
        assert_eq!(day_of(&day(3 * d, 4 * d - 1, 2), 3), None, "a NULL time");
        assert_eq!(day_of(&ColumnSynopsis::default(), 3), Some(Key::Null));
    }
}

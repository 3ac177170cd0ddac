//! What a query's filters say about a table: the partition keys they allow ([`KeyFilter`]) and the row ranges buffered chunks can skip ([`RowFilter`]).

use super::*;

/// Which partition keys can hold rows matching the filters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyFilter {
    /// Inclusive lower bound.
    pub lo: u64,
    /// Inclusive upper bound.
    pub hi: u64,
    /// When equality pinned the key to a set.
    pub only: Option<BTreeSet<u64>>,
}

impl KeyFilter {
    pub(super) fn all() -> Self {
        Self {
            lo: 0,
            hi: u64::MAX,
            only: None,
        }
    }

    /// The bounds as a `RowsRequest` names them (`lo`, `hi`, `only`).
    pub(crate) fn request_bounds(&self) -> (u64, u64, Option<Vec<u64>>) {
        let only = self.only.as_ref().map(|o| o.iter().copied().collect());
        (self.lo, self.hi, only)
    }

    /// True if partition `k` may match.
    pub(crate) fn admits(&self, k: u64) -> bool {
        k >= self.lo && k <= self.hi && self.only.as_ref().is_none_or(|s| s.contains(&k))
    }
}

/// Derives key bounds from predicates on the partition column (`col op literal`).
pub(crate) fn key_filter(def: &TableDef, filters: &[Expr]) -> KeyFilter {
    let mut f = KeyFilter::all();
    let col_name = &def.columns[def.partition_column].name;
    let ty = def.columns[def.partition_column].ty;
    for filter in filters {
        for e in split_conjunction(filter) {
            let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
                continue;
            };
            let (op, lit) = match (column_of(left), column_of(right)) {
                (Some(c), None) if c == col_name => (*op, right.as_ref()),
                (None, Some(c)) if c == col_name => match op.swap() {
                    Some(op) => (op, left.as_ref()),
                    None => continue,
                },
                _ => continue,
            };
            let Some(v) = literal_value(lit, ty) else {
                continue;
            };
            let k = def.partition.key(&v);
            if !def.partition.is_monotonic() {
                if op == Operator::Eq {
                    let set = f.only.get_or_insert_with(|| BTreeSet::from([k]));
                    set.retain(|x| *x == k);
                }
                continue;
            }
            match op {
                Operator::Eq => {
                    f.lo = f.lo.max(k);
                    f.hi = f.hi.min(k);
                }
                Operator::GtEq => f.lo = f.lo.max(k),
                Operator::LtEq => f.hi = f.hi.min(k),
                // Strict bounds: the key of the next (previous) value, so `ts < '12:00'`
                // does not read the partition that starts at 12:00.
                // (At the ends of the type no step exists; the bound is then not used.)
                Operator::Gt => {
                    if let Some(next) = step(&v, 1) {
                        f.lo = f.lo.max(def.partition.key(&next));
                    }
                }
                Operator::Lt => {
                    if let Some(prev) = step(&v, -1) {
                        f.hi = f.hi.min(def.partition.key(&prev));
                    }
                }
                _ => {}
            }
        }
    }
    f
}

/// The predicates among `filters` that chunk indexes answer ([`RowFilter`]): a string
/// column equal to a literal or in a list of literals, and a timestamp column compared with
/// one (also through the cast the planner adds to compare with `now()`).
pub(crate) fn row_filter(def: &TableDef, filters: &[Expr]) -> RowFilter {
    use crate::types::ColumnType;
    let mut f = RowFilter::default();
    let column = |e: &Expr| -> Option<(usize, ColumnType)> {
        let (name, cast) = match e {
            Expr::Column(c) => (c.name.as_str(), None),
            Expr::Cast(c) => (column_of(&c.expr)?, Some(c.field.data_type())),
            _ => return None,
        };
        let i = def.columns.iter().position(|c| c.name == name)?;
        let ty = def.columns[i].ty;
        match cast {
            // A cast that keeps every instant as it is (to compare with `now()`): not one to
            // seconds or milliseconds (which rounds), nor to another zone (which shifts); or
            // one that keeps every number (`CAST(f32 AS DOUBLE) < 0.5`, as DataFusion
            // coerces a FLOAT column compared with a literal).
            Some(to) if !instant_preserving(to) && !widening(ty, to) => None,
            _ => Some((i, ty)),
        }
    };
    let text = |e: &Expr| match e {
        Expr::Literal(ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)), _) => {
            Some(s.clone())
        }
        _ => None,
    };
    for e in filters.iter().flat_map(split_conjunction) {
        match e {
            // A short IN list, as the optimizer writes it: `d = 'a' OR d = 'b'`.
            Expr::BinaryExpr(BinaryExpr {
                op: Operator::Or, ..
            }) => {
                let mut at = None;
                let mut values = Vec::new();
                // Each side exactly one equality on the same column, nothing else (`d = 'a'
                // AND x` would read as `d = 'a'`: too wide for a synopsis).
                let all = split_binary(e, Operator::Or).into_iter().all(|d| {
                    let one = row_filter(def, std::slice::from_ref(d));
                    let single = split_conjunction(d).len() == 1;
                    match (&one.equal[..], &one.time[..], &one.value[..], single) {
                        ([(c, v)], [], [], true) if at.is_none_or(|a| a == *c) => {
                            at = Some(*c);
                            values.extend(v.iter().cloned());
                            true
                        }
                        _ => false,
                    }
                });
                if let (true, Some(c)) = (all, at) {
                    f.equal.push((c, values));
                }
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (c, op, lit) = match (column(left), column(right)) {
                    (Some(c), None) => (c, *op, right.as_ref()),
                    (None, Some(c)) => match op.swap() {
                        Some(op) => (c, op, left.as_ref()),
                        None => continue,
                    },
                    _ => continue,
                };
                match c.1 {
                    ColumnType::Int8
                    | ColumnType::Int16
                    | ColumnType::Int32
                    | ColumnType::Int64
                    | ColumnType::UInt8
                    | ColumnType::UInt16
                    | ColumnType::UInt32
                    | ColumnType::UInt64
                    | ColumnType::Float32
                    | ColumnType::Float64 => {
                        use Operator::*;
                        if let (Some(n), Lt | LtEq | Gt | GtEq | Eq) = (number(lit), op) {
                            f.value.push((c.0, op, n));
                        }
                    }
                    ColumnType::String if op == Operator::Eq => {
                        if let Some(v) = text(lit) {
                            f.equal.push((c.0, vec![v]));
                        }
                    }
                    ColumnType::Timestamp => {
                        // The literal in whole microseconds, rounded down, and whether that
                        // was exact: the bounds below are then exact in microseconds.
                        let (t, exact) = match lit {
                            Expr::Literal(ScalarValue::TimestampNanosecond(Some(v), _), _) => {
                                (v.div_euclid(1_000), v.rem_euclid(1_000) == 0)
                            }
                            _ => match literal_value(lit, c.1).and_then(|v| v.as_micros()) {
                                Some(t) => (t, true),
                                None => continue,
                            },
                        };
                        let up = |t: i64| t.saturating_add(1);
                        let (lo, hi) = match op {
                            Operator::Eq if exact => (t, t),
                            // Between two microseconds: no stored time equals it.
                            Operator::Eq => (i64::MAX, i64::MIN),
                            Operator::Gt => (up(t), i64::MAX),
                            Operator::GtEq => (if exact { t } else { up(t) }, i64::MAX),
                            Operator::Lt => (i64::MIN, if exact { t.saturating_sub(1) } else { t }),
                            Operator::LtEq => (i64::MIN, t),
                            _ => continue,
                        };
                        f.time.push((c.0, lo, hi));
                    }
                    _ => {}
                }
            }
            Expr::InList(l) if !l.negated => {
                let Some((i, ColumnType::String)) = column(&l.expr) else {
                    continue;
                };
                if let Some(values) = l.list.iter().map(text).collect::<Option<Vec<_>>>() {
                    f.equal.push((i, values));
                }
            }
            _ => {}
        }
    }
    f
}

/// Where file `f` lies against the time bounds `lo..=hi` (when `bounded`): `Some(None)`
/// wholly outside them, else `Some(Some(inside))` (whether wholly inside); `None` when the
/// bounds need a time range the file does not have.
pub(super) fn placed(f: &FileMeta, bounded: bool, lo: i64, hi: i64) -> Option<Option<bool>> {
    if !bounded {
        return Some(Some(true));
    }
    let (a, b) = (f.min_time?, f.max_time?);
    Some((b >= lo && a <= hi).then_some(lo <= a && b <= hi))
}

/// A number literal as a synopsis number (not NaN, which no synopsis bound orders).
fn number(e: &Expr) -> Option<crate::query::synopsis::Num> {
    use crate::query::synopsis::Num;
    let Expr::Literal(v, _) = e else {
        return None;
    };
    Some(match v {
        ScalarValue::Int8(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Int16(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Int32(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Int64(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt8(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt16(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt32(Some(v)) => Num::Int((*v).into()),
        ScalarValue::UInt64(Some(v)) => Num::Int((*v).into()),
        ScalarValue::Float32(Some(v)) if !v.is_nan() => Num::Float((*v).into()),
        ScalarValue::Float64(Some(v)) if !v.is_nan() => Num::Float(*v),
        _ => return None,
    })
}

/// The value one unit (1 microsecond, 1) after (`delta` 1) or before (-1) `v`; `None` past
/// the end of its type.
fn step(v: &Value, delta: i64) -> Option<Value> {
    Some(match v {
        Value::Timestamp(t) => Value::Timestamp(t.checked_add(delta)?),
        Value::Int(i) => Value::Int(i.checked_add(delta)?),
        Value::UInt(u) => Value::UInt(u.checked_add_signed(delta)?),
        _ => return None,
    })
}

/// Whether casting a number column of type `from` to `to` keeps every value (and its order).
fn widening(from: crate::types::ColumnType, to: &DataType) -> bool {
    use crate::types::ColumnType::*;
    match to {
        DataType::Float64 => matches!(from, Float32 | Float64),
        DataType::Int64 => matches!(from, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32),
        DataType::Int32 => matches!(from, Int8 | Int16 | Int32 | UInt8 | UInt16),
        DataType::Int16 => matches!(from, Int8 | Int16 | UInt8),
        DataType::UInt64 => matches!(from, UInt8 | UInt16 | UInt32 | UInt64),
        DataType::UInt32 => matches!(from, UInt8 | UInt16 | UInt32),
        DataType::UInt16 => matches!(from, UInt8 | UInt16),
        _ => false,
    }
}

/// Whether casting a microsecond timestamp without zone to `ty` keeps its instant.
fn instant_preserving(ty: &DataType) -> bool {
    use datafusion::arrow::datatypes::TimeUnit;
    match ty {
        DataType::Timestamp(TimeUnit::Microsecond | TimeUnit::Nanosecond, tz) => tz
            .as_deref()
            .is_none_or(|z| matches!(z, "+00:00" | "+00" | "UTC" | "Z" | "utc")),
        _ => false,
    }
}

fn column_of(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(c.name.as_str()),
        _ => None,
    }
}

fn literal_value(e: &Expr, ty: crate::types::ColumnType) -> Option<Value> {
    let scalar = match e {
        Expr::Literal(s, _) => s.clone(),
        Expr::Cast(c) => match c.expr.as_ref() {
            Expr::Literal(s, _) => s.cast_to(c.field.data_type()).ok()?,
            _ => return None,
        },
        _ => return None,
    };
    if scalar.is_null() {
        return None;
    }
    let micros = |s: &ScalarValue| -> Option<i64> {
        Some(match s {
            ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1_000_000)?,
            ScalarValue::TimestampMillisecond(Some(v), _) => v.checked_mul(1_000)?,
            ScalarValue::TimestampMicrosecond(Some(v), _) => *v,
            ScalarValue::TimestampNanosecond(Some(v), _) => v.div_euclid(1_000),
            ScalarValue::Date32(Some(d)) => i64::from(*d).checked_mul(86_400_000_000)?,
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => {
                return crate::ingest::decode::parse_text(crate::types::ColumnType::Timestamp, s)
                    .ok()?
                    .as_micros();
            }
            _ => return None,
        })
    };
    if ty.is_time() {
        return micros(&scalar).map(Value::Timestamp);
    }
    match scalar {
        ScalarValue::Int8(Some(v)) => Some(Value::Int(v.into())),
        ScalarValue::Int16(Some(v)) => Some(Value::Int(v.into())),
        ScalarValue::Int32(Some(v)) => Some(Value::Int(v.into())),
        ScalarValue::Int64(Some(v)) => Some(Value::Int(v)),
        ScalarValue::UInt8(Some(v)) => Some(Value::UInt(v.into())),
        ScalarValue::UInt16(Some(v)) => Some(Value::UInt(v.into())),
        ScalarValue::UInt32(Some(v)) => Some(Value::UInt(v.into())),
        ScalarValue::UInt64(Some(v)) => Some(Value::UInt(v)),
        _ => None,
    }
}

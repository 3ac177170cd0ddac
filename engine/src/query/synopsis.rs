//! Synopses: per column, the count of non-null values, their exact sum (integers in i128,
//! floats accumulated in f64) and their min and max. Every Parquet file gets one when it is
//! written (kept in the manifest); buffered rows get one when a query asks. They let
//! `count`, `sum`, `min`, `max` and `avg` over whole partitions be answered without reading
//! column data ([`crate::query::optimizer`]).

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

/// A number in a synopsis.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Num {
    /// Integers, dates (days) and times (the column's unit), exactly.
    Int(i128),
    /// Floating point.
    Float(#[serde(with = "float")] f64),
}

/// Floats as manifests (JSON) hold them: numbers, and `"NaN"`, `"inf"` and `"-inf"`, which
/// JSON numbers cannot be (serde_json would write `null`, and then refuse to read it).
mod float {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *v {
            v if v.is_finite() => s.serialize_f64(v),
            v if v.is_nan() => s.serialize_str("NaN"),
            v if v > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        struct Float;
        impl Visitor<'_> for Float {
            type Value = f64;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, \"NaN\", \"inf\" or \"-inf\"")
            }
            fn visit_f64<E: Error>(self, v: f64) -> Result<f64, E> {
                Ok(v)
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<f64, E> {
                Ok(v as f64)
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<f64, E> {
                Ok(v as f64)
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<f64, E> {
                match v {
                    "NaN" => Ok(f64::NAN),
                    "inf" => Ok(f64::INFINITY),
                    "-inf" => Ok(f64::NEG_INFINITY),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(Float)
    }
}

impl Num {
    /// As a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// One column's synopsis.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnSynopsis {
    /// Values that are not NULL.
    pub count: u64,
    /// Sum of the values (numeric columns; `None` when there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<Num>,
    /// Smallest value (numbers, dates, times; not when a float is NaN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Num>,
    /// Largest value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Num>,
    /// Whether min/max are known: false for types without them (text) or with NaN.
    #[serde(default)]
    pub ordered: bool,
}

impl ColumnSynopsis {
    /// Adds another part of the same column.
    pub fn merge(&mut self, o: &ColumnSynopsis) {
        let both_ordered = (self.ordered || self.count == 0) && (o.ordered || o.count == 0);
        // Floats with floats and integers with integers first: a mixed pair converts an
        // i128, a library call (`__floattidf`) that the compiled code made for float pairs
        // too (8% of a grouped synopsis answer's profile).
        self.sum = match (self.sum, o.sum) {
            (Some(Num::Int(a)), Some(Num::Int(b))) => a.checked_add(b).map(Num::Int),
            (Some(Num::Float(a)), Some(Num::Float(b))) => Some(Num::Float(a + b)),
            (Some(a), Some(b)) => Some(Num::Float(a.as_f64() + b.as_f64())),
            (a, b) => a.or(b),
        };
        let pick = |a: Option<Num>, b: Option<Num>, less: bool| match (a, b) {
            (Some(x), Some(y)) => {
                let x_first = match (x, y) {
                    (Num::Int(p), Num::Int(q)) => (p < q) == less,
                    (Num::Float(p), Num::Float(q)) => (p < q) == less,
                    _ => (x.as_f64() < y.as_f64()) == less,
                };
                Some(if x_first { x } else { y })
            }
            (a, b) => a.or(b),
        };
        self.min = pick(self.min, o.min, true);
        self.max = pick(self.max, o.max, false);
        self.count += o.count;
        self.ordered = both_ordered;
    }

    /// Whether [`ColumnSynopsis::of`] sums and bounds a column of this type (the others
    /// are only counted).
    pub fn summed(ty: &DataType) -> bool {
        use DataType::*;
        matches!(
            ty,
            Int8 | Int16
                | Int32
                | Int64
                | UInt8
                | UInt16
                | UInt32
                | UInt64
                | Float32
                | Float64
                | Date32
                | Timestamp(TimeUnit::Microsecond, _)
        )
    }

    /// The synopsis of one array.
    pub fn of(a: &ArrayRef) -> Self {
        let count = (a.len() - a.null_count()) as u64;
        let mut s = ColumnSynopsis {
            count,
            ..Default::default()
        };
        macro_rules! ints {
            ($t:ty, $sum:expr) => {{
                let p = a.as_primitive::<$t>();
                let mut sum: i128 = 0;
                let (mut lo, mut hi) = (i128::MAX, i128::MIN);
                let mut add = |v| {
                    let v = i128::from(v);
                    sum += v;
                    lo = lo.min(v);
                    hi = hi.max(v);
                };
                each_value(p, &mut add);
                if count > 0 {
                    s.sum = $sum.then_some(Num::Int(sum));
                    s.min = Some(Num::Int(lo));
                    s.max = Some(Num::Int(hi));
                }
                s.ordered = true;
            }};
        }
        macro_rules! floats {
            ($t:ty) => {{
                let p = a.as_primitive::<$t>();
                let mut sum = 0f64;
                let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
                let mut nan = false;
                let mut add = |v| {
                    let v = f64::from(v);
                    sum += v;
                    nan |= v.is_nan();
                    lo = lo.min(v);
                    hi = hi.max(v);
                };
                each_value(p, &mut add);
                if count > 0 {
                    s.sum = Some(Num::Float(sum));
                    if !nan {
                        s.min = Some(Num::Float(lo));
                        s.max = Some(Num::Float(hi));
                    }
                }
                s.ordered = !nan;
            }};
        }
        match a.data_type() {
            DataType::Int8 => ints!(Int8Type, true),
            DataType::Int16 => ints!(Int16Type, true),
            DataType::Int32 => ints!(Int32Type, true),
            DataType::Int64 => ints!(Int64Type, true),
            DataType::UInt8 => ints!(UInt8Type, true),
            DataType::UInt16 => ints!(UInt16Type, true),
            DataType::UInt32 => ints!(UInt32Type, true),
            DataType::UInt64 => ints!(UInt64Type, true),
            DataType::Float32 => floats!(Float32Type),
            DataType::Float64 => floats!(Float64Type),
            DataType::Date32 => ints!(Date32Type, false),
            DataType::Timestamp(TimeUnit::Microsecond, _) => ints!(TimestampMicrosecondType, false),
            _ => {}
        }
        s
    }
}

/// Calls `f` with each non-NULL value of `p`, in order; a column without NULLs is read
/// without a validity check per value.
fn each_value<T: ArrowPrimitiveType>(p: &PrimitiveArray<T>, f: impl FnMut(T::Native)) {
    match p.null_count() {
        0 => p.values().iter().copied().for_each(f),
        _ => p.iter().flatten().for_each(f),
    }
}

/// Synopses of every column of `batches` (which share a schema).
pub(crate) fn of_batches(batches: &[RecordBatch], columns: usize) -> Vec<ColumnSynopsis> {
    let mut out = vec![ColumnSynopsis::default(); columns];
    for b in batches {
        for (i, s) in out.iter_mut().enumerate().take(b.num_columns()) {
            s.merge(&ColumnSynopsis::of(b.column(i)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float32Array, Int8Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn exact_sums_and_bounds() {
        let a: ArrayRef = Arc::new(Int8Array::from(vec![Some(100), None, Some(100), Some(-5)]));
        let s = ColumnSynopsis::of(&a);
        assert_eq!(s.count, 3);
        assert_eq!(s.sum, Some(Num::Int(195)), "no i8 overflow");
        assert_eq!((s.min, s.max), (Some(Num::Int(-5)), Some(Num::Int(100))));
        let f: ArrayRef = Arc::new(Float32Array::from(vec![0.1f32, 0.2]));
        let g = ColumnSynopsis::of(&f);
        assert_eq!(
            g.sum,
            Some(Num::Float(f64::from(0.1f32) + f64::from(0.2f32)))
        );
        let mut m = s.clone();
        let minus: ArrayRef = Arc::new(Int8Array::from(vec![-100]));
        m.merge(&ColumnSynopsis::of(&minus));
        assert_eq!(m.count, 4);
        assert_eq!(m.sum, Some(Num::Int(95)));
        assert_eq!(m.min, Some(Num::Int(-100)));
        let empty: ArrayRef = Arc::new(Int8Array::from(vec![None::<i8>]));
        let mut e = ColumnSynopsis::of(&empty);
        assert_eq!((e.count, e.sum, e.min), (0, None, None));
        e.merge(&s);
        assert_eq!(e, s);
        // Through a manifest (JSON) and back, NaN and infinities included.
        let odd = ColumnSynopsis {
            count: 3,
            sum: Some(Num::Float(f64::NAN)),
            min: Some(Num::Float(f64::NEG_INFINITY)),
            max: Some(Num::Float(f64::INFINITY)),
            ordered: false,
        };
        let text = serde_json::to_string(&odd).unwrap();
        let back: ColumnSynopsis = serde_json::from_str(&text).unwrap();
        assert!(
            matches!(back.sum, Some(Num::Float(f)) if f.is_nan()),
            "{text}"
        );
        assert_eq!((back.min, back.max), (odd.min, odd.max));
        let t: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        let ts = ColumnSynopsis::of(&t);
        assert_eq!((ts.count, ts.ordered, ts.sum), (1, false, None));
    }
}

//! Partition functions: one u64 key per row, which is also the partition's name.
//!
//! Time functions read the calendar in UTC (`ymdh12` of 2016-01-31 13:00 is 2016013112).
//! Buckets of several days count from the 1st of the month, buckets of several hours from
//! midnight, as JoinBase does. Every function except `rem` is monotonic in its column, which
//! is what lets range predicates on the column prune partitions ([`PartitionFn::key_range`]).

use crate::types::{ColumnType, Value};
use chrono::{Datelike, Timelike};
use serde::{Deserialize, Serialize};

/// How a table computes its partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fn", rename_all = "lowercase")]
pub enum PartitionFn {
    /// Year: 2016.
    Yyyy,
    /// Month: 201601.
    Yyyymm,
    /// Day bucket of `days` (1, 3, 7 or 10) days from the 1st: 20160131.
    Yyyymmdd {
        /// Bucket width in days.
        days: u32,
    },
    /// Hour bucket of `hours` (1, 2, 4, 6 or 12) hours from midnight: 2016013112.
    Ymdh {
        /// Bucket width in hours.
        hours: u32,
    },
    /// The column's own (unsigned) value.
    Raw,
    /// The column's value modulo `n`.
    Rem {
        /// The divisor.
        n: u64,
    },
}

impl PartitionFn {
    /// Parses a function name and its extra argument (`rem(col, n)` only).
    pub fn parse(name: &str, arg: Option<u64>) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        Some(match (lower.as_str(), arg) {
            ("yyyy", None) => Self::Yyyy,
            ("yyyymm", None) => Self::Yyyymm,
            ("yyyymmdd", None) => Self::Yyyymmdd { days: 1 },
            ("yyyymmdd3", None) => Self::Yyyymmdd { days: 3 },
            ("yyyymmdd7", None) => Self::Yyyymmdd { days: 7 },
            ("yyyymmdd10", None) => Self::Yyyymmdd { days: 10 },
            ("ymdh", None) => Self::Ymdh { hours: 1 },
            ("ymdh2", None) => Self::Ymdh { hours: 2 },
            ("ymdh4", None) => Self::Ymdh { hours: 4 },
            ("ymdh6", None) => Self::Ymdh { hours: 6 },
            ("ymdh12", None) => Self::Ymdh { hours: 12 },
            ("rem", Some(n)) if n > 0 => Self::Rem { n },
            _ => return None,
        })
    }

    /// The SQL spelling, for SHOW CREATE / DESCRIBE.
    pub fn sql(&self, column: &str) -> String {
        match self {
            Self::Yyyy => format!("yyyy({column})"),
            Self::Yyyymm => format!("yyyymm({column})"),
            Self::Yyyymmdd { days: 1 } => format!("yyyymmdd({column})"),
            Self::Yyyymmdd { days } => format!("yyyymmdd{days}({column})"),
            Self::Ymdh { hours: 1 } => format!("ymdh({column})"),
            Self::Ymdh { hours } => format!("ymdh{hours}({column})"),
            Self::Raw => column.to_string(),
            Self::Rem { n } => format!("rem({column}, {n})"),
        }
    }

    /// Whether this function can be applied to a column of type `ty`.
    pub fn accepts(&self, ty: ColumnType) -> bool {
        use ColumnType::*;
        match self {
            Self::Raw | Self::Rem { .. } => matches!(
                ty,
                UInt8 | UInt16 | UInt32 | UInt64 | Int8 | Int16 | Int32 | Int64
            ),
            _ => ty.is_time(),
        }
    }

    /// True when the function is monotonic (range predicates prune).
    pub fn is_monotonic(&self) -> bool {
        !matches!(self, Self::Rem { .. })
    }

    /// The key of one value. NULL (and negative raw values) go to partition 0.
    pub fn key(&self, value: &Value) -> u64 {
        match self {
            Self::Raw => match value {
                Value::UInt(v) => *v,
                Value::Int(v) => u64::try_from(*v).unwrap_or(0),
                _ => 0,
            },
            Self::Rem { n } => match value {
                Value::UInt(v) => v % n,
                Value::Int(v) => i128::from(*v).rem_euclid(i128::from(*n)) as u64,
                _ => 0,
            },
            _ => match value.as_micros() {
                Some(us) => self.time_key(us),
                None => 0,
            },
        }
    }

    /// The key of a time, in microseconds since the epoch (UTC).
    pub fn time_key(&self, micros: i64) -> u64 {
        let Some(t) = chrono::DateTime::from_timestamp_micros(micros) else {
            return 0;
        };
        let t = t.naive_utc();
        let y = u64::try_from(t.year()).unwrap_or(0);
        let (m, d, h) = (
            u64::from(t.month()),
            u64::from(t.day()),
            u64::from(t.hour()),
        );
        match self {
            Self::Yyyy => y,
            Self::Yyyymm => y * 100 + m,
            Self::Yyyymmdd { days } => {
                let days = u64::from(*days);
                y * 10_000 + m * 100 + ((d - 1) / days) * days + 1
            }
            Self::Ymdh { hours } => {
                let hours = u64::from(*hours);
                (y * 10_000 + m * 100 + d) * 100 + (h / hours) * hours
            }
            Self::Raw => micros.max(0) as u64,
            Self::Rem { n } => i128::from(micros).rem_euclid(i128::from(*n)) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(s: &str) -> i64 {
        chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S")
            .unwrap()
            .and_utc()
            .timestamp_micros()
    }

    #[test]
    fn joinbase_table() {
        let t = us("2016-01-31 13:45:00");
        let k = |name: &str| PartitionFn::parse(name, None).unwrap().time_key(t);
        assert_eq!(k("yyyy"), 2016);
        assert_eq!(k("yyyymm"), 201601);
        assert_eq!(k("yyyymmdd"), 20160131);
        assert_eq!(k("yyyymmdd3"), 20160131);
        assert_eq!(k("yyyymmdd7"), 20160129);
        assert_eq!(k("yyyymmdd10"), 20160131);
        assert_eq!(k("ymdh"), 2016013113);
        assert_eq!(k("ymdh2"), 2016013112);
        assert_eq!(k("ymdh4"), 2016013112);
        assert_eq!(k("ymdh6"), 2016013112);
        assert_eq!(k("ymdh12"), 2016013112);
        let t = us("2016-01-05 05:00:00");
        let k = |name: &str| PartitionFn::parse(name, None).unwrap().time_key(t);
        assert_eq!(k("yyyymmdd3"), 20160104);
        assert_eq!(k("ymdh12"), 2016010500);
        assert_eq!(k("ymdh4"), 2016010504);
    }

    #[test]
    fn raw_and_rem() {
        assert_eq!(PartitionFn::Raw.key(&Value::UInt(42)), 42);
        assert_eq!(PartitionFn::Rem { n: 10 }.key(&Value::Int(-3)), 7);
        assert_eq!(PartitionFn::parse("rem", Some(0)), None);
        let huge = PartitionFn::Rem { n: u64::MAX };
        assert_eq!(huge.key(&Value::Int(i64::MIN)), (1u64 << 63) - 1);
        assert_eq!(huge.key(&Value::Int(-1)), u64::MAX - 1);
        assert_eq!(PartitionFn::Raw.key(&Value::Null), 0);
    }

    #[test]
    fn time_keys_are_monotonic() {
        let f = PartitionFn::Ymdh { hours: 6 };
        let mut last = 0;
        for h in 0..24 * 40 {
            let k = f.time_key(us("2016-01-01 00:00:00") + h * 3_600_000_000);
            assert!(k >= last);
            last = k;
        }
    }
}

//! Query answers from different systems as plain cells, and their comparison: rows in any
//! order unless the query orders them, integers exactly, floating point to a relative 1e-9
//! (the systems add the same `Float32` values in different orders), dates as `YYYY-MM-DD`
//! text.

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use std::cmp::Ordering;
use std::fmt;

/// Largest relative difference between two floating-point answers that still agree.
pub const REL_TOLERANCE: f64 = 1e-9;

/// One value of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// An integer (counts, integer sums, integer group keys).
    Int(i128),
    /// A floating-point number.
    Float(f64),
    /// Text, dates and timestamps.
    Str(String),
}

/// Rows of cells.
pub type Rows = Vec<Vec<Cell>>;

impl Cell {
    /// The cell a JSON value stands for.
    pub fn from_json(v: &serde_json::Value) -> Self {
        use serde_json::Value as J;
        match v {
            J::Null => Cell::Null,
            J::Bool(b) => Cell::Str(b.to_string()),
            J::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Cell::Int(i.into()),
                (None, Some(u)) => Cell::Int(u.into()),
                _ => Cell::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Cell::Str(s.clone()),
            other => Cell::Str(other.to_string()),
        }
    }

    fn number(&self) -> Option<f64> {
        match self {
            Cell::Int(i) => Some(*i as f64),
            Cell::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// Whether two answers' cells agree.
    pub fn agrees(&self, other: &Cell) -> bool {
        match (self, other) {
            (Cell::Int(a), Cell::Int(b)) => a == b,
            (Cell::Str(a), Cell::Str(b)) => a == b,
            (Cell::Null, Cell::Null) => true,
            _ => match (self.number(), other.number()) {
                (Some(a), Some(b)) => {
                    a == b || (a - b).abs() <= REL_TOLERANCE * a.abs().max(b.abs())
                }
                _ => false,
            },
        }
    }

    /// A total order for sorting rows: NULL, then numbers, then text.
    fn order(&self, other: &Cell) -> Ordering {
        let rank = |c: &Cell| match c {
            Cell::Null => 0,
            Cell::Int(_) | Cell::Float(_) => 1,
            Cell::Str(_) => 2,
        };
        match (self, other) {
            (Cell::Int(a), Cell::Int(b)) => a.cmp(b),
            (Cell::Str(a), Cell::Str(b)) => a.cmp(b),
            _ => match (self.number(), other.number()) {
                (Some(a), Some(b)) => a.total_cmp(&b),
                _ => rank(self).cmp(&rank(other)),
            },
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Null => f.write_str("NULL"),
            Cell::Int(i) => write!(f, "{i}"),
            Cell::Float(x) => write!(f, "{x}"),
            Cell::Str(s) => write!(f, "'{s}'"),
        }
    }
}

/// Rows from JSON arrays of arrays (`[[1, "a"], [2, "b"]]`), as the peer script prints them.
pub fn rows_from_arrays(v: &serde_json::Value) -> anyhow::Result<Rows> {
    let rows = v
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("rows are not a JSON array: {v}"))?;
    rows.iter()
        .map(|r| {
            r.as_array()
                .map(|r| r.iter().map(Cell::from_json).collect())
                .ok_or_else(|| anyhow::anyhow!("a row is not a JSON array: {r}"))
        })
        .collect()
}

/// Rows from Sluice's `format=json`: an array of objects whose keys come in column order
/// (read in that order here rather than through a map, which would sort them).
pub fn rows_from_objects(body: &[u8]) -> anyhow::Result<Rows> {
    let rows: Vec<ObjectRow> = serde_json::from_slice(body)?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

struct ObjectRow(Vec<Cell>);

impl<'de> serde::Deserialize<'de> for ObjectRow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = ObjectRow;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a row object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<ObjectRow, A::Error> {
                let mut cells = Vec::new();
                while let Some((_, v)) =
                    m.next_entry::<serde::de::IgnoredAny, serde_json::Value>()?
                {
                    cells.push(Cell::from_json(&v));
                }
                Ok(ObjectRow(cells))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<ObjectRow, A::Error> {
                let mut cells = Vec::new();
                while let Some(v) = s.next_element::<serde_json::Value>()? {
                    cells.push(Cell::from_json(&v));
                }
                Ok(ObjectRow(cells))
            }
        }
        d.deserialize_any(InOrder)
    }
}

/// Where `ours` and `theirs` disagree, one line each (at most `limit` lines about rows);
/// empty when they agree. Rows are compared in order when `ordered`, else sorted first.
pub fn differences(ours: &Rows, theirs: &Rows, ordered: bool, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    if ours.len() != theirs.len() {
        out.push(format!("{} rows vs {} rows", ours.len(), theirs.len()));
    }
    let (a, b) = (sorted(ours, ordered), sorted(theirs, ordered));
    let show = |r: &Vec<Cell>| r.iter().map(Cell::to_string).collect::<Vec<_>>().join(", ");
    let mut shown = 0;
    for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
        let same = x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| p.agrees(q));
        if !same {
            shown += 1;
            if shown <= limit {
                out.push(format!("row {}: ({}) vs ({})", i + 1, show(x), show(y)));
            }
        }
    }
    if shown > limit {
        out.push(format!("... {} differing rows in all", shown));
    }
    out
}

/// The rows in the order they are compared in: as given when `ordered`, else sorted.
fn sorted(rows: &Rows, ordered: bool) -> Vec<&Vec<Cell>> {
    let mut r: Vec<&Vec<Cell>> = rows.iter().collect();
    if !ordered {
        r.sort_by(|a, b| {
            a.iter()
                .zip(b.iter())
                .map(|(x, y)| x.order(y))
                .find(|o| o.is_ne())
                .unwrap_or(a.len().cmp(&b.len()))
        });
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_rows_keep_column_order() {
        let body = br#"[{"z":1,"a":"x","m":2.5},{"z":2,"a":null,"m":-1.0}]"#;
        let rows = rows_from_objects(body).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![Cell::Int(1), Cell::Str("x".into()), Cell::Float(2.5)],
                vec![Cell::Int(2), Cell::Null, Cell::Float(-1.0)],
            ]
        );
        assert!(rows_from_objects(b"[]").unwrap().is_empty());
    }

    #[test]
    fn unordered_rows_agree_within_tolerance() {
        let ours = vec![
            vec![Cell::Int(2), Cell::Float(1.000_000_000_1)],
            vec![Cell::Int(1), Cell::Float(3.0)],
        ];
        let theirs = rows_from_arrays(&serde_json::json!([[1, 3], [2, 1.0]])).unwrap();
        assert!(differences(&ours, &theirs, false, 5).is_empty());
        // Ordered queries keep their order.
        assert_eq!(differences(&ours, &theirs, true, 5).len(), 2);
    }

    #[test]
    fn integers_exactly_floats_to_1e9() {
        assert!(!Cell::Int(10_000_000_001).agrees(&Cell::Int(10_000_000_000)));
        assert!(!Cell::Float(1.0).agrees(&Cell::Float(1.000_000_01)));
        assert!(!Cell::Str("2016-01-01".into()).agrees(&Cell::Str("2016-01-02".into())));
        let d = differences(
            &vec![vec![Cell::Int(1)]],
            &vec![vec![Cell::Int(1)], vec![Cell::Int(2)]],
            false,
            5,
        );
        assert_eq!(d, vec!["1 rows vs 2 rows".to_string()]);
    }
}

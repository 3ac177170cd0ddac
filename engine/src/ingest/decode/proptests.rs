//! Property tests: every payload decoder reads back the rows an encoder of its format
//! wrote, for random tables and rows, and no input makes a decoder panic.

use super::mapping::JsonMapping;
use super::testutil::{table_of, with_mapping};
use super::*;
use crate::types::ColumnType as T;
use proptest::prelude::*;
use serde_json::{Value as J, json};

const TYPES: [T; 15] = [
    T::Bool,
    T::Int8,
    T::Int16,
    T::Int32,
    T::Int64,
    T::UInt8,
    T::UInt16,
    T::UInt32,
    T::UInt64,
    T::Float32,
    T::Float64,
    T::String,
    T::Binary,
    T::Timestamp,
    T::Date,
];

/// Microseconds up to the year 2200 (nanoseconds of it still fit an i64).
const MAX_MICROS: i64 = 7_258_118_400_000_000;

fn value(ty: T) -> BoxedStrategy<Value> {
    match ty {
        T::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        T::Int8 => any::<i8>().prop_map(|v| Value::Int(v.into())).boxed(),
        T::Int16 => any::<i16>().prop_map(|v| Value::Int(v.into())).boxed(),
        T::Int32 => any::<i32>().prop_map(|v| Value::Int(v.into())).boxed(),
        T::Int64 => any::<i64>().prop_map(Value::Int).boxed(),
        T::UInt8 => any::<u8>().prop_map(|v| Value::UInt(v.into())).boxed(),
        T::UInt16 => any::<u16>().prop_map(|v| Value::UInt(v.into())).boxed(),
        T::UInt32 => any::<u32>().prop_map(|v| Value::UInt(v.into())).boxed(),
        T::UInt64 => any::<u64>().prop_map(Value::UInt).boxed(),
        // Thousandths: short decimals every JSON parser reads back exactly.
        T::Float32 | T::Float64 => (-1_000_000_000_000i64..1_000_000_000_000)
            .prop_map(|k| Value::Float(k as f64 / 1000.0))
            .boxed(),
        T::String => "[ -~äé€😀]{0,12}".prop_map(Value::Str).boxed(),
        T::Binary => "[a-zA-Z0-9 ,=]{0,8}"
            .prop_map(|s| Value::Bytes(s.into_bytes()))
            .boxed(),
        T::Timestamp => (-MAX_MICROS..MAX_MICROS).prop_map(Value::Timestamp).boxed(),
        T::Date => (-100_000i32..100_000).prop_map(Value::Date).boxed(),
    }
}

/// A random table (`ts` Timestamp NOT NULL first, the partition column) and rows for it.
#[derive(Debug, Clone)]
struct Case {
    table: TableDef,
    rows: Vec<Vec<Value>>,
}

fn case(id: u64) -> impl Strategy<Value = Case> {
    let column = (prop::sample::select(TYPES.to_vec()), any::<bool>());
    prop::collection::vec(column, 1..7).prop_flat_map(move |cols| {
        let names: Vec<String> = (1..=cols.len()).map(|i| format!("c{i}")).collect();
        let mut defs = vec![("ts", T::Timestamp, false)];
        defs.extend(
            names
                .iter()
                .zip(&cols)
                .map(|(n, (ty, nullable))| (n.as_str(), *ty, *nullable)),
        );
        let table = table_of(id, &defs);
        let mut row: Vec<BoxedStrategy<Value>> = vec![value(T::Timestamp)];
        for (ty, nullable) in &cols {
            row.push(if *nullable {
                prop_oneof![1 => Just(Value::Null), 4 => value(*ty)].boxed()
            } else {
                value(*ty)
            });
        }
        prop::collection::vec(row, 1..6).prop_map(move |rows| Case {
            table: table.clone(),
            rows,
        })
    })
}

fn rfc3339(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .expect("in range")
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn date(days: i32) -> String {
    (chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("valid") + chrono::Days::new(0))
        .checked_add_signed(chrono::TimeDelta::days(days.into()))
        .expect("in range")
        .format("%Y-%m-%d")
        .to_string()
}

/// The value as text [`parse_text`] reads back (NULL as empty).
fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Str(s) => s.clone(),
        Value::Bytes(b) => String::from_utf8(b.clone()).expect("ASCII"),
        Value::Timestamp(t) => rfc3339(*t),
        Value::Date(d) => date(*d),
    }
}

fn json_of(v: &Value) -> J {
    match v {
        Value::Null => J::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => json!(i),
        Value::UInt(u) => json!(u),
        Value::Float(f) => json!(f),
        other => J::String(text(other)),
    }
}

fn csv_field(ty: T, v: &Value) -> String {
    match (ty, v) {
        (_, Value::Null) => String::new(),
        (T::String | T::Binary, v) => format!("\"{}\"", text(v).replace('"', "\"\"")),
        (_, v) => text(v),
    }
}

/// Escapes a line protocol key or tag value.
fn lp_key(s: &str) -> String {
    s.replace(',', "\\,")
        .replace('=', "\\=")
        .replace(' ', "\\ ")
}

fn lp_field(v: &Value) -> String {
    match v {
        Value::Int(i) => format!("{i}i"),
        Value::UInt(u) => format!("{u}u"),
        Value::Float(f) => f.to_string(),
        Value::Bool(true) => "t".into(),
        Value::Bool(false) => "False".into(),
        other => format!(
            "\"{}\"",
            text(other).replace('\\', "\\\\").replace('"', "\\\"")
        ),
    }
}

/// Escapes a JSON pointer token.
fn token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn csv_roundtrips(c in case(101), fix in prop::collection::vec(any::<bool>(), 7)) {
        // Some columns come from the topic instead: the first row's value, in every row.
        let fixed: Vec<(usize, String)> = (0..c.table.columns.len())
            .filter(|&i| fix[i])
            .map(|i| (i, text(&c.rows[0][i])))
            .collect();
        let lines: Vec<String> = c
            .rows
            .iter()
            .map(|row| {
                let fields: Vec<String> = (0..row.len())
                    .filter(|i| !fix[*i])
                    .map(|i| csv_field(c.table.columns[i].ty, &row[i]))
                    .collect();
                fields.join(",")
            })
            .collect();
        // A line of one empty field is a blank line, which CSV skips.
        prop_assume!(lines.iter().all(|l| !l.is_empty()));
        let body = lines.join("\r\n");
        let got = decode_message(&c.table, Format::Csv, body.as_bytes(), 0, &fixed).unwrap();
        let want: Vec<Vec<Value>> = c
            .rows
            .iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| {
                        let col = &c.table.columns[i];
                        let v = if fix[i] { &c.rows[0][i] } else { &row[i] };
                        if fix[i] && col.ty != T::String && text(v).is_empty() {
                            // An empty topic segment is a missing value.
                            return missing(col.nullable, col.ty);
                        }
                        match (col.ty, v) {
                            // An empty field is an empty string, not NULL.
                            (T::String, Value::Null) => Value::Str(String::new()),
                            _ => v.clone(),
                        }
                    })
                    .collect()
            })
            .collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn json_roundtrips(c in case(102), lines in any::<bool>(), omit_nulls in any::<bool>()) {
        let docs: Vec<J> = c
            .rows
            .iter()
            .map(|row| {
                J::Object(
                    c.table
                        .columns
                        .iter()
                        .zip(row)
                        .filter(|(_, v)| !(omit_nulls && **v == Value::Null))
                        .map(|(col, v)| (col.name.clone(), json_of(v)))
                        .collect(),
                )
            })
            .collect();
        let body = if lines {
            docs.iter().map(|d| d.to_string() + "\n").collect()
        } else {
            J::Array(docs).to_string()
        };
        let got = decode(&c.table, Format::Json, body.as_bytes(), 0).unwrap();
        prop_assert_eq!(got, c.rows);
    }

    #[test]
    fn json_mapping_roundtrips(
        c in case(103),
        modes in prop::collection::vec(0u8..3, 7),
        objects in any::<bool>(),
        array in prop::sample::select(vec!["data", "da/ta", "a~b", "*x", "x y"]),
    ) {
        // Per column: 0 from the flattened array, 1 the top-level field of its name,
        // 2 a fixed pointer into `meta`. Only array columns vary between rows.
        let mode = |i: usize| if i == 0 { 0 } else { modes[i] };
        let mut mapping = Vec::new();
        let mut doc = serde_json::Map::new();
        let mut meta = serde_json::Map::new();
        for (i, col) in c.table.columns.iter().enumerate() {
            let key = format!("k/~{i}");
            match mode(i) {
                0 if objects => mapping.push(format!(
                    "{} <- '/{}/*/{}'",
                    col.name,
                    token(array),
                    token(&key)
                )),
                0 => mapping.push(format!("{} <- /{}/*/{i}", col.name, token(array))),
                1 => {
                    doc.insert(col.name.clone(), json_of(&c.rows[0][i]));
                }
                _ => {
                    mapping.push(format!("{} <- \"/meta/{}\"", col.name, token(&key)));
                    meta.insert(key, json_of(&c.rows[0][i]));
                }
            }
        }
        let items: Vec<J> = c
            .rows
            .iter()
            .map(|row| {
                if objects {
                    J::Object(
                        (0..row.len())
                            .filter(|&i| mode(i) == 0)
                            .map(|i| (format!("k/~{i}"), json_of(&row[i])))
                            .collect(),
                    )
                } else {
                    J::Array(row.iter().map(json_of).collect())
                }
            })
            .collect();
        doc.insert(array.to_string(), J::Array(items));
        doc.insert("meta".into(), J::Object(meta));
        let table = with_mapping(c.table.clone(), &mapping.join(", "));
        let got = decode(&table, Format::Json, J::Object(doc).to_string().as_bytes(), 0).unwrap();
        let want: Vec<Vec<Value>> = c
            .rows
            .iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| if mode(i) == 0 { row[i].clone() } else { c.rows[0][i].clone() })
                    .collect()
            })
            .collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn line_protocol_roundtrips(c in case(104), tags in prop::collection::vec(any::<bool>(), 7)) {
        let body: String = c
            .rows
            .iter()
            .map(|row| {
                let mut line = "m\\ 1\\,x".to_string();
                let mut fields = Vec::new();
                for (i, (col, v)) in c.table.columns.iter().zip(row).enumerate().skip(1) {
                    match v {
                        Value::Null => {}
                        Value::Str(s)
                            if tags[i] && !s.is_empty() && !s.contains('\\') && !s.starts_with(' ') =>
                        {
                            line.push_str(&format!(",{}={}", lp_key(&col.name), lp_key(s)));
                        }
                        v => fields.push(format!("{}={}", lp_key(&col.name), lp_field(v))),
                    }
                }
                // Every line needs a field; `ts` doubles as one when nothing else is there.
                if fields.is_empty() {
                    fields.push(format!("ts={}", lp_field(&Value::Str(rfc3339(row[0].as_micros().unwrap_or(0))))));
                }
                let ns = row[0].as_micros().expect("a time") * 1000;
                format!("# reading\n{line} {} {ns}\n\n", fields.join(","))
            })
            .collect();
        let got = decode(&c.table, Format::LineProtocol, body.as_bytes(), 0).unwrap();
        prop_assert_eq!(got, c.rows);
    }

    #[test]
    fn never_panics_on_bytes(body in prop::collection::vec(any::<u8>(), 0..200)) {
        let t = table_of(105, &[("ts", T::Timestamp, true), ("a", T::String, true), ("b", T::Int8, false)]);
        let m = with_mapping(t.clone(), "a <- /x/*/0, b <- /x/*/1");
        for format in [Format::Csv, Format::Json, Format::LineProtocol] {
            let _ = decode(&t, format, &body, 0);
            let _ = decode(&m, format, &body, 0);
        }
    }

    #[test]
    fn never_panics_on_near_misses(
        lp in "[a-b0-9,= \\\\\"#.\\-iutTfF\n]{0,60}",
        js in "[\\[\\]{}\":,0-9ax/*~ ]{0,60}",
        mapping in "[ab<\\- /*~0-9,'\"]{0,40}",
    ) {
        let t = table_of(106, &[("ts", T::Timestamp, true), ("a", T::String, true), ("b", T::Int8, false)]);
        let _ = decode_message(&t, Format::LineProtocol, lp.as_bytes(), 0, &[(1, "x".into())]);
        let _ = decode(&t, Format::Csv, lp.as_bytes(), 0);
        let m = with_mapping(t.clone(), "a <- /x/*/0, b <- '/x/*/1', ts <- /0");
        let _ = decode(&m, Format::Json, js.as_bytes(), 0);
        let _ = decode(&t, Format::Json, js.as_bytes(), 0);
        let _ = infer_json_columns(js.as_bytes());
        let _ = JsonMapping::parse(&t, &mapping);
    }
}

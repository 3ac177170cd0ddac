//! Payload decoding: CSV and JSON bodies into rows typed for one table.
//!
//! HTTP writes use this now and MQTT payloads will use it next, so a row means the same
//! thing whichever way it arrives. Every error names the 1-based line of the body and the
//! column at fault. A whole payload is decoded before anything is logged, so a write is all
//! or nothing.

use crate::catalog::TableDef;
use crate::error::{Error, Result};
use crate::types::{ColumnType, Value};
use datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos;

/// Payload formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values in column order, one row per line, no header.
    Csv,
    /// A JSON object, an array of objects, or objects one per line (JSON lines).
    Json,
    /// InfluxDB line protocol.
    LineProtocol,
}

impl Format {
    /// Guesses from the first non-blank byte: `{` or `[` is JSON, anything else CSV.
    pub fn sniff(body: &[u8]) -> Self {
        match body.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') | Some(b'[') => Format::Json,
            _ => Format::Csv,
        }
    }
}

/// Decodes `body` into rows of `table`'s full width. `now_micros` fills a missing time
/// partition column (a reading without a time is taken to be from its arrival).
pub fn decode(
    table: &TableDef,
    format: Format,
    body: &[u8],
    now_micros: i64,
) -> Result<Vec<Vec<Value>>> {
    let text = std::str::from_utf8(body).map_err(|e| {
        let line = 1 + body[..e.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        Error::BadPayload {
            line,
            reason: "payload is not valid UTF-8".into(),
        }
    })?;
    let mut rows = match format {
        Format::Csv => decode_csv(table, text)?,
        Format::Json => decode_json(table, text)?,
        Format::LineProtocol => {
            return Err(Error::BadPayload {
                line: 1,
                reason: "line protocol is not supported yet".into(),
            });
        }
    };
    fill_arrival_time(table, &mut rows, now_micros);
    if rows.is_empty() {
        return Err(Error::BadPayload {
            line: 1,
            reason: "no rows in payload".into(),
        });
    }
    Ok(rows)
}

fn decode_csv(table: &TableDef, text: &str) -> Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if raw.trim().is_empty() {
            continue;
        }
        let fields = split_csv(raw).map_err(|reason| Error::BadPayload { line, reason })?;
        if fields.len() != table.columns.len() {
            return Err(Error::BadPayload {
                line,
                reason: format!(
                    "expected {} fields (columns {}), found {}",
                    table.columns.len(),
                    table
                        .columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    fields.len()
                ),
            });
        }
        let mut row = Vec::with_capacity(fields.len());
        for (col, (field, quoted)) in table.columns.iter().zip(fields) {
            let v = if field.is_empty() && !quoted && col.ty != ColumnType::String {
                missing(col.nullable, col.ty)
            } else {
                parse_text(col.ty, &field)
            };
            row.push(v.map_err(|reason| Error::BadRow {
                line,
                column: col.name.clone(),
                reason,
            })?);
        }
        rows.push(row);
        check_size(table, rows.len())?;
    }
    Ok(rows)
}

/// Splits one CSV line (RFC 4180 quoting). Returns each field and whether it was quoted.
fn split_csv(line: &str) -> Result<Vec<(String, bool)>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        let mut quoted = false;
        if chars.peek() == Some(&'"') {
            quoted = true;
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err("unterminated quoted field".into()),
                }
            }
            match chars.next() {
                None => {
                    out.push((field, quoted));
                    return Ok(out);
                }
                Some(',') => {}
                Some(c) => return Err(format!("unexpected '{c}' after a quoted field")),
            }
        } else {
            loop {
                match chars.next() {
                    Some(',') => break,
                    Some(c) => field.push(c),
                    None => {
                        out.push((field.trim().to_string(), quoted));
                        return Ok(out);
                    }
                }
            }
            field = field.trim().to_string();
        }
        out.push((field, quoted));
    }
}

/// Most values one write may carry: bounds the memory a single request can take
/// (a small body of `{}` lines would otherwise expand to full-width rows).
pub const MAX_VALUES_PER_WRITE: usize = 8 << 20;

fn check_size(table: &TableDef, rows: usize) -> Result<()> {
    if rows.saturating_mul(table.columns.len()) > MAX_VALUES_PER_WRITE {
        return Err(Error::TooLarge {
            what: format!("more than {MAX_VALUES_PER_WRITE} values in one write; split it"),
        });
    }
    Ok(())
}

fn decode_json(table: &TableDef, text: &str) -> Result<Vec<Vec<Value>>> {
    let line_of = |offset: usize| {
        1 + text.as_bytes()[..offset.min(text.len())]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
    };
    let mut rows = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    loop {
        let start = stream.byte_offset();
        let next = match stream.next() {
            None => break,
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                return Err(Error::BadPayload {
                    line: e.line(),
                    reason: format!("invalid JSON: {e}"),
                });
            }
        };
        // Skip the whitespace serde_json counted before the value.
        let start = start + text[start..].len() - text[start..].trim_start().len();
        match next {
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    // Elements of an array are numbered by position when on one line.
                    let line = line_of(start) + i;
                    rows.push(json_row(table, item, line)?);
                    check_size(table, rows.len())?;
                }
            }
            other => {
                rows.push(json_row(table, &other, line_of(start))?);
                check_size(table, rows.len())?;
            }
        }
    }
    Ok(rows)
}

fn json_row(table: &TableDef, v: &serde_json::Value, line: usize) -> Result<Vec<Value>> {
    let serde_json::Value::Object(obj) = v else {
        return Err(Error::BadPayload {
            line,
            reason: "expected a JSON object (field = column)".into(),
        });
    };
    for key in obj.keys() {
        if table.column_index(key).is_none() {
            return Err(Error::BadRow {
                line,
                column: key.clone(),
                reason: format!("no such column in {}.{}", table.database, table.name),
            });
        }
    }
    let mut row = Vec::with_capacity(table.columns.len());
    for col in &table.columns {
        let field = obj.get(&col.name).or_else(|| {
            obj.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(&col.name))
                .map(|(_, v)| v)
        });
        let v = match field {
            None => missing(col.nullable, col.ty),
            Some(serde_json::Value::Null) if col.nullable => Ok(Value::Null),
            Some(serde_json::Value::Null) => Err("NULL in a NOT NULL column".to_string()),
            Some(f) => from_json(col.ty, f),
        };
        row.push(v.map_err(|reason| Error::BadRow {
            line,
            column: col.name.clone(),
            reason,
        })?);
    }
    Ok(row)
}

/// Rows of `INSERT ... VALUES` literals (text, `None` for NULL) for `columns` (all columns in
/// order when `None`). Errors name the 1-based row and the column.
pub fn decode_values(
    table: &TableDef,
    columns: Option<&[String]>,
    rows: &[Vec<Option<String>>],
    now_micros: i64,
) -> Result<Vec<Vec<Value>>> {
    let targets: Vec<usize> = match columns {
        None => (0..table.columns.len()).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                table.column_index(n).ok_or_else(|| Error::BadRow {
                    line: 1,
                    column: n.clone(),
                    reason: format!("no such column in {}.{}", table.database, table.name),
                })
            })
            .collect::<Result<_>>()?,
    };
    let mut out = Vec::with_capacity(rows.len());
    for (i, lits) in rows.iter().enumerate() {
        let line = i + 1;
        if lits.len() != targets.len() {
            return Err(Error::BadPayload {
                line,
                reason: format!("expected {} values, found {}", targets.len(), lits.len()),
            });
        }
        check_size(table, i + 1)?;
        let mut row: Vec<Option<Value>> = vec![None; table.columns.len()];
        for (&c, lit) in targets.iter().zip(lits) {
            let col = &table.columns[c];
            let v = match lit {
                None if col.nullable => Ok(Value::Null),
                None => Err("NULL in a NOT NULL column".to_string()),
                Some(text) => parse_text(col.ty, text),
            };
            row[c] = Some(v.map_err(|reason| Error::BadRow {
                line,
                column: col.name.clone(),
                reason,
            })?);
        }
        let row = row
            .into_iter()
            .zip(&table.columns)
            .map(|(v, col)| match v {
                Some(v) => Ok(v),
                None => missing(col.nullable, col.ty).map_err(|reason| Error::BadRow {
                    line,
                    column: col.name.clone(),
                    reason,
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        out.push(row);
    }
    fill_arrival_time(table, &mut out, now_micros);
    Ok(out)
}

/// A reading without a time value is taken to be from its arrival.
fn fill_arrival_time(table: &TableDef, rows: &mut [Vec<Value>], now_micros: i64) {
    let pc = table.partition_column;
    if !table.columns[pc].ty.is_time() {
        return;
    }
    for row in rows {
        if row[pc] == Value::Null {
            row[pc] = match table.columns[pc].ty {
                ColumnType::Date => Value::Date(now_micros.div_euclid(86_400_000_000) as i32),
                _ => Value::Timestamp(now_micros),
            };
        }
    }
}

fn missing(nullable: bool, ty: ColumnType) -> Result<Value, String> {
    Ok(if nullable {
        Value::Null
    } else {
        ty.default_value()
    })
}

fn from_json(ty: ColumnType, v: &serde_json::Value) -> Result<Value, String> {
    use serde_json::Value as J;
    match (ty, v) {
        (_, J::String(s)) => parse_text(ty, s),
        (ColumnType::Bool, J::Bool(b)) => Ok(Value::Bool(*b)),
        (ColumnType::Timestamp, J::Number(n)) => n
            .as_i64()
            .map(|x| Value::Timestamp(epoch_to_micros(x)))
            .or_else(|| n.as_f64().map(|f| Value::Timestamp((f * 1e6) as i64)))
            .ok_or_else(|| format!("{n} is not a time")),
        (ColumnType::String, J::Number(_) | J::Bool(_)) => Ok(Value::Str(v.to_string())),
        (ColumnType::String, J::Array(_) | J::Object(_)) => Ok(Value::Str(v.to_string())),
        (_, J::Number(n)) => parse_text(ty, &n.to_string()),
        (_, J::Bool(b)) => parse_text(ty, if *b { "1" } else { "0" }),
        _ => Err(format!("{v} does not fit type {}", ty.name())),
    }
}

/// Interprets an integer epoch by its magnitude: seconds, milliseconds, microseconds or
/// nanoseconds (the units devices actually send).
fn epoch_to_micros(x: i64) -> i64 {
    let a = x.unsigned_abs();
    if a < 100_000_000_000 {
        x.saturating_mul(1_000_000)
    } else if a < 100_000_000_000_000 {
        x.saturating_mul(1_000)
    } else if a < 100_000_000_000_000_000 {
        x
    } else {
        x / 1_000
    }
}

/// Parses text (a CSV field, a JSON string) as a value of `ty`.
pub fn parse_text(ty: ColumnType, s: &str) -> Result<Value, String> {
    use ColumnType as T;
    let t = s.trim();
    let int = |lo: i64, hi: i64| -> Result<Value, String> {
        let v: i64 = t
            .parse()
            .map_err(|_| format!("'{s}' is not an integer ({})", ty.name()))?;
        if v < lo || v > hi {
            return Err(format!(
                "{v} is out of range for {} ({lo}..={hi})",
                ty.name()
            ));
        }
        Ok(Value::Int(v))
    };
    let uint = |hi: u64| -> Result<Value, String> {
        let v: u64 = t
            .parse()
            .map_err(|_| format!("'{s}' is not an unsigned integer ({})", ty.name()))?;
        if v > hi {
            return Err(format!("{v} is out of range for {} (0..={hi})", ty.name()));
        }
        Ok(Value::UInt(v))
    };
    match ty {
        T::Bool => match t.to_ascii_lowercase().as_str() {
            "true" | "t" | "1" | "yes" => Ok(Value::Bool(true)),
            "false" | "f" | "0" | "no" => Ok(Value::Bool(false)),
            _ => Err(format!("'{s}' is not a boolean")),
        },
        T::Int8 => int(i8::MIN.into(), i8::MAX.into()),
        T::Int16 => int(i16::MIN.into(), i16::MAX.into()),
        T::Int32 => int(i32::MIN.into(), i32::MAX.into()),
        T::Int64 => int(i64::MIN, i64::MAX),
        T::UInt8 => uint(u8::MAX.into()),
        T::UInt16 => uint(u16::MAX.into()),
        T::UInt32 => uint(u32::MAX.into()),
        T::UInt64 => uint(u64::MAX),
        T::Float32 | T::Float64 => t
            .parse::<f64>()
            .map(Value::Float)
            .map_err(|_| format!("'{s}' is not a number")),
        T::String => Ok(Value::Str(s.to_string())),
        T::Binary => Ok(Value::Bytes(s.as_bytes().to_vec())),
        T::Timestamp => {
            if let Ok(n) = t.parse::<i64>() {
                return Ok(Value::Timestamp(epoch_to_micros(n)));
            }
            string_to_timestamp_nanos(t)
                .map(|ns| Value::Timestamp(ns.div_euclid(1000)))
                .map_err(|_| {
                    format!("'{s}' is not a timestamp (e.g. '2016-01-31 13:45:00' or RFC 3339)")
                })
        }
        T::Date => chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d")
            .map(|d| {
                let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("valid");
                Value::Date((d - epoch).num_days() as i32)
            })
            .map_err(|_| format!("'{s}' is not a date (YYYY-MM-DD)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ColumnDef;
    use crate::partition::PartitionFn;
    use proptest::prelude::*;

    fn table() -> TableDef {
        let col = |name: &str, ty, nullable| ColumnDef {
            name: name.into(),
            ty,
            nullable,
        };
        TableDef {
            id: 1,
            database: "iot".into(),
            name: "readings".into(),
            columns: vec![
                col("ts", ColumnType::Timestamp, true),
                col("device", ColumnType::String, true),
                col("temp", ColumnType::Float64, true),
                col("n", ColumnType::Int8, false),
            ],
            partition: PartitionFn::Ymdh { hours: 1 },
            partition_column: 0,
            ttl_secs: None,
            options: Default::default(),
        }
    }

    #[test]
    fn csv_rows_and_errors() {
        let t = table();
        let rows = decode(
            &t,
            Format::Csv,
            b"2016-01-31 13:45:00,\"a,b\",1.5,3\n\n2016-01-31T13:45:01Z,c,,",
            0,
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][1], Value::Str("a,b".into()));
        assert_eq!(rows[1][2], Value::Null);
        assert_eq!(rows[1][3], Value::Int(0), "NOT NULL gets its default");
        let err = decode(
            &t,
            Format::Csv,
            b"2016-01-31 13:45:00,a,1.5,3\n2016-01-31 13:45:00,a,hot,3",
            0,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2, column 'temp': 'hot' is not a number"
        );
        let err = decode(&t, Format::Csv, b"2016-01-31 13:45:00,a,1.5,300", 0).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("line 1, column 'n': 300 is out of range"),
            "{err}"
        );
        let err = decode(&t, Format::Csv, b"1,2", 0).unwrap_err();
        assert!(err.to_string().contains("expected 4 fields"), "{err}");
    }

    #[test]
    fn json_forms() {
        let t = table();
        let one = decode(
            &t,
            Format::Json,
            br#"{"ts":"2016-01-31 13:45:00","device":"d1","temp":20.5}"#,
            0,
        )
        .unwrap();
        assert_eq!(one[0][2], Value::Float(20.5));
        let arr = decode(&t, Format::Json, br#"[{"device":"a"},{"device":"b"}]"#, 42).unwrap();
        assert_eq!(arr.len(), 2);
        assert_eq!(
            arr[0][0],
            Value::Timestamp(42),
            "missing time takes arrival time"
        );
        let lines = decode(
            &t,
            Format::Json,
            b"{\"device\":\"a\"}\n{\"device\":\"b\",\"temp\":\"x\"}\n",
            0,
        )
        .unwrap_err();
        assert_eq!(
            lines.to_string(),
            "line 2, column 'temp': 'x' is not a number"
        );
        let unknown = decode(&t, Format::Json, br#"{"devise":"a"}"#, 0).unwrap_err();
        assert!(unknown.to_string().contains("column 'devise'"), "{unknown}");
        assert!(decode(&t, Format::Json, b"{\"device\":", 0).is_err());
        let epoch = decode(&t, Format::Json, br#"{"ts":1454247900}"#, 0).unwrap();
        assert_eq!(epoch[0][0], Value::Timestamp(1_454_247_900_000_000));
    }

    proptest! {
        #[test]
        fn csv_never_panics(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&table(), Format::Csv, &body, 0);
            let _ = decode(&table(), Format::Json, &body, 0);
        }

        #[test]
        fn csv_roundtrips_quoted_strings(s in "[a-z,\" ]{0,20}") {
            let line = format!("2016-01-31 13:45:00,\"{}\",1,1", s.replace('"', "\"\""));
            let rows = decode(&table(), Format::Csv, line.as_bytes(), 0).unwrap();
            prop_assert_eq!(&rows[0][1], &Value::Str(s));
        }
    }
}

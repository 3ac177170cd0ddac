//! Payload decoding: CSV, JSON and InfluxDB line protocol bodies into rows typed for one table.
//!
//! HTTP writes and MQTT messages both come through [`decode_message`], so a row means the same
//! thing whichever way it arrives. Every error names the 1-based line of the body and the
//! column at fault. A whole payload is decoded before anything is logged, so a write is all
//! or nothing.
//!
//! Each format has its own submodule; they all build rows through one `Target`, which
//! knows the table, the values fixed by the MQTT topic (they win over the payload) and what a
//! missing value becomes. JSON bodies of a table with a `json_mappings` option go through
//! `mapping` instead of the plain field = column reading ([`mapping::JsonMapping`] has the syntax). [`infer_json_columns`] guesses a
//! schema for tables created on their first message.

mod csv;
mod infer;
mod json;
mod line_protocol;
mod mapping;

pub(crate) use infer::infer_json_columns;
pub(crate) use line_protocol::by_measurement_keeping;
pub(crate) use mapping::{JSON_MAPPINGS, validate_options};

use crate::error::{Error, Result};
use crate::store::catalog::TableDef;
use crate::types::{ColumnType, Value};
use datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos;

/// Payload formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values in column order, one row per line, no header.
    Csv,
    /// A JSON object, an array of objects, or objects one per line (JSON lines); shaped by
    /// the table's `json_mappings` option when it has one.
    Json,
    /// InfluxDB line protocol: `measurement[,tag=v...] field=v[,...] [nanoseconds]`.
    LineProtocol,
    /// Sparkplug B protobuf, on `spBv1.0/...` topics (decoded by [`crate::ingest::sparkplug`]).
    Sparkplug,
}

impl Format {
    /// Guesses a payload's format: JSON when it starts with `{` or `[`; InfluxDB line
    /// protocol when its first line reads `measurement[,tags] field=value...`; CSV otherwise.
    pub fn sniff(body: &[u8]) -> Self {
        let text = body.trim_ascii_start();
        match text.first() {
            Some(b'{') | Some(b'[') => return Format::Json,
            None => return Format::Csv,
            _ => {}
        }
        let line = text.split(|b| *b == b'\n').next().unwrap_or(&[]);
        let mut fields = line.split(|b| *b == b' ').filter(|f| !f.is_empty());
        let head = fields.next().unwrap_or(&[]);
        let body = fields.next().unwrap_or(&[]);
        let head_ok = !head.is_empty() && !head.contains(&b'"') && !head.starts_with(b"=");
        let body_ok = body.iter().position(|b| *b == b'=').is_some_and(|i| i > 0);
        if head_ok && body_ok {
            Format::LineProtocol
        } else {
            Format::Csv
        }
    }

    /// A format by name (case-insensitive): `csv`, `json`, or `line` / `lp` / `influx` /
    /// `line_protocol` for line protocol.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            "line" | "lp" | "influx" | "line_protocol" | "line-protocol" => {
                Some(Format::LineProtocol)
            }
            _ => None,
        }
    }
}

/// Decodes `body` into rows of `table`'s full width. `now_micros` fills a missing time
/// partition column (a reading without a time is taken to be from its arrival).
pub(crate) fn decode(
    table: &TableDef,
    format: Format,
    body: &[u8],
    now_micros: i64,
) -> Result<Vec<Vec<Value>>> {
    decode_message(table, format, body, now_micros, &[])
}

/// Decodes one message for `table`, like [`decode`], with some columns `fixed`: (column
/// index, text) pairs taken from the MQTT topic. Fixed texts are parsed into the column's
/// type, set in every row and win over the payload. A CSV line then carries either the
/// other columns in order or all columns (the fixed ones are overwritten).
pub fn decode_message(
    table: &TableDef,
    format: Format,
    body: &[u8],
    now_micros: i64,
    fixed: &[(usize, String)],
) -> Result<Vec<Vec<Value>>> {
    let target = Target::new(table, fixed)?;
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
        Format::Csv => csv::decode(&target, text)?,
        Format::Json => match mapping::for_table(table)? {
            Some(m) => mapping::decode(&target, &m, text)?,
            None => json::decode(&target, text)?,
        },
        Format::LineProtocol => line_protocol::decode(&target, text, now_micros)?,
        Format::Sparkplug => {
            return Err(Error::invalid(
                "Sparkplug B payloads are stored by their own path",
            ));
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

/// The table rows are decoded for, with the values the topic fixes.
#[derive(Debug)]
struct Target<'a> {
    table: &'a TableDef,
    /// Per column: the value fixed by the topic, if any; empty when the topic fixes none
    /// (most messages: then nothing is allocated for it).
    fixed: Vec<Option<Value>>,
    /// How many columns the topic fixes.
    fixed_count: usize,
}

impl<'a> Target<'a> {
    fn new(table: &'a TableDef, fixed: &[(usize, String)]) -> Result<Self> {
        if fixed.is_empty() {
            return Ok(Self {
                table,
                fixed: Vec::new(),
                fixed_count: 0,
            });
        }
        let mut values = vec![None; table.columns.len()];
        for (c, text) in fixed {
            let col = table.columns.get(*c).ok_or_else(|| {
                Error::invalid(format!(
                    "fixed column {c} is out of range: {}.{} has {} columns",
                    table.database,
                    table.name,
                    table.columns.len()
                ))
            })?;
            let v = if text.is_empty() && col.ty != ColumnType::String {
                Ok(missing(col.nullable, col.ty))
            } else {
                parse_text(col.ty, text)
            };
            values[*c] = Some(v.map_err(|reason| Error::BadRow {
                line: 1,
                column: col.name.clone(),
                reason: format!("value from the topic: {reason}"),
            })?);
        }
        let fixed_count = values.iter().filter(|v| v.is_some()).count();
        Ok(Self {
            table,
            fixed: values,
            fixed_count,
        })
    }

    fn is_fixed(&self, c: usize) -> bool {
        self.fixed.get(c).is_some_and(Option::is_some)
    }

    /// An empty row to fill.
    fn blank(&self) -> Vec<Option<Value>> {
        vec![None; self.table.columns.len()]
    }

    /// Completes a row: fixed values win, missing values become NULL or the type's default
    /// (a missing time partition column stays NULL for [`fill_arrival_time`]).
    fn finish(&self, row: Vec<Option<Value>>) -> Vec<Value> {
        let pc = self.table.partition_column;
        row.into_iter()
            .zip(&self.table.columns)
            .enumerate()
            .map(
                |(c, (v, col))| match (self.fixed.get(c).and_then(Option::as_ref), v) {
                    (Some(f), _) => f.clone(),
                    (None, Some(v)) => v,
                    (None, None) if c == pc && col.ty.is_time() => Value::Null,
                    (None, None) => missing(col.nullable, col.ty),
                },
            )
            .collect()
    }

    /// Appends a finished row, refusing writes past [`MAX_VALUES_PER_WRITE`].
    fn push(&self, rows: &mut Vec<Vec<Value>>, row: Vec<Option<Value>>) -> Result<()> {
        rows.push(self.finish(row));
        check_size(self.table, rows.len())
    }

    /// The error for a field naming no column.
    fn unknown(&self, line: usize, name: &str) -> Error {
        Error::BadRow {
            line,
            column: name.to_string(),
            reason: format!(
                "no such column in {}.{}",
                self.table.database, self.table.name
            ),
        }
    }
}

/// Most values one write may carry: bounds the memory a single request can take
/// (a small body of `{}` lines would otherwise expand to full-width rows).
pub(crate) const MAX_VALUES_PER_WRITE: usize = 8 << 20;

fn check_size(table: &TableDef, rows: usize) -> Result<()> {
    if rows.saturating_mul(table.columns.len()) > MAX_VALUES_PER_WRITE {
        return Err(Error::TooLarge {
            what: format!("more than {MAX_VALUES_PER_WRITE} values in one write; split it"),
        });
    }
    Ok(())
}

/// Rows of `INSERT ... VALUES` literals (text, `None` for NULL) for `columns` (all columns in
/// order when `None`). Errors name the 1-based row and the column.
pub(crate) fn decode_values(
    table: &TableDef,
    columns: Option<&[String]>,
    rows: &[Vec<Option<String>>],
    now_micros: i64,
) -> Result<Vec<Vec<Value>>> {
    let target = Target::new(table, &[])?;
    let targets: Vec<usize> = match columns {
        None => (0..table.columns.len()).collect(),
        Some(names) => names
            .iter()
            .map(|n| table.column_index(n).ok_or_else(|| target.unknown(1, n)))
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
        let mut row = target.blank();
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
        target.push(&mut out, row)?;
    }
    fill_arrival_time(table, &mut out, now_micros);
    Ok(out)
}

/// A reading without a time value is taken to be from its arrival: a NULL time partition
/// column gets `now_micros`.
fn fill_arrival_time(table: &TableDef, rows: &mut [Vec<Value>], now_micros: i64) {
    let pc = table.partition_column;
    if !table.columns[pc].ty.is_time() {
        return;
    }
    for row in rows {
        if row[pc] == Value::Null {
            row[pc] = time_value(table.columns[pc].ty, now_micros);
        }
    }
}

/// `micros` as a value of a time column of type `ty` (Date truncates to the day).
fn time_value(ty: ColumnType, micros: i64) -> Value {
    match ty {
        ColumnType::Date => Value::Date(micros.div_euclid(86_400_000_000) as i32),
        _ => Value::Timestamp(micros),
    }
}

/// What a column the payload leaves out holds: NULL, or the type's default when NOT NULL.
fn missing(nullable: bool, ty: ColumnType) -> Value {
    if nullable {
        Value::Null
    } else {
        ty.default_value()
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

/// Parses text (a CSV field, a JSON string, a topic segment) as a value of `ty`.
pub(crate) fn parse_text(ty: ColumnType, s: &str) -> Result<Value, String> {
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
        integer => match int_range(integer) {
            Some(IntRange::Signed(lo, hi)) => int(lo, hi),
            Some(IntRange::Unsigned(hi)) => uint(hi),
            None => Err(format!("'{s}' does not fit type {}", ty.name())),
        },
    }
}

/// The values an integer column type holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IntRange {
    /// Least and most.
    Signed(i64, i64),
    /// Most.
    Unsigned(u64),
}

/// The range of an integer column type; `None` for the other types.
pub(crate) fn int_range(ty: ColumnType) -> Option<IntRange> {
    use ColumnType as T;
    use IntRange::{Signed, Unsigned};
    Some(match ty {
        T::Int8 => Signed(i8::MIN.into(), i8::MAX.into()),
        T::Int16 => Signed(i16::MIN.into(), i16::MAX.into()),
        T::Int32 => Signed(i32::MIN.into(), i32::MAX.into()),
        T::Int64 => Signed(i64::MIN, i64::MAX),
        T::UInt8 => Unsigned(u8::MAX.into()),
        T::UInt16 => Unsigned(u16::MAX.into()),
        T::UInt32 => Unsigned(u32::MAX.into()),
        T::UInt64 => Unsigned(u64::MAX),
        _ => return None,
    })
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

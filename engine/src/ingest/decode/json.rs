//! Plain JSON bodies: each object is a row, each field the column of the same name.

use super::{Target, epoch_to_micros, parse_text};
use crate::error::{Error, Result};
use crate::store::catalog::ColumnDef;
use crate::types::{ColumnType, Value};
use serde_json::Value as J;

/// Decodes a JSON object, an array of objects, or objects one per line.
pub(super) fn decode(target: &Target<'_>, text: &str) -> Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    for_each_value(text, |value, line| match value {
        J::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                // Elements of an array are numbered by position when on one line.
                let row = object_row(target, item, line + i)?;
                target.push(&mut rows, row)?;
            }
            Ok(())
        }
        other => {
            let row = object_row(target, &other, line)?;
            target.push(&mut rows, row)
        }
    })?;
    Ok(rows)
}

/// Calls `each` with every top-level JSON value of `text` and the 1-based line it starts on.
pub(super) fn for_each_value(
    text: &str,
    mut each: impl FnMut(J, usize) -> Result<()>,
) -> Result<()> {
    let line_of = |offset: usize| {
        1 + text.as_bytes()[..offset.min(text.len())]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
    };
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<J>();
    loop {
        let start = stream.byte_offset();
        let value = match stream.next() {
            None => return Ok(()),
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                return Err(Error::BadPayload {
                    line: e.line(),
                    reason: format!("invalid JSON: {e}"),
                });
            }
        };
        // Skip the whitespace serde_json counted before the value.
        let rest = text.get(start..).unwrap_or("");
        let start = start + rest.len() - rest.trim_start().len();
        each(value, line_of(start))?;
    }
}

/// One object as a partial row: fields name columns; a field naming no column is refused
/// unless it is null (it then says nothing).
fn object_row(target: &Target<'_>, v: &J, line: usize) -> Result<Vec<Option<Value>>> {
    let table = target.table;
    let J::Object(obj) = v else {
        return Err(Error::BadPayload {
            line,
            reason: "expected a JSON object (field = column)".into(),
        });
    };
    for (key, value) in obj {
        if table.column_index(key).is_none() && !value.is_null() {
            return Err(target.unknown(line, key));
        }
    }
    let mut row = target.blank();
    for (c, col) in table.columns.iter().enumerate() {
        if target.is_fixed(c) {
            continue;
        }
        if let Some(field) = top_level(obj, &col.name) {
            row[c] = Some(cell(col, field).map_err(|reason| Error::BadRow {
                line,
                column: col.name.clone(),
                reason,
            })?);
        }
    }
    Ok(row)
}

/// The field of `obj` named `name`, matched exactly first, then ignoring ASCII case.
pub(super) fn top_level<'v>(obj: &'v serde_json::Map<String, J>, name: &str) -> Option<&'v J> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// A JSON value present in the payload as a value of `col` (null checked against NOT NULL).
pub(super) fn cell(col: &ColumnDef, v: &J) -> Result<Value, String> {
    match v {
        J::Null if col.nullable => Ok(Value::Null),
        J::Null => Err("NULL in a NOT NULL column".to_string()),
        f => from_json(col.ty, f),
    }
}

/// Converts a non-null JSON value to `ty`. Nested objects and arrays fit a String column as
/// their JSON text.
fn from_json(ty: ColumnType, v: &J) -> Result<Value, String> {
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

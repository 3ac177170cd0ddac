//! Plain JSON bodies: each object is a row, each field the column of the same name.

use super::{Target, epoch_to_micros, parse_text};
use crate::error::{Error, Result};
use crate::store::catalog::ColumnDef;
use crate::types::{ColumnType, Value};
use serde_json::Value as J;

/// Decodes a JSON object, an array of objects, or objects one per line.
pub(super) fn decode(target: &Target<'_>, text: &str) -> Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    // A device's reading: one small object, read without a map of owned keys.
    if let Some(mut fields) = one_object(text) {
        let rest = text.trim_start();
        let line = 1 + text[..text.len() - rest.len()].matches('\n').count();
        let row = fields_row(target, fields.effective(), line)?;
        target.push(&mut rows, row)?;
        return Ok(rows);
    }
    decode_all(target, text)
}

/// [`decode`] without the fast path for one small object.
fn decode_all(target: &Target<'_>, text: &str) -> Result<Vec<Vec<Value>>> {
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
    let J::Object(obj) = v else {
        return Err(Error::BadPayload {
            line,
            reason: "expected a JSON object (field = column)".into(),
        });
    };
    let fields: Vec<(&str, &J)> = obj.iter().map(|(k, v)| (k.as_str(), v)).collect();
    fields_row(target, &fields, line)
}

/// A JSON object's fields in payload order, keys borrowed from the text when unescaped.
struct Fields<'de>(Vec<(std::borrow::Cow<'de, str>, J)>);

/// The fields of `text` when it is one object and nothing else; `None` sends it down the
/// general path (which also words any error).
fn one_object(text: &str) -> Option<Fields<'_>> {
    serde_json::from_str::<Fields>(text).ok()
}

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(8);
                while let Some(Key(k)) = map.next_key()? {
                    out.push((k, map.next_value::<J>()?));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(Object)
    }
}

/// An object's key, borrowed unless it has escapes.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(Text)
    }
}

impl Fields<'_> {
    /// The fields that count, in place: of keys given twice the last, as a map keeps it; in
    /// the order of their keys, as a map iterates.
    fn effective(&mut self) -> &[(std::borrow::Cow<'_, str>, J)] {
        // Stable: of equal keys, the last given stays last in its run.
        self.0.sort_by(|a, b| a.0.cmp(&b.0));
        // `dedup_by` drops the later of two equal neighbours: move its value into the
        // earlier one first, so the last given is the one kept.
        self.0.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(later, kept);
            }
            same
        });
        &self.0
    }
}

/// A row from an object's fields, sorted by key and each key once (as a map holds them):
/// fields name columns, matched exactly first, then ignoring ASCII case; a field naming no
/// column is refused unless it is null (it then says nothing).
fn fields_row<K: AsRef<str>, V: std::borrow::Borrow<J>>(
    target: &Target<'_>,
    fields: &[(K, V)],
    line: usize,
) -> Result<Vec<Option<Value>>> {
    let table = target.table;
    for (key, value) in fields {
        let key = key.as_ref();
        if table.column_index(key).is_none() && !value.borrow().is_null() {
            return Err(target.unknown(line, key));
        }
    }
    let mut row = target.blank();
    for (c, col) in table.columns.iter().enumerate() {
        if target.is_fixed(c) {
            continue;
        }
        let name = col.name.as_str();
        let field = (fields.binary_search_by(|(k, _)| k.as_ref().cmp(name)).ok())
            .map(|i| &fields[i])
            .or_else(|| (fields.iter()).find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name)));
        if let Some((_, field)) = field {
            row[c] = Some(cell(col, field.borrow()).map_err(|reason| Error::BadRow {
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
        (_, J::Number(n)) => direct(ty, n).map_or_else(|| parse_text(ty, &n.to_string()), Ok),
        (_, J::Bool(b)) => parse_text(ty, if *b { "1" } else { "0" }),
        _ => Err(format!("{v} does not fit type {}", ty.name())),
    }
}

/// A JSON number as a value of a numeric `ty` without going through its text, when that
/// gives the same value ([`parse_text`] of its text does the rest and words the errors).
fn direct(ty: ColumnType, n: &serde_json::Number) -> Option<Value> {
    use super::IntRange;
    match (ty, super::int_range(ty)) {
        (ColumnType::Float32 | ColumnType::Float64, _) => n.as_f64().map(Value::Float),
        (_, Some(IntRange::Signed(lo, hi))) => (n.as_i64())
            .filter(|x| (lo..=hi).contains(x))
            .map(Value::Int),
        (_, Some(IntRange::Unsigned(hi))) => n.as_u64().filter(|x| *x <= hi).map(Value::UInt),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::decode::testutil::table_of;

    #[test]
    fn one_object_reads_as_the_general_path_does() {
        use ColumnType as T;
        let table = table_of(
            1,
            &[
                ("ts", T::Timestamp, true),
                ("Device", T::String, true),
                ("temp", T::Float64, true),
                ("n", T::Int16, true),
                ("u", T::UInt8, false),
                ("ok", T::Bool, true),
            ],
        );
        let target = Target::new(&table, &[]).unwrap();
        for text in [
            r#"{"ts":1700000000000,"Device":"d1","temp":21.5,"n":-3,"u":7,"ok":true}"#,
            "\n\n  {\"u\":1}",
            r#"{"device":"lower","DEVICE":"upper","u":1}"#,
            r#"{"u":1,"u":2}"#,
            r#"{"u":1,"temp":null,"temp":2.5}"#,
            r#"{"u":1,"zzz":null}"#,
            r#"{"u":1,"zzz":3,"aaa":4}"#,
            r#"{"u":1,"Device":{"nested":[1,2]}}"#,
            r#"{"u":300}"#,
            r#"{"u":-1}"#,
            r#"{"u":1,"n":40000}"#,
            r#"{"u":1,"n":2.5}"#,
            r#"{"u":1,"temp":"3.25"}"#,
            r#"{"u":1,"temp":18446744073709551615}"#,
            r#"{"u":1,"ok":"yes"}"#,
            r#"{"u":null}"#,
            r#"{"\u0075":5}"#,
            r#"{"u":1} {"u":2}"#,
            r#"[{"u":1}]"#,
            "42",
            r#"{"u":"#,
        ] {
            let fast = decode(&target, text).map_err(|e| e.to_string());
            let all = decode_all(&target, text).map_err(|e| e.to_string());
            assert_eq!(fast, all, "{text}");
        }
        // Many fields, given twice, nulls for the unknown ones.
        let wide: Vec<String> = (0..60)
            .map(|i| format!(r#""x{i}":null,"u":{}"#, i % 7))
            .collect();
        let text = format!("{{{},\"temp\":1.5}}", wide.join(","));
        let fast = decode(&target, &text).map_err(|e| e.to_string());
        assert_eq!(fast, decode_all(&target, &text).map_err(|e| e.to_string()));
        assert_eq!(fast.unwrap()[0][4], Value::UInt(3), "the last `u` given");
    }
}

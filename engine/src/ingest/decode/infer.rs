//! Schema inference for tables created by their first JSON message.

use crate::error::{Error, Result};
use crate::types::ColumnType;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as J;

/// Columns for the top-level fields of a JSON object (or of the first object of an array or
/// of JSON lines), in the order they are written: booleans are `Bool`, integers `Int64`
/// (`UInt64` past `i64::MAX`), other numbers `Float64`, strings that read as RFC 3339
/// timestamps `Timestamp`, other strings `String`, nested objects and arrays `String` (their
/// JSON text is stored). Null fields say nothing about their type and are left out.
pub(crate) fn infer_json_columns(body: &[u8]) -> Result<Vec<(String, ColumnType)>> {
    let text = std::str::from_utf8(body).map_err(|_| Error::BadPayload {
        line: 1,
        reason: "payload is not valid UTF-8".into(),
    })?;
    let first = serde_json::Deserializer::from_str(text)
        .into_iter::<First>()
        .next()
        .ok_or_else(|| Error::BadPayload {
            line: 1,
            reason: "no JSON object in payload".into(),
        })?
        .map_err(|e| Error::BadPayload {
            line: e.line(),
            reason: format!("invalid JSON: {e}"),
        })?;
    let fields = first.0.ok_or_else(|| Error::BadPayload {
        line: 1,
        reason: "expected a JSON object (or an array of objects) to infer columns from".into(),
    })?;
    let mut out: Vec<(String, ColumnType)> = Vec::with_capacity(fields.len());
    for (name, value) in fields {
        let ty = match value {
            J::Null => continue,
            J::Bool(_) => ColumnType::Bool,
            J::Number(n) if n.is_i64() => ColumnType::Int64,
            J::Number(n) if n.is_u64() => ColumnType::UInt64,
            J::Number(_) => ColumnType::Float64,
            J::String(s) if chrono::DateTime::parse_from_rfc3339(&s).is_ok() => {
                ColumnType::Timestamp
            }
            J::String(_) | J::Array(_) | J::Object(_) => ColumnType::String,
        };
        // A repeated key: the last one wins, as when decoding.
        out.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
        out.push((name, ty));
    }
    Ok(out)
}

/// The fields of the first object, in document order (serde_json's map sorts its keys).
/// `None` when the first value is not an object or an array starting with one.
struct First(Option<Vec<(String, J)>>);

impl<'de> Deserialize<'de> for First {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FirstVisitor)
    }
}

struct FirstVisitor;

impl<'de> Visitor<'de> for FirstVisitor {
    type Value = First;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object or an array of objects")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<First, A::Error> {
        let mut fields = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, J>()? {
            fields.push((k, v));
        }
        Ok(First(Some(fields)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First, A::Error> {
        let first = seq.next_element::<First>()?.and_then(|f| f.0);
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(First(first))
    }

    fn visit_bool<E>(self, _: bool) -> Result<First, E> {
        Ok(First(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<First, E> {
        Ok(First(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<First, E> {
        Ok(First(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<First, E> {
        Ok(First(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<First, E> {
        Ok(First(None))
    }
    fn visit_unit<E>(self) -> Result<First, E> {
        Ok(First(None))
    }
}

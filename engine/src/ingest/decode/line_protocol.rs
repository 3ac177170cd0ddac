//! InfluxDB line protocol: `measurement[,tag=v...] field=v[,field=v...] [timestamp]`.
//!
//! One row per line; blank lines and `#` comments are skipped. The measurement is not stored
//! (the topic or URL chooses the table). Tags and fields fill the columns of their names;
//! the timestamp, in nanoseconds since the epoch, fills the table's time column (winning
//! over a field of that name), and a line with neither takes its arrival time. A timestamp
//! for a table without a time column is refused rather than dropped. Escapes are InfluxDB's: `\,` `\ ` `\=` in the
//! measurement, keys and tag values; `\"` and `\\` in string field values.
//!
//! Field values are typed as written (`1.5` float, `1i` integer, `1u` unsigned, `"s"`
//! string, `t`/`true`/`F`/`false`... boolean) and converted to the column's type where no
//! information is lost: an integer fits a float column, a float does not fit an integer one.

use super::{Target, epoch_to_micros, parse_text, time_value};
use crate::error::{Error, Result};
use crate::types::{ColumnType, Value};
use std::borrow::Cow;

/// Decodes line protocol text; `now_micros` is the arrival time for lines without one.
pub(super) fn decode(target: &Target<'_>, text: &str, now_micros: i64) -> Result<Vec<Vec<Value>>> {
    let table = target.table;
    let time_col = table.time_column();
    let mut rows = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw).trim_start();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let parsed = parse_line(raw).map_err(|reason| Error::BadPayload { line, reason })?;
        let mut row = target.blank();
        // Keys usually come in the table's column order: each lookup tries the column after
        // the last one found before searching.
        let mut next = 0;
        let mut column = |key: &str| -> Result<usize> {
            let c = match table.columns.get(next) {
                Some(col) if col.name == key => next,
                _ => table
                    .column_index(key)
                    .ok_or_else(|| target.unknown(line, key))?,
            };
            next = c + 1;
            Ok(c)
        };
        let mut set = |c: usize, value: Result<Value, String>| -> Result<()> {
            row[c] = Some(value.map_err(|reason| Error::BadRow {
                line,
                column: table.columns[c].name.clone(),
                reason,
            })?);
            Ok(())
        };
        for (key, value) in &parsed.tags {
            let c = column(key)?;
            if !target.is_fixed(c) {
                set(c, parse_text(table.columns[c].ty, value))?;
            }
        }
        for (key, value) in &parsed.fields {
            let c = column(key)?;
            if !target.is_fixed(c) {
                set(c, value.convert(table.columns[c].ty))?;
            }
        }
        match (parsed.timestamp, time_col) {
            (Some(_), None) => {
                return Err(Error::BadPayload {
                    line,
                    reason: format!(
                        "the line has a timestamp but {}.{} has no time column",
                        table.database, table.name
                    ),
                });
            }
            (Some(ns), Some(tc)) if !target.is_fixed(tc) => {
                row[tc] = Some(time_value(table.columns[tc].ty, ns.div_euclid(1000)));
            }
            (None, Some(tc)) if row[tc].is_none() && !target.is_fixed(tc) => {
                row[tc] = Some(time_value(table.columns[tc].ty, now_micros));
            }
            _ => {}
        }
        target.push(&mut rows, row)?;
    }
    Ok(rows)
}

/// `v` as a value of the integer column type `ty` when it is in the type's range.
fn int_value(ty: ColumnType, v: i128) -> Option<Value> {
    use super::IntRange;
    match super::int_range(ty)? {
        IntRange::Signed(lo, hi) => (i128::from(lo)..=i128::from(hi))
            .contains(&v)
            .then_some(Value::Int(v as i64)),
        IntRange::Unsigned(hi) => (0..=i128::from(hi))
            .contains(&v)
            .then_some(Value::UInt(v as u64)),
    }
}

/// One parsed line (the measurement is checked and dropped); keys and values borrow from
/// the line unless they held escapes.
#[derive(Debug, Clone, PartialEq)]
struct Line<'a> {
    measurement: Cow<'a, str>,
    tags: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    fields: Vec<(Cow<'a, str>, Field<'a>)>,
    timestamp: Option<i64>,
}

/// A field value as typed in the line.
#[derive(Debug, Clone, PartialEq)]
enum Field<'a> {
    Float(f64),
    Int(i64),
    UInt(u64),
    Str(Cow<'a, str>),
    Bool(bool),
}

impl Field<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Field::Float(_) => "float",
            Field::Int(_) => "integer",
            Field::UInt(_) => "unsigned",
            Field::Str(_) => "string",
            Field::Bool(_) => "boolean",
        }
    }

    /// The value for a column of type `ty`, refusing conversions that lose information.
    fn convert(&self, ty: ColumnType) -> Result<Value, String> {
        use ColumnType as T;
        let int_type = matches!(
            ty,
            T::Int8 | T::Int16 | T::Int32 | T::Int64 | T::UInt8 | T::UInt16 | T::UInt32 | T::UInt64
        );
        match (self, ty) {
            (Field::Str(s), _) => parse_text(ty, s),
            (Field::Bool(b), T::Bool) => Ok(Value::Bool(*b)),
            (Field::Bool(b), T::String) => Ok(Value::Str(b.to_string())),
            // In range: as is; otherwise `parse_text` words the error.
            (Field::Int(i), _) if int_type => {
                int_value(ty, i128::from(*i)).map_or_else(|| parse_text(ty, &i.to_string()), Ok)
            }
            (Field::UInt(u), _) if int_type => {
                int_value(ty, i128::from(*u)).map_or_else(|| parse_text(ty, &u.to_string()), Ok)
            }
            (Field::Int(i), T::Float32 | T::Float64) => Ok(Value::Float(*i as f64)),
            (Field::UInt(u), T::Float32 | T::Float64) => Ok(Value::Float(*u as f64)),
            (Field::Float(x), T::Float32 | T::Float64) => Ok(Value::Float(*x)),
            (Field::Int(i), T::Timestamp) => Ok(Value::Timestamp(epoch_to_micros(*i))),
            (Field::UInt(u), T::Timestamp) => i64::try_from(*u)
                .map(|i| Value::Timestamp(epoch_to_micros(i)))
                .map_err(|_| format!("{u} is out of range for a timestamp")),
            (Field::Int(i), T::String) => Ok(Value::Str(i.to_string())),
            (Field::UInt(u), T::String) => Ok(Value::Str(u.to_string())),
            (Field::Float(x), T::String) => Ok(Value::Str(x.to_string())),
            (Field::Float(x), _) if int_type => Err(format!(
                "float {x} does not fit column type {} (write integers as {}i or {}u)",
                ty.name(),
                x.trunc(),
                x.trunc()
            )),
            (f, _) => Err(format!(
                "a {} value does not fit column type {}",
                f.kind(),
                ty.name()
            )),
        }
    }
}

/// A position in a line. Every delimiter is ASCII, so the line is walked byte by byte and
/// cut only at delimiters (always at a char boundary).
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn skip_spaces(&mut self) -> bool {
        let start = self.pos;
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
        self.pos > start
    }

    /// Reads up to an unescaped byte of `stops`, resolving `\,` `\ ` `\=`; any other
    /// backslash is kept as written. Borrowed unless there was an escape.
    fn token(&mut self, stops: &[u8]) -> Cow<'a, str> {
        let bytes = self.s.as_bytes();
        let start = self.pos;
        let mut escaped = false;
        while let Some(&c) = bytes.get(self.pos) {
            if stops.contains(&c) {
                break;
            }
            if c == b'\\' && matches!(bytes.get(self.pos + 1), Some(b',' | b' ' | b'=')) {
                escaped = true;
                self.pos += 2;
            } else {
                self.pos += 1;
            }
        }
        let raw = &self.s[start..self.pos];
        if !escaped {
            return Cow::Borrowed(raw);
        }
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek()) {
                ('\\', Some(&n @ (',' | ' ' | '='))) => {
                    chars.next();
                    out.push(n);
                }
                _ => out.push(c),
            }
        }
        Cow::Owned(out)
    }

    /// Reads a string field value after its opening quote (`\"` and `\\` resolved).
    fn string(&mut self, key: &str) -> Result<Cow<'a, str>, String> {
        let bytes = self.s.as_bytes();
        let start = self.pos;
        let mut escaped = false;
        loop {
            match bytes.get(self.pos) {
                None => return Err(format!("field '{key}' has an unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.pos +=
                        1 + usize::from(matches!(bytes.get(self.pos + 1), Some(b'"' | b'\\')));
                }
                Some(_) => self.pos += 1,
            }
        }
        let raw = &self.s[start..self.pos];
        self.pos += 1;
        if !escaped {
            return Ok(Cow::Borrowed(raw));
        }
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek()) {
                ('\\', Some(&n @ ('"' | '\\'))) => {
                    chars.next();
                    out.push(n);
                }
                _ => out.push(c),
            }
        }
        Ok(Cow::Owned(out))
    }
}

fn parse_line(s: &str) -> Result<Line<'_>, String> {
    let mut cur = Cursor { s, pos: 0 };
    let measurement = cur.token(b", ");
    if measurement.is_empty() {
        return Err("missing measurement name".into());
    }
    let mut tags = Vec::new();
    while cur.peek() == Some(b',') {
        cur.bump();
        let key = cur.token(b"=, ");
        if cur.bump() != Some(b'=') {
            return Err(format!("tag '{key}' has no '=value'"));
        }
        let value = cur.token(b", ");
        if key.is_empty() || value.is_empty() {
            return Err(format!("tag '{key}={value}' has an empty key or value"));
        }
        tags.push((key, value));
    }
    if !cur.skip_spaces() || cur.peek().is_none() {
        return Err("expected a space and at least one field (key=value)".into());
    }
    let mut fields = Vec::new();
    loop {
        let key = cur.token(b"=, ");
        if key.is_empty() {
            return Err("a field has an empty key".into());
        }
        if cur.bump() != Some(b'=') {
            return Err(format!("field '{key}' has no '=value'"));
        }
        let value = if cur.peek() == Some(b'"') {
            cur.bump();
            Field::Str(cur.string(&key)?)
        } else {
            let raw = cur.token(b", ");
            field_value(&raw).ok_or_else(|| {
                format!(
                    "field '{key}': '{raw}' is not a value (float 1.5, integer 1i, unsigned 1u, string \"s\", boolean t/f)"
                )
            })?
        };
        fields.push((key, value));
        if cur.peek() == Some(b',') {
            cur.bump();
        } else {
            break;
        }
    }
    cur.skip_spaces();
    let timestamp = match cur.peek() {
        None => None,
        Some(_) => {
            let raw = cur.token(b" ");
            let ts = raw.parse::<i64>().map_err(|_| {
                format!("'{raw}' is not a timestamp (integer nanoseconds since the epoch)")
            })?;
            cur.skip_spaces();
            if cur.peek().is_some() {
                return Err(format!(
                    "unexpected '{}' after the timestamp",
                    &cur.s[cur.pos..]
                ));
            }
            Some(ts)
        }
    };
    Ok(Line {
        measurement,
        tags,
        fields,
        timestamp,
    })
}

/// The lines of one measurement (InfluxDB's write API: the measurement is the table).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measurement {
    /// Its name.
    pub(crate) name: String,
    /// Its lines, timestamps in nanoseconds.
    pub(crate) text: String,
    /// For each of its lines, that line's number in the whole text (errors name it).
    pub(crate) lines: Vec<usize>,
    /// The columns its lines name, with the types they are written in (first seen wins):
    /// `time` (Timestamp), tags (String), fields (Float64, Int64, UInt64, String, Bool).
    pub(crate) columns: Vec<(String, ColumnType)>,
}

impl Measurement {
    /// `e`, an error decoding this measurement's text, with its line numbered as in the
    /// whole text.
    pub(crate) fn in_whole_text(&self, e: Error) -> Error {
        let whole = |line: usize| {
            self.lines
                .get(line.wrapping_sub(1))
                .copied()
                .unwrap_or(line)
        };
        match e {
            Error::BadRow {
                line,
                column,
                reason,
            } => Error::BadRow {
                line: whole(line),
                column,
                reason,
            },
            Error::BadPayload { line, reason } => Error::BadPayload {
                line: whole(line),
                reason,
            },
            other => other,
        }
    }
}

/// Line protocol text grouped by measurement, in order of first appearance, its
/// timestamps written in units of `ns_per_unit` nanoseconds (1 for `precision=ns`,
/// 1,000,000,000 for `s`) rewritten in nanoseconds. A line that does not parse is an error
/// naming its line.
/// With `rejected`, a line that does not parse (or whose timestamp is out of range) is put
/// there, as an error naming it, instead of failing the whole text.
pub(crate) fn by_measurement_keeping(
    text: &str,
    ns_per_unit: i64,
    mut rejected: Option<&mut Vec<Error>>,
) -> Result<Vec<Measurement>> {
    let mut out: Vec<Measurement> = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let raw = raw.strip_suffix('\r').unwrap_or(raw).trim();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let parsed = parse_line(raw).map_err(|reason| Error::BadPayload {
            line: i + 1,
            reason,
        });
        let line = match (parsed, rejected.as_deref_mut()) {
            (Ok(line), _) => line,
            (Err(e), Some(rejected)) => {
                rejected.push(e);
                continue;
            }
            (Err(e), None) => return Err(e),
        };
        // The timestamp in nanoseconds, checked before the line counts for its measurement
        // (a refused line adds no column).
        let rescaled = match line.timestamp {
            Some(ts) if ns_per_unit != 1 => match ts.checked_mul(ns_per_unit) {
                Some(ns) => Some(ns),
                None => {
                    let e = Error::BadPayload {
                        line: i + 1,
                        reason: format!("timestamp {ts} is out of range at this precision"),
                    };
                    match rejected.as_deref_mut() {
                        Some(rejected) => {
                            rejected.push(e);
                            continue;
                        }
                        None => return Err(e),
                    }
                }
            },
            _ => None,
        };
        let at = match out.iter().position(|m| m.name == line.measurement) {
            Some(at) => at,
            None => {
                out.push(Measurement {
                    name: line.measurement.to_string(),
                    text: String::new(),
                    lines: Vec::new(),
                    columns: vec![("time".into(), ColumnType::Timestamp)],
                });
                out.len() - 1
            }
        };
        let m = &mut out[at];
        let mut add = |name: &str, ty| {
            if !m.columns.iter().any(|(n, _)| n == name) {
                m.columns.push((name.to_string(), ty));
            }
        };
        for (key, _) in &line.tags {
            add(key, ColumnType::String);
        }
        for (key, value) in &line.fields {
            add(
                key,
                match value {
                    Field::Float(_) => ColumnType::Float64,
                    Field::Int(_) => ColumnType::Int64,
                    Field::UInt(_) => ColumnType::UInt64,
                    Field::Str(_) => ColumnType::String,
                    Field::Bool(_) => ColumnType::Bool,
                },
            );
        }
        // The timestamp is the line's last token (the parse checked the grammar).
        match rescaled {
            Some(ns) => {
                let (head, _) = raw.rsplit_once(' ').unwrap_or((raw, ""));
                m.text.push_str(head);
                m.text.push(' ');
                m.text.push_str(&ns.to_string());
            }
            None => m.text.push_str(raw),
        }
        m.text.push('\n');
        m.lines.push(i + 1);
    }
    Ok(out)
}

/// A non-string field value, typed by its spelling.
fn field_value(raw: &str) -> Option<Field<'static>> {
    match raw {
        "t" | "T" | "true" | "True" | "TRUE" => return Some(Field::Bool(true)),
        "f" | "F" | "false" | "False" | "FALSE" => return Some(Field::Bool(false)),
        _ => {}
    }
    if let Some(n) = raw.strip_suffix('i') {
        return n.parse().ok().map(Field::Int);
    }
    if let Some(n) = raw.strip_suffix('u') {
        return n.parse().ok().map(Field::UInt);
    }
    // Digits, sign, point and exponent only: no `inf` or `NaN`.
    let numeric = raw
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '+' | '-' | '.' | 'e' | 'E'));
    raw.parse::<f64>()
        .ok()
        .filter(|x| numeric && x.is_finite())
        .map(Field::Float)
}

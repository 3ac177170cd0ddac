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
        let mut set = |key: &str, value: Result<Value, String>| -> Result<()> {
            let c = table
                .column_index(key)
                .ok_or_else(|| target.unknown(line, key))?;
            if target.is_fixed(c) {
                return Ok(());
            }
            row[c] = Some(value.map_err(|reason| Error::BadRow {
                line,
                column: table.columns[c].name.clone(),
                reason,
            })?);
            Ok(())
        };
        for (key, value) in &parsed.tags {
            let ty = table.column_index(key).map(|c| table.columns[c].ty);
            set(key, ty.map_or(Ok(Value::Null), |ty| parse_text(ty, value)))?;
        }
        for (key, value) in &parsed.fields {
            let ty = table.column_index(key).map(|c| table.columns[c].ty);
            set(key, ty.map_or(Ok(Value::Null), |ty| value.convert(ty)))?;
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

/// One parsed line (the measurement is checked and dropped).
#[derive(Debug, Clone, PartialEq)]
struct Line {
    tags: Vec<(String, String)>,
    fields: Vec<(String, Field)>,
    timestamp: Option<i64>,
}

/// A field value as typed in the line.
#[derive(Debug, Clone, PartialEq)]
enum Field {
    Float(f64),
    Int(i64),
    UInt(u64),
    Str(String),
    Bool(bool),
}

impl Field {
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
            (Field::Int(i), _) if int_type => parse_text(ty, &i.to_string()),
            (Field::UInt(u), _) if int_type => parse_text(ty, &u.to_string()),
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

/// A position in a line.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_spaces(&mut self) -> bool {
        let start = self.pos;
        while self.peek() == Some(' ') {
            self.bump();
        }
        self.pos > start
    }

    /// Reads up to an unescaped char of `stops`, resolving `\,` `\ ` `\=`; any other
    /// backslash is kept as written.
    fn token(&mut self, stops: &[char]) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if stops.contains(&c) {
                break;
            }
            self.bump();
            match (c, self.peek()) {
                ('\\', Some(n @ (',' | ' ' | '='))) => {
                    self.bump();
                    out.push(n);
                }
                _ => out.push(c),
            }
        }
        out
    }

    /// Reads a string field value after its opening quote.
    fn string(&mut self, key: &str) -> Result<String, String> {
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err(format!("field '{key}' has an unterminated string")),
                Some('"') => return Ok(out),
                Some('\\') => match self.peek() {
                    Some(n @ ('"' | '\\')) => {
                        self.bump();
                        out.push(n);
                    }
                    _ => out.push('\\'),
                },
                Some(c) => out.push(c),
            }
        }
    }
}

fn parse_line(s: &str) -> Result<Line, String> {
    let mut cur = Cursor { s, pos: 0 };
    if cur.token(&[',', ' ']).is_empty() {
        return Err("missing measurement name".into());
    }
    let mut tags = Vec::new();
    while cur.peek() == Some(',') {
        cur.bump();
        let key = cur.token(&['=', ',', ' ']);
        if cur.bump() != Some('=') {
            return Err(format!("tag '{key}' has no '=value'"));
        }
        let value = cur.token(&[',', ' ']);
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
        let key = cur.token(&['=', ',', ' ']);
        if key.is_empty() {
            return Err("a field has an empty key".into());
        }
        if cur.bump() != Some('=') {
            return Err(format!("field '{key}' has no '=value'"));
        }
        let value = if cur.peek() == Some('"') {
            cur.bump();
            Field::Str(cur.string(&key)?)
        } else {
            let raw = cur.token(&[',', ' ']);
            field_value(&raw).ok_or_else(|| {
                format!(
                    "field '{key}': '{raw}' is not a value (float 1.5, integer 1i, unsigned 1u, string \"s\", boolean t/f)"
                )
            })?
        };
        fields.push((key, value));
        if cur.peek() == Some(',') {
            cur.bump();
        } else {
            break;
        }
    }
    cur.skip_spaces();
    let timestamp = match cur.peek() {
        None => None,
        Some(_) => {
            let raw = cur.token(&[' ']);
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
        tags,
        fields,
        timestamp,
    })
}

/// A non-string field value, typed by its spelling.
fn field_value(raw: &str) -> Option<Field> {
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

//! CSV bodies: one row per line, no header, RFC 4180 quoting.

use super::{Target, parse_text};
use crate::error::{Error, Result};
use crate::types::{ColumnType, Value};

/// Decodes CSV lines. A line holds either every column in order, or, when the topic fixes
/// some columns, only the others in order.
pub(super) fn decode(target: &Target<'_>, text: &str) -> Result<Vec<Vec<Value>>> {
    let table = target.table;
    let all: Vec<usize> = (0..table.columns.len()).collect();
    let free: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&c| !target.is_fixed(c))
        .collect();
    let mut rows = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if raw.trim().is_empty() {
            continue;
        }
        let fields = split_csv(raw).map_err(|reason| Error::BadPayload { line, reason })?;
        let columns = if fields.len() == free.len() {
            &free
        } else if fields.len() == all.len() {
            &all
        } else {
            return Err(Error::BadPayload {
                line,
                reason: format!(
                    "expected {} fields (columns {}), found {}",
                    free.len(),
                    free.iter()
                        .map(|&c| table.columns[c].name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    fields.len()
                ),
            });
        };
        let mut row = target.blank();
        for (&c, (field, quoted)) in columns.iter().zip(fields) {
            if target.is_fixed(c) {
                continue;
            }
            let col = &table.columns[c];
            if field.is_empty() && !quoted && col.ty != ColumnType::String {
                // Left for `finish`: NULL, the default, or the arrival time.
                continue;
            }
            row[c] = Some(parse_text(col.ty, &field).map_err(|reason| Error::BadRow {
                line,
                column: col.name.clone(),
                reason,
            })?);
        }
        target.push(&mut rows, row)?;
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

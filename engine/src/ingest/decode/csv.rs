//! CSV bodies: one row per line, no header, RFC 4180 quoting.

use super::{Target, parse_text};
use crate::error::{Error, Result};
use crate::types::{ColumnType, Value};
use std::borrow::Cow;

/// Decodes CSV lines. A line holds either every column in order, or, when the topic fixes
/// some columns, only the others in order.
pub(super) fn decode(target: &Target<'_>, text: &str) -> Result<Vec<Vec<Value>>> {
    let table = target.table;
    let width = table.columns.len();
    let free = width - target.fixed_count;
    let mut rows = Vec::new();
    let mut fields = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if raw.trim().is_empty() {
            continue;
        }
        fields.clear();
        split_csv(raw, &mut fields).map_err(|reason| Error::BadPayload { line, reason })?;
        // The fields fill the columns the topic leaves free, or all of them (the fixed
        // ones then read and dropped).
        let skip_fixed = fields.len() == free;
        if !skip_fixed && fields.len() != width {
            return Err(Error::BadPayload {
                line,
                reason: format!(
                    "expected {} fields (columns {}), found {}",
                    free,
                    (table.columns.iter().enumerate())
                        .filter(|(c, _)| !target.is_fixed(*c))
                        .map(|(_, col)| col.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    fields.len()
                ),
            });
        }
        let columns = (0..width).filter(|&c| !(skip_fixed && target.is_fixed(c)));
        let mut row = target.blank();
        for (c, (field, quoted)) in columns.zip(fields.drain(..)) {
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

/// Splits one CSV line (RFC 4180 quoting) into `out`: each field and whether it was quoted.
/// Unquoted fields are trimmed; a field is borrowed from the line unless it holds an
/// escaped quote.
fn split_csv<'a>(line: &'a str, out: &mut Vec<(Cow<'a, str>, bool)>) -> Result<(), String> {
    let mut rest = line;
    loop {
        if let Some(quoted) = rest.strip_prefix('"') {
            let (field, after) = quoted_field(quoted)?;
            out.push((field, true));
            let mut after = after.chars();
            match after.next() {
                None => return Ok(()),
                Some(',') => rest = after.as_str(),
                Some(c) => return Err(format!("unexpected '{c}' after a quoted field")),
            }
        } else {
            match rest.split_once(',') {
                Some((field, after)) => {
                    out.push((Cow::Borrowed(field.trim()), false));
                    rest = after;
                }
                None => {
                    out.push((Cow::Borrowed(rest.trim()), false));
                    return Ok(());
                }
            }
        }
    }
}

/// A quoted field's text (`text` starts after its opening quote) and what follows its
/// closing quote.
fn quoted_field(text: &str) -> Result<(Cow<'_, str>, &str), String> {
    let mut owned: Option<String> = None;
    let mut from = 0;
    loop {
        let Some(at) = text[from..].find('"').map(|i| from + i) else {
            return Err("unterminated quoted field".into());
        };
        if text[at + 1..].starts_with('"') {
            // `""`: one quote in the field.
            owned
                .get_or_insert_with(String::new)
                .push_str(&text[from..=at]);
            from = at + 2;
            continue;
        }
        let field = match owned {
            Some(mut s) => {
                s.push_str(&text[from..at]);
                Cow::Owned(s)
            }
            None => Cow::Borrowed(&text[..at]),
        };
        return Ok((field, &text[at + 1..]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str) -> Result<Vec<(String, bool)>, String> {
        let mut out = Vec::new();
        split_csv(line, &mut out)?;
        Ok(out.into_iter().map(|(f, q)| (f.into_owned(), q)).collect())
    }

    #[test]
    fn fields_quoted_and_not() {
        let f = |s: &str, q| (s.to_string(), q);
        assert_eq!(
            split("a, b ,c").unwrap(),
            [f("a", false), f("b", false), f("c", false)]
        );
        assert_eq!(split("").unwrap(), [f("", false)]);
        assert_eq!(
            split("a,,").unwrap(),
            [f("a", false), f("", false), f("", false)]
        );
        // The line `"x, ""y""",2,""`: an escaped quote, and an empty quoted field.
        assert_eq!(
            split("\"x, \"\"y\"\"\",2,\"\"").unwrap(),
            [f("x, \"y\"", true), f("2", false), f("", true)]
        );
        // `"x",""""`: a field of one quote.
        assert_eq!(
            split("\"x\",\"\"\"\"").unwrap(),
            [f("x", true), f("\"", true)]
        );
        // `"x","""`: the escaped quote leaves the field open.
        assert_eq!(
            split("\"x\",\"\"\"").unwrap_err(),
            "unterminated quoted field"
        );
        assert_eq!(split(r#"" a ""#).unwrap(), [f(" a ", true)]);
        assert_eq!(split(r#""""#).unwrap(), [f("", true)]);
        assert_eq!(
            split(r#""é""ü",ß"#).unwrap(),
            [f(r#"é"ü"#, true), f("ß", false)]
        );
        assert_eq!(
            split(r#""a"b"#).unwrap_err(),
            "unexpected 'b' after a quoted field"
        );
        assert_eq!(split("\"a").unwrap_err(), "unterminated quoted field");
    }
}

//! What a PostgreSQL server answers itself, without the engine: the settings clients set and
//! read on connect (`SET`, `RESET`, `SHOW`), transactions (accepted, as no-ops: every
//! statement commits on its own), and splitting a simple query's text into statements.

use std::collections::HashMap;

/// Where a connection's `SET` values live in the client's metadata.
const PREFIX: &str = "sluice.set.";

/// A statement the server answers itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Local {
    /// `SET name = value` (also `SET SESSION`, `SET LOCAL`, `SET name TO value`).
    Set(String, String),
    /// `RESET name` (`None`: `RESET ALL`).
    Reset(Option<String>),
    /// `SHOW name` of a setting (not Sluice's own `SHOW TABLES`, ...).
    Show(String),
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END`, `ROLLBACK`, `ABORT`: with the word the client is told.
    End(&'static str),
    /// `DISCARD ...`, `DEALLOCATE ...`, `LISTEN`, `UNLISTEN`: nothing to do.
    Nothing(&'static str),
}

/// Sluice's own `SHOW` statements, which the engine answers.
const SLUICE_SHOWS: [&str; 5] = ["tables", "databases", "users", "grants", "create"];

impl Local {
    /// The statement, if the server answers it itself.
    pub(crate) fn parse(sql: &str) -> Option<Local> {
        let words: Vec<&str> = sql.split_whitespace().collect();
        let word = |i: usize| words.get(i).map(|w| w.to_ascii_lowercase());
        let first = word(0)?;
        let first = first.trim_end_matches(';');
        Some(match first {
            "begin" | "start" => Local::Begin,
            "commit" | "end" => Local::End("COMMIT"),
            "rollback" | "abort" => Local::End("ROLLBACK"),
            "discard" => Local::Nothing("DISCARD ALL"),
            "deallocate" => Local::Nothing("DEALLOCATE"),
            "listen" => Local::Nothing("LISTEN"),
            "unlisten" => Local::Nothing("UNLISTEN"),
            "set" => {
                let rest = sql.trim().trim_end_matches(';')[3..].trim_start();
                let rest = strip_word(rest, "session")
                    .or_else(|| strip_word(rest, "local"))
                    .unwrap_or(rest);
                if let Some(zone) = strip_word(rest, "time") {
                    let zone = strip_word(zone, "zone")?;
                    return Some(Local::Set("timezone".into(), unquote(zone)));
                }
                let (name, value) = match rest.split_once('=') {
                    Some((n, v)) => (n.trim(), v.trim()),
                    None => {
                        let (n, v) = rest.split_once(char::is_whitespace)?;
                        (n.trim(), strip_word(v.trim_start(), "to")?.trim())
                    }
                };
                Local::Set(name.to_ascii_lowercase(), unquote(value))
            }
            "reset" => match word(1)?.trim_end_matches(';') {
                "all" => Local::Reset(None),
                name => Local::Reset(Some(name.to_string())),
            },
            "show" => {
                let name = word(1)?;
                let name = name.trim_end_matches(';');
                if SLUICE_SHOWS.contains(&name) {
                    return None;
                }
                match name {
                    "time" if word(2).as_deref() == Some("zone") => Local::Show("timezone".into()),
                    "transaction" => Local::Show("transaction_isolation".into()),
                    _ => Local::Show(name.to_string()),
                }
            }
            _ => return None,
        })
    }

    /// Applies a `SET` or `RESET` to the connection's settings.
    pub(crate) fn apply(&self, settings: &mut HashMap<String, String>) {
        match self {
            Local::Set(name, value) => {
                settings.insert(format!("{PREFIX}{name}"), value.clone());
            }
            Local::Reset(Some(name)) => {
                settings.remove(&format!("{PREFIX}{name}"));
            }
            Local::Reset(None) => settings.retain(|k, _| !k.starts_with(PREFIX)),
            _ => {}
        }
    }
}

/// The value `SHOW name` gives: what the connection set, else what PostgreSQL clients
/// expect of a server; `None` for a setting no one knows.
pub(crate) fn setting(settings: &HashMap<String, String>, name: &str) -> Option<String> {
    if let Some(v) = settings.get(&format!("{PREFIX}{name}")) {
        return Some(v.clone());
    }
    // Startup parameters the client sent (application_name, client_encoding, ...).
    if let Some(v) = settings.get(name) {
        return Some(v.clone());
    }
    Some(
        match name {
            "server_version" => SERVER_VERSION,
            "server_version_num" => "160006",
            "server_encoding" | "client_encoding" => "UTF8",
            "datestyle" => "ISO, MDY",
            "intervalstyle" => "postgres",
            "timezone" | "log_timezone" => "UTC",
            "standard_conforming_strings" | "integer_datetimes" => "on",
            "transaction_isolation" | "default_transaction_isolation" => "read committed",
            "transaction_read_only" | "default_transaction_read_only" | "is_superuser" => "off",
            "search_path" => "\"$user\", public",
            "max_identifier_length" => "63",
            "application_name" => "",
            "extra_float_digits" => "1",
            "lc_collate" | "lc_ctype" | "lc_messages" | "lc_monetary" | "lc_numeric" => "C",
            "statement_timeout" | "lock_timeout" | "idle_in_transaction_session_timeout" => "0",
            _ => return None,
        }
        .to_string(),
    )
}

/// What the server calls itself to clients (`server_version`): PostgreSQL 16's protocol.
pub(crate) const SERVER_VERSION: &str = "16.6 (Sluice)";

/// `text` without its first word when that word is `word` (any case).
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let (first, rest) = text.split_at(text.find(char::is_whitespace).unwrap_or(text.len()));
    first.eq_ignore_ascii_case(word).then(|| rest.trim_start())
}

/// A setting's value without its quotes.
fn unquote(v: &str) -> String {
    let v = v.trim();
    for q in ['\'', '"'] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner.replace(&format!("{q}{q}"), &q.to_string());
        }
    }
    v.to_string()
}

/// Calls `f` with the position of each byte of `sql` that is code: outside quotes, dollar
/// quotes (`$tag$ ... $tag$`, not a parameter such as `$1`) and comments.
fn each_code_byte(sql: &str, mut f: impl FnMut(usize)) {
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q {
                    i += 1;
                }
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = sql[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |e| i + 2 + e + 1);
            }
            b'$' => match dollar_tag(&sql[i..]) {
                Some(tag) => {
                    let body = i + tag.len();
                    i = sql[body..]
                        .find(tag)
                        .map_or(bytes.len(), |e| body + e + tag.len() - 1);
                }
                None => f(i),
            },
            _ => f(i),
        }
        i += 1;
    }
}

/// The dollar-quote tag (`$$`, `$body$`) `text` starts with, if any.
fn dollar_tag(text: &str) -> Option<&str> {
    let end = text[1..].find('$')? + 1;
    let name = &text[1..end];
    let is_tag = name.chars().all(|c| c.is_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    is_tag.then(|| &text[..=end])
}

/// Splits a simple query's text into its statements at the `;` that are code; empty
/// statements are dropped.
pub(crate) fn split(sql: &str) -> Vec<&str> {
    let (mut out, mut start) = (Vec::new(), 0);
    each_code_byte(sql, |i| {
        if sql.as_bytes()[i] == b';' {
            out.push(&sql[start..i]);
            start = i + 1;
        }
    });
    out.push(&sql[start.min(sql.len())..]);
    out.into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Calls `f` with the number of each `$n` parameter in code, and where it is in `sql`.
fn each_parameter(sql: &str, mut f: impl FnMut(usize, std::ops::Range<usize>)) {
    let bytes = sql.as_bytes();
    each_code_byte(sql, |i| {
        if bytes[i] == b'$' {
            let digits = bytes[i + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if let Ok(n) = sql[i + 1..i + 1 + digits].parse() {
                f(n, i..i + 1 + digits);
            }
        }
    });
}

/// How many parameters `sql` takes: its highest `$n`.
pub(crate) fn parameters(sql: &str) -> usize {
    let mut most = 0;
    each_parameter(sql, |n, _| most = most.max(n));
    most
}

/// `sql` with each `$n` replaced by its value written as a SQL literal: for Sluice's own
/// statements (`INSERT`, DDL), which take literals rather than parameters.
pub(crate) fn inline(
    sql: &str,
    values: &[datafusion::common::ScalarValue],
) -> Result<String, String> {
    use datafusion::common::ScalarValue as V;
    let mut out = String::with_capacity(sql.len());
    let (mut last, mut missing) = (0, None);
    each_parameter(sql, |n, at| {
        out.push_str(&sql[last..at.start]);
        last = at.end;
        let literal = match values.get(n.wrapping_sub(1)) {
            None => {
                missing.get_or_insert(n);
                return;
            }
            Some(v) if v.is_null() => "NULL".to_string(),
            Some(V::Boolean(Some(b))) => b.to_string().to_uppercase(),
            Some(v) if v.data_type().is_numeric() => v.to_string(),
            Some(v) => match v.cast_to(&datafusion::arrow::datatypes::DataType::Utf8) {
                Ok(V::Utf8(Some(text))) => format!("'{}'", text.replace('\'', "''")),
                _ => format!("'{}'", v.to_string().replace('\'', "''")),
            },
        };
        out.push_str(&literal);
    });
    if let Some(n) = missing {
        return Err(format!("no value for parameter ${n}"));
    }
    out.push_str(&sql[last..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        let text = "SELECT 'a;b'; -- c;d\nSELECT \"x;\" FROM t; /* ; */ SELECT $$;$$, $1;;";
        assert_eq!(
            split(text),
            [
                "SELECT 'a;b'",
                "-- c;d\nSELECT \"x;\" FROM t",
                "/* ; */ SELECT $$;$$, $1"
            ]
        );
        assert!(split(" ; ").is_empty());
    }

    #[test]
    fn parameters_become_literals() {
        use datafusion::common::ScalarValue as V;
        let sql = "INSERT INTO t VALUES ($1, $2, '$3', $3, $4) -- $9";
        assert_eq!(parameters(sql), 4);
        let values = [
            V::Utf8(Some("it's".into())),
            V::Float64(Some(1.5)),
            V::Boolean(Some(true)),
            V::Int64(None),
        ];
        assert_eq!(
            inline(sql, &values).unwrap(),
            "INSERT INTO t VALUES ('it''s', 1.5, '$3', TRUE, NULL) -- $9"
        );
        assert!(inline(sql, &values[..2]).is_err());
        let at = V::TimestampMicrosecond(Some(1_767_225_600_000_000), None);
        assert_eq!(inline("$1", &[at]).unwrap(), "'2026-01-01T00:00:00'");
    }

    #[test]
    fn settings_are_set_shown_and_reset() {
        let mut s = HashMap::new();
        let set = Local::parse("SET extra_float_digits = 3").unwrap();
        assert_eq!(set, Local::Set("extra_float_digits".into(), "3".into()));
        set.apply(&mut s);
        Local::parse("set session DateStyle to 'ISO'")
            .unwrap()
            .apply(&mut s);
        Local::parse("SET TIME ZONE 'Europe/Paris'")
            .unwrap()
            .apply(&mut s);
        assert_eq!(setting(&s, "extra_float_digits").as_deref(), Some("3"));
        assert_eq!(setting(&s, "datestyle").as_deref(), Some("ISO"));
        assert_eq!(setting(&s, "timezone").as_deref(), Some("Europe/Paris"));
        Local::parse("RESET ALL").unwrap().apply(&mut s);
        assert_eq!(setting(&s, "extra_float_digits").as_deref(), Some("1"));
        assert_eq!(setting(&s, "no_such_thing"), None);
        assert_eq!(
            Local::parse("SHOW TIME ZONE"),
            Some(Local::Show("timezone".into()))
        );
        assert_eq!(Local::parse("SHOW TABLES"), None);
        assert_eq!(Local::parse("show create table t"), None);
        assert_eq!(Local::parse("BEGIN READ ONLY"), Some(Local::Begin));
        assert_eq!(Local::parse("rollback;"), Some(Local::End("ROLLBACK")));
        assert_eq!(Local::parse("SELECT 1"), None);
    }
}

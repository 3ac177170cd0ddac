//! JSON mappings: the `json_mappings` table option, which picks columns out of nested JSON.
//!
//! The option is a comma-separated list of `column <- pointer`, each pointer an RFC 6901
//! JSON Pointer (`""` is the whole document, `/a/0/b` walks keys and array indices, `~0` is
//! `~` and `~1` is `/`), quoted with `'` or `"` or not. A pointer may hold one `*` segment:
//! every `*` of a mapping must stand for the same array, which is flattened into one row per
//! element. Columns without a mapping take the top-level field of their name, as plain JSON
//! does; other top-level fields are ignored. A literal key `*` cannot be addressed.
//!
//! ```text
//! sensor_id <- /data/*/0, value <- /data/*/1
//! {"dev_id":"id-01","data":[[1,25.1],[2,25.5]]}  =>  (id-01, 1, 25.1), (id-01, 2, 25.5)
//! ```
//!
//! Mappings are checked when a table is created or its options change, and parsed once per
//! table version: `for_table` keeps parsed mappings in a small cache.

use super::Target;
use super::json::{cell, for_each_value, top_level};
use crate::error::{Error, Result};
use crate::store::catalog::TableDef;
use crate::types::Value;
use parking_lot::RwLock;
use serde_json::Value as J;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// The table option holding JSON mappings.
pub(crate) const JSON_MAPPINGS: &str = "json_mappings";

/// A parsed `json_mappings` option: `column <- pointer, ...`, each pointer an RFC 6901 JSON
/// Pointer (quoted with `'` or `"`, or not) with at most one `*` segment; every `*` stands
/// for the same array, flattened into one row per element. Unmapped columns take the
/// top-level field of their name.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct JsonMapping {
    /// Mapped columns: index, name (to check a cached mapping still fits) and pointer.
    entries: Vec<Entry>,
    /// The segments leading to the array every `*` stands for, if any pointer has one.
    array: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    column: usize,
    name: String,
    /// The pointer as written, for messages.
    text: String,
    /// Segments (after the `*` when `wildcard`).
    path: Vec<String>,
    wildcard: bool,
}

impl JsonMapping {
    /// Parses the option text against `table`; the message says which entry is wrong.
    pub(super) fn parse(table: &TableDef, text: &str) -> Result<Self, String> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut array: Option<(Vec<String>, String)> = None;
        for item in split_entries(text)? {
            let (column, pointer) = item
                .split_once("<-")
                .ok_or_else(|| format!("'{item}' is not 'column <- /json/pointer'"))?;
            let column = unquote(column.trim(), '"')?;
            let text = unquote_pointer(pointer.trim())?;
            let c = table.column_index(column).ok_or_else(|| {
                format!(
                    "'{column}' is not a column of {}.{}",
                    table.database, table.name
                )
            })?;
            if entries.iter().any(|e| e.column == c) {
                return Err(format!("column '{column}' is mapped twice"));
            }
            let segments = parse_pointer(text)?;
            let star: Vec<usize> = (0..segments.len())
                .filter(|&i| segments[i] == "*")
                .collect();
            let (path, wildcard) = match star.as_slice() {
                [] => (segments, false),
                [i] => {
                    let prefix = segments[..*i].to_vec();
                    match &array {
                        Some((p, first)) if *p != prefix => {
                            return Err(format!(
                                "'{text}' and '{first}' flatten different arrays; all '*' of a mapping must stand for the same array"
                            ));
                        }
                        Some(_) => {}
                        None => array = Some((prefix, text.to_string())),
                    }
                    (segments[i + 1..].to_vec(), true)
                }
                _ => return Err(format!("'{text}' has more than one '*'")),
            };
            entries.push(Entry {
                column: c,
                name: table.columns[c].name.clone(),
                text: text.to_string(),
                path,
                wildcard,
            });
        }
        if entries.is_empty() {
            return Err("no 'column <- /json/pointer' entries".into());
        }
        Ok(Self {
            entries,
            array: array.map(|(p, _)| p),
        })
    }

    /// Whether this mapping still fits `table` (the columns it names are where they were).
    fn fits(&self, table: &TableDef) -> bool {
        self.entries.iter().all(|e| {
            table
                .columns
                .get(e.column)
                .is_some_and(|c| c.name == e.name)
        })
    }
}

/// Checks the options of a table being created or altered: a `json_mappings` option must
/// parse against its columns, and a `last_value_key` name key columns.
pub(crate) fn validate_options(table: &TableDef) -> Result<()> {
    if let Some(text) = mapping_text(table) {
        JsonMapping::parse(table, text)
            .map_err(|e| Error::invalid(format!("invalid {JSON_MAPPINGS}: {e}")))?;
    }
    crate::store::latest::key_columns(table).map_err(Error::invalid)?;
    Ok(())
}

fn mapping_text(table: &TableDef) -> Option<&str> {
    table
        .options
        .get(JSON_MAPPINGS)
        .map(String::as_str)
        .filter(|t| !t.trim().is_empty())
}

/// Parsed mappings by table id, with the text they were parsed from.
type Cache = HashMap<u64, (String, Arc<JsonMapping>)>;
static CACHE: LazyLock<RwLock<Cache>> = LazyLock::new(Default::default);
/// Beyond this many tables the cache starts over (dropped tables leave entries behind).
const CACHE_MAX: usize = 4096;

/// The table's mapping, parsed once per option text.
pub(super) fn for_table(table: &TableDef) -> Result<Option<Arc<JsonMapping>>> {
    let Some(text) = mapping_text(table) else {
        return Ok(None);
    };
    if let Some((src, m)) = CACHE.read().get(&table.id)
        && src == text
        && m.fits(table)
    {
        return Ok(Some(m.clone()));
    }
    let m = Arc::new(
        JsonMapping::parse(table, text)
            .map_err(|e| Error::invalid(format!("invalid {JSON_MAPPINGS}: {e}")))?,
    );
    let mut cache = CACHE.write();
    if cache.len() >= CACHE_MAX {
        cache.clear();
    }
    cache.insert(table.id, (text.to_string(), m.clone()));
    Ok(Some(m))
}

/// Splits the option at commas outside quotes.
fn split_entries(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut quote = None;
    let mut start = 0;
    for (i, ch) in text.char_indices() {
        match (quote, ch) {
            (None, '\'' | '"') => quote = Some(ch),
            (Some(q), _) if q == ch => quote = None,
            (None, ',') => {
                out.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if quote.is_some() {
        return Err("unterminated quote".into());
    }
    out.push(text[start..].trim());
    if out.iter().all(|e| e.is_empty()) {
        return Ok(Vec::new());
    }
    if let Some(i) = out.iter().position(|e| e.is_empty()) {
        return Err(format!("entry {} is empty", i + 1));
    }
    Ok(out)
}

fn unquote(s: &str, q: char) -> Result<&str, String> {
    match s.strip_prefix(q) {
        Some(rest) => rest
            .strip_suffix(q)
            .ok_or_else(|| format!("unbalanced quote in {s}")),
        None => Ok(s),
    }
}

fn unquote_pointer(s: &str) -> Result<&str, String> {
    if s.starts_with('\'') {
        unquote(s, '\'')
    } else {
        unquote(s, '"')
    }
}

/// RFC 6901 reference tokens of `pointer` (`*` kept as is).
fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "'{pointer}' is not a JSON pointer: it must be empty or start with '/'"
        ));
    };
    rest.split('/')
        .map(|seg| {
            let mut out = String::with_capacity(seg.len());
            let mut chars = seg.chars();
            while let Some(c) = chars.next() {
                match c {
                    '~' => match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => {
                            return Err(format!(
                                "'{pointer}' has '~' not followed by 0 or 1 (write ~0 for '~', ~1 for '/')"
                            ));
                        }
                    },
                    c => out.push(c),
                }
            }
            Ok(out)
        })
        .collect()
}

/// Walks `path` from `v`: keys into objects, decimal indices into arrays.
fn get<'v>(mut v: &'v J, path: &[String]) -> Option<&'v J> {
    for seg in path {
        v = match v {
            J::Object(m) => m.get(seg)?,
            J::Array(a) => {
                let canonical = seg == "0" || (!seg.starts_with('0') && !seg.starts_with('+'));
                a.get(seg.parse::<usize>().ok().filter(|_| canonical)?)?
            }
            _ => return None,
        };
    }
    Some(v)
}

/// Decodes JSON documents (one, or one per line) through `mapping`. A top-level array is a
/// list of documents unless the mapping flattens the root array itself (`/*/...`).
pub(super) fn decode(
    target: &Target<'_>,
    mapping: &JsonMapping,
    text: &str,
) -> Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    let root_array = mapping.array.as_ref().is_some_and(|p| p.is_empty());
    for_each_value(text, |value, line| match value {
        J::Array(items) if !root_array => {
            for (i, item) in items.iter().enumerate() {
                document(target, mapping, item, line + i, &mut rows)?;
            }
            Ok(())
        }
        doc => document(target, mapping, &doc, line, &mut rows),
    })?;
    Ok(rows)
}

/// The rows of one document: one, or one per element of the flattened array.
fn document(
    target: &Target<'_>,
    mapping: &JsonMapping,
    doc: &J,
    line: usize,
    rows: &mut Vec<Vec<Value>>,
) -> Result<()> {
    let table = target.table;
    let bad = |column: &str, reason: String| Error::BadRow {
        line,
        column: column.to_string(),
        reason,
    };
    if !matches!(doc, J::Object(_) | J::Array(_)) {
        return Err(Error::BadPayload {
            line,
            reason: format!("expected a JSON object or array, found {doc}"),
        });
    }
    let mut base = target.blank();
    if let J::Object(obj) = doc {
        for (c, col) in table.columns.iter().enumerate() {
            if target.is_fixed(c) || mapping.entries.iter().any(|e| e.column == c) {
                continue;
            }
            if let Some(v) = top_level(obj, &col.name) {
                base[c] = Some(cell(col, v).map_err(|r| bad(&col.name, r))?);
            }
        }
    }
    for e in mapping.entries.iter().filter(|e| !e.wildcard) {
        if target.is_fixed(e.column) {
            continue;
        }
        if let Some(v) = get(doc, &e.path) {
            let col = &table.columns[e.column];
            base[e.column] =
                Some(cell(col, v).map_err(|r| bad(&col.name, format!("at '{}': {r}", e.text)))?);
        }
    }
    let Some(prefix) = &mapping.array else {
        return target.push(rows, base);
    };
    let first = mapping
        .entries
        .iter()
        .find(|e| e.wildcard)
        .expect("an array implies a '*' entry");
    let items = match get(doc, prefix) {
        Some(J::Array(items)) => items,
        found => {
            let at: String = prefix
                .iter()
                .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
                .collect();
            let what = if found.is_some() {
                "is not an array"
            } else {
                "is missing"
            };
            return Err(bad(
                &first.name,
                format!("'{at}' {what} (from '{}')", first.text),
            ));
        }
    };
    for (i, item) in items.iter().enumerate() {
        let mut row = base.clone();
        for e in mapping.entries.iter().filter(|e| e.wildcard) {
            if target.is_fixed(e.column) {
                continue;
            }
            if let Some(v) = get(item, &e.path) {
                let col = &table.columns[e.column];
                row[e.column] =
                    Some(cell(col, v).map_err(|r| {
                        bad(&col.name, format!("element {i} at '{}': {r}", e.text))
                    })?);
            }
        }
        target.push(rows, row)?;
    }
    Ok(())
}

//! `CREATE ROLLUP [IF NOT EXISTS] name AS SELECT <bucket>, <keys>, <aggregates> FROM t
//! GROUP BY <bucket and keys> [WITH (ttl = '1 year')]`: the query is read into a
//! [`RollupDef`] (`crate::store::rollup`); its columns are checked against the source table
//! when the statement runs.

use super::{P, Statement, TableRef, perr};
use crate::error::{Error, Result};
use crate::store::rollup::{AggFn, Aggregate, RollupDef};
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Query, SelectItem, SetExpr,
    TableFactor, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

/// A parsed `CREATE ROLLUP`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RollupSpec {
    /// The rollup's name.
    pub name: TableRef,
    /// IF NOT EXISTS.
    pub if_not_exists: bool,
    /// The table it reads.
    pub source: TableRef,
    /// What it keeps (`source` 0 until the statement runs).
    pub def: RollupDef,
    /// Its own retention.
    pub ttl_secs: Option<u64>,
}

/// TimescaleDB's default origin of `time_bucket`: Monday 2000-01-03, UTC.
const MONDAY_2000_MICROS: i64 = 946_857_600_000_000;

fn bad(message: impl Into<String>) -> Error {
    Error::sql(message.into())
}

impl P<'_> {
    /// After `CREATE ROLLUP`.
    pub(super) fn create_rollup(&mut self, sql: &str) -> Result<Statement> {
        let if_not_exists = self.if_not_exists();
        let name = self.table_ref()?;
        self.expect_word("AS")?;
        let start = self.p.peek_token();
        if start.token == Token::EOF {
            return self.p.expected("a query after AS", start).map_err(perr);
        }
        // The query runs to the end, or to a `WITH (` outside parentheses (a query's own
        // WITH would come first and be followed by a name).
        let mut depth = 0i32;
        let mut end = None;
        loop {
            let t = self.p.next_token();
            match &t.token {
                Token::EOF => break,
                Token::LParen => depth += 1,
                Token::RParen => depth -= 1,
                Token::Word(w)
                    if depth == 0
                        && w.keyword == Keyword::WITH
                        && self.p.peek_token().token == Token::LParen =>
                {
                    end = Some(t.span.start);
                    self.p.prev_token();
                    break;
                }
                _ => {}
            }
        }
        let from = crate::alerts::byte_offset(sql, start.span.start.line, start.span.start.column);
        let to = end.map_or(sql.len(), |e| {
            crate::alerts::byte_offset(sql, e.line, e.column)
        });
        let text = sql[from..to].trim().trim_end_matches(';').trim_end();
        let ttl_secs = match self.word("WITH") {
            true => {
                let (ttl, options) = self.options()?;
                if let Some(k) = options.keys().next() {
                    return Err(bad(format!("unknown rollup option '{k}'; expected ttl")));
                }
                ttl
            }
            false => None,
        };
        self.end()?;
        let query = Parser::new(&GenericDialect {})
            .try_with_sql(text)
            .map_err(perr)?
            .parse_query()
            .map_err(perr)?;
        let (source, def) = read_query(&query, self.database, text)?;
        Ok(Statement::CreateRollup(Box::new(RollupSpec {
            name,
            if_not_exists,
            source,
            def,
            ttl_secs,
        })))
    }
}

/// The source table and the definition a rollup's query gives.
fn read_query(q: &Query, database: &str, text: &str) -> Result<(TableRef, RollupDef)> {
    if q.with.is_some() || q.order_by.is_some() || q.limit_clause.is_some() || q.fetch.is_some() {
        return Err(bad("a rollup's query has no WITH, ORDER BY or LIMIT"));
    }
    let SetExpr::Select(s) = q.body.as_ref() else {
        return Err(bad("a rollup's query is one SELECT"));
    };
    if s.selection.is_some() || s.having.is_some() || s.distinct.is_some() {
        return Err(bad(
            "a rollup's query has no WHERE, HAVING or DISTINCT (filter when you query the rollup)",
        ));
    }
    let source = match s.from.as_slice() {
        [t] if t.joins.is_empty() => match &t.relation {
            TableFactor::Table {
                name, args: None, ..
            } => {
                let parts: Vec<String> = (name.0.iter())
                    .map(|p| {
                        p.as_ident()
                            .map_or_else(|| p.to_string(), |i| i.value.clone())
                    })
                    .collect();
                match parts.as_slice() {
                    [t] => TableRef {
                        database: database.into(),
                        table: t.clone(),
                    },
                    [d, t] => TableRef {
                        database: d.clone(),
                        table: t.clone(),
                    },
                    _ => return Err(bad(format!("'{name}' is not a table name"))),
                }
            }
            _ => return Err(bad("a rollup reads one table")),
        },
        _ => return Err(bad("a rollup reads one table (FROM t, no joins)")),
    };
    let mut def = RollupDef {
        source: 0,
        time_column: String::new(),
        stride_micros: 0,
        origin_micros: 0,
        bucket: String::new(),
        keys: Vec::new(),
        aggregates: Vec::new(),
        sql: text.to_string(),
    };
    // Per select item: its expression's text and the name it gives (to match GROUP BY).
    let mut items: Vec<(String, String, bool)> = Vec::new();
    for item in &s.projection {
        let (e, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
            _ => return Err(bad("a rollup's query names its columns (no *)")),
        };
        let named = |n: String| alias.clone().unwrap_or(n);
        if let Some((bucket_fn, args)) = call(e) {
            match AggFn::parse(&bucket_fn) {
                Some(func) => {
                    let column = match args.as_slice() {
                        [] if func == AggFn::Count => None,
                        [Some(c)] => Some(c.clone()),
                        _ => {
                            return Err(bad(format!(
                                "{e}: an aggregate of a rollup reads one column (or count(*))"
                            )));
                        }
                    };
                    let name = named(match &column {
                        Some(c) => format!("{}_{c}", func.name()),
                        None => "count".into(),
                    });
                    items.push((e.to_string(), name.clone(), false));
                    def.aggregates.push(Aggregate { func, column, name });
                    continue;
                }
                None if ["date_bin", "time_bucket"].contains(&bucket_fn.as_str()) => {
                    if !def.bucket.is_empty() {
                        return Err(bad("a rollup has one bucket"));
                    }
                    bucket(&mut def, &bucket_fn, e)?;
                    def.bucket = named("bucket".into());
                    items.push((e.to_string(), def.bucket.clone(), true));
                    continue;
                }
                None => {}
            }
        }
        match ident(e) {
            Some(c) if alias.as_ref().is_none_or(|a| *a == c) => {
                items.push((e.to_string(), c.clone(), true));
                def.keys.push(c);
            }
            _ => {
                return Err(bad(format!(
                    "{e}: a rollup's columns are date_bin(...) or time_bucket(...), key columns (not renamed) and avg, sum, min, max or count of a column"
                )));
            }
        }
    }
    if def.bucket.is_empty() {
        return Err(bad(
            "a rollup needs a bucket: date_bin('1 minute', time) or time_bucket(...)",
        ));
    }
    if def.aggregates.is_empty() {
        return Err(bad("a rollup keeps at least one aggregate"));
    }
    // GROUP BY names the bucket and every key (by position, name or expression), nothing else.
    let GroupByExpr::Expressions(group_by, modifiers) = &s.group_by else {
        return Err(bad("a rollup groups by its bucket and keys"));
    };
    let mut grouped = vec![false; items.len()];
    for g in group_by {
        let text = g.to_string();
        let at = match g {
            Expr::Value(v) if matches!(v.value, Value::Number(..)) => {
                text.parse::<usize>().ok().and_then(|n| n.checked_sub(1))
            }
            _ => items.iter().position(|(e, n, _)| *e == text || *n == text),
        };
        match at {
            Some(i) if i < items.len() && items[i].2 => grouped[i] = true,
            _ => {
                return Err(bad(format!(
                    "GROUP BY {g}: not the rollup's bucket or a key"
                )));
            }
        }
    }
    if !modifiers.is_empty()
        || items
            .iter()
            .zip(&grouped)
            .any(|((_, _, key), g)| *key && !g)
    {
        return Err(bad(
            "a rollup groups by its bucket and every key column, nothing else",
        ));
    }
    Ok((source, def))
}

/// A function call's lowercase name and its arguments: a column's name, `None` for
/// anything else (`*` gives none).
fn call(e: &Expr) -> Option<(String, Vec<Option<String>>)> {
    let Expr::Function(f) = e else { return None };
    let FunctionArguments::List(list) = &f.args else {
        return Some((f.name.to_string().to_ascii_lowercase(), Vec::new()));
    };
    let args = (list.args.iter())
        .filter_map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => None,
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(ident(e)),
            _ => Some(None),
        })
        .collect();
    Some((f.name.to_string().to_ascii_lowercase(), args))
}

fn ident(e: &Expr) -> Option<String> {
    match e {
        Expr::Identifier(i) => Some(i.value.clone()),
        Expr::CompoundIdentifier(p) => p.last().map(|i| i.value.clone()),
        _ => None,
    }
}

/// `date_bin(width, time[, origin])` / `time_bucket(width, time[, origin])` into `def`.
fn bucket(def: &mut RollupDef, func: &str, e: &Expr) -> Result<()> {
    let Expr::Function(f) = e else {
        unreachable!("a call")
    };
    let args = match crate::query::gapfill::arguments(&f.args) {
        Some(a) if (2..=3).contains(&a.len()) => a,
        _ => return Err(bad(format!("{e}: {func}(width, time[, origin])"))),
    };
    let width = text(args[0])
        .ok_or_else(|| bad(format!("{e}: the width is an interval such as '1 minute'")))?;
    let d = sluice_conf::parse_duration(&width).map_err(|m| {
        bad(format!(
            "{e}: {m} (a rollup's buckets have a fixed width: no months)"
        ))
    })?;
    def.stride_micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    if def.stride_micros <= 0 {
        return Err(bad(format!("{e}: the width must be positive")));
    }
    def.time_column = ident(args[1]).ok_or_else(|| bad(format!("{e}: the time is a column")))?;
    def.origin_micros = match args.get(2) {
        None if func == "time_bucket" => MONDAY_2000_MICROS,
        None => 0,
        Some(o) => text(o).and_then(|t| timestamp(&t)).ok_or_else(|| {
            bad(format!(
                "{e}: the origin is a timestamp such as '2024-01-01 00:00:00'"
            ))
        })?,
    };
    Ok(())
}

/// The text of a literal: `'1 minute'`, `INTERVAL '1 minute'`, `INTERVAL '1' MINUTE`,
/// `TIMESTAMP '...'`.
fn text(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        Expr::Interval(i) => {
            let v = text(&i.value)?;
            Some(match &i.leading_field {
                Some(f) => format!("{v} {f}"),
                None => v,
            })
        }
        Expr::TypedString(t) => match &t.value.value {
            Value::SingleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// Microseconds since the epoch of a time as a timestamp column reads it.
fn timestamp(t: &str) -> Option<i64> {
    match crate::ingest::decode::parse_text(crate::types::ColumnType::Timestamp, t) {
        Ok(crate::types::Value::Timestamp(us)) => Some(us),
        _ => None,
    }
}

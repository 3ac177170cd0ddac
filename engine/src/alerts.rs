//! Alerts: named queries the server runs on a schedule, firing when a condition holds.
//!
//! A definition ([`AlertDef`]) lives in the catalog, made by `CREATE ALERT` (parsed in
//! [`crate::query::ddl`]) or the HTTP API, both through [`crate::Engine::create_alert`]. The
//! [`evaluator`] keeps one state per alert (pending, ok, firing, error), runs each query at
//! its interval, and on every change of state logs it and hands a notification to the
//! [`AlertSink`] (the broker publishes it on `$alerts/<name>`) and, when set, POSTs it to the
//! alert's webhook. A failing query puts the alert in `error` with the reason; it never stops
//! the evaluator. `system.alerts` shows the states.

pub mod evaluator;

pub use evaluator::{AlertSink, AlertState, AlertStatus, Alerts};

use crate::error::{Error, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;
use serde::{Deserialize, Serialize};

/// Shortest interval an alert may run at.
pub const MIN_INTERVAL_MS: u64 = 100;
/// Longest interval an alert may run at (one day).
pub const MAX_INTERVAL_MS: u64 = 86_400_000;

/// How a threshold compares the query's value with the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CmpOp {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `=`
    Eq,
    /// `!=` or `<>`
    Ne,
}

impl CmpOp {
    /// The SQL spelling.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Eq => "=",
            Self::Ne => "!=",
        }
    }

    /// Whether `value op limit` holds.
    pub fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Self::Gt => value > limit,
            Self::Ge => value >= limit,
            Self::Lt => value < limit,
            Self::Le => value <= limit,
            Self::Eq => value == limit,
            Self::Ne => value != limit,
        }
    }

    fn from_token(t: &Token) -> Option<Self> {
        Some(match t {
            Token::Gt => Self::Gt,
            Token::GtEq => Self::Ge,
            Token::Lt => Self::Lt,
            Token::LtEq => Self::Le,
            Token::Eq | Token::DoubleEq => Self::Eq,
            Token::Neq => Self::Ne,
            _ => return None,
        })
    }
}

/// When an alert fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Condition {
    /// The query returns at least one row.
    AnyRows,
    /// A numeric column of the query's first row compared with a limit (no row, or NULL,
    /// does not fire).
    Threshold {
        /// Result column.
        column: String,
        /// Comparison.
        op: CmpOp,
        /// The limit.
        value: f64,
    },
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AnyRows => f.write_str("any rows"),
            Self::Threshold { column, op, value } => {
                let plain = column
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !column.starts_with(|c: char| c.is_ascii_digit());
                if plain {
                    write!(f, "{column} {} {value}", op.symbol())
                } else {
                    write!(
                        f,
                        "\"{}\" {} {value}",
                        column.replace('"', "\"\""),
                        op.symbol()
                    )
                }
            }
        }
    }
}

impl Condition {
    /// Parses the text form: `any rows`, or `column op number` (`t > 90`, `"Max temp" <= -3.5`).
    pub fn parse(text: &str) -> Result<Self> {
        let mut p = Parser::new(&GenericDialect {})
            .try_with_sql(text)
            .map_err(parser_error)?;
        let c = condition(&mut p)?;
        let t = p.peek_token();
        if t.token != Token::EOF {
            return p.expected("end of the condition", t).map_err(parser_error);
        }
        Ok(c)
    }
}

pub(crate) fn parser_error(e: ParserError) -> Error {
    Error::sql(
        e.to_string()
            .trim_start_matches("sql parser error: ")
            .to_string(),
    )
}

/// Reads a condition from `p`: `ANY ROWS` | `ROWS` | `column op [-]number`.
pub(crate) fn condition(p: &mut Parser<'_>) -> Result<Condition> {
    let is_word = |t: &Token, w: &str| matches!(t, Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w));
    let first = p.peek_token();
    if is_word(&first.token, "ANY") {
        p.next_token();
        let t = p.next_token();
        if !is_word(&t.token, "ROWS") {
            return p.expected("ROWS after ANY", t).map_err(parser_error);
        }
        return Ok(Condition::AnyRows);
    }
    if is_word(&first.token, "ROWS") {
        p.next_token();
        return Ok(Condition::AnyRows);
    }
    let column = p.parse_identifier().map_err(parser_error)?.value;
    let t = p.next_token();
    let Some(op) = CmpOp::from_token(&t.token) else {
        return p
            .expected("a comparison (>, >=, <, <=, =, !=)", t)
            .map_err(parser_error);
    };
    let negative = p.consume_token(&Token::Minus);
    let t = p.next_token();
    let value = match &t.token {
        Token::Number(n, _) => n.parse::<f64>().ok(),
        _ => None,
    };
    let Some(value) = value.filter(|v| v.is_finite()) else {
        return p.expected("a number", t).map_err(parser_error);
    };
    Ok(Condition::Threshold {
        column,
        op,
        value: if negative { -value } else { value },
    })
}

/// An alert as the catalog keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertDef {
    /// Name: letters, digits, `_` and `-` (it is also an MQTT topic level).
    pub name: String,
    /// The query (any SELECT, typically on `WHERE PARTS last`).
    pub query: String,
    /// The database of the query's unqualified names.
    pub database: String,
    /// When it fires.
    pub condition: Condition,
    /// How often it runs.
    pub interval_ms: u64,
    /// Whether changes of state are published on `$alerts/<name>`.
    pub publish: bool,
    /// Where changes of state are POSTed as JSON, if anywhere.
    pub webhook: Option<String>,
    /// Who made it (`None`: an administrator on a server without users): it runs with
    /// that user's rights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl AlertDef {
    /// Checks what can be checked without planning the query.
    pub fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && (self.name.chars()).all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(Error::invalid(format!(
                "invalid alert name '{}': use letters, digits, '_' and '-'",
                self.name
            )));
        }
        if self.query.trim().is_empty() {
            return Err(Error::invalid("an alert needs a query"));
        }
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&self.interval_ms) {
            return Err(Error::invalid(format!(
                "alert interval {} ms is outside {MIN_INTERVAL_MS} ms .. 1 day",
                self.interval_ms
            )));
        }
        if let Some(url) = &self.webhook
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(Error::invalid(format!(
                "webhook '{url}' must be an http:// or https:// URL"
            )));
        }
        if !self.publish && self.webhook.is_none() {
            tracing::info!(alert = %self.name, "alert neither publishes nor calls a webhook; its state shows in system.alerts only");
        }
        Ok(())
    }

    /// The statement that makes this alert.
    pub fn create_sql(&self) -> String {
        let mut sql = format!(
            "CREATE ALERT \"{}\" EVERY '{} ms' WHEN {}",
            self.name, self.interval_ms, self.condition
        );
        if !self.publish {
            sql.push_str(" NO PUBLISH");
        }
        if let Some(url) = &self.webhook {
            sql.push_str(&format!(" WEBHOOK '{}'", url.replace('\'', "''")));
        }
        sql.push_str(" AS ");
        sql.push_str(&self.query);
        sql
    }
}

/// The byte offset in `sql` of a token that starts at 1-based `line` and `column`
/// (sqlparser counts columns in characters).
pub(crate) fn byte_offset(sql: &str, line: u64, column: u64) -> usize {
    let mut offset = 0;
    for (i, l) in sql.split_inclusive('\n').enumerate() {
        if i as u64 + 1 == line {
            return offset
                + l.char_indices()
                    .nth(column.saturating_sub(1) as usize)
                    .map_or(l.len(), |(b, _)| b);
        }
        offset += l.len();
    }
    sql.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_and_print() {
        let c = Condition::parse("t > 90").unwrap();
        assert_eq!(
            c,
            Condition::Threshold {
                column: "t".into(),
                op: CmpOp::Gt,
                value: 90.0
            }
        );
        assert_eq!(c.to_string(), "t > 90");
        assert_eq!(Condition::parse("any rows").unwrap(), Condition::AnyRows);
        assert_eq!(Condition::parse("ROWS").unwrap(), Condition::AnyRows);
        let c = Condition::parse("\"max temp\" <= -3.5").unwrap();
        assert_eq!(c.to_string(), "\"max temp\" <= -3.5");
        assert_eq!(Condition::parse(&c.to_string()).unwrap(), c);
        for (text, op) in [
            ("a<>1", CmpOp::Ne),
            ("a != 1", CmpOp::Ne),
            ("a = 1", CmpOp::Eq),
        ] {
            assert!(
                matches!(Condition::parse(text).unwrap(), Condition::Threshold { op: o, .. } if o == op)
            );
        }
        for bad in ["t >", "t 90", "> 90", "t > x", "any", "t > 1 2"] {
            let e = Condition::parse(bad).unwrap_err().to_string();
            assert!(e.contains("Expected"), "{bad}: {e}");
        }
    }

    #[test]
    fn create_sql_round_trips_through_the_parser() {
        let def = AlertDef {
            name: "hot-1".into(),
            query: "SELECT max(t) AS t FROM plant.r WHERE PARTS last".into(),
            database: "default".into(),
            condition: Condition::parse("t >= 90.5").unwrap(),
            interval_ms: 1500,
            publish: false,
            webhook: Some("http://127.0.0.1:9/x?a='b'".into()),
            owner: None,
        };
        def.validate().unwrap();
        match crate::query::ddl::parse(&def.create_sql()).unwrap() {
            crate::query::ddl::Statement::CreateAlert { def: parsed, .. } => {
                assert_eq!(parsed, def)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn validation_names_the_problem() {
        let mut def = AlertDef {
            name: "a b".into(),
            query: "SELECT 1".into(),
            database: "default".into(),
            condition: Condition::AnyRows,
            interval_ms: 1000,
            publish: true,
            webhook: None,
            owner: None,
        };
        assert!(
            def.validate()
                .unwrap_err()
                .to_string()
                .contains("alert name")
        );
        def.name = "ok".into();
        def.interval_ms = 5;
        assert!(def.validate().unwrap_err().to_string().contains("interval"));
        def.interval_ms = 1000;
        def.webhook = Some("ftp://x".into());
        assert!(def.validate().unwrap_err().to_string().contains("webhook"));
    }

    #[test]
    fn byte_offsets_follow_lines_and_characters() {
        let sql = "ab\nçd AS x";
        assert_eq!(&sql[byte_offset(sql, 2, 4)..], "AS x");
        assert_eq!(byte_offset(sql, 9, 1), sql.len());
    }
}

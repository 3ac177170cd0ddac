//! `CREATE ALERT`'s options and query.

use super::{P, Statement, perr};
use crate::alerts::{self, AlertDef};
use crate::error::{Error, Result};
use datafusion::sql::sqlparser::tokenizer::Token;

impl P<'_> {
    /// After `CREATE ALERT`: options in any order, then `AS` and the query (the rest of the
    /// text, kept as written).
    pub(super) fn create_alert(&mut self, sql: &str) -> Result<Statement> {
        let if_not_exists = self.if_not_exists();
        let name = self.ident()?;
        let mut interval_ms = 1000;
        let mut condition = None;
        let mut publish = true;
        let mut webhook = None;
        loop {
            if self.word("EVERY") {
                interval_ms = self.interval()?;
            } else if self.word("WHEN") {
                condition = Some(alerts::condition(&mut self.p)?);
            } else if self.words(&["NO", "PUBLISH"]) {
                publish = false;
            } else if self.word("PUBLISH") {
                publish = true;
            } else if self.word("WEBHOOK") {
                let t = self.p.next_token();
                match t.token {
                    Token::SingleQuotedString(url) => webhook = Some(url),
                    _ => {
                        return self
                            .p
                            .expected("the webhook URL in single quotes", t)
                            .map_err(perr);
                    }
                }
            } else if self.word("AS") {
                break;
            } else {
                let t = self.p.peek_token();
                return (self.p)
                    .expected("EVERY, WHEN, PUBLISH, NO PUBLISH, WEBHOOK or AS <query>", t)
                    .map_err(perr);
            }
        }
        let start = self.p.peek_token();
        if start.token == Token::EOF {
            return self.p.expected("a query after AS", start).map_err(perr);
        }
        let at = alerts::byte_offset(sql, start.span.start.line, start.span.start.column);
        let query = sql[at..]
            .trim()
            .trim_end_matches(';')
            .trim_end()
            .to_string();
        let Some(condition) = condition else {
            return Err(Error::sql(
                "CREATE ALERT needs WHEN <column> <op> <number> or WHEN ANY ROWS",
            ));
        };
        Ok(Statement::CreateAlert {
            def: AlertDef {
                name,
                query,
                database: self.database.to_string(),
                condition,
                interval_ms,
                publish,
                webhook,
                owner: None,
            },
            if_not_exists,
        })
    }

    /// `'5 s'`, `5 SECONDS`, `500 ms`, `2 MINUTES`: in milliseconds.
    pub(super) fn interval(&mut self) -> Result<u64> {
        let t = self.p.next_token();
        let text = match t.token {
            Token::SingleQuotedString(s) => s,
            Token::Number(n, _) => match &self.p.peek_token().token {
                Token::Word(w)
                    if w.quote_style.is_none()
                        && !["WHEN", "AS", "PUBLISH", "NO", "WEBHOOK"]
                            .iter()
                            .any(|k| w.value.eq_ignore_ascii_case(k)) =>
                {
                    let unit = w.value.clone();
                    self.p.next_token();
                    format!("{n} {unit}")
                }
                _ => n,
            },
            _ => {
                return self
                    .p
                    .expected("an interval such as '5 seconds'", t)
                    .map_err(perr);
            }
        };
        let d = sluice_conf::parse_duration(&text).map_err(Error::sql)?;
        Ok(d.as_millis() as u64)
    }
}

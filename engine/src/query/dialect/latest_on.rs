//! QuestDB's `LATEST ON ts PARTITION BY device[, ...]`: the newest row of each device
//! among those the `WHERE` clause admits. It becomes `DISTINCT ON`:
//!
//! - `SELECT cols FROM t [WHERE ...] LATEST ON ts PARTITION BY d [LIMIT n]` is
//!   `SELECT DISTINCT ON (d) cols FROM t [WHERE ...] ORDER BY d, ts DESC [LIMIT n]`;
//! - with an `ORDER BY` of its own after the clause, the query is wrapped:
//!   `SELECT * FROM (SELECT DISTINCT ON (d) ... ORDER BY d, ts DESC) AS latest ORDER BY ...`.
//!
//! Both are answered from the last-value cache ([`crate::query::latest`]) when they can be.

use super::{at, is_word, skip_space};
use crate::error::{Error, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Span, Token, TokenWithSpan, Tokenizer};

/// Rewrites every `LATEST ON` clause of `tokens`.
pub(super) fn rewrite(mut tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    while let Some(i) = find(&tokens) {
        tokens = rewrite_one(tokens, i)?;
    }
    Ok(tokens)
}

/// The index of the first `LATEST` followed by `ON`.
fn find(tokens: &[TokenWithSpan]) -> Option<usize> {
    (0..tokens.len()).find(|&i| {
        is_word(&tokens[i].token, "LATEST") && {
            let j = skip_space(tokens, i + 1);
            j < tokens.len() && is_word(&tokens[j].token, "ON")
        }
    })
}

/// The paren depth at each token (before it).
fn depths(tokens: &[TokenWithSpan]) -> Vec<i32> {
    let mut d = 0;
    (tokens.iter())
        .map(|t| {
            let here = d;
            match t.token {
                Token::LParen => d += 1,
                Token::RParen => d -= 1,
                _ => {}
            }
            here
        })
        .collect()
}

/// A column name at `i` (`word` or `word.word`): its text and the index after it.
fn name(tokens: &[TokenWithSpan], i: usize) -> Option<(String, usize)> {
    let mut j = skip_space(tokens, i);
    let mut text = String::new();
    loop {
        let Token::Word(w) = &tokens.get(j)?.token else {
            return None;
        };
        text.push_str(&w.to_string());
        j += 1;
        if tokens.get(j).map(|t| &t.token) != Some(&Token::Period) {
            return Some((text, j));
        }
        text.push('.');
        j += 1;
    }
}

fn rewrite_one(tokens: Vec<TokenWithSpan>, i: usize) -> Result<Vec<TokenWithSpan>> {
    let clause = tokens[i].span;
    let fail = |what: &str| {
        Error::sql(format!(
            "LATEST ON at {}: {what} (SELECT ... FROM t [WHERE ...] LATEST ON ts PARTITION BY device[, ...])",
            at(clause.start)
        ))
    };
    let on = skip_space(&tokens, i + 1);
    let (time, next) = name(&tokens, on + 1).ok_or_else(|| fail("expected a time column"))?;
    let p = skip_space(&tokens, next);
    let by = skip_space(&tokens, p + 1);
    let word_at = |k: usize, w: &str| k < tokens.len() && is_word(&tokens[k].token, w);
    if !(word_at(p, "PARTITION") && word_at(by, "BY")) {
        return Err(fail("expected PARTITION BY"));
    }
    let mut keys = Vec::new();
    let mut end = by + 1;
    loop {
        let (key, after) = name(&tokens, end).ok_or_else(|| fail("expected a column"))?;
        keys.push(key);
        end = after;
        let comma = skip_space(&tokens, end);
        if tokens.get(comma).map(|t| &t.token) != Some(&Token::Comma) {
            break;
        }
        end = comma + 1;
    }
    let depth = depths(&tokens);
    let level = depth[i];
    // The SELECT of this level, before the clause.
    let select = (0..i)
        .rev()
        .find(|&k| depth[k] == level && is_word(&tokens[k].token, "SELECT"))
        .ok_or_else(|| fail("not in a SELECT"))?;
    let first = skip_space(&tokens, select + 1);
    if is_word(&tokens[first].token, "DISTINCT") {
        return Err(fail("cannot be combined with DISTINCT"));
    }
    // An ORDER BY of this level after the clause (before the level closes).
    let mut order = None;
    for (k, t) in tokens.iter().enumerate().skip(end) {
        if depth[k] < level || (depth[k] == level && t.token == Token::SemiColon) {
            break;
        }
        if depth[k] == level && is_word(&t.token, "ORDER") {
            order = Some(k);
            break;
        }
    }
    let keys = keys.join(", ");
    let distinct = format!(" DISTINCT ON ({keys}) ");
    let sort = format!(" ORDER BY {keys}, {time} DESC ");
    let mut out = Vec::with_capacity(tokens.len() + 16);
    let text = |s: &str| snippet(s, clause);
    match order {
        None => {
            out.extend_from_slice(&tokens[..=select]);
            out.extend(text(&distinct)?);
            out.extend_from_slice(&tokens[select + 1..i]);
            out.extend(text(&sort)?);
            out.extend_from_slice(&tokens[end..]);
        }
        Some(_) => {
            out.extend_from_slice(&tokens[..select]);
            out.extend(text("SELECT * FROM (SELECT")?);
            out.extend(text(&distinct)?);
            out.extend_from_slice(&tokens[select + 1..i]);
            out.extend(text(&sort)?);
            out.extend(text(") AS latest ")?);
            out.extend_from_slice(&tokens[end..]);
        }
    }
    Ok(out)
}

/// The tokens of `sql`, placed at `span` (for error positions).
fn snippet(sql: &str, span: Span) -> Result<Vec<TokenWithSpan>> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| Error::sql(e.to_string()))?;
    Ok(tokens
        .into_iter()
        .map(|t| TokenWithSpan::new(t, span))
        .collect())
}

#[cfg(test)]
mod tests {
    fn sql(text: &str) -> String {
        let s = super::super::parse(text).unwrap();
        s[0].to_string()
    }

    #[test]
    fn latest_on_is_distinct_on() {
        assert_eq!(
            sql("SELECT * FROM iot.r WHERE site = 'a' LATEST ON ts PARTITION BY device LIMIT 5"),
            "SELECT DISTINCT ON (device) * FROM iot.r WHERE site = 'a' ORDER BY device, ts DESC LIMIT 5"
        );
        assert_eq!(
            sql(
                "SELECT device, temp FROM t LATEST ON t.ts PARTITION BY site, device ORDER BY temp"
            ),
            "SELECT * FROM (SELECT DISTINCT ON (site, device) device, temp FROM t ORDER BY site, device, t.ts DESC) AS latest ORDER BY temp"
        );
        // In a subquery: its own level.
        assert_eq!(
            sql("SELECT count(*) FROM (SELECT * FROM t LATEST ON ts PARTITION BY d) AS x"),
            "SELECT count(*) FROM (SELECT DISTINCT ON (d) * FROM t ORDER BY d, ts DESC) AS x"
        );
        // A string is not the clause.
        assert_eq!(
            sql("SELECT 'LATEST ON ts PARTITION BY d'"),
            "SELECT 'LATEST ON ts PARTITION BY d'"
        );
        let err = super::super::parse("SELECT * FROM t LATEST ON ts").unwrap_err();
        assert!(err.to_string().contains("expected PARTITION BY"), "{err}");
    }
}

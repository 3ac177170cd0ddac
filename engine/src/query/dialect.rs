//! Sluice's query dialect on top of DataFusion's SQL: JoinBase's `WHERE PARTS` clause and its
//! typed literals (`dt'2016-02-01 00:00:00'`, `datetime'..'`, `d'..'`, `t'..'`), and
//! QuestDB's `LATEST ON` ([`latest_on`]).
//!
//! The SQL is tokenized with sqlparser (the copy DataFusion re-exports); the token stream is
//! rewritten and handed to sqlparser's parser, so strings, quoted names and comments can never
//! be mistaken for the clause. `FROM [db.]t [[AS] a] WHERE PARTS <list>` becomes
//! `FROM [db.]"t WHERE PARTS <list>" AS a` (alias `t` when none was written): the table's name
//! carries the list to the table provider ([`crate::query::parts`]), each table reference its own.

mod latest_on;

use crate::error::{Error, Result};
use crate::query::parts::{PartsItem, PartsSpec};
use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{
    Location, Token, TokenWithSpan, Tokenizer, Whitespace,
};

/// Parses one or more statements of Sluice's dialect.
pub(crate) fn parse(sql: &str) -> Result<Vec<ast::Statement>> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| Error::sql(e.to_string()))?;
    let tokens = latest_on::rewrite(rewrite(tokens)?)?;
    Parser::new(&dialect)
        .with_tokens_with_locations(tokens)
        .parse_statements()
        .map_err(|e| {
            Error::sql(
                e.to_string()
                    .trim_start_matches("sql parser error: ")
                    .to_string(),
            )
        })
}

fn is_space(t: &Token) -> bool {
    matches!(t, Token::Whitespace(_))
}

fn is_word(t: &Token, w: &str) -> bool {
    matches!(t, Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w))
}

fn word(value: &str, quote_style: Option<char>) -> Token {
    Token::make_word(value, quote_style)
}

fn at(l: Location) -> String {
    format!("line {}, column {}", l.line, l.column)
}

/// The next index at or after `i` that is not whitespace or a comment.
fn skip_space(tokens: &[TokenWithSpan], mut i: usize) -> usize {
    while i < tokens.len() && is_space(&tokens[i].token) {
        i += 1;
    }
    i
}

fn rewrite(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len() + 4);
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        if is_word(&t.token, "WHERE") {
            let j = skip_space(&tokens, i + 1);
            if j < tokens.len() && is_word(&tokens[j].token, "PARTS") {
                let (spec, next) = parts_list(&tokens, j + 1)?;
                attach(&mut out, &spec, t.span.start)?;
                i = next;
                continue;
            }
        }
        if let Some(ty) = typed_literal(&tokens, i) {
            out.push(TokenWithSpan::new(word(ty, None), t.span));
            out.push(TokenWithSpan::new(
                Token::Whitespace(Whitespace::Space),
                t.span,
            ));
            out.push(tokens[i + 1].clone());
            i += 2;
            continue;
        }
        out.push(t.clone());
        i += 1;
    }
    Ok(out)
}

/// JoinBase's typed literal prefixes, written right against the quote: `dt'...'`.
fn typed_literal(tokens: &[TokenWithSpan], i: usize) -> Option<&'static str> {
    let Token::Word(w) = &tokens[i].token else {
        return None;
    };
    let next = tokens.get(i + 1)?;
    if w.quote_style.is_some()
        || !matches!(next.token, Token::SingleQuotedString(_))
        || next.span.start != tokens[i].span.end
    {
        return None;
    }
    Some(match w.value.to_ascii_lowercase().as_str() {
        "dt" | "datetime" => "TIMESTAMP",
        "d" => "DATE",
        "t" => "TIME",
        _ => return None,
    })
}

/// Reads the list after `WHERE PARTS` starting at token `i`; returns it and the index of the
/// first token after it.
fn parts_list(tokens: &[TokenWithSpan], i: usize) -> Result<(PartsSpec, usize)> {
    // The list's characters, each with the token it came from, read as one small grammar:
    // sqlparser splits `1..2` into `1.` and `.2`, so tokens alone do not delimit it.
    let mut chars: Vec<(char, usize)> = Vec::new();
    let mut end = i;
    while end < tokens.len() {
        let t = &tokens[end].token;
        let text = match t {
            Token::Number(n, false) => n.clone(),
            Token::Period => ".".into(),
            Token::Eq => "=".into(),
            Token::Comma => ",".into(),
            Token::Whitespace(_) => " ".into(),
            _ if is_word(t, "last") => "last".into(),
            _ => break,
        };
        chars.extend(text.chars().map(|c| (c, end)));
        end += 1;
    }
    let mut r = ListReader {
        chars: &chars,
        pos: 0,
        tokens,
        end,
    };
    let mut items = Vec::new();
    let mut consumed;
    loop {
        r.spaces();
        items.push(r.item()?);
        consumed = r.pos;
        r.spaces();
        if r.peek() != Some(',') {
            break;
        }
        r.pos += 1;
        r.spaces();
        // `FROM t WHERE PARTS 1, u`: the comma joins another table; the list has ended.
        if !matches!(r.peek(), Some(c) if c.is_ascii_digit() || c == 'l') {
            break;
        }
    }
    // The list ends at a token boundary (the grammar never stops inside a token).
    let next = match chars.get(consumed) {
        Some((_, t)) if chars[consumed - 1].1 == *t => {
            return Err(Error::sql(format!(
                "WHERE PARTS at {}: unexpected '{}'",
                at(tokens[*t].span.start),
                tokens[*t].token
            )));
        }
        Some((_, t)) => *t,
        None => end,
    };
    Ok((PartsSpec { items }, next))
}

struct ListReader<'a> {
    chars: &'a [(char, usize)],
    pos: usize,
    tokens: &'a [TokenWithSpan],
    end: usize,
}

impl ListReader<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).map(|c| c.0)
    }

    fn spaces(&mut self) {
        while self.peek() == Some(' ') {
            self.pos += 1;
        }
    }

    fn fail<T>(&self, expected: &str) -> Result<T> {
        let t = self.chars.get(self.pos).map_or(self.end, |c| c.1);
        let (found, loc) = match self.tokens.get(t) {
            Some(t) => (format!("'{}'", t.token), t.span.start),
            None => (
                "end of statement".to_string(),
                self.tokens
                    .last()
                    .map_or(Location::new(1, 1), |t| t.span.end),
            ),
        };
        Err(Error::sql(format!(
            "WHERE PARTS at {}: expected {expected}, found {found}",
            at(loc)
        )))
    }

    fn number(&mut self, expected: &str) -> Result<u64> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.fail(expected);
        }
        let text: String = self.chars[start..self.pos].iter().map(|c| c.0).collect();
        text.parse().or_else(|_| {
            self.pos = start;
            self.fail("a partition key that fits in 64 bits")
        })
    }

    fn item(&mut self) -> Result<PartsItem> {
        const ITEM: &str = "a partition key, a range like 2016010100..2016010800, or last [N]";
        if self.peek() == Some('l') {
            self.pos += 4;
            self.spaces();
            if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
                return Ok(PartsItem::Last(1));
            }
            let n = self.number("a count after last")?;
            if n == 0 {
                self.pos -= 1;
                return self.fail("a count of at least 1 after last");
            }
            return Ok(PartsItem::Last(n));
        }
        let lo = self.number(ITEM)?;
        let save = self.pos;
        self.spaces();
        if self.peek() != Some('.') {
            self.pos = save;
            return Ok(PartsItem::Key(lo));
        }
        self.pos += 1;
        if self.peek() != Some('.') {
            return self.fail("'..' or '..=' in a range");
        }
        self.pos += 1;
        let inclusive = self.peek() == Some('=');
        if inclusive {
            self.pos += 1;
        }
        self.spaces();
        let hi = self.number("the end of the range")?;
        Ok(PartsItem::Range { lo, hi, inclusive })
    }
}

/// Gives the table reference that ends `out` the partition list.
fn attach(out: &mut Vec<TokenWithSpan>, spec: &PartsSpec, clause: Location) -> Result<()> {
    // Walk back over `[db.]t [[AS] alias]`, which must follow FROM, JOIN or a comma.
    let mut idx: Vec<usize> = Vec::new();
    let mut k = out.len();
    while k > 0 {
        k -= 1;
        match &out[k].token {
            t if is_space(t) => continue,
            t if is_word(t, "FROM") || is_word(t, "JOIN") => break,
            Token::Word(_) | Token::Period => idx.push(k),
            _ => break,
        }
    }
    idx.reverse();
    let follows_table = k < out.len()
        && !idx.is_empty()
        && (is_word(&out[k].token, "FROM")
            || is_word(&out[k].token, "JOIN")
            || out[k].token == Token::Comma);
    let not_table = || {
        Error::sql(format!(
            "WHERE PARTS at {}: expected it right after a table name (FROM [db.]table [alias] WHERE PARTS ...)",
            at(clause)
        ))
    };
    if !follows_table {
        return Err(not_table());
    }
    // The name: word (. word)*; then [AS] alias.
    let mut n = 1;
    while n + 1 < idx.len() && out[idx[n]].token == Token::Period {
        n += 2;
    }
    let rest = &idx[n.min(idx.len())..];
    let alias = match rest {
        [] => None,
        [a] => Some(*a),
        [as_, a] if is_word(&out[*as_].token, "AS") => Some(*a),
        _ => return Err(not_table()),
    };
    if idx[..n]
        .iter()
        .step_by(2)
        .any(|i| !matches!(out[*i].token, Token::Word(_)))
        || alias.is_some_and(|a| !matches!(out[a].token, Token::Word(_)))
    {
        return Err(not_table());
    }
    let name_at = idx[n - 1];
    let Token::Word(name) = out[name_at].token.clone() else {
        return Err(not_table());
    };
    let span = out[name_at].span;
    out[name_at] = TokenWithSpan::new(word(&spec.table_name(&name.value), Some('"')), span);
    if alias.is_none() {
        let extra = [
            Token::Whitespace(Whitespace::Space),
            word("AS", None),
            Token::Whitespace(Whitespace::Space),
            Token::Word(name),
        ];
        let at = name_at + 1;
        out.splice(
            at..at,
            extra.into_iter().map(|t| TokenWithSpan::new(t, span)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str) -> String {
        parse(text)
            .unwrap()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parts_after_table() {
        assert_eq!(
            sql("select count(x) from nyct_lite where parts 2016013112 where total_amount<0"),
            "SELECT count(x) FROM \"nyct_lite WHERE PARTS 2016013112\" AS nyct_lite WHERE total_amount < 0"
        );
        assert_eq!(
            sql(
                "SELECT * FROM benchmark.t WHERE PARTS 2016010100..2016010800, 5..=7,9 WHERE a = 1"
            ),
            "SELECT * FROM benchmark.\"t WHERE PARTS 2016010100..2016010800,5..=7,9\" AS t WHERE a = 1"
        );
        assert_eq!(
            sql("select * from t as x where parts last"),
            "SELECT * FROM \"t WHERE PARTS last 1\" AS x"
        );
        assert_eq!(
            sql("select * from t y where parts last 3 group by 1"),
            "SELECT * FROM \"t WHERE PARTS last 3\" y GROUP BY 1"
        );
        assert_eq!(
            sql("select * from t where parts 1 .. 3"),
            "SELECT * FROM \"t WHERE PARTS 1..3\" AS t"
        );
    }

    #[test]
    fn each_table_its_own() {
        assert_eq!(
            sql(
                "select * from a where parts 1, b where parts 2..4 join c where parts last 2 on a.x = c.x"
            ),
            "SELECT * FROM \"a WHERE PARTS 1\" AS a, \"b WHERE PARTS 2..4\" AS b JOIN \"c WHERE PARTS last 2\" AS c ON a.x = c.x"
        );
        assert_eq!(
            sql("select * from (select * from t where parts 7 where v > 1) s where s.v < 3"),
            "SELECT * FROM (SELECT * FROM \"t WHERE PARTS 7\" AS t WHERE v > 1) s WHERE s.v < 3"
        );
    }

    #[test]
    fn strings_and_comments_are_not_clauses() {
        assert_eq!(
            sql("select 'where parts 1' from t -- where parts 2\n where a = 'x'"),
            "SELECT 'where parts 1' FROM t WHERE a = 'x'"
        );
        assert_eq!(
            sql("select * from t where \"parts\" = 1"),
            "SELECT * FROM t WHERE \"parts\" = 1"
        );
    }

    #[test]
    fn typed_literals() {
        assert_eq!(
            sql("select * from t where ts < dt'2016-02-01 00:00:00' and d = d'2016-01-01'"),
            "SELECT * FROM t WHERE ts < TIMESTAMP '2016-02-01 00:00:00' AND d = DATE '2016-01-01'"
        );
        assert_eq!(
            sql("select datetime'2001-01-01 01:01:01', t'01:01:01' from t"),
            "SELECT TIMESTAMP '2001-01-01 01:01:01', TIME '01:01:01' FROM t"
        );
    }

    #[test]
    fn errors_name_position_and_expectation() {
        assert_eq!(
            err("select * from t where parts where a = 1"),
            "WHERE PARTS at line 1, column 29: expected a partition key, a range like 2016010100..2016010800, or last [N], found 'where'"
        );
        assert_eq!(
            err("select * from t where parts 1..x"),
            "WHERE PARTS at line 1, column 32: expected the end of the range, found 'x'"
        );
        assert_eq!(
            err("select * from t where parts 99999999999999999999"),
            "WHERE PARTS at line 1, column 29: expected a partition key that fits in 64 bits, found '99999999999999999999'"
        );
        assert!(
            err("select * from (select 1) s where parts 1").contains("right after a table name")
        );
        assert!(err("select * from t where parts last 0").contains("at least 1"));
        assert!(err("select * from t where parts 1.5").contains("'..' or '..='"));
    }
}

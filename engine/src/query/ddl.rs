//! Sluice's own statements: DDL, SHOW, DESCRIBE, FLUSH.
//!
//! They are parsed from sqlparser tokens (the copy DataFusion re-exports) so that type names
//! in both SQL and JoinBase/ClickHouse spelling, `PARTITION BY fn(col)`, `WITH (ttl = ...)`
//! and `ALTER TABLE t SET (json_mappings = '...')` read as written; errors carry sqlparser's
//! line and column. Anything else is a query and goes to DataFusion.

use crate::alerts::AlertDef;
use crate::error::{Error, Result};
use crate::store::catalog::ColumnDef;
use crate::store::partition::PartitionFn;
use crate::types::ColumnType;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;
use std::collections::BTreeMap;

/// A table named in a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableRef {
    /// Database (`default` when not written).
    pub database: String,
    /// Table.
    pub table: String,
}

/// `CREATE TABLE` as parsed, before ids and validation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CreateTable {
    /// Where.
    pub name: TableRef,
    /// Columns.
    pub columns: Vec<ColumnDef>,
    /// Partition function.
    pub partition: PartitionFn,
    /// The column it reads.
    pub partition_column: String,
    /// TTL in seconds.
    pub ttl_secs: Option<u64>,
    /// Other options.
    pub options: BTreeMap<String, String>,
    /// IF NOT EXISTS.
    pub if_not_exists: bool,
}

/// A statement Sluice executes itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Statement {
    /// `CREATE DATABASE [IF NOT EXISTS] name`.
    CreateDatabase {
        /// Name.
        name: String,
        /// IF NOT EXISTS.
        if_not_exists: bool,
    },
    /// `DROP DATABASE [IF EXISTS] name` (must be empty).
    DropDatabase {
        /// Name.
        name: String,
        /// IF EXISTS.
        if_exists: bool,
    },
    /// `CREATE TABLE`.
    CreateTable(CreateTable),
    /// `DROP TABLE [IF EXISTS] t`.
    DropTable {
        /// Table.
        name: TableRef,
        /// IF EXISTS.
        if_exists: bool,
    },
    /// `ALTER TABLE t ADD [COLUMN] [IF NOT EXISTS] c type`.
    AddColumn {
        /// Table.
        name: TableRef,
        /// New column.
        column: ColumnDef,
        /// IF NOT EXISTS.
        if_not_exists: bool,
    },
    /// `ALTER TABLE t SET (key = 'value', ...)`: changes `WITH` options; an empty value
    /// removes the option.
    SetOptions {
        /// Table.
        name: TableRef,
        /// New TTL in seconds, when `ttl` is set.
        ttl_secs: Option<u64>,
        /// Other options to set (or, when empty, remove).
        options: BTreeMap<String, String>,
    },
    /// `CREATE USER [IF NOT EXISTS] name [WITH] PASSWORD 'secret' [ADMIN]`.
    CreateUser {
        /// Name.
        name: String,
        /// The password (hashed before it is stored).
        password: String,
        /// IF NOT EXISTS.
        if_not_exists: bool,
        /// An administrator (otherwise a plain user, with the rights granted to it).
        admin: bool,
    },
    /// `GRANT SELECT|INSERT|ALL [, ...] ON DATABASE db TO user`, or `REVOKE ... FROM user`.
    Grant {
        /// The rights given or taken.
        rights: crate::access::Rights,
        /// Database.
        database: String,
        /// User.
        user: String,
        /// REVOKE.
        revoke: bool,
    },
    /// `SHOW GRANTS [FOR user]`.
    ShowGrants {
        /// Whose (the caller's when `None`).
        user: Option<String>,
    },
    /// `ALTER USER name [WITH] PASSWORD 'secret'`.
    AlterUser {
        /// Name.
        name: String,
        /// The new password.
        password: String,
    },
    /// `DROP USER [IF EXISTS] name`.
    DropUser {
        /// Name.
        name: String,
        /// IF EXISTS.
        if_exists: bool,
    },
    /// `SHOW USERS`.
    ShowUsers,
    /// `SHOW DATABASES`.
    ShowDatabases,
    /// `SHOW TABLES [IN|FROM db]`.
    ShowTables {
        /// Database filter.
        database: Option<String>,
    },
    /// `DESCRIBE t`, `DESC [TABLE] t`.
    Describe(TableRef),
    /// `SHOW CREATE TABLE t`.
    ShowCreateTable(TableRef),
    /// `FLUSH TABLE t`.
    Flush(TableRef),
    /// `INSERT INTO t [(cols)] VALUES (...), ...`: literals only, stored through the same
    /// write path as HTTP and MQTT writes (one durable append for all the rows).
    Insert {
        /// Table.
        name: TableRef,
        /// Named columns, or `None` for all in order.
        columns: Option<Vec<String>>,
        /// Rows of literals as text (`None` is NULL).
        rows: Vec<Vec<Option<String>>>,
    },
    /// `CREATE ALERT [IF NOT EXISTS] name [EVERY d] WHEN cond [[NO] PUBLISH] [WEBHOOK 'url']
    /// AS query`.
    CreateAlert {
        /// The alert (its database is the statement's).
        def: AlertDef,
        /// IF NOT EXISTS.
        if_not_exists: bool,
    },
    /// `DROP ALERT [IF EXISTS] name`.
    DropAlert {
        /// Name.
        name: String,
        /// IF EXISTS.
        if_exists: bool,
    },
    /// `CREATE ROLLUP [IF NOT EXISTS] name AS SELECT ... [WITH (ttl = ...)]`.
    CreateRollup(Box<RollupSpec>),
    /// `DROP ROLLUP [IF EXISTS] name`.
    DropRollup {
        /// Rollup.
        name: TableRef,
        /// IF EXISTS.
        if_exists: bool,
    },
    /// Anything else: a query for DataFusion.
    Query,
}

struct P<'a> {
    p: Parser<'a>,
    /// The database of names written without one.
    database: &'a str,
}

fn perr(e: ParserError) -> Error {
    Error::sql(
        e.to_string()
            .trim_start_matches("sql parser error: ")
            .to_string(),
    )
}

impl P<'_> {
    fn word(&mut self, w: &str) -> bool {
        let hit = matches!(&self.p.peek_token().token,
            Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w));
        if hit {
            self.p.next_token();
        }
        hit
    }

    fn words(&mut self, ws: &[&str]) -> bool {
        let start = self.p.index();
        for w in ws {
            if !self.word(w) {
                while self.p.index() > start {
                    self.p.prev_token();
                }
                return false;
            }
        }
        true
    }

    fn expect_word(&mut self, w: &str) -> Result<()> {
        if self.word(w) {
            Ok(())
        } else {
            let t = self.p.peek_token();
            self.p.expected(w, t).map_err(perr)
        }
    }

    fn expect(&mut self, t: &Token) -> Result<()> {
        self.p.expect_token(t).map(|_| ()).map_err(perr)
    }

    fn ident(&mut self) -> Result<String> {
        self.p.parse_identifier().map(|i| i.value).map_err(perr)
    }

    fn table_ref(&mut self) -> Result<TableRef> {
        let name = self.p.parse_object_name(false).map_err(perr)?;
        let parts: Vec<String> = name
            .0
            .iter()
            .map(|p| {
                p.as_ident()
                    .map(|i| i.value.clone())
                    .unwrap_or_else(|| p.to_string())
            })
            .collect();
        match parts.as_slice() {
            [t] => Ok(TableRef {
                database: self.database.into(),
                table: t.clone(),
            }),
            [d, t] => Ok(TableRef {
                database: d.clone(),
                table: t.clone(),
            }),
            _ => Err(Error::sql(format!(
                "'{name}' is not a table name (use db.table)"
            ))),
        }
    }

    fn end(&mut self) -> Result<()> {
        while self.p.consume_token(&Token::SemiColon) {}
        let t = self.p.peek_token();
        if t.token == Token::EOF {
            Ok(())
        } else {
            self.p.expected("end of statement", t).map_err(perr)
        }
    }

    fn if_not_exists(&mut self) -> bool {
        self.words(&["IF", "NOT", "EXISTS"])
    }

    /// A column type; returns the type and whether `Nullable(...)` wrapped it.
    fn column_type(&mut self) -> Result<(ColumnType, bool)> {
        let at = self.p.peek_token();
        let first = self.ident()?;
        if first.eq_ignore_ascii_case("Nullable") || first.eq_ignore_ascii_case("LowCardinality") {
            self.expect(&Token::LParen)?;
            let (t, n) = self.column_type()?;
            self.expect(&Token::RParen)?;
            return Ok((t, n || first.eq_ignore_ascii_case("Nullable")));
        }
        let mut name = first;
        for follow in ["PRECISION", "UNSIGNED", "VARYING"] {
            if self.word(follow) {
                name = format!("{name} {follow}");
            }
        }
        for zone in [["WITH", "TIME", "ZONE"], ["WITHOUT", "TIME", "ZONE"]] {
            if self.words(&zone) {
                name = format!("{name} {}", zone.join(" "));
            }
        }
        // Length, precision or time-zone arguments do not change the stored type.
        if self.p.consume_token(&Token::LParen) {
            let mut depth = 1;
            while depth > 0 {
                match self.p.next_token().token {
                    Token::LParen => depth += 1,
                    Token::RParen => depth -= 1,
                    Token::EOF => return self.p.expected(")", self.p.peek_token()).map_err(perr),
                    _ => {}
                }
            }
        }
        let ty = ColumnType::parse(&name).ok_or_else(|| {
            Error::sql(format!(
                "unknown column type '{name}'{}; expected one of Bool, Int8..Int64, UInt8..UInt64, Float32, Float64, String, Blob, Date, DateTime (or BIGINT, DOUBLE, VARCHAR, TIMESTAMP, ...)",
                at.span.start
            ))
        })?;
        Ok((ty, false))
    }

    fn column_def(&mut self) -> Result<ColumnDef> {
        let name = self.ident()?;
        let (ty, wrapped) = self.column_type()?;
        let mut nullable = true;
        loop {
            if self.words(&["NOT", "NULL"]) {
                if wrapped {
                    return Err(Error::sql(format!(
                        "column '{name}' is both Nullable and NOT NULL"
                    )));
                }
                nullable = false;
            } else if self.word("NULL") {
                nullable = true;
            } else {
                break;
            }
        }
        Ok(ColumnDef { name, ty, nullable })
    }

    /// `[WITH] PASSWORD 'secret'`.
    /// The rest of `GRANT`/`REVOKE`: `SELECT|INSERT|ALL [PRIVILEGES] [, ...] ON DATABASE db
    /// TO|FROM user`.
    fn grant(&mut self, revoke: bool) -> Result<Statement> {
        let mut rights = crate::access::Rights::default();
        loop {
            if self.word("SELECT") {
                rights.select = true;
            } else if self.word("INSERT") {
                rights.insert = true;
            } else if self.word("ALL") {
                let _ = self.word("PRIVILEGES");
                (rights.select, rights.insert) = (true, true);
            } else {
                let t = self.p.peek_token();
                return self.p.expected("SELECT, INSERT or ALL", t).map_err(perr);
            }
            if !self.p.consume_token(&Token::Comma) {
                break;
            }
        }
        self.expect_word("ON")?;
        if !(self.word("DATABASE") || self.word("SCHEMA")) {
            let t = self.p.peek_token();
            return (self.p)
                .expected("DATABASE (rights are granted per database)", t)
                .map_err(perr);
        }
        let database = self.ident()?;
        self.expect_word(if revoke { "FROM" } else { "TO" })?;
        let user = self.ident()?;
        self.end()?;
        Ok(Statement::Grant {
            rights,
            database,
            user,
            revoke,
        })
    }

    fn password(&mut self) -> Result<String> {
        let _ = self.word("WITH");
        if !self.word("PASSWORD") {
            return self
                .p
                .expected("PASSWORD 'secret'", self.p.peek_token())
                .map_err(perr);
        }
        let t = self.p.next_token();
        match t.token {
            Token::SingleQuotedString(s) if !s.is_empty() => Ok(s),
            _ => self
                .p
                .expected("a non-empty password in single quotes", t)
                .map_err(perr),
        }
    }

    /// One literal of a VALUES list, as text; `None` for NULL.
    fn literal(&mut self) -> Result<Option<String>> {
        let negative = self.p.consume_token(&Token::Minus);
        // Typed literals (TIMESTAMP '...', DATE '...', dt'...') carry their text.
        if let Token::Word(w) = &self.p.peek_token().token {
            let upper = w.value.to_ascii_uppercase();
            if ["TIMESTAMP", "DATETIME", "DATE", "DT", "D"].contains(&upper.as_str()) {
                self.p.next_token();
            }
        }
        let t = self.p.next_token();
        let text = match t.token {
            Token::Number(n, _) => n,
            Token::SingleQuotedString(s) => s,
            Token::Word(w) if w.value.eq_ignore_ascii_case("NULL") => return Ok(None),
            Token::Word(w)
                if w.value.eq_ignore_ascii_case("TRUE")
                    || w.value.eq_ignore_ascii_case("FALSE") =>
            {
                w.value
            }
            _ => {
                return self
                    .p
                    .expected("a literal (number, 'string', NULL, TRUE, FALSE)", t)
                    .map_err(perr);
            }
        };
        Ok(Some(if negative { format!("-{text}") } else { text }))
    }

    fn insert(&mut self) -> Result<Statement> {
        let name = self.table_ref()?;
        let columns = if self.p.consume_token(&Token::LParen) {
            let mut cols = vec![self.ident()?];
            while self.p.consume_token(&Token::Comma) {
                cols.push(self.ident()?);
            }
            self.expect(&Token::RParen)?;
            Some(cols)
        } else {
            None
        };
        self.expect_word("VALUES")?;
        let mut rows = Vec::new();
        loop {
            self.expect(&Token::LParen)?;
            let mut row = vec![self.literal()?];
            while self.p.consume_token(&Token::Comma) {
                row.push(self.literal()?);
            }
            self.expect(&Token::RParen)?;
            rows.push(row);
            if !self.p.consume_token(&Token::Comma) {
                break;
            }
        }
        self.end()?;
        Ok(Statement::Insert {
            name,
            columns,
            rows,
        })
    }

    /// `(key = value, ...)`: `ttl` apart (as seconds), the others verbatim by lowercase key.
    fn options(&mut self) -> Result<(Option<u64>, BTreeMap<String, String>)> {
        let mut ttl_secs = None;
        let mut options = BTreeMap::new();
        self.expect(&Token::LParen)?;
        loop {
            let key = self.ident()?.to_ascii_lowercase();
            self.expect(&Token::Eq)?;
            let t = self.p.next_token();
            let value = match t.token {
                Token::SingleQuotedString(s) => s,
                Token::Number(n, _) => n,
                Token::Word(w) => w.value,
                _ => return self.p.expected("an option value", t).map_err(perr),
            };
            if key == "ttl" {
                let d = sluice_conf::parse_duration(&value).map_err(Error::sql)?;
                ttl_secs = Some(d.as_secs().max(1));
            } else {
                options.insert(key, value);
            }
            if !self.p.consume_token(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RParen)?;
        Ok((ttl_secs, options))
    }

    fn create_table(&mut self) -> Result<Statement> {
        let if_not_exists = self.if_not_exists();
        let name = self.table_ref()?;
        self.expect(&Token::LParen)?;
        let mut columns = vec![self.column_def()?];
        while self.p.consume_token(&Token::Comma) {
            columns.push(self.column_def()?);
        }
        self.expect(&Token::RParen)?;
        if !self.words(&["PARTITION", "BY"]) {
            let t = self.p.peek_token();
            return self.p.expected("PARTITION BY fn(column)", t).map_err(perr);
        }
        let at = self.p.peek_token();
        let func = self.ident()?;
        let (partition, partition_column) = if self.p.consume_token(&Token::LParen) {
            let col = self.ident()?;
            let arg = if self.p.consume_token(&Token::Comma) {
                Some(self.p.parse_literal_uint().map_err(perr)?)
            } else {
                None
            };
            self.expect(&Token::RParen)?;
            let f = PartitionFn::parse(&func, arg).ok_or_else(|| {
                Error::sql(format!(
                    "unknown partition function '{func}'{}; expected yyyy, yyyymm, yyyymmdd, yyyymmdd3/7/10, ymdh, ymdh2/4/6/12, rem(col, n) or a column",
                    at.span.start
                ))
            })?;
            (f, col)
        } else {
            (PartitionFn::Raw, func)
        };
        let (ttl_secs, options) = if self.word("WITH") {
            self.options()?
        } else {
            (None, BTreeMap::new())
        };
        self.end()?;
        Ok(Statement::CreateTable(CreateTable {
            name,
            columns,
            partition,
            partition_column,
            ttl_secs,
            options,
            if_not_exists,
        }))
    }
}

/// Parses one statement. Statements that are not Sluice's own come back as
/// [`Statement::Query`] without being parsed further.
#[cfg(test)]
pub(crate) fn parse(sql: &str) -> Result<Statement> {
    parse_in(sql, crate::store::catalog::DEFAULT_DATABASE)
}

/// Like [`parse`], with names written without a database meaning `database`.
pub(crate) fn parse_in(sql: &str, database: &str) -> Result<Statement> {
    let parser = Parser::new(&GenericDialect {})
        .try_with_sql(sql)
        .map_err(perr)?;
    let mut p = P {
        p: parser,
        database,
    };
    if p.word("CREATE") {
        if p.word("DATABASE") || p.word("SCHEMA") {
            let if_not_exists = p.if_not_exists();
            let name = p.ident()?;
            p.end()?;
            return Ok(Statement::CreateDatabase {
                name,
                if_not_exists,
            });
        }
        if p.word("TABLE") {
            return p.create_table();
        }
        if p.word("ALERT") {
            return p.create_alert(sql);
        }
        if p.word("ROLLUP") {
            return p.create_rollup(sql);
        }
        if p.word("USER") {
            let if_not_exists = p.if_not_exists();
            let name = p.ident()?;
            let password = p.password()?;
            let admin = p.word("ADMIN");
            p.end()?;
            return Ok(Statement::CreateUser {
                name,
                password,
                if_not_exists,
                admin,
            });
        }
        return Ok(Statement::Query);
    }
    if p.words(&["ALTER", "USER"]) {
        let name = p.ident()?;
        let password = p.password()?;
        p.end()?;
        return Ok(Statement::AlterUser { name, password });
    }
    if p.word("DROP") {
        if p.word("ALERT") {
            let if_exists = p.words(&["IF", "EXISTS"]);
            let name = p.ident()?;
            p.end()?;
            return Ok(Statement::DropAlert { name, if_exists });
        }
        if p.word("USER") {
            let if_exists = p.words(&["IF", "EXISTS"]);
            let name = p.ident()?;
            p.end()?;
            return Ok(Statement::DropUser { name, if_exists });
        }
        if p.word("DATABASE") || p.word("SCHEMA") {
            let if_exists = p.words(&["IF", "EXISTS"]);
            let name = p.ident()?;
            p.end()?;
            return Ok(Statement::DropDatabase { name, if_exists });
        }
        if p.word("TABLE") {
            let if_exists = p.words(&["IF", "EXISTS"]);
            let name = p.table_ref()?;
            p.end()?;
            return Ok(Statement::DropTable { name, if_exists });
        }
        if p.word("ROLLUP") {
            let if_exists = p.words(&["IF", "EXISTS"]);
            let name = p.table_ref()?;
            p.end()?;
            return Ok(Statement::DropRollup { name, if_exists });
        }
        return Ok(Statement::Query);
    }
    if p.words(&["ALTER", "TABLE"]) {
        let name = p.table_ref()?;
        if p.word("SET") {
            let (ttl_secs, options) = p.options()?;
            p.end()?;
            return Ok(Statement::SetOptions {
                name,
                ttl_secs,
                options,
            });
        }
        if !p.word("ADD") {
            let t = p.p.peek_token();
            return p
                .p
                .expected("ADD [COLUMN] or SET (option = value, ...)", t)
                .map_err(perr);
        }
        p.word("COLUMN");
        let if_not_exists = p.if_not_exists();
        let column = p.column_def()?;
        p.end()?;
        return Ok(Statement::AddColumn {
            name,
            column,
            if_not_exists,
        });
    }
    let grant = p.word("GRANT");
    if grant || p.word("REVOKE") {
        return p.grant(!grant);
    }
    if p.word("SHOW") {
        if p.word("GRANTS") {
            let user = if p.word("FOR") {
                Some(p.ident()?)
            } else {
                None
            };
            p.end()?;
            return Ok(Statement::ShowGrants { user });
        }
        if p.word("USERS") {
            p.end()?;
            return Ok(Statement::ShowUsers);
        }
        if p.word("DATABASES") || p.word("SCHEMAS") {
            p.end()?;
            return Ok(Statement::ShowDatabases);
        }
        if p.word("TABLES") {
            let database = if p.word("IN") || p.word("FROM") {
                Some(p.ident()?)
            } else {
                None
            };
            p.end()?;
            return Ok(Statement::ShowTables { database });
        }
        if p.words(&["CREATE", "TABLE"]) {
            let name = p.table_ref()?;
            p.end()?;
            return Ok(Statement::ShowCreateTable(name));
        }
        return Ok(Statement::Query);
    }
    if p.word("DESCRIBE") || p.word("DESC") {
        p.word("TABLE");
        let name = p.table_ref()?;
        p.end()?;
        return Ok(Statement::Describe(name));
    }
    if p.words(&["INSERT", "INTO"]) {
        return p.insert();
    }
    if p.word("FLUSH") {
        p.expect_word("TABLE")?;
        let name = p.table_ref()?;
        p.end()?;
        return Ok(Statement::Flush(name));
    }
    Ok(Statement::Query)
}

mod alert;
mod rollup;
pub(crate) use rollup::RollupSpec;
#[cfg(test)]
mod tests;

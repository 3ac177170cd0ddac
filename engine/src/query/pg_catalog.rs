//! PostgreSQL's system catalogs for PostgreSQL clients. psql's `\dt` and `\d`, JDBC's
//! metadata calls and Grafana's table and column lookups ask about the schema through
//! `pg_catalog`, `information_schema` and functions such as `format_type` or
//! `pg_table_is_visible`, written in PostgreSQL's own SQL (`OPERATOR(pg_catalog.~)`,
//! `'t'::regclass`, `COLLATE`). A query from the pg listener that names any of them is
//! answered here: parsed and rewritten by `datafusion-pg-catalog`'s PostgreSQL parser and
//! planned in a session that has its `pg_catalog` tables, DataFusion's `information_schema`
//! and the PostgreSQL functions. Sluice's databases are PostgreSQL's schemas (`iot.readings`
//! is schema `iot`, table `readings`), inside one database, `sluice`.
//!
//! A session is kept per (database, user) while the catalog's version holds, so the object
//! ids a client reads in one query (`pg_class.oid`) mean the same table in its next. The user
//! sees the databases they may read, nothing else; a catalog query may join a Sluice table
//! only with the right to read it.

mod information_schema;

use crate::Engine;
use crate::error::{Error, Result};
use crate::ports::{Described, QueryOptions, QueryOutput};
use crate::query::planner::{bounded, budget};
use crate::query::provider::SluiceCatalog;
use crate::store::catalog::{DEFAULT_DATABASE, SYSTEM_DATABASE};
use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::{CatalogProvider, SchemaProvider};
use datafusion::common::ScalarValue;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use datafusion_pg_catalog::pg_catalog::PG_CATALOG_TABLES;
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

/// Catalog sessions kept; past this they are dropped and remade as used.
const KEPT: usize = 256;

/// The PostgreSQL parser with its rewrites (built once: it tokenizes its own patterns).
static PARSER: LazyLock<PostgresCompatibilityParser> =
    LazyLock::new(PostgresCompatibilityParser::new);

/// Names that only PostgreSQL's catalogs answer (besides `pg_catalog`'s tables and `pg_*`
/// functions).
const CATALOG_WORDS: &[&str] = &[
    "pg_catalog",
    "information_schema",
    "current_schema",
    "current_schemas",
    "current_database",
    "current_catalog",
    "format_type",
    "has_table_privilege",
    "has_schema_privilege",
    "has_database_privilege",
    "has_any_column_privilege",
    "obj_description",
    "col_description",
    "quote_ident",
    "parse_ident",
    "regclass",
    "regtype",
    "regnamespace",
    "regproc",
    "regprocedure",
    "regrole",
];

/// Whether `sql` is a query (`SELECT`, `WITH`) about PostgreSQL's catalogs: a word (not in
/// quotes) that names one of its schemas, tables or functions. A user's table or column
/// named `pg_something` is not one (unless it is a catalog table's name).
pub(crate) fn asks_catalog(sql: &str) -> bool {
    // Every pg query passes here: most name none of these, and need no tokenizing.
    let lower = sql.to_ascii_lowercase();
    const HINTS: [&str; 8] = [
        "pg_",
        "information_schema",
        "current_",
        "format_type",
        "has_",
        "ident",
        "description",
        "reg",
    ];
    if !HINTS.iter().any(|h| lower.contains(h)) {
        return false;
    }
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return false;
    };
    let code: Vec<&Token> = (tokens.iter())
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let word = |t: &Token| match t {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_lowercase()),
        _ => None,
    };
    if !matches!(
        code.first().and_then(|t| word(t)).as_deref(),
        Some("select" | "with")
    ) {
        return false;
    }
    code.iter().enumerate().any(|(i, t)| {
        let Some(v) = word(t) else { return false };
        let called = code.get(i + 1).is_some_and(|n| **n == Token::LParen);
        CATALOG_WORDS.contains(&v.as_str())
            || (v.starts_with("pg_") && (called || PG_CATALOG_TABLES.contains(&v.as_str())))
    })
}

/// The subquery Grafana's PostgreSQL data source lists the schemas of `search_path` with:
/// DataFusion has no `current_setting` nor set-returning functions in `FROM`, and the
/// PostgreSQL parser would make it match nothing. The search path of a Sluice connection is
/// its database, so the subquery becomes that one name.
const GRAFANA_SEARCH_PATH: &str = r#"SELECT
    CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
  FROM generate_series(
      array_lower(string_to_array(current_setting('search_path'),','),1),
      array_upper(string_to_array(current_setting('search_path'),','),1)
    ) as i,
    string_to_array(current_setting('search_path'),',') s"#;

/// `sql` made plannable, where it has to be: Grafana's search path subquery becomes
/// `database` (see [`GRAFANA_SEARCH_PATH`]; compared token by token, so layout and comments
/// do not matter), and `current_catalog` (a keyword without parentheses, which JDBC's
/// `getCatalog` reads) becomes `current_database()`.
fn rewrite(sql: &str, database: &str) -> Option<String> {
    if !sql.contains("current_setting") && !sql.contains("current_catalog") {
        return None;
    }
    // Literals as written: the tokens are printed back.
    let tokenize = |s: &str| {
        (Tokenizer::new(&PostgreSqlDialect {}, s).with_unescape(false))
            .tokenize()
            .ok()
    };
    let code = |tokens: &[Token]| -> Vec<usize> {
        (0..tokens.len())
            .filter(|&i| !matches!(tokens[i], Token::Whitespace(_)))
            .collect()
    };
    let mut tokens = tokenize(sql)?;
    let pattern = tokenize(GRAFANA_SEARCH_PATH)?;
    let pattern: Vec<&Token> = code(&pattern).into_iter().map(|i| &pattern[i]).collect();
    let at = code(&tokens);
    let found = (0..at.len().saturating_sub(pattern.len() - 1))
        .find(|&k| (0..pattern.len()).all(|j| tokens[at[k + j]] == *pattern[j]));
    if let Some(k) = found {
        let name = format!("SELECT '{}'", database.replace('\'', "''"));
        tokens.splice(
            at[k]..=at[k + pattern.len() - 1],
            [Token::make_word(&name, None)],
        );
    }
    let at = code(&tokens);
    for (n, &i) in at.iter().enumerate() {
        let called = at.get(n + 1).is_some_and(|&j| tokens[j] == Token::LParen);
        if let Token::Word(w) = &tokens[i]
            && w.quote_style.is_none()
            && w.value.eq_ignore_ascii_case("current_catalog")
            && !called
        {
            tokens[i] = Token::make_word("current_database()", None);
        }
    }
    Some(tokens.iter().map(Token::to_string).collect())
}

/// Whose catalog session: (database, user).
type Whose = (String, Option<String>);

/// Kept catalog sessions: whose -> (catalog version, session).
#[derive(Default)]
pub(crate) struct CatalogSessions {
    kept: Mutex<HashMap<Whose, (u64, SessionContext)>>,
}

/// The `sluice` catalog as one user sees it: the databases they may read, and the schemas
/// `datafusion-pg-catalog` adds (`pg_catalog`).
#[derive(Debug)]
struct Visible {
    inner: SluiceCatalog,
    readable: HashSet<String>,
    added: RwLock<HashMap<String, Arc<dyn SchemaProvider>>>,
}

impl CatalogProvider for Visible {
    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (self.inner.schema_names().into_iter())
            .filter(|d| self.readable.contains(d))
            .collect();
        names.extend(self.added.read().keys().cloned());
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if let Some(s) = self.added.read().get(name) {
            return Some(s.clone());
        }
        self.readable
            .contains(name)
            .then(|| self.inner.schema(name))
            .flatten()
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> datafusion::error::Result<Option<Arc<dyn SchemaProvider>>> {
        Ok(self.added.write().insert(name.to_string(), schema))
    }
}

impl Engine {
    /// The catalog session of `user` in `database`, made anew when the catalog changed.
    fn catalog_session(&self, database: &str, user: Option<&str>) -> Result<SessionContext> {
        let cat = self.store.catalog.snapshot();
        let key = (database.to_string(), user.map(str::to_string));
        let mut kept = self.planner.catalog.kept.lock();
        if let Some((version, ctx)) = kept.get(&key)
            && *version == cat.version
        {
            return Ok(ctx.clone());
        }
        let mut readable: HashSet<String> = (cat.databases.keys())
            .filter(|db| self.access.rights(&cat, user, db).select)
            .cloned()
            .collect();
        if self.access.is_admin(&cat, user) {
            readable.insert(SYSTEM_DATABASE.to_string());
        }
        let cfg = SessionConfig::new()
            .with_default_catalog_and_schema("sluice", database)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(false)
            .with_target_partitions(1);
        // The same memory budget as every query (`query.max_memory_bytes`).
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_pool(budget(self.config.query.max_memory_bytes))
            .build_arc()?;
        let ctx = SessionContext::new_with_config_rt(cfg, runtime);
        ctx.register_catalog(
            "sluice",
            Arc::new(Visible {
                inner: SluiceCatalog {
                    store: self.store.clone(),
                },
                added: RwLock::new(HashMap::from([(
                    "information_schema".to_string(),
                    information_schema::schema(&cat, &readable)?,
                )])),
                readable,
            }),
        );
        ctx.register_object_store(
            self.store.storage.url.as_ref(),
            self.store.storage.store.clone(),
        );
        for f in crate::query::functions::all() {
            ctx.register_udf(f);
        }
        datafusion_pg_catalog::setup_pg_catalog(&ctx, "sluice", EmptyContextProvider)
            .map_err(|e| Error::from(*e))?;
        // The current schema is the connection's database (where unqualified names are).
        let schema = ScalarValue::Utf8(Some(database.to_string()));
        ctx.register_udf(create_udf(
            "current_schema",
            Vec::new(),
            DataType::Utf8,
            Volatility::Stable,
            Arc::new(move |_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(schema.clone()))),
        ));
        if kept.len() >= KEPT {
            kept.clear();
        }
        kept.insert(key, (cat.version, ctx.clone()));
        Ok(ctx)
    }

    /// Plans a catalog query: PostgreSQL's SQL rewritten for DataFusion, every table it
    /// reads outside the catalogs checked against the user's rights.
    async fn plan_catalog(&self, sql: &str, options: &QueryOptions) -> Result<LogicalPlan> {
        let database = options.database.as_deref().unwrap_or(DEFAULT_DATABASE);
        let user = options.user.as_deref();
        let rewritten = rewrite(sql, database);
        let sql = rewritten.as_deref().unwrap_or(sql);
        let mut statements = PARSER.parse(sql).map_err(|e| Error::sql(e.to_string()))?;
        if statements.len() != 1 {
            return Err(Error::sql(format!(
                "expected one statement, found {}",
                statements.len()
            )));
        }
        let ctx = self.catalog_session(database, user)?;
        let state = ctx.state();
        let stmt = DfStatement::Statement(Box::new(statements.remove(0)));
        let mut reads = Vec::new();
        for r in state.resolve_table_references(&stmt)? {
            let db = r.schema().unwrap_or(database);
            if !matches!(db, "pg_catalog" | "information_schema") && !reads.iter().any(|d| d == db)
            {
                reads.push(db.to_string());
            }
        }
        reads.retain(|db| db != SYSTEM_DATABASE);
        self.check_reads(user, &reads)?;
        let plan = state.statement_to_plan(stmt).await?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)?;
        Ok(plan)
    }

    /// Runs a PostgreSQL client's catalog query (see the module's text).
    pub(crate) async fn query_catalog(
        &self,
        sql: &str,
        options: &QueryOptions,
    ) -> Result<QueryOutput> {
        let plan = self.plan_catalog(sql, options).await?;
        let plan = crate::query::planner::bind(plan, &options.params)?;
        let database = options.database.as_deref().unwrap_or(DEFAULT_DATABASE);
        let ctx = self.catalog_session(database, options.user.as_deref())?;
        let (deadline, timeout) = self.query_deadline();
        let frame = ctx.execute_logical_plan(plan).await?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        let limit = self.config.query.max_memory_bytes;
        let stream = frame.execute_stream().await?;
        Ok(QueryOutput {
            schema,
            // The same time limit as every query (`query.timeout`).
            stream: bounded(stream, None, deadline, (timeout, limit)),
        })
    }

    /// What a catalog query takes and returns.
    pub(crate) async fn describe_catalog(
        &self,
        sql: &str,
        options: &QueryOptions,
    ) -> Result<Described> {
        let plan = self.plan_catalog(sql, options).await?;
        let types = plan.get_parameter_types()?;
        Ok(Described {
            params: (1..=types.len())
                .map(|i| types.get(&format!("${i}")).cloned().flatten())
                .collect(),
            schema: Some(Arc::new(plan.schema().as_arrow().clone())),
            statement: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::asks_catalog;

    #[test]
    fn grafanas_search_path_is_the_database() {
        let sql = "select quote_ident(table_name) from information_schema.tables where \
            quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user \
            ELSE trim(s[i]) END FROM generate_series(array_lower(string_to_array(\
            current_setting('search_path'),','),1), array_upper(string_to_array(\
            current_setting('search_path'),','),1)) as i, \
            string_to_array(current_setting('search_path'),',') s) ORDER BY 1";
        let out = super::rewrite(sql, "iot").unwrap();
        assert!(out.ends_with("IN (SELECT 'iot') ORDER BY 1"), "{out}");
        assert!(super::rewrite("SELECT 1", "iot").is_none());
        let out = super::rewrite("select current_catalog, 'it''s'", "iot").unwrap();
        assert_eq!(out, "select current_database(), 'it''s'");
    }

    #[test]
    fn catalog_queries_are_told_from_data_queries() {
        assert!(asks_catalog(
            "SELECT c.relname FROM pg_catalog.pg_class c WHERE pg_table_is_visible(c.oid)"
        ));
        assert!(asks_catalog(
            "select table_name from information_schema.tables"
        ));
        assert!(asks_catalog("SELECT 'readings'::regclass"));
        assert!(asks_catalog("SELECT current_schema()"));
        assert!(asks_catalog("select pg_catalog.pg_get_userbyid(1)"));
        assert!(asks_catalog("SELECT relname FROM pg_class"));
        assert!(!asks_catalog("SELECT pg_reading FROM t"));
        assert!(!asks_catalog("INSERT INTO pg_x VALUES (1)"));
        assert!(!asks_catalog(
            "SELECT avg(temp) FROM iot.readings WHERE PARTS ('2026-01-01')"
        ));
        assert!(!asks_catalog("SELECT 'pg_class' AS name, \"pg_x\" FROM t"));
        assert!(!asks_catalog("SELECT 1 -- pg_class"));
    }
}

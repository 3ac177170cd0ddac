//! The PostgreSQL wire protocol (on the `pgwire` crate), so that psql, psycopg, JDBC tools
//! and Grafana's PostgreSQL data source can query Sluice: the same SQL (`WHERE PARTS`
//! included), users, rights and errors as `POST /v1/sql`, through [`QueryPort`].
//!
//! - Startup: with users, a cleartext password checked against the user's argon2 hash (the
//!   listener is on loopback or behind TLS, see `pg.listen`); without users, no password.
//!   The startup `database` names the database of unqualified names; a client's default
//!   (`postgres`, `template1`, or the user's own name) means Sluice's `default`.
//! - Simple queries: the text is split into statements ([`session::split`]), each answered
//!   in turn; the first error ends the rest, as in PostgreSQL.
//! - Extended queries: `Parse` asks the engine what the statement takes and returns
//!   ([`QueryPort::describe`]), `Bind` decodes the parameters (text or binary) to the types
//!   the plan infers, `Execute` runs it with them. Results go out in text or binary.
//! - `SET`, `RESET`, `SHOW` of settings and transactions are answered here ([`session`]).
//! - Errors carry a SQLSTATE code chosen from the engine's error kind ([`sqlstate`]).

mod session;

use crate::auth::{Authenticator, matches};
use arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch, into_pg_type};
use async_trait::async_trait;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ParamValues;
use futures::{Sink, StreamExt, stream};
use pgwire::api::auth::{
    DefaultServerParameterProvider, StartupHandler, finish_authentication, protocol_negotiation,
    save_startup_parameters_to_metadata,
};
use pgwire::api::portal::{Format, Portal, PortalExecutionState};
use pgwire::api::query::{
    ExtendedQueryHandler, SimpleQueryHandler, send_execution_response, send_query_response,
};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, DEFAULT_NAME, METADATA_DATABASE, METADATA_USER,
    PgWireConnectionState, PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use session::Local;
use sluice_engine::{Described, ErrorKind, QueryOptions, QueryOutput, QueryPort};
use std::fmt::Debug;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Where the authenticated user is kept in a connection's metadata (absent: no users).
const SLUICE_USER: &str = "sluice.user";

/// Serves the PostgreSQL protocol on `listener` until `cancel`; `tls` lets clients ask for
/// TLS. At most `max_connections` at once: one more is closed when accepted.
pub async fn serve_pg(
    listener: TcpListener,
    db: Arc<dyn QueryPort>,
    auth: Arc<dyn Authenticator>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    max_connections: usize,
    cancel: CancellationToken,
) {
    let handlers = Arc::new(Pg {
        queries: Arc::new(Queries { db }),
        startup: Arc::new(Startup {
            auth,
            params: server_parameters(),
        }),
    });
    let open = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        let (socket, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "pg: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max_connections, "pg: too many connections; closed");
            continue;
        };
        let _ = socket.set_nodelay(true);
        let (handlers, tls, cancel) = (handlers.clone(), tls.clone(), cancel.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = pgwire::tokio::process_socket(socket, tls, handlers) => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "pg: connection ended");
                    }
                }
            }
            drop(permit);
        });
    }
}

fn server_parameters() -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.server_version = session::SERVER_VERSION.into();
    p.time_zone = "UTC".into();
    p.date_style = "ISO, MDY".into();
    p.is_superuser = false;
    p
}

/// The handlers of every connection.
struct Pg {
    queries: Arc<Queries>,
    startup: Arc<Startup>,
}

impl PgWireServerHandlers for Pg {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.queries.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.queries.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }
}

/// Logins: a cleartext password checked against the user's hash, when users exist.
struct Startup {
    auth: Arc<dyn Authenticator>,
    params: DefaultServerParameterProvider,
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        use futures::SinkExt;
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                if self.auth.required() {
                    client.set_state(PgWireConnectionState::AuthenticationInProgress);
                    let ask = Authentication::CleartextPassword;
                    client
                        .send(PgWireBackendMessage::Authentication(ask))
                        .await?;
                } else {
                    finish_authentication(client, &self.params).await?;
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                let password = message.into_password()?.password;
                let user = (client.metadata().get(METADATA_USER).cloned()).unwrap_or_default();
                let peer = client.socket_addr().ip();
                let good = match self.auth.password_hash(&user) {
                    Some(hash) => matches(hash, password).await,
                    None => false,
                };
                if !good {
                    tokio::time::sleep(self.auth.login_failed(peer)).await;
                    return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                        "FATAL".into(),
                        "28P01".into(),
                        format!("password authentication failed for user \"{user}\""),
                    ))));
                }
                self.auth.login_succeeded(peer);
                client.metadata_mut().insert(SLUICE_USER.into(), user);
                finish_authentication(client, &self.params).await?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Queries of both protocols, run through the engine.
struct Queries {
    db: Arc<dyn QueryPort>,
}

/// A prepared statement: answered here, or by the engine (with what it takes and returns).
#[derive(Debug, Clone)]
enum Prepared {
    Local(Local),
    Sluice { sql: String, described: Described },
}

/// The options a connection's statements run with: its database and user.
fn options<C: ClientInfo>(client: &C) -> QueryOptions {
    let meta = client.metadata();
    let user = meta.get(SLUICE_USER).cloned();
    let login = meta.get(METADATA_USER).map(String::as_str);
    let database = match meta.get(METADATA_DATABASE).map(String::as_str) {
        None | Some("" | "postgres" | "template0" | "template1") => None,
        Some(d) if Some(d) == login => None,
        Some(d) => Some(d.to_string()),
    };
    QueryOptions {
        database,
        user,
        // `SET sluice.cache = off`: computed answers, as `/v1/sql?cache=off`.
        no_result_cache: session::setting(meta, "sluice.cache").as_deref() == Some("off"),
        postgres: true,
        ..QueryOptions::default()
    }
}

impl Queries {
    /// Answers a statement the server handles itself.
    fn local<C: ClientInfo>(&self, client: &mut C, local: &Local) -> PgWireResult<Response> {
        Ok(match local {
            Local::Set(..) | Local::Reset(_) => {
                local.apply(client.metadata_mut());
                Response::Execution(Tag::new(match local {
                    Local::Set(..) => "SET",
                    _ => "RESET",
                }))
            }
            Local::Show(name) => {
                let value = session::setting(client.metadata(), name).ok_or_else(|| {
                    user_error(
                        "42704",
                        format!("unrecognized configuration parameter \"{name}\""),
                    )
                })?;
                let text = pgwire::api::results::FieldFormat::Text;
                let field = FieldInfo::new(name.clone(), None, None, Type::TEXT, text);
                let fields = Arc::new(vec![field]);
                let mut row = pgwire::api::results::DataRowEncoder::new(fields.clone());
                row.encode_field(&value)?;
                let rows = stream::iter([Ok(row.take_row())]);
                Response::Query(QueryResponse::new(fields, rows))
            }
            Local::Begin => Response::TransactionStart(Tag::new("BEGIN")),
            Local::End(word) => Response::TransactionEnd(Tag::new(word)),
            Local::Nothing(word) => Response::Execution(Tag::new(word)),
        })
    }

    /// Runs `sql` with `options` and answers with its rows in `format`, or the tag of a
    /// statement without rows (`statement`, else guessed from its first words).
    async fn run(
        &self,
        sql: &str,
        options: &QueryOptions,
        format: &Format,
        statement: Option<&str>,
    ) -> PgWireResult<Response> {
        let output = self.db.query(sql, options).await.map_err(engine_error)?;
        let command = statement.map_or_else(|| command_of(sql), str::to_string);
        if command == "INSERT" && output.schema.fields().len() == 1 {
            let rows = count_of(output).await?;
            return Ok(Response::Execution(
                Tag::new("INSERT").with_oid(0).with_rows(rows),
            ));
        }
        if output.schema.fields().is_empty() {
            return Ok(Response::Execution(Tag::new(&command)));
        }
        let fields = Arc::new(arrow_schema_to_pg_fields(&output.schema, format, None)?);
        let encode = fields.clone();
        let rows = output
            .stream
            .map(move |batch| {
                let rows: Box<dyn Iterator<Item = PgWireResult<_>> + Send + Sync> = match batch {
                    Ok(batch) => encode_recordbatch(encode.clone(), batch),
                    Err(e) => Box::new(std::iter::once(Err(engine_error(e.into())))),
                };
                stream::iter(rows)
            })
            .flatten();
        Ok(Response::Query(QueryResponse::new(fields, rows)))
    }
}

/// The number in the one-row result of an `INSERT`.
async fn count_of(output: QueryOutput) -> PgWireResult<usize> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::UInt64Type;
    let batches: Vec<_> = output.stream.collect().await;
    let mut rows = 0;
    for b in batches {
        let b = b.map_err(|e| engine_error(e.into()))?;
        if let Some(c) = b.column(0).as_primitive_opt::<UInt64Type>() {
            rows += c.iter().flatten().sum::<u64>() as usize;
        }
    }
    Ok(rows)
}

/// The command tag of a statement without rows, from its first words.
fn command_of(sql: &str) -> String {
    let words: Vec<String> = (sql.split_whitespace().take(2))
        .map(|w| w.trim_end_matches(';').to_ascii_uppercase())
        .collect();
    match words.first().map(String::as_str) {
        Some("CREATE" | "DROP" | "ALTER") if words.len() > 1 => {
            let what = match words[1].as_str() {
                "USER" => "ROLE",
                w => w,
            };
            format!("{} {what}", words[0])
        }
        Some(w) => w.to_string(),
        None => String::new(),
    }
}

#[async_trait]
impl SimpleQueryHandler for Queries {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut out = Vec::new();
        for sql in session::split(query) {
            let answer = match Local::parse(sql) {
                Some(local) => self.local(client, &local),
                None => {
                    let options = options(client);
                    self.run(sql, &options, &Format::UnifiedText, None).await
                }
            };
            match answer {
                Ok(r) => out.push(r),
                Err(PgWireError::UserError(e)) => {
                    out.push(Response::Error(e));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            out.push(Response::EmptyQuery);
        }
        Ok(out)
    }
}

#[async_trait]
impl QueryParser for Queries {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let sql = sql.trim().trim_end_matches(';').trim();
        if sql.is_empty() {
            return Ok(None);
        }
        if let Some(local) = Local::parse(sql) {
            return Ok(Some(Prepared::Local(local)));
        }
        let options = options(client);
        let described = match self.db.describe(sql, &options).await {
            Ok(d) => d,
            // Sluice's own statements (`INSERT`) take literals, not parameters: described
            // with NULLs in their place, they get the values as literals when they run.
            Err(e) => match session::parameters(sql) {
                0 => return Err(engine_error(e)),
                n => {
                    let nulls = vec![datafusion::common::ScalarValue::Null; n];
                    let Ok(with_nulls) = session::inline(sql, &nulls) else {
                        return Err(engine_error(e));
                    };
                    match self.db.describe(&with_nulls, &options).await {
                        Ok(d) if d.statement.is_some() => d,
                        _ => return Err(engine_error(e)),
                    }
                }
            },
        };
        Ok(Some(Prepared::Sluice {
            sql: sql.to_string(),
            described,
        }))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        match stmt {
            Prepared::Local(_) => Ok(Vec::new()),
            // Sluice's own statements take literals: their `$n` are filled in here.
            Prepared::Sluice { described, sql } if described.statement.is_some() => {
                Ok(vec![Type::UNKNOWN; session::parameters(sql)])
            }
            Prepared::Sluice { described, .. } => (described.params.iter())
                .map(|t| t.as_ref().map_or(Ok(Type::UNKNOWN), into_pg_type))
                .collect(),
        }
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let format = format.unwrap_or(&Format::UnifiedText);
        match stmt {
            Prepared::Local(Local::Show(name)) => Ok(vec![FieldInfo::new(
                name.clone(),
                None,
                None,
                Type::TEXT,
                format.format_for(0),
            )]),
            Prepared::Local(_) => Ok(Vec::new()),
            Prepared::Sluice { described, .. } => match &described.schema {
                Some(schema) => arrow_schema_to_pg_fields(schema, format, None),
                None => Ok(Vec::new()),
            },
        }
    }
}

#[async_trait]
impl ExtendedQueryHandler for Queries {
    type Statement = Prepared;
    type QueryParser = Queries;

    fn query_parser(&self) -> Arc<Queries> {
        Arc::new(Queries {
            db: self.db.clone(),
        })
    }

    /// pgwire's `on_execute` gathers every row of a portal before it sends the first (so that
    /// a later Execute can take the rest); a query's whole result (`max_rows` 0, what drivers
    /// ask unless told to fetch in steps) is streamed here instead, so that a large result
    /// is never held. A portal read in steps, and statements without rows, take pgwire's way.
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        let portal = match client.portal_store().get_portal(name) {
            Some(Entry::Value(p)) if message.max_rows == 0 => p,
            _ => return self._on_execute(client, message).await,
        };
        let rows = matches!(&portal.statement.statement,
            Prepared::Sluice { described, .. } if described.schema.is_some());
        let fresh = matches!(*portal.state().lock().await, PortalExecutionState::Initial);
        let ready = matches!(client.state(), PgWireConnectionState::ReadyForQuery);
        if !(rows && fresh && ready) {
            return self._on_execute(client, message).await;
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        match ExtendedQueryHandler::do_query(self, client, portal.as_ref(), 0).await? {
            Response::Query(results) => send_query_response(client, results, false).await?,
            Response::Execution(tag) => send_execution_response(client, tag).await?,
            _ => return Err(user_error("XX000", "a query answered as no query does")),
        }
        *portal.state().lock().await = PortalExecutionState::Finished;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        Ok(())
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match &portal.statement.statement {
            Prepared::Local(local) => self.local(client, local),
            Prepared::Sluice { sql, described } => {
                let types: Vec<Option<&DataType>> =
                    described.params.iter().map(Option::as_ref).collect();
                let params: Vec<_> =
                    match arrow_pg::datatypes::df::deserialize_parameters(portal, &types)? {
                        ParamValues::List(values) => values.into_iter().map(|v| v.value).collect(),
                        ParamValues::Map(_) => {
                            return Err(user_error("08P01", "named parameters are not supported"));
                        }
                    };
                let format = &portal.result_column_format;
                if described.statement.is_some() {
                    let sql = session::inline(sql, &params).map_err(|e| user_error("08P01", e))?;
                    let options = options(client);
                    return self.run(&sql, &options, format, described.statement).await;
                }
                let options = QueryOptions {
                    params,
                    ..options(client)
                };
                self.run(sql, &options, format, described.statement).await
            }
        }
    }
}

/// An error the client is told, with its SQLSTATE `code`.
fn user_error(code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        code.into(),
        message.into(),
    )))
}

/// An engine error as the client sees it: the same message as over HTTP, with the SQLSTATE
/// code of its kind.
fn engine_error(e: sluice_engine::Error) -> PgWireError {
    let message = e.to_string();
    user_error(sqlstate(e.kind(), &message), message)
}

/// The SQLSTATE code of an engine error of `kind`.
fn sqlstate(kind: ErrorKind, message: &str) -> &'static str {
    match kind {
        ErrorKind::BadSql => "42601",
        ErrorKind::InvalidDefinition => "42P16",
        ErrorKind::UnknownDatabase => "3D000",
        ErrorKind::UnknownTable => "42P01",
        ErrorKind::UnknownAlert => "42704",
        ErrorKind::AlreadyExists => "42P07",
        ErrorKind::Denied => "42501",
        ErrorKind::BadRow | ErrorKind::BadPayload => "22P02",
        ErrorKind::TooLarge => "54000",
        ErrorKind::Overloaded | ErrorKind::BuffersFull => "53000",
        ErrorKind::ShuttingDown => "57P01",
        ErrorKind::NotCommitted | ErrorKind::LogUnavailable => "57P03",
        ErrorKind::DiskFull => "53100",
        ErrorKind::ResourcesExhausted if message.contains("query.timeout") => "57014",
        ErrorKind::ResourcesExhausted => "53200",
        ErrorKind::QueryFailed if message.contains("query.timeout") => "57014",
        ErrorKind::QueryFailed => "22000",
        ErrorKind::StorageFailed => "58030",
        ErrorKind::Internal => "XX000",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_named_from_their_first_words() {
        assert_eq!(command_of("create table t (a int)"), "CREATE TABLE");
        assert_eq!(command_of("CREATE USER bob PASSWORD 'x'"), "CREATE ROLE");
        assert_eq!(command_of("GRANT read ON db TO bob;"), "GRANT");
        assert_eq!(command_of(""), "");
    }

    #[test]
    fn errors_have_sqlstate_codes() {
        assert_eq!(sqlstate(ErrorKind::UnknownTable, ""), "42P01");
        assert_eq!(sqlstate(ErrorKind::Denied, ""), "42501");
        let slow = "the query ran longer than query.timeout (5s) and was stopped";
        assert_eq!(sqlstate(ErrorKind::QueryFailed, slow), "57014");
        assert_eq!(sqlstate(ErrorKind::ResourcesExhausted, slow), "57014");
    }
}

//! Running queries. Per default database one DataFusion session state (and its task
//! context) is built once and reused; planned queries are cached by their text, so a repeated
//! query (an alert, a dashboard panel, a prepared statement with `$1` parameters) skips
//! parsing and SQL planning and only optimizes and runs. The cache is keyed by catalog version:
//! any DDL makes every cached plan stale. Plans are cached before optimization, so values that
//! change between runs (partition lists, `last N`, statistics, `now()`) are read afresh; the
//! optimized plan is cached as well when optimizing it read none of those ([`reusable`]),
//! with its physical plan, whose scans take the table's rows when they run (not when
//! planned), so a repeated alert query costs only its execution; and its small result
//! is kept until a table it reads changes (a row applied, a partition expired) or the
//! catalog does, so polling unchanged data costs a lookup.

use crate::Engine;
use crate::error::{Error, Result};
use crate::ports::{Described, Logins, QueryOptions, QueryOutput};
use crate::query::ddl::{self, Statement};
use crate::query::parts::PartsSpec;
use crate::query::provider::SluiceCatalog;
use crate::store::Store;
use crate::store::catalog::{DEFAULT_DATABASE, SYSTEM_DATABASE};
use crate::store::remote::PartialQuery;
use crate::store::state::TableState;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::execution::TaskContext;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext, SessionState};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::sql::parser::Statement as DfStatement;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Plans kept; past this the cache is emptied and refills with what is used.
pub(crate) const CACHED_PLANS: usize = 4096;

/// A session for one default database.
pub(crate) struct Session {
    pub(crate) state: SessionState,
    /// The task context small queries share (their memory budget is shared too).
    task: Arc<TaskContext>,
    /// Task contexts with a memory budget each, free for the next query: made once and
    /// reused, since making one copies the session's function tables (a computed alert
    /// query ran ~25% slower making one per query).
    spare: Mutex<Vec<Arc<TaskContext>>>,
}

/// Task contexts kept spare per session.
const SPARE_TASKS: usize = 64;

/// A query's task context, given back to its session when the query's stream is dropped,
/// if nothing holds it or its memory any more (otherwise it is dropped).
pub(crate) struct Lease {
    task: Option<Arc<TaskContext>>,
    session: Arc<Session>,
}

impl Lease {
    /// The leased task context (held until the lease is dropped).
    pub(crate) fn task(&self) -> Arc<TaskContext> {
        self.task
            .clone()
            .expect("a lease holds its task until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        if Arc::strong_count(&task) == 1 && task.memory_pool().reserved() == 0 {
            let mut spare = self.session.spare.lock();
            if spare.len() < SPARE_TASKS {
                spare.push(task);
            }
        }
    }
}

impl Session {
    /// A task context for one query, with its own memory budget of `limit` bytes: a spare
    /// one, or a new one.
    pub(crate) fn lease(self: &Arc<Self>, limit: usize) -> Lease {
        let task = self.spare.lock().pop();
        Lease {
            task: Some(task.unwrap_or_else(|| self.task_with_budget(limit))),
            session: self.clone(),
        }
    }

    /// A new task context with its own memory budget of `limit` bytes (the session's disk
    /// manager, caches and object stores).
    fn task_with_budget(&self, limit: usize) -> Arc<TaskContext> {
        let base = self.state.runtime_env();
        let runtime = datafusion::execution::runtime_env::RuntimeEnv {
            memory_pool: budget(limit),
            disk_manager: base.disk_manager.clone(),
            cache_manager: base.cache_manager.clone(),
            object_store_registry: base.object_store_registry.clone(),
        };
        Arc::new(TaskContext::from(&self.state).with_runtime(Arc::new(runtime)))
    }
}

/// A memory pool of `limit` bytes whose refusals name the largest consumers.
pub(crate) fn budget(limit: usize) -> Arc<dyn datafusion::execution::memory_pool::MemoryPool> {
    use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
    let top = std::num::NonZeroUsize::new(3).expect("3 is not 0");
    Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(limit), top))
}

/// `stream`, stopped with an error once `deadline` passes, and with a memory refusal
/// explained by the setting behind it.
pub(crate) fn bounded(
    stream: datafusion::execution::SendableRecordBatchStream,
    lease: Option<Lease>,
    deadline: tokio::time::Instant,
    (timeout, limit): (Arc<str>, usize),
) -> datafusion::execution::SendableRecordBatchStream {
    use datafusion::error::DataFusionError;
    let schema = stream.schema();
    // One timer for the whole query. The lease comes last: dropped after the stream, whose
    // operators hold the task context. The setting's text travels in the state, used only
    // in an error.
    let sleep = Box::pin(tokio::time::sleep_until(deadline));
    let state = (Some((stream, sleep)), lease, timeout);
    let rows = futures::stream::unfold(state, move |(state, lease, timeout)| {
        async move {
            let (mut stream, mut sleep) = state?;
            let next = tokio::select! {
                biased;
                item = stream.next() => Ok(item),
                _ = &mut sleep => Err(()),
            };
            let error = match next {
                Ok(Some(Err(e)))
                    if matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)) =>
                {
                    let m = e.find_root().to_string();
                    format!("the query needs more than query.max_memory_bytes ({limit}): {m}")
                }
                Ok(Some(item)) => return Some((item, (Some((stream, sleep)), lease, timeout))),
                Ok(None) => return None,
                Err(()) => {
                    format!("the query ran longer than query.timeout ({timeout}) and was stopped")
                }
            };
            // Dropping the stream stops the query's work, before the lease goes back.
            drop(stream);
            Some((
                Err(DataFusionError::ResourcesExhausted(error)),
                (None, lease, timeout),
            ))
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}

/// A plan and the tables it reads.
#[derive(Clone)]
pub(crate) struct Planned {
    pub(crate) plan: LogicalPlan,
    tables: Vec<Arc<TableState>>,
    /// The databases of the tables it reads (`system` aside): the caller needs SELECT on
    /// each, checked every run (a kept plan may be run by another user).
    reads: Vec<String>,
}

/// A small result kept with what it was computed from.
struct CachedResult {
    /// Each table's change count before the query ran.
    changes: Vec<u64>,
    /// On a node holding only some shards: where the others stood before it ran.
    versions: Option<Vec<(u32, u64)>>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

/// An optimized plan that can be run again as it is, its physical plan (scans take their
/// rows when they run, so the plan is run again after [`reset_plan_states`]), and its last
/// small result.
struct Reusable {
    /// Catalog version it was planned at.
    version: u64,
    planned: Planned,
    physical: Option<Arc<dyn ExecutionPlan>>,
    result: Option<CachedResult>,
    /// Whether its answer depends only on the tables (not on `now()`): only then is a
    /// result kept.
    timeless: bool,
}

impl Reusable {
    /// The kept result, if no table it read has changed since (and no shard held
    /// elsewhere moved: `versions`, where they stand now).
    fn result(&self, versions: &Option<Vec<(u32, u64)>>) -> Option<QueryOutput> {
        let r = self.result.as_ref().filter(|_| self.timeless)?;
        let tables = &self.planned.tables;
        let unchanged = r.versions == *versions
            && tables.len() == r.changes.len()
            && tables
                .iter()
                .zip(&r.changes)
                .all(|(t, c)| t.changes() == *c);
        unchanged.then(|| QueryOutput::from_batches(r.schema.clone(), r.batches.clone()))
    }
}

/// How long a query on a node holding only some shards waits to learn where the others
/// stand before it goes on without a kept result.
const VERSIONS_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// Results up to this size are kept.
const RESULT_MAX_BYTES: usize = 1 << 20;

/// Sessions and cached plans.
#[derive(Default)]
pub(crate) struct Planner {
    /// (database, one partition) -> its session.
    sessions: Mutex<HashMap<(String, bool), Arc<Session>>>,
    /// (database, SQL) -> (catalog version, plan before optimization).
    pub(crate) plans: Mutex<HashMap<(String, String), (u64, Planned)>>,
    /// (database, SQL, parameters) -> the optimized plan, for plans whose optimization
    /// reads nothing that changes between runs, with its last small result, valid while no
    /// table it reads has changed (an alert query polled with no new rows is not recomputed).
    reusable: Mutex<HashMap<(String, String, String), Reusable>>,
    /// Queries (keyed as `reusable`) with values of the moment that cannot be kept: they
    /// are optimized with the time of each run (catalog version as value).
    per_run: Mutex<HashMap<(String, String, String), u64>>,
    /// `query.timeout`, parsed once, with its text (for the error that names it).
    timeout: std::sync::OnceLock<(std::time::Duration, Arc<str>)>,
    /// PostgreSQL clients' catalog sessions ([`crate::query::pg_catalog`]).
    pub(crate) catalog: crate::query::pg_catalog::CatalogSessions,
    /// Partial aggregates this node ran for others ([`crate::query::split`]).
    pub(crate) partials: crate::query::split::ReplicaPlans,
}

/// Inserts into a bounded cache: past `limit` entries it is emptied and refills with what is
/// used.
pub(crate) fn bounded_insert<K: std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    limit: usize,
    k: K,
    v: V,
) {
    if map.len() >= limit {
        map.clear();
    }
    map.insert(k, v);
}

/// Whether `plan` reads a value of the moment: calls a function that is not immutable
/// (`now()`, `random()`), which optimizing folds into the plan or which must be evaluated
/// each run. (Synopsis nodes read the clock when they run and show no expressions.)
pub(crate) fn of_the_moment(plan: &LogicalPlan) -> bool {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut found = false;
    let walked = plan.apply_with_subqueries(|node| {
        found |= node
            .expressions()
            .iter()
            .any(crate::query::optimizer::of_the_moment);
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found || walked.is_err()
}

/// Optimizes `plan` with `now()` as `now`, or left unfolded when `None` (for a plan kept and
/// run again: its synopsis nodes then read the clock each run). A session's own clock is
/// set once, when the session is made, and sessions live as long as the engine: optimizing
/// through [`SessionState::optimize`] would give every query the same `now()`.
pub(crate) fn optimize_at(
    state: &SessionState,
    plan: &LogicalPlan,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<LogicalPlan> {
    if matches!(plan, LogicalPlan::Explain(_)) {
        // EXPLAIN records each rule's output; rare enough to pay for a copy of the state.
        let mut state = state.clone();
        let options = state.config_options().clone();
        state.execution_props_mut().mark_start_execution(options);
        return Ok(state.optimize(plan)?);
    }
    let analyzed =
        (state.analyzer()).execute_and_check(plan.clone(), state.config_options(), |_, _| {})?;
    let clock = crate::query::optimizer::Clock { state, now };
    Ok(state.optimizer().optimize(analyzed, &clock, |_, _| {})?)
}

/// A session whose names default to `database`; with `one_partition`, plans run as one
/// partition (cheaper to plan and start, for small queries run often, such as alerts).
fn new_session(store: &Arc<Store>, database: &str, one_partition: bool, limit: usize) -> Session {
    // DataFusion's own settings may be given as `DATAFUSION_*` environment variables
    // (`DATAFUSION_EXECUTION_TARGET_PARTITIONS=4`); a bad one leaves all at their defaults.
    let from_env = SessionConfig::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "DATAFUSION_* settings not applied");
        SessionConfig::new()
    });
    let mut cfg = from_env
        .with_default_catalog_and_schema("sluice", database)
        .with_create_default_catalog_and_schema(false)
        .with_information_schema(false);
    cfg.options_mut().sql_parser.enable_ident_normalization = false;
    if one_partition {
        cfg = cfg.with_target_partitions(1);
    }
    let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_memory_pool(budget(limit))
        .build_arc()
        .expect("a runtime environment with default parts");
    let state = SessionStateBuilder::new()
        .with_config(cfg)
        .with_runtime_env(runtime)
        .with_default_features()
        .with_query_planner(Arc::new(crate::query::optimizer::SluiceQueryPlanner))
        .with_physical_optimizer_rule(Arc::new(crate::query::keyed_sort::KeyedSortRule))
        .with_physical_optimizer_rule(Arc::new(crate::query::split::SplitRule))
        .build();
    let ctx = SessionContext::new_with_state(state);
    ctx.register_catalog(
        "sluice",
        Arc::new(SluiceCatalog {
            store: store.clone(),
        }),
    );
    ctx.register_object_store(store.storage.url.as_ref(), store.storage.store.clone());
    for f in crate::query::functions::all() {
        ctx.register_udf(f);
    }
    ctx.add_optimizer_rule(Arc::new(crate::query::optimizer::SynopsisRule));
    let state = ctx.state();
    let task = state.task_ctx();
    Session {
        state,
        task,
        spare: Mutex::new(Vec::new()),
    }
}

impl Engine {
    /// A task context for work a query did not ask for here (filling a last-value cache
    /// another node's query needs), with the memory budget small queries share.
    pub(crate) fn background_task(&self, database: &str) -> Result<Arc<TaskContext>> {
        Ok(self.session(database, true)?.task.clone())
    }

    /// On a node holding only some shards, where the others stand now (a kept result also
    /// needs them not to have moved); `Ok(None)` on a node holding every shard; `Err` when
    /// that cannot be told in time (no result is kept or used then).
    async fn shard_versions(&self) -> std::result::Result<Option<Vec<(u32, u64)>>, ()> {
        match self.store.reader() {
            Some(r) if self.store.partial() => {
                let asked = tokio::time::timeout(VERSIONS_WAIT, r.versions()).await;
                asked.ok().flatten().map(Some).ok_or(())
            }
            _ => Ok(None),
        }
    }

    pub(crate) fn session(&self, database: &str, one_partition: bool) -> Result<Arc<Session>> {
        if database != DEFAULT_DATABASE
            && database != SYSTEM_DATABASE
            && !self
                .store
                .catalog
                .snapshot()
                .databases
                .contains_key(database)
        {
            return Err(Error::UnknownDatabase {
                database: database.into(),
            });
        }
        let limit = self.config.query.max_memory_bytes;
        let mut sessions = self.planner.sessions.lock();
        Ok(sessions
            .entry((database.to_string(), one_partition))
            .or_insert_with(|| Arc::new(new_session(&self.store, database, one_partition, limit)))
            .clone())
    }

    /// Executes one statement: Sluice's own (DDL, SHOW, ...) or a query through DataFusion.
    pub(crate) async fn query(&self, sql: &str, options: &QueryOptions) -> Result<QueryOutput> {
        if options.postgres && crate::query::pg_catalog::asks_catalog(sql) {
            return self.query_catalog(sql, options).await;
        }
        let database = options.database.as_deref().unwrap_or(DEFAULT_DATABASE);
        let user = options.user.as_deref();
        let (deadline, timeout) = self.query_deadline();
        // `now()` of this run, here and on the replicas that aggregate part of it.
        let now = chrono::Utc::now();
        let session = self.session(database, options.small)?;
        let version = self.store.catalog.snapshot().version;
        let key = (database.to_string(), sql.to_string());
        // Where the shards held elsewhere stand, asked (once) only for a kept result.
        let mut asked = None;
        // `small` plans as one partition: a kept physical plan is per session.
        let okey = (
            key.0.clone(),
            key.1.clone(),
            format!("{:?} {}", options.params, options.small),
        );
        let reused = self
            .planner
            .reusable
            .lock()
            .get(&okey)
            .filter(|r| r.version == version)
            .map(|r| {
                let kept = r.result.is_some() && r.timeless;
                (r.planned.clone(), r.physical.clone(), kept, r.timeless)
            });
        if let Some((planned, ..)) = &reused {
            self.check_reads(user, &planned.reads)?;
        }
        let (optimized, reuse, timeless, physical) = match reused {
            Some((planned, physical, kept, timeless)) => {
                if kept && !options.no_result_cache {
                    let versions = self.shard_versions().await;
                    let hit = (versions.as_ref().ok())
                        .and_then(|v| self.planner.reusable.lock().get(&okey)?.result(v));
                    if let Some(hit) = hit {
                        return Ok(hit);
                    }
                    asked = Some(versions);
                }
                (planned, true, timeless, physical)
            }
            None => {
                let cached = (self.planner.plans.lock().get(&key))
                    .filter(|(v, _)| *v == version)
                    .map(|(_, p)| p.clone());
                let (planned, cacheable) = match cached {
                    Some(planned) => (planned, true),
                    None => match ddl::parse_in(sql, database)? {
                        Statement::Query => {
                            let (planned, cacheable) =
                                self.plan(&session, database, sql, user).await?;
                            if cacheable {
                                let entry = (version, planned.clone());
                                bounded_insert(
                                    &mut self.planner.plans.lock(),
                                    CACHED_PLANS,
                                    key,
                                    entry,
                                );
                            }
                            (planned, cacheable)
                        }
                        other if options.params.is_empty() => {
                            return self.run_statement(other, user).await;
                        }
                        _ => {
                            return Err(Error::sql(
                                "parameters are only for queries, not for DDL or SHOW",
                            ));
                        }
                    },
                };
                self.check_reads(user, &planned.reads)?;
                let plan = bind(planned.plan, &options.params)?;
                let explain = matches!(plan, LogicalPlan::Explain(_) | LogicalPlan::Analyze(_));
                let timeless = !of_the_moment(&plan);
                let mut reuse = cacheable && !explain && timeless;
                // A plan whose values of the moment (`now()`) all went into synopsis nodes,
                // which read the clock when they run, is kept too: optimized with `now()`
                // unbound. Its results are not kept. Tried once per query text.
                let mut unbound = None;
                let tried = |p: &Planner| p.per_run.lock().get(&okey) == Some(&version);
                if cacheable && !explain && !timeless && !tried(&self.planner) {
                    let p = optimize_at(&session.state, &plan, None)?;
                    match of_the_moment(&p) {
                        false => (unbound, reuse) = (Some(p), true),
                        true => bounded_insert(
                            &mut self.planner.per_run.lock(),
                            CACHED_PLANS,
                            okey.clone(),
                            version,
                        ),
                    }
                }
                let optimized = Planned {
                    plan: match unbound {
                        Some(p) => p,
                        None => optimize_at(&session.state, &plan, Some(now))?,
                    },
                    tables: planned.tables,
                    reads: planned.reads,
                };
                if reuse {
                    let entry = Reusable {
                        version,
                        planned: optimized.clone(),
                        physical: None,
                        result: None,
                        timeless,
                    };
                    bounded_insert(
                        &mut self.planner.reusable.lock(),
                        CACHED_PLANS,
                        okey.clone(),
                        entry,
                    );
                }
                (optimized, reuse, timeless, None)
            }
        };
        // Read before running: a change that lands meanwhile makes the kept result stale.
        let changes: Vec<u64> = optimized.tables.iter().map(|t| t.changes()).collect();
        let versions = match (reuse && timeless && !options.no_result_cache, asked) {
            (false, _) => Err(()),
            (true, Some(v)) => v,
            (true, None) => self.shard_versions().await,
        };
        let physical = match physical {
            Some(kept) => reset_plan_states(kept)?,
            None => {
                let physical = session
                    .state
                    .query_planner()
                    .create_physical_plan(&optimized.plan, &session.state)
                    .await?;
                if reuse
                    && let Some(r) = self.planner.reusable.lock().get_mut(&okey)
                    && r.version == version
                {
                    // Kept reset: this run's snapshot of the tables is not kept with it.
                    r.physical = Some(reset_plan_states(physical.clone())?);
                }
                physical
            }
        };
        if let Some(running) = crate::query::log::current() {
            running.set_plan(physical.clone());
        }
        if self.store.reader().is_some() {
            let query =
                || (options.params.is_empty()).then(|| PartialQuery::new(database, sql, now));
            let min_rows = self.config.query.split_min_rows;
            crate::query::split::SplitAggExec::prepare(&physical, query, min_rows);
        }
        let schema = physical.schema();
        let limit = self.config.query.max_memory_bytes;
        let (task, lease) = match options.small {
            true => (session.task.clone(), None),
            false => {
                let lease = session.lease(limit);
                (lease.task(), Some(lease))
            }
        };
        let stream = datafusion::physical_plan::execute_stream(physical, task)?;
        let mut stream = bounded(stream, lease, deadline, (timeout.clone(), limit));
        let Ok(versions) = versions else {
            return Ok(QueryOutput { schema, stream });
        };
        let mut batches = Vec::new();
        let mut bytes = 0;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            bytes += batch.get_array_memory_size();
            batches.push(batch);
            if bytes > RESULT_MAX_BYTES {
                // Too big to keep: what was read so far, then the rest as it comes.
                let head = futures::stream::iter(batches.into_iter().map(Ok));
                let stream = RecordBatchStreamAdapter::new(schema.clone(), head.chain(stream));
                return Ok(QueryOutput {
                    schema,
                    stream: Box::pin(stream),
                });
            }
        }
        if let Some(r) = self.planner.reusable.lock().get_mut(&okey)
            && r.version == version
        {
            r.result = Some(CachedResult {
                changes,
                versions,
                schema: schema.clone(),
                batches: batches.clone(),
            });
        }
        Ok(QueryOutput::from_batches(schema, batches))
    }

    /// When a query starting now must end (`query.timeout`), with the setting's text.
    pub(crate) fn query_deadline(&self) -> (tokio::time::Instant, Arc<str>) {
        let (limit_time, timeout) = self.planner.timeout.get_or_init(|| {
            let text = &self.config.query.timeout;
            (
                sluice_conf::Config::duration(text),
                Arc::from(text.as_str()),
            )
        });
        (tokio::time::Instant::now() + *limit_time, timeout.clone())
    }

    /// Checks that `sql` is one query that plans in `database` (for alerts, made now and run
    /// later).
    pub(crate) async fn check_query(
        &self,
        database: &str,
        sql: &str,
        user: Option<&str>,
    ) -> Result<()> {
        match ddl::parse_in(sql, database)? {
            Statement::Query => {}
            _ => return Err(Error::sql("an alert's query must be a query (SELECT ...)")),
        }
        let session = self.session(database, true)?;
        let (planned, _) = self.plan(&session, database, sql, user).await?;
        self.check_reads(user, &planned.reads)
    }

    /// What `sql` takes and returns, without running it (see [`crate::QueryPort::describe`]).
    pub(crate) async fn describe(&self, sql: &str, options: &QueryOptions) -> Result<Described> {
        if options.postgres && crate::query::pg_catalog::asks_catalog(sql) {
            return self.describe_catalog(sql, options).await;
        }
        let database = options.database.as_deref().unwrap_or(DEFAULT_DATABASE);
        let user = options.user.as_deref();
        match ddl::parse_in(sql, database)? {
            Statement::Query => {
                let session = self.session(database, options.small)?;
                let (planned, _) = self.plan(&session, database, sql, user).await?;
                self.check_reads(user, &planned.reads)?;
                let types = planned.plan.get_parameter_types()?;
                let params = (1..=types.len())
                    .map(|i| types.get(&format!("${i}")).cloned().flatten())
                    .collect();
                Ok(Described {
                    params,
                    schema: Some(Arc::new(planned.plan.schema().as_arrow().clone())),
                    statement: None,
                })
            }
            // Read-only: run to learn the columns.
            other if other.is_show() => Ok(Described {
                params: Vec::new(),
                schema: Some(self.run_statement(other, user).await?.schema),
                statement: None,
            }),
            Statement::Insert { .. } => Ok(Described {
                params: Vec::new(),
                schema: None,
                statement: Some("INSERT"),
            }),
            Statement::Flush(_) => Ok(Described {
                params: Vec::new(),
                schema: Some(Arc::new(Schema::new(vec![Field::new(
                    "files_written",
                    DataType::UInt64,
                    false,
                )]))),
                statement: None,
            }),
            other => Ok(Described {
                params: Vec::new(),
                schema: None,
                statement: Some(other.command()),
            }),
        }
    }

    /// Plans a query; also says whether the plan may be cached (not when it reads `system`
    /// tables, whose rows are taken when the plan is made).
    pub(crate) async fn plan(
        &self,
        session: &Session,
        database: &str,
        sql: &str,
        user: Option<&str>,
    ) -> Result<(Planned, bool)> {
        let mut statements = crate::query::dialect::parse(sql)?;
        if statements.len() != 1 {
            return Err(Error::sql(format!(
                "expected one statement, found {}",
                statements.len()
            )));
        }
        let stmt = crate::query::gapfill::rewrite(statements.remove(0))?;
        let stmt = DfStatement::Statement(Box::new(stmt));
        let mut cacheable = true;
        let mut tables = Vec::new();
        let mut reads = Vec::new();
        let mut system = false;
        for r in session.state.resolve_table_references(&stmt)? {
            let db = r.schema().unwrap_or(database);
            system |= db == SYSTEM_DATABASE;
            if db == SYSTEM_DATABASE && !crate::query::users::SHOWN_TO_USERS.contains(&r.table()) {
                let what = format!("read system.{}", r.table());
                self.authorize(user, crate::access::Need::Admin(&what))?;
            }
            if let Some(id) = self.check_table(database, &r)? {
                tables.extend(self.store.tables.get(id));
                // A rollup's answer changes with its source's rows.
                if let Some(rollup) = self.store.catalog.snapshot().rollups.get(&id) {
                    tables.extend(self.store.tables.get(rollup.source));
                }
                if !reads.iter().any(|d| d == db) {
                    reads.push(db.to_string());
                }
            }
        }
        cacheable &= !system;
        let mut plan = session.state.statement_to_plan(stmt).await?;
        // System tables are planned afresh each time (never kept), so the rows a plain user
        // may see are chosen here.
        if system && !self.is_admin(user) {
            plan = self.system_rows_for(plan, database, user.unwrap_or_default())?;
        }
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)?;
        Ok((
            Planned {
                plan,
                tables,
                reads,
            },
            cacheable,
        ))
    }

    /// Names a missing table or database before planning, so the client gets a 404 that says
    /// which, rather than a planning error. Returns the id of a Sluice table (`None` for
    /// `system` tables).
    fn check_table(
        &self,
        database: &str,
        r: &datafusion::common::TableReference,
    ) -> Result<Option<u64>> {
        if r.catalog().is_some_and(|c| c != "sluice") {
            return Ok(None);
        }
        let (table, _) = PartsSpec::split_name(r.table());
        let db = r.schema().unwrap_or(database);
        if db == SYSTEM_DATABASE {
            return match crate::query::system::SystemSchema::has(&self.store, table) {
                true => Ok(None),
                false => Err(Error::UnknownTable {
                    database: db.into(),
                    table: table.into(),
                }),
            };
        }
        let cat = self.store.catalog.snapshot();
        match crate::query::provider::resolve(&cat, db, table) {
            Some(def) => Ok(Some(def.id)),
            // The catalog's own lookup says which is missing, the database or the table.
            None => cat.table(db, table).map(|def| Some(def.id)),
        }
    }
}

/// Gives `$1`, `$2`, ... their values, each cast to the type its place in the query asks for
/// (a JSON number compared with a Float32 column becomes a Float32).
pub(crate) fn bind(plan: LogicalPlan, params: &[ScalarValue]) -> Result<LogicalPlan> {
    if params.is_empty() {
        return Ok(plan);
    }
    let types = plan.get_parameter_types()?;
    if types.len() != params.len() {
        return Err(Error::sql(format!(
            "the query has {} parameters, {} values were given",
            types.len(),
            params.len()
        )));
    }
    let values = params
        .iter()
        .enumerate()
        .map(|(i, v)| match types.get(&format!("${}", i + 1)) {
            Some(Some(ty)) if v.data_type() != *ty => v
                .cast_to(ty)
                .map_err(|e| Error::sql(format!("parameter ${}: {v} is not a {ty}: {e}", i + 1))),
            Some(_) => Ok(v.clone()),
            None => Err(Error::sql(format!(
                "parameter ${} is not used by the query (use $1..${})",
                i + 1,
                params.len()
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(plan.with_param_values(values)?)
}

#[cfg(test)]
mod tests;

//! Running queries. Per default database one DataFusion session state (and its task
//! context) is built once and reused; planned queries are cached by their text, so a repeated
//! query (an alert, a dashboard panel, a prepared statement with `$1` parameters) skips
//! parsing and SQL planning and only optimizes and runs. The cache is keyed by catalog version:
//! any DDL makes every cached plan stale. Plans are cached before optimization, so values that
//! change between runs (partition lists, `last N`, statistics, `now()`) are read afresh; the
//! optimized plan is cached as well when optimizing it read none of those ([`reusable`]), so
//! a repeated alert query costs only physical planning and execution.

use super::Engine;
use crate::api::{QueryOptions, QueryOutput};
use crate::catalog::{DEFAULT_DATABASE, SYSTEM_DATABASE};
use crate::ddl::{self, Statement};
use crate::error::{Error, Result};
use crate::parts::PartsSpec;
use crate::provider::{Shared, SluiceCatalog};
use datafusion::common::ScalarValue;
use datafusion::execution::TaskContext;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext, SessionState};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::sql::parser::Statement as DfStatement;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Plans kept; past this the cache is emptied and refills with what is used.
const CACHED_PLANS: usize = 4096;

/// A session for one default database.
pub(super) struct Session {
    state: SessionState,
    task: Arc<TaskContext>,
}

/// Cached plans by key, each with the catalog version it was planned at.
type PlanCache<K> = Mutex<HashMap<K, (u64, LogicalPlan)>>;

/// Sessions and cached plans.
#[derive(Default)]
pub(super) struct Planner {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// (database, SQL) -> (catalog version, plan before optimization).
    plans: PlanCache<(String, String)>,
    /// (database, SQL, parameters) -> (catalog version, optimized plan), for plans whose
    /// optimization reads nothing that changes between runs.
    optimized: PlanCache<(String, String, String)>,
}

fn remember<K: std::hash::Hash + Eq>(map: &PlanCache<K>, key: K, version: u64, plan: &LogicalPlan) {
    let mut m = map.lock();
    if m.len() >= CACHED_PLANS {
        m.clear();
    }
    m.insert(key, (version, plan.clone()));
}

fn recall<K: std::hash::Hash + Eq>(
    map: &PlanCache<K>,
    key: &K,
    version: u64,
) -> Option<LogicalPlan> {
    map.lock()
        .get(key)
        .filter(|(v, _)| *v == version)
        .map(|(_, p)| p.clone())
}

/// Whether an optimized plan can be run again as it is: not when the optimizer folded in a
/// value of the moment (`now()` and other non-immutable functions), answered from synopses
/// (a `Values` node), or when it is an EXPLAIN.
fn reusable(plan: &LogicalPlan, optimized: &LogicalPlan) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::Volatility;
    let any = |p: &LogicalPlan, test: &dyn Fn(&LogicalPlan) -> bool| {
        let mut found = false;
        let walked = p.apply_with_subqueries(|node| {
            found |= test(node);
            Ok(if found {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        });
        found || walked.is_err()
    };
    let moment = any(plan, &|node| {
        node.expressions().iter().any(|e| {
            e.exists(|e| {
                Ok(matches!(e, Expr::ScalarFunction(f)
                    if f.func.signature().volatility != Volatility::Immutable))
            })
            .unwrap_or(true)
        })
    });
    let values = any(optimized, &|node| matches!(node, LogicalPlan::Values(_)));
    !moment && !values && !matches!(optimized, LogicalPlan::Explain(_) | LogicalPlan::Analyze(_))
}

fn new_session(shared: &Arc<Shared>, database: &str) -> Session {
    let mut cfg = SessionConfig::new()
        .with_default_catalog_and_schema("sluice", database)
        .with_create_default_catalog_and_schema(false)
        .with_information_schema(false);
    cfg.options_mut().sql_parser.enable_ident_normalization = false;
    let ctx = SessionContext::new_with_config(cfg);
    ctx.register_catalog(
        "sluice",
        Arc::new(SluiceCatalog {
            shared: shared.clone(),
        }),
    );
    ctx.register_object_store(shared.storage.url.as_ref(), shared.storage.store.clone());
    for f in crate::functions::all() {
        ctx.register_udf(f);
    }
    ctx.add_optimizer_rule(Arc::new(crate::optimizer::SynopsisRule));
    let state = ctx.state();
    let task = state.task_ctx();
    Session { state, task }
}

impl Engine {
    fn session(&self, database: &str) -> Result<Arc<Session>> {
        if database != DEFAULT_DATABASE
            && database != SYSTEM_DATABASE
            && !self
                .shared
                .catalog
                .snapshot()
                .databases
                .contains_key(database)
        {
            return Err(Error::UnknownDatabase {
                database: database.into(),
            });
        }
        let mut sessions = self.planner.sessions.lock();
        Ok(sessions
            .entry(database.to_string())
            .or_insert_with(|| Arc::new(new_session(&self.shared, database)))
            .clone())
    }

    /// Executes one statement: Sluice's own (DDL, SHOW, ...) or a query through DataFusion.
    pub(super) async fn query(&self, sql: &str, options: &QueryOptions) -> Result<QueryOutput> {
        let database = options.database.as_deref().unwrap_or(DEFAULT_DATABASE);
        let session = self.session(database)?;
        let version = self.shared.catalog.snapshot().version;
        let key = (database.to_string(), sql.to_string());
        let okey = (
            key.0.clone(),
            key.1.clone(),
            format!("{:?}", options.params),
        );
        let optimized = match recall(&self.planner.optimized, &okey, version) {
            Some(optimized) => optimized,
            None => {
                let (plan, cacheable) = match recall(&self.planner.plans, &key, version) {
                    Some(plan) => (plan, true),
                    None => match ddl::parse_in(sql, database)? {
                        Statement::Query => {
                            let (plan, cacheable) = self.plan(&session, database, sql).await?;
                            if cacheable {
                                remember(&self.planner.plans, key, version, &plan);
                            }
                            (plan, cacheable)
                        }
                        other if options.params.is_empty() => {
                            return self.run_statement(other).await;
                        }
                        _ => {
                            return Err(Error::sql(
                                "parameters are only for queries, not for DDL or SHOW",
                            ));
                        }
                    },
                };
                let plan = bind(plan, &options.params)?;
                let optimized = session.state.optimize(&plan)?;
                if cacheable && reusable(&plan, &optimized) {
                    remember(&self.planner.optimized, okey, version, &optimized);
                }
                optimized
            }
        };
        let physical = session
            .state
            .query_planner()
            .create_physical_plan(&optimized, &session.state)
            .await?;
        let schema = physical.schema();
        let stream = datafusion::physical_plan::execute_stream(physical, session.task.clone())?;
        Ok(QueryOutput { schema, stream })
    }

    /// Plans a query; also says whether the plan may be cached (not when it reads `system`
    /// tables, whose rows are taken when the plan is made).
    async fn plan(
        &self,
        session: &Session,
        database: &str,
        sql: &str,
    ) -> Result<(LogicalPlan, bool)> {
        let mut statements = crate::dialect::parse(sql)?;
        if statements.len() != 1 {
            return Err(Error::sql(format!(
                "expected one statement, found {}",
                statements.len()
            )));
        }
        let stmt = DfStatement::Statement(Box::new(statements.remove(0)));
        let mut cacheable = true;
        for r in session.state.resolve_table_references(&stmt)? {
            self.check_table(database, &r)?;
            cacheable &= r.schema().unwrap_or(database) != SYSTEM_DATABASE;
        }
        let plan = session.state.statement_to_plan(stmt).await?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)?;
        Ok((plan, cacheable))
    }

    /// Names a missing table or database before planning, so the client gets a 404 that says
    /// which, rather than a planning error.
    fn check_table(&self, database: &str, r: &datafusion::common::TableReference) -> Result<()> {
        if r.catalog().is_some_and(|c| c != "sluice") {
            return Ok(());
        }
        let (table, _) = PartsSpec::split_name(r.table());
        let db = r.schema().unwrap_or(database);
        if db == SYSTEM_DATABASE {
            return match crate::system::SystemSchema::has(table) {
                true => Ok(()),
                false => Err(Error::UnknownTable {
                    database: db.into(),
                    table: table.into(),
                }),
            };
        }
        let cat = self.shared.catalog.snapshot();
        match crate::provider::resolve(&cat, db, table) {
            Some(_) => Ok(()),
            None => cat.table(db, table).map(|_| ()),
        }
    }
}

/// Gives `$1`, `$2`, ... their values, each cast to the type its place in the query asks for
/// (a JSON number compared with a Float32 column becomes a Float32).
fn bind(plan: LogicalPlan, params: &[ScalarValue]) -> Result<LogicalPlan> {
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

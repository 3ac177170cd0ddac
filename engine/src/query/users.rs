//! Who may run which statement ([`Engine::check_statement`]), and the statements about
//! users and their rights: `CREATE USER [ADMIN]`, `ALTER USER`, `DROP USER`, `SHOW USERS`,
//! `GRANT`, `REVOKE`, `SHOW GRANTS`.

use crate::Engine;
use crate::access::{Need, Rights};
use crate::error::{Error, Result};
use crate::ports::{Logins, QueryOutput};
use crate::query::ddl::Statement;
use crate::query::statements::{hash_password, no_rows, strings, table_output, valid_name};
use crate::store::catalog::CatalogData;
use crate::store::catalog::SYSTEM_DATABASE;
use datafusion::arrow::array::{ArrayRef, BooleanArray};
use datafusion::common::Column;
use datafusion::common::tree_node::Transformed;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, lit};
use std::sync::Arc;

/// The `system` tables a plain user may read, each showing only its rows: tables,
/// partitions and files of the databases it may read, its own sessions, alerts and
/// statements.
pub(crate) const SHOWN_TO_USERS: [&str; 7] = [
    "tables",
    "partitions",
    "files",
    "rollups",
    "sessions",
    "alerts",
    "queries",
];

impl Engine {
    /// Whether `user` may read every database in `reads`.
    pub(crate) fn check_reads(&self, user: Option<&str>, reads: &[String]) -> Result<()> {
        for db in reads {
            self.authorize(user, Need::Select(db))?;
        }
        Ok(())
    }

    /// `plan` with each scan of a `system` table kept to the rows plain user `user` may see
    /// (see [`SHOWN_TO_USERS`]; reading the others was refused when planning began).
    pub(crate) fn system_rows_for(
        &self,
        plan: LogicalPlan,
        database: &str,
        user: &str,
    ) -> Result<LogicalPlan> {
        let cat = self.store.catalog.snapshot();
        let readable: Vec<Expr> = (cat.databases.keys())
            .filter(|db| self.access.rights(&cat, Some(user), db).select)
            .map(|db| lit(db.clone()))
            .collect();
        let plan = plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::TableScan(scan) = &node else {
                return Ok(Transformed::no(node));
            };
            if scan.table_name.schema().unwrap_or(database) != SYSTEM_DATABASE {
                return Ok(Transformed::no(node));
            }
            let column =
                |name: &str| Expr::Column(Column::new(Some(scan.table_name.clone()), name));
            let keep = match scan.table_name.table() {
                "sessions" => column("user").eq(lit(user)),
                "alerts" => column("owner").eq(lit(user)),
                "queries" => column("user").eq(lit(user)),
                _ if readable.is_empty() => lit(false),
                _ => column("database_name").in_list(readable.clone(), false),
            };
            let filter = Filter::try_new(keep, Arc::new(node))?;
            Ok(Transformed::yes(LogicalPlan::Filter(filter)))
        })?;
        Ok(plan.data)
    }

    /// Whether `user` may run `stmt`: administrators everything; a plain user reads
    /// (DESCRIBE, SHOW CREATE TABLE) and writes (INSERT) the databases granted to it,
    /// changes its own password, sees its own grants and drops its own alerts. Queries are
    /// checked when planned (every table they read).
    pub(crate) fn check_statement(&self, stmt: &Statement, user: Option<&str>) -> Result<()> {
        let admin = |what| self.authorize(user, Need::Admin(what));
        match stmt {
            Statement::Query | Statement::ShowDatabases | Statement::ShowTables { .. } => Ok(()),
            Statement::CreateDatabase { .. } => admin("create databases"),
            Statement::DropDatabase { .. } => admin("drop databases"),
            Statement::CreateTable(_) => admin("create tables"),
            Statement::DropTable { .. } => admin("drop tables"),
            Statement::CreateRollup(_) => admin("create rollups"),
            Statement::DropRollup { .. } => admin("drop rollups"),
            Statement::AddColumn { .. } | Statement::SetOptions { .. } => admin("alter tables"),
            Statement::Flush(_) => admin("flush tables"),
            Statement::CreateUser { .. } | Statement::DropUser { .. } => admin("manage users"),
            Statement::AlterUser { name, .. } if user == Some(name.as_str()) => Ok(()),
            Statement::AlterUser { .. } => admin("change other users' passwords"),
            Statement::ShowUsers => admin("list users"),
            Statement::Grant { .. } => admin("grant or revoke rights"),
            Statement::ShowGrants { user: Some(u) } if user != Some(u.as_str()) => {
                admin("see other users' grants")
            }
            Statement::ShowGrants { .. } => Ok(()),
            Statement::Describe(t) | Statement::ShowCreateTable(t) => {
                self.authorize(user, Need::Select(&t.database))
            }
            Statement::Insert { name, .. } => self.authorize(
                user,
                Need::Insert {
                    database: &name.database,
                    table: &name.table,
                },
            ),
            // Checked by `create_alert` (webhooks need an administrator; the query is planned
            // with its creator's rights) and `drop_alert` (a plain user drops its own).
            Statement::CreateAlert { .. } | Statement::DropAlert { .. } => Ok(()),
        }
    }

    /// Whether `user` has any right on `database` (SHOW lists only those).
    pub(crate) fn may_see(&self, cat: &CatalogData, user: Option<&str>, database: &str) -> bool {
        let r = self.access.rights(cat, user, database);
        r.select || r.insert
    }

    /// Runs a statement about users and rights (already checked).
    pub(crate) async fn run_user_statement(
        &self,
        stmt: Statement,
        user: Option<&str>,
    ) -> Result<QueryOutput> {
        let catalog = &self.store.catalog;
        match stmt {
            Statement::CreateUser {
                name,
                password,
                if_not_exists,
                admin,
            } => {
                valid_name("user", &name)?;
                let hash = hash_password(password).await?;
                catalog.change(|d| {
                    if d.users.contains_key(&name) || self.access.configured(&name) {
                        return match if_not_exists {
                            true => Ok(()),
                            false => Err(Error::AlreadyExists {
                                what: "user",
                                name: name.clone(),
                            }),
                        };
                    }
                    d.users.insert(name.clone(), hash);
                    if admin {
                        d.admins.insert(name.clone());
                    }
                    Ok(())
                })?;
                Ok(no_rows())
            }
            Statement::AlterUser { name, password } => {
                self.not_configured(&name)?;
                let hash = hash_password(password).await?;
                catalog.change(|d| match d.users.get_mut(&name) {
                    Some(h) => {
                        *h = hash;
                        Ok(())
                    }
                    None => Err(Error::invalid(format!("no user '{name}'"))),
                })?;
                Ok(no_rows())
            }
            Statement::DropUser { name, if_exists } => {
                self.not_configured(&name)?;
                catalog.change(|d| match d.users.remove(&name) {
                    Some(_) => {
                        d.admins.remove(&name);
                        d.grants.remove(&name);
                        Ok(())
                    }
                    None if if_exists => Ok(()),
                    None => Err(Error::invalid(format!("no user '{name}'"))),
                })?;
                Ok(no_rows())
            }
            Statement::ShowUsers => {
                let cat = catalog.snapshot();
                let names: Vec<String> = cat.users.keys().cloned().collect();
                let admin: Vec<bool> = names.iter().map(|u| cat.admins.contains(u)).collect();
                table_output(vec![
                    ("user_name", strings(names)),
                    ("admin", Arc::new(BooleanArray::from(admin)) as ArrayRef),
                ])
            }
            Statement::Grant {
                rights,
                database,
                user: grantee,
                revoke,
            } => {
                catalog.change(|d| {
                    if !self.access.exists(d, &grantee) {
                        return Err(Error::invalid(format!("no user '{grantee}'")));
                    }
                    if !d.databases.contains_key(&database) {
                        return Err(Error::UnknownDatabase { database });
                    }
                    let granted = d.grants.entry(grantee.clone()).or_default();
                    let now = granted.entry(database.clone()).or_default();
                    match revoke {
                        false => {
                            now.select |= rights.select;
                            now.insert |= rights.insert;
                        }
                        true => {
                            now.select &= !rights.select;
                            now.insert &= !rights.insert;
                        }
                    }
                    if *now == Rights::default() {
                        granted.remove(&database);
                    }
                    if granted.is_empty() {
                        d.grants.remove(&grantee);
                    }
                    Ok(())
                })?;
                Ok(no_rows())
            }
            Statement::ShowGrants { user: whose } => {
                let cat = catalog.snapshot();
                let whose = whose.or(user.map(str::to_string));
                let mut rows: Vec<(String, String, String)> = Vec::new();
                let admins = |u: &str| self.access.is_admin(&cat, Some(u));
                match &whose {
                    Some(u) if admins(u) => rows.push((u.clone(), "*".into(), "ADMIN".into())),
                    Some(u) => {
                        for (db, r) in cat.grants.get(u).into_iter().flatten() {
                            rows.push((u.clone(), db.clone(), r.names().into()));
                        }
                    }
                    // No users: the anonymous caller may do everything.
                    None => rows.push(("anonymous".into(), "*".into(), "ADMIN".into())),
                }
                table_output(vec![
                    (
                        "user_name",
                        strings(rows.iter().map(|r| r.0.clone()).collect()),
                    ),
                    (
                        "database_name",
                        strings(rows.iter().map(|r| r.1.clone()).collect()),
                    ),
                    (
                        "privileges",
                        strings(rows.iter().map(|r| r.2.clone()).collect()),
                    ),
                ])
            }
            _ => Err(Error::sql("internal: not a statement about users")),
        }
    }

    /// Users from `[[user]]` are changed in the configuration, not with SQL.
    fn not_configured(&self, name: &str) -> Result<()> {
        match self.access.configured(name) {
            true => Err(Error::invalid(format!(
                "user '{name}' is configured in [[user]]: change it in the configuration file"
            ))),
            false => Ok(()),
        }
    }
}

//! Executing Sluice's own statements (DDL, SHOW, DESCRIBE, FLUSH).

use crate::Engine;
use crate::error::{Error, Result};
use crate::ports::QueryOutput;
use crate::query::ddl::{CreateTable, Statement, TableRef};
use crate::store::catalog::{Catalog, ColumnDef, DEFAULT_DATABASE, SYSTEM_DATABASE, TableDef};
use crate::store::state::TableState;
use datafusion::arrow::array::{ArrayRef, BooleanArray, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) fn table_output(cols: Vec<(&str, ArrayRef)>) -> Result<QueryOutput> {
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|(_, a)| a).collect())?;
    Ok(QueryOutput::from_batches(schema, vec![batch]))
}

pub(super) fn strings(v: Vec<String>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

/// An argon2id hash of `password` (slow by design, so off the async threads).
pub(super) async fn hash_password(password: String) -> Result<String> {
    tokio::task::spawn_blocking(move || {
        use argon2::PasswordHasher;
        argon2::Argon2::default()
            .hash_password(password.as_bytes())
            .map(|h| h.to_string())
            .map_err(|e| Error::invalid(format!("hashing the password: {e}")))
    })
    .await
    .map_err(|e| Error::invalid(format!("hashing the password: {e}")))?
}

impl Statement {
    /// The command a PostgreSQL client is told ran (its `CommandComplete` tag).
    pub(crate) fn command(&self) -> &'static str {
        match self {
            Statement::CreateDatabase { .. } => "CREATE DATABASE",
            Statement::DropDatabase { .. } => "DROP DATABASE",
            Statement::CreateTable(_) => "CREATE TABLE",
            Statement::DropTable { .. } => "DROP TABLE",
            Statement::AddColumn { .. } | Statement::SetOptions { .. } => "ALTER TABLE",
            Statement::CreateUser { .. } => "CREATE ROLE",
            Statement::AlterUser { .. } => "ALTER ROLE",
            Statement::DropUser { .. } => "DROP ROLE",
            Statement::Grant { revoke: false, .. } => "GRANT",
            Statement::Grant { revoke: true, .. } => "REVOKE",
            Statement::Insert { .. } => "INSERT",
            Statement::CreateAlert { .. } => "CREATE ALERT",
            Statement::DropAlert { .. } => "DROP ALERT",
            Statement::Flush(_) => "FLUSH",
            Statement::CreateRollup(_) => "CREATE ROLLUP",
            Statement::DropRollup { .. } => "DROP ROLLUP",
            _ => "SELECT",
        }
    }

    /// Whether it only reads and answers with rows: `SHOW ...` and `DESCRIBE`.
    pub(crate) fn is_show(&self) -> bool {
        matches!(
            self,
            Statement::ShowGrants { .. }
                | Statement::ShowUsers
                | Statement::ShowDatabases
                | Statement::ShowTables { .. }
                | Statement::Describe(_)
                | Statement::ShowCreateTable(_)
        )
    }
}

pub(super) fn no_rows() -> QueryOutput {
    QueryOutput::from_batches(Arc::new(Schema::empty()), Vec::new())
}

/// Columns a table may have (WAL records count columns in 16 bits).
const MAX_COLUMNS: usize = 4096;

pub(crate) fn valid_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {what} name '{name}': use letters, digits and '_', not starting with a digit"
        )))
    }
}

impl Engine {
    /// Runs one of Sluice's own statements as `user` (`None`: the server, or anyone on a
    /// server without users), once [`Engine::check_statement`] allows it.
    pub(crate) async fn run_statement(
        &self,
        stmt: Statement,
        user: Option<&str>,
    ) -> Result<QueryOutput> {
        self.check_statement(&stmt, user)?;
        let catalog = &self.store.catalog;
        match stmt {
            Statement::Query => Err(Error::sql("internal: query routed as a statement")),
            Statement::CreateDatabase {
                name,
                if_not_exists,
            } => {
                valid_name("database", &name)?;
                if name == SYSTEM_DATABASE {
                    return Err(Error::invalid("'system' is reserved"));
                }
                catalog.change(|d| {
                    if d.databases.contains_key(&name) {
                        return if if_not_exists {
                            Ok(())
                        } else {
                            Err(Error::AlreadyExists {
                                what: "database",
                                name: name.clone(),
                            })
                        };
                    }
                    d.databases.insert(name.clone(), BTreeMap::new());
                    Ok(())
                })?;
                Ok(no_rows())
            }
            Statement::DropDatabase { name, if_exists } => {
                if name == DEFAULT_DATABASE {
                    return Err(Error::invalid("the default database cannot be dropped"));
                }
                catalog.change(|d| match d.databases.get(&name) {
                    None if if_exists => Ok(()),
                    None => Err(Error::UnknownDatabase {
                        database: name.clone(),
                    }),
                    Some(t) if !t.is_empty() => Err(Error::invalid(format!(
                        "database '{name}' still has {} tables; drop them first",
                        t.len()
                    ))),
                    Some(_) => {
                        d.databases.remove(&name);
                        // A database made later with this name starts with no grants.
                        for granted in d.grants.values_mut() {
                            granted.remove(&name);
                        }
                        d.grants.retain(|_, granted| !granted.is_empty());
                        Ok(())
                    }
                })?;
                Ok(no_rows())
            }
            Statement::CreateTable(ct) => {
                self.create_table(ct, true)?;
                Ok(no_rows())
            }
            Statement::DropTable { name, if_exists } => {
                self.drop_table(&name, if_exists).await?;
                Ok(no_rows())
            }
            Statement::CreateRollup(spec) => {
                self.create_rollup(*spec).await?;
                Ok(no_rows())
            }
            Statement::DropRollup { name, if_exists } => {
                self.drop_rollup(&name, if_exists).await?;
                Ok(no_rows())
            }
            Statement::AddColumn {
                name,
                column,
                if_not_exists,
            } => {
                self.add_columns(&name, std::slice::from_ref(&column), if_not_exists)?;
                Ok(no_rows())
            }
            Statement::SetOptions {
                name,
                ttl_secs,
                options,
            } => {
                self.change_table(&name, |next| {
                    for (k, v) in &options {
                        if v.is_empty() {
                            next.options.remove(k);
                        } else {
                            next.options.insert(k.clone(), v.clone());
                        }
                    }
                    if ttl_secs.is_some() {
                        next.ttl_secs = ttl_secs;
                    }
                    crate::ingest::decode::validate_options(next)
                })?;
                Ok(no_rows())
            }
            Statement::CreateUser { .. }
            | Statement::AlterUser { .. }
            | Statement::DropUser { .. }
            | Statement::ShowUsers
            | Statement::Grant { .. }
            | Statement::ShowGrants { .. } => self.run_user_statement(stmt, user).await,
            Statement::CreateAlert {
                mut def,
                if_not_exists,
            } => {
                def.owner = user.map(str::to_string);
                self.create_alert(def, if_not_exists).await?;
                Ok(no_rows())
            }
            Statement::DropAlert { name, if_exists } => {
                self.drop_alert(&name, if_exists, user)?;
                Ok(no_rows())
            }
            Statement::ShowDatabases => {
                // A plain user sees the databases it has a right on.
                let cat = catalog.snapshot();
                let mut names: Vec<String> = (cat.databases.keys())
                    .filter(|db| self.may_see(&cat, user, db))
                    .cloned()
                    .collect();
                names.push(SYSTEM_DATABASE.into());
                table_output(vec![("database_name", strings(names))])
            }
            Statement::ShowTables { database } => {
                let cat = catalog.snapshot();
                if let Some(db) = database
                    .as_ref()
                    .filter(|db| !cat.databases.contains_key(*db))
                {
                    return Err(Error::UnknownDatabase {
                        database: db.clone(),
                    });
                }
                let defs: Vec<&Arc<TableDef>> = cat
                    .tables()
                    .filter(|t| database.as_ref().is_none_or(|d| &t.database == d))
                    .filter(|t| self.may_see(&cat, user, &t.database))
                    .collect();
                table_output(vec![
                    (
                        "database_name",
                        strings(defs.iter().map(|t| t.database.clone()).collect()),
                    ),
                    (
                        "table_name",
                        strings(defs.iter().map(|t| t.name.clone()).collect()),
                    ),
                ])
            }
            Statement::Describe(name) => {
                let mut def = self.table(&name.database, &name.table)?;
                if let Some(r) = self.store.catalog.snapshot().rollups.get(&def.id) {
                    // What its queries answer with, not its partial rows.
                    let columns = r.answer_columns(&def);
                    def = Arc::new(TableDef {
                        columns,
                        ..(*def).clone()
                    });
                }
                let pc = def.partition_column;
                table_output(vec![
                    (
                        "column_name",
                        strings(def.columns.iter().map(|c| c.name.clone()).collect()),
                    ),
                    (
                        "data_type",
                        strings(
                            def.columns
                                .iter()
                                .map(|c| c.ty.name().to_string())
                                .collect(),
                        ),
                    ),
                    (
                        "nullable",
                        Arc::new(BooleanArray::from(
                            def.columns.iter().map(|c| c.nullable).collect::<Vec<_>>(),
                        )),
                    ),
                    (
                        "partition_key",
                        strings(
                            (0..def.columns.len())
                                .map(|i| {
                                    if i == pc {
                                        def.partition.sql(&def.columns[i].name)
                                    } else {
                                        String::new()
                                    }
                                })
                                .collect(),
                        ),
                    ),
                ])
            }
            Statement::ShowCreateTable(name) => {
                let def = self.table(&name.database, &name.table)?;
                let sql = match self.store.catalog.snapshot().rollups.get(&def.id) {
                    Some(r) => r.create_sql(&def),
                    None => def.create_sql(),
                };
                table_output(vec![("statement", strings(vec![sql]))])
            }
            Statement::Insert {
                name,
                columns,
                rows,
            } => {
                let def = self.table(&name.database, &name.table)?;
                let rows = crate::ingest::decode::decode_values(
                    &def,
                    columns.as_deref(),
                    &rows,
                    crate::now_micros(),
                )?;
                let receipt = self.append_rows(&def, rows).await?;
                table_output(vec![(
                    "rows",
                    Arc::new(UInt64Array::from(vec![receipt.rows as u64])) as ArrayRef,
                )])
            }
            Statement::Flush(name) => {
                let def = self.table(&name.database, &name.table)?;
                let files = match (self.clustered(), self.log.get()) {
                    // Each shard's leader writes its rows (`WriteLog::flush_table`).
                    (true, Some(log)) => log.flush_table(def.id).await? as usize,
                    (true, None) => return Err(Error::invalid("the cluster has not started")),
                    (false, _) => match self.store.tables.get(def.id) {
                        Some(t) => self.flush_table(&t).await?,
                        None => 0,
                    },
                };
                table_output(vec![(
                    "files_written",
                    Arc::new(UInt64Array::from(vec![files as u64])) as ArrayRef,
                )])
            }
        }
    }

    /// Adds `columns` (made nullable: stored rows have no value for them) to a table in one
    /// catalog change. With `if_not_exists`, columns already there are skipped.
    pub(crate) fn add_columns(
        &self,
        name: &TableRef,
        columns: &[ColumnDef],
        if_not_exists: bool,
    ) -> Result<()> {
        for c in columns {
            valid_name("column", &c.name)?;
        }
        if self.is_rollup(name) {
            return Err(Error::invalid(format!(
                "'{}' is a rollup: its columns come from its query",
                name.table
            )));
        }
        self.change_table(name, |next| {
            for column in columns {
                if next.column_index(&column.name).is_some() {
                    if if_not_exists {
                        continue;
                    }
                    return Err(Error::AlreadyExists {
                        what: "column",
                        name: column.name.clone(),
                    });
                }
                if next.columns.len() >= MAX_COLUMNS {
                    return Err(Error::invalid(format!(
                        "a table has at most {MAX_COLUMNS} columns"
                    )));
                }
                next.columns.push(ColumnDef {
                    nullable: true,
                    ..column.clone()
                });
            }
            Ok(())
        })
    }

    /// Whether `name` is a rollup.
    pub(crate) fn is_rollup(&self, name: &TableRef) -> bool {
        let cat = self.store.catalog.snapshot();
        (cat.table(&name.database, &name.table)).is_ok_and(|d| cat.rollups.contains_key(&d.id))
    }

    /// Changes a table's definition in one catalog change; when `change` fails the catalog
    /// stays as it was.
    fn change_table(
        &self,
        name: &TableRef,
        change: impl FnOnce(&mut TableDef) -> Result<()>,
    ) -> Result<()> {
        self.store.catalog.change(|d| {
            let cur = d.table(&name.database, &name.table)?.clone();
            let mut next = (*cur).clone();
            change(&mut next)?;
            if next == *cur {
                return Ok(());
            }
            let next = Arc::new(next);
            // Widen the live state before the new definition is published (the
            // catalog's write lock is held here), so no row decoded against it can
            // meet a narrower buffer, and ALTERs apply in order.
            if let Some(t) = self.store.tables.get(next.id) {
                t.alter(next.clone());
            }
            d.databases
                .get_mut(&name.database)
                .expect("checked")
                .insert(name.table.clone(), next);
            Ok(())
        })
    }

    /// Creates a table. `create_database`: a missing database comes into being with it (as
    /// for `CREATE TABLE`), else it is an error.
    pub(crate) fn create_table(&self, ct: CreateTable, create_database: bool) -> Result<()> {
        valid_name("table", &ct.name.table)?;
        if ct.columns.len() > MAX_COLUMNS {
            return Err(Error::invalid(format!(
                "a table has at most {MAX_COLUMNS} columns"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &ct.columns {
            valid_name("column", &c.name)?;
            if !seen.insert(c.name.to_ascii_lowercase()) {
                return Err(Error::invalid(format!(
                    "column '{}' is defined twice",
                    c.name
                )));
            }
        }
        let pc = ct
            .columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(&ct.partition_column))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "PARTITION BY names unknown column '{}'",
                    ct.partition_column
                ))
            })?;
        let pty = ct.columns[pc].ty;
        if !ct.partition.accepts(pty) {
            return Err(Error::invalid(format!(
                "partition function {} cannot read column '{}' of type {}",
                ct.partition.sql(&ct.columns[pc].name),
                ct.columns[pc].name,
                pty.name()
            )));
        }
        valid_name("database", &ct.name.database)?;
        if ct.name.database == SYSTEM_DATABASE {
            return Err(Error::invalid("'system' is reserved"));
        }
        let mut allocated = None;
        let created = self.store.catalog.change(|d| {
            // JoinBase scripts create `db.t` without a CREATE DATABASE first: the database
            // comes into being with its first table.
            if !create_database && !d.databases.contains_key(&ct.name.database) {
                return Err(Error::UnknownDatabase {
                    database: ct.name.database.clone(),
                });
            }
            let db = d.databases.entry(ct.name.database.clone()).or_default();
            if db.contains_key(&ct.name.table) {
                return if ct.if_not_exists {
                    Ok(None)
                } else {
                    Err(Error::AlreadyExists {
                        what: "table",
                        name: format!("{}.{}", ct.name.database, ct.name.table),
                    })
                };
            }
            let def = Arc::new(TableDef {
                id: *allocated.insert(Catalog::allocate_id(d)),
                database: ct.name.database.clone(),
                name: ct.name.table.clone(),
                columns: ct.columns.clone(),
                partition: ct.partition,
                partition_column: pc,
                ttl_secs: ct.ttl_secs,
                options: ct.options.clone(),
            });
            crate::ingest::decode::validate_options(&def)?;
            // The live state exists before the definition is published, so no write can
            // resolve the table and then find nothing to apply to.
            self.store
                .tables
                .by_id
                .write()
                .insert(def.id, Arc::new(TableState::new(def.clone())));
            d.databases
                .get_mut(&ct.name.database)
                .expect("checked")
                .insert(ct.name.table.clone(), def.clone());
            Ok(Some(def))
        });
        if created.is_err() {
            // A failed catalog write leaves no live state for the id it allocated.
            if let Some(id) = allocated {
                self.store.tables.by_id.write().remove(&id);
            }
        }
        created.map(|_| ())
    }

    pub(crate) async fn drop_table(&self, name: &TableRef, if_exists: bool) -> Result<()> {
        // In a cluster the catalog change waits for the metadata group, whose apply takes
        // the manifest lock to install files: not held across it there. The dropped table's
        // files this node knows go to the graveyard (deleted once queries on any node are
        // done with them); any the table gained meanwhile, the metadata group's leader
        // deletes as orphans (`Engine::collect_shared_orphans`).
        let m = match self.clustered() {
            true => None,
            false => Some(self.manifest.lock().await),
        };
        let removed = self.store.catalog.change(|d| {
            if !d.databases.contains_key(&name.database) {
                return if if_exists {
                    Ok(None)
                } else {
                    Err(Error::UnknownDatabase {
                        database: name.database.clone(),
                    })
                };
            }
            if let Ok(def) = d.table(&name.database, &name.table)
                && let Some((id, _)) = d.rollups_of(def.id).first()
            {
                let rollup = d.tables().find(|t| t.id == *id);
                return Err(Error::invalid(format!(
                    "table '{}' has rollup '{}': drop it first (DROP ROLLUP)",
                    name.table,
                    rollup.map_or("?", |t| t.name.as_str())
                )));
            }
            let db = d.databases.get_mut(&name.database).expect("checked");
            match db.remove(&name.table) {
                Some(def) => {
                    d.rollups.remove(&def.id);
                    Ok(Some(def))
                }
                None if if_exists => Ok(None),
                None => Err(Error::UnknownTable {
                    database: name.database.clone(),
                    table: name.table.clone(),
                }),
            }
        })?;
        let Some(def) = removed else {
            return Ok(());
        };
        self.store.tables.remove(def.id);
        let Some(mut m) = m else {
            let m = self.manifest.lock().await;
            let files = (m.tables.get(&def.id).into_iter())
                .flat_map(|parts| parts.values())
                .flat_map(|p| p.files.iter().map(|f| f.path.clone()))
                .collect();
            self.retire(files);
            return Ok(());
        };
        if let Some(parts) = m.tables.get(&def.id) {
            let files: Vec<String> = parts
                .values()
                .flat_map(|p| p.files.iter().map(|f| f.path.clone()))
                .collect();
            self.change_manifest(&mut m, |next| {
                next.tables.remove(&def.id);
            })
            .await?;
            self.retire(files);
        }
        drop(m);
        self.truncate_wal()
    }
}

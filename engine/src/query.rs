//! SQL over the store, through DataFusion. [`dialect`] parses Sluice's statements and the
//! `WHERE PARTS` clause ([`parts`]), [`ddl`] their grammar, and [`statements`] runs them;
//! [`planner`] keeps a session per database and caches planned queries and results;
//! [`provider`] exposes databases as schemas and tables as providers that union Parquet files
//! with buffers, pruning partitions; [`system`] serves `system.*`; [`optimizer`] answers
//! aggregates from [`synopsis`] and [`groups`] synopses without reading rows; [`functions`]
//! adds JoinBase's SQL functions; [`pg_catalog`] answers PostgreSQL clients' catalog queries.

pub(crate) mod ddl;
pub(crate) mod dialect;
pub(crate) mod functions;
pub(crate) mod gapfill;
pub(crate) mod groups;
pub(crate) mod kept;
pub(crate) mod keyed_sort;
pub(crate) mod latest;
pub(crate) mod log;
pub(crate) mod made_once;
pub(crate) mod optimizer;
pub(crate) mod parts;
pub(crate) mod pg_catalog;
pub(crate) mod planner;
pub(crate) mod provider;
pub(crate) mod rollup;
pub(crate) mod split;
pub(crate) mod statements;
pub(crate) mod summaries;
pub(crate) mod synopsis;
pub(crate) mod system;
pub(crate) mod users;

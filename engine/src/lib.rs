//! The Sluice storage engine: everything below the protocols.
//!
//! Data flows: a client's payload is decoded against its table ([`decode`]) into rows; the
//! rows become one [`wal::record::WriteRecord`], appended to the write-ahead log ([`wal`]) with
//! group commit; once durable, the apply step ([`state`]) puts them into per-partition Arrow
//! buffers ([`buffer`]), where SQL sees them; only then is the write acknowledged. In the
//! background ([`engine`]'s maintenance) buffers become sorted Parquet files on an object store
//! ([`storage`]), a new manifest names them, and the log is truncated behind them.
//!
//! Queries go through DataFusion: [`provider`] exposes databases as schemas and tables as
//! providers that union Parquet files with buffers, pruning partitions by the partition key;
//! [`system`] serves `system.*`; [`ddl`] parses Sluice's own statements.
//!
//! Start reading at [`api::Database`] (what HTTP and MQTT call) and [`Engine`] (how it is done).
//! The MQTT broker turns a message into rows with [`Engine::table_for_json`] (tables made or
//! widened from JSON) and [`Engine::write_message`] ([`decode::decode_message`] with the
//! columns its topic fixes, then one durable append).

pub mod alerts;
pub mod api;
pub mod buffer;
pub mod catalog;
pub mod chunk;
pub mod ddl;
pub mod dead_letter;
pub mod decode;
pub mod dialect;
pub mod engine;
pub mod error;
pub mod files;
pub mod functions;
pub mod groups;
pub mod hex;
pub mod hot;
pub mod optimizer;
pub mod origin;
pub mod partition;
pub mod parts;
pub mod provider;
pub mod state;
pub mod storage;
pub mod synopsis;
pub mod system;
pub mod types;
pub mod wal;

pub use alerts::{AlertDef, AlertSink, AlertStatus, Condition};
pub use api::{
    Database, DeadLetter, Health, Publication, QueryOptions, QueryOutput, SystemRows, WriteReceipt,
};
pub use decode::Format;
pub use engine::{
    Engine, FileChange, MergedFiles, Replicator, ShardFile, encode_record, now_micros,
};
pub use error::{Error, Result};
pub use origin::Origin;

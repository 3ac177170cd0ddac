//! Sparkplug B (Eclipse Tahu): edge nodes publish `spBv1.0/{group}/{NBIRTH|NDATA|NDEATH|
//! DBIRTH|DDATA|DDEATH}/{edge node}[/{device}]` with protobuf payloads ([`payload`]). The
//! broker hands such a message over with its group as the table and its edge node, device
//! and message type as fixed columns; here it becomes rows of the group's long table
//! ([`COLUMNS`]: one row per metric, the value in the column of its type) in the Sparkplug
//! database, made on the first message.
//!
//! A group id that is not a table name (`Plant-1`) is stored under one: each character other
//! than letters, digits and `_` becomes `_` (`Plant_1`).
//!
//! BIRTH messages announce each metric's name, alias and type; DATA messages usually carry
//! only aliases. The announcements are kept per edge node and device in memory and are
//! durable as the BIRTH rows themselves (all rows of one BIRTH carry its payload's time):
//! after a restart, the first DATA message of a node or device reads its latest BIRTH rows
//! back from the table (a device's only if not older than its node's latest NBIRTH). A DATA
//! metric whose alias no BIRTH announced refuses the message ([`Error::NoBirth`]: a dead
//! letter naming the alias; the broker then asks the edge node for a rebirth). DEATH messages
//! mark the node (and its devices) or the device offline in `system.sparkplug_nodes`.

pub mod payload;
mod wide;

use crate::Engine;
use crate::error::{Error, Result};
use crate::log::wal::Journal;
use crate::ports::{IngestPort, Publication, QueryOptions, WriteReceipt};
use crate::types::{ColumnType, Value};
use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use futures::StreamExt;
use parking_lot::Mutex;
use payload::{Metric, Payload, Value as V, datatype_name};
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The columns of a group's table, in order.
pub const COLUMNS: [(&str, ColumnType); 14] = [
    ("time", ColumnType::Timestamp),
    ("edge_node", ColumnType::String),
    ("device", ColumnType::String),
    ("message", ColumnType::String),
    ("metric", ColumnType::String),
    ("alias", ColumnType::Int64),
    ("datatype", ColumnType::String),
    ("int_value", ColumnType::Int64),
    ("double_value", ColumnType::Float64),
    ("bool_value", ColumnType::Bool),
    ("text_value", ColumnType::String),
    ("bytes_value", ColumnType::Binary),
    ("seq", ColumnType::Int64),
    ("historical", ColumnType::Bool),
];

/// How often an edge node is asked for a rebirth at most.
const REBIRTH_EVERY: Duration = Duration::from_secs(10);

/// Whose announcements: (database, group, edge node, device; `None` for the node itself).
type Key = (String, String, String, Option<String>);

/// What one BIRTH announced: alias -> (name, datatype), and name -> datatype.
#[derive(Debug, Default, Clone)]
struct Birth {
    aliases: HashMap<u64, (String, u32)>,
    types: HashMap<String, u32>,
}

/// The state of an edge node or device, for `system.sparkplug_nodes`.
#[derive(Debug, Default, Clone)]
struct Node {
    online: bool,
    birth: Option<i64>,
    death: Option<i64>,
    last: i64,
    seq: Option<i64>,
    metrics: usize,
}

/// Sparkplug state: what the BIRTH messages announced, and who is online.
#[derive(Debug, Default)]
pub(crate) struct Sparkplug {
    /// Per node or device: its latest BIRTH (empty when none was found).
    births: Mutex<HashMap<Key, Birth>>,
    /// Per node (device `None`): the time (µs) of its latest NBIRTH.
    node_births: Mutex<HashMap<Key, i64>>,
    nodes: Mutex<BTreeMap<Key, Node>>,
    asked: Mutex<HashMap<(String, String), Instant>>,
}

/// The topic of a Sparkplug B message: (group, message type, edge node, device).
pub fn parse_topic(topic: &str) -> Option<(&str, &str, &str, Option<&str>)> {
    let mut parts = topic.strip_prefix("spBv1.0/")?.split('/');
    let group = parts.next()?;
    let kind = parts.next()?;
    let edge = parts.next()?;
    let device = parts.next();
    if parts.next().is_some() || group.is_empty() || edge.is_empty() {
        return None;
    }
    Some((group, kind, edge, device))
}

/// The table name of a group id: letters, digits and `_` kept, anything else `_`, and a `_`
/// before a leading digit.
pub fn table_name(group: &str) -> String {
    let mut name: String = (group.chars())
        .map(|c| {
            if c.is_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name.truncate(128);
    name
}

/// One metric's value in the long table's columns: int, double, bool, text, bytes.
fn value_columns(m: &Metric, datatype: u32) -> [Value; 5] {
    let mut out = [
        Value::Null,
        Value::Null,
        Value::Null,
        Value::Null,
        Value::Null,
    ];
    if m.is_null == Some(true) {
        return out;
    }
    match &m.value {
        Some(V::Int(v)) => {
            out[0] = Value::Int(match datatype {
                1 => *v as u8 as i8 as i64,
                2 => *v as u16 as i16 as i64,
                3 => *v as i32 as i64,
                _ => *v as i64,
            })
        }
        Some(V::Long(v)) => match i64::try_from(*v) {
            Ok(n) => out[0] = Value::Int(n),
            // Int64 is two's complement; a UInt64 past i64 goes to the double column.
            Err(_) if datatype == 8 => out[1] = Value::Float(*v as f64),
            Err(_) => out[0] = Value::Int(*v as i64),
        },
        Some(V::Float(v)) => out[1] = Value::Float(*v as f64),
        Some(V::Double(v)) => out[1] = Value::Float(*v),
        Some(V::Boolean(v)) => out[2] = Value::Bool(*v),
        Some(V::String(v)) => out[3] = Value::Str(v.clone()),
        Some(V::Bytes(v)) => out[4] = Value::Bytes(v.clone()),
        None => {}
    }
    out
}

impl Sparkplug {
    /// Remembers what a BIRTH announced; a node's BIRTH forgets its devices' (they are born
    /// again after it).
    fn born(&self, key: &Key, metrics: &[Metric], node: bool, time: i64) {
        let mut births = self.births.lock();
        if node {
            births.retain(|k, _| !(k.0 == key.0 && k.1 == key.1 && k.2 == key.2));
            self.node_births.lock().insert(key.clone(), time);
        }
        let mut birth = Birth::default();
        for m in metrics {
            let (Some(name), Some(ty)) = (&m.name, m.datatype) else {
                continue;
            };
            birth.types.insert(name.clone(), ty);
            if let Some(alias) = m.alias {
                birth.aliases.insert(alias, (name.clone(), ty));
            }
        }
        births.insert(key.clone(), birth);
    }

    /// Each metric's (name, datatype), or the first alias no BIRTH announced.
    fn resolve(
        &self,
        key: &Key,
        metrics: &[Metric],
    ) -> std::result::Result<Vec<(String, u32)>, u64> {
        let births = self.births.lock();
        let birth = births.get(key);
        metrics
            .iter()
            .map(|m| {
                let announced = m.alias.and_then(|a| birth?.aliases.get(&a));
                match (&m.name, announced) {
                    (Some(name), _) => {
                        let known = birth.and_then(|b| b.types.get(name)).copied();
                        Ok((name.clone(), m.datatype.or(known).unwrap_or(0)))
                    }
                    (None, Some((name, ty))) => Ok((name.clone(), m.datatype.unwrap_or(*ty))),
                    (None, None) => Err(m.alias.unwrap_or(0)),
                }
            })
            .collect()
    }

    /// Whether to ask `edge` for a rebirth now (not more often than [`REBIRTH_EVERY`]).
    pub(crate) fn ask_rebirth(&self, group: &str, edge: &str) -> bool {
        let mut asked = self.asked.lock();
        let now = Instant::now();
        let key = (group.to_string(), edge.to_string());
        match asked.get(&key) {
            Some(at) if now.duration_since(*at) < REBIRTH_EVERY => false,
            _ => {
                asked.insert(key, now);
                true
            }
        }
    }

    /// Notes a stored message of `kind` at `time` (µs) in the node view.
    fn seen(&self, key: &Key, kind: &str, time: i64, seq: Option<u64>, metrics: usize) {
        let mut nodes = self.nodes.lock();
        let node = nodes.entry(key.clone()).or_default();
        node.last = node.last.max(time);
        node.seq = seq.map(|s| s as i64).or(node.seq);
        if kind.ends_with("BIRTH") {
            (node.online, node.birth, node.metrics) = (true, Some(time), metrics);
        } else if kind.ends_with("DEATH") {
            (node.online, node.death) = (false, Some(time));
            if kind == "NDEATH" {
                for (k, n) in nodes.iter_mut() {
                    if k.0 == key.0 && k.1 == key.1 && k.2 == key.2 && k.3.is_some() {
                        (n.online, n.death) = (false, Some(time));
                    }
                }
            }
        } else {
            node.online = true;
        }
    }

    /// The rows of `system.sparkplug_nodes`.
    pub(crate) fn system_table(&self) -> RecordBatch {
        let nodes = self.nodes.lock();
        let text = |f: &dyn Fn(&Key) -> Option<String>| -> ArrayRef {
            Arc::new(nodes.keys().map(f).collect::<StringArray>())
        };
        let time = |f: &dyn Fn(&Node) -> Option<i64>| -> ArrayRef {
            Arc::new(nodes.values().map(f).collect::<TimestampMicrosecondArray>())
        };
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        let schema = Schema::new(vec![
            Field::new("database", DataType::Utf8, false),
            Field::new("group_id", DataType::Utf8, false),
            Field::new("edge_node", DataType::Utf8, false),
            Field::new("device", DataType::Utf8, true),
            Field::new("online", DataType::Boolean, false),
            Field::new("birth_time", ts.clone(), true),
            Field::new("death_time", ts.clone(), true),
            Field::new("last_seen", ts, true),
            Field::new("seq", DataType::Int64, true),
            Field::new("metrics", DataType::Int64, false),
        ]);
        let columns: Vec<ArrayRef> = vec![
            text(&|k| Some(k.0.clone())),
            text(&|k| Some(k.1.clone())),
            text(&|k| Some(k.2.clone())),
            text(&|k| k.3.clone()),
            Arc::new(
                nodes
                    .values()
                    .map(|n| Some(n.online))
                    .collect::<BooleanArray>(),
            ),
            time(&|n| n.birth),
            time(&|n| n.death),
            time(&|n| Some(n.last)),
            Arc::new(nodes.values().map(|n| n.seq).collect::<Int64Array>()),
            Arc::new((nodes.values().map(|n| Some(n.metrics as i64))).collect::<Int64Array>()),
        ];
        RecordBatch::try_new(Arc::new(schema), columns).expect("columns match the schema")
    }
}

impl Engine {
    /// Stores a Sparkplug B message (see the module's text). `p.table` is its group, and
    /// `p.fixed` holds its `edge_node`, `device` (absent for the node's own) and `message`.
    pub(crate) async fn publish_sparkplug(
        &self,
        p: Publication<'_>,
        journal: Option<Journal>,
    ) -> Result<Option<WriteReceipt>> {
        let fixed = |name: &str| p.fixed.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let (Some(edge), Some(kind)) = (fixed("edge_node"), fixed("message")) else {
            return Err(Error::invalid(
                "a Sparkplug message needs its edge node and type",
            ));
        };
        crate::query::statements::valid_name("database", p.database)?;
        let key: Key = (
            p.database.to_string(),
            table_name(p.table),
            edge.clone(),
            fixed("device").cloned(),
        );
        let payload = Payload::decode(p.payload).map_err(|e| Error::BadPayload {
            line: 1,
            reason: format!("not a Sparkplug B payload: {e}"),
        })?;
        let now = crate::engine::now_micros();
        let at = |ms: Option<u64>| match ms {
            None => Ok(now),
            Some(ms) => (ms as i64).checked_mul(1000).ok_or(Error::BadPayload {
                line: 1,
                reason: format!("timestamp {ms} ms is out of range"),
            }),
        };
        let birth = kind.ends_with("BIRTH");
        // The long rows' table: the group's, or in the wide layout its BIRTHs' only.
        let wide = self.config.mqtt.sparkplug_layout == sluice_conf::SparkplugLayout::Wide;
        let long = match wide {
            true => format!("{}_births", key.1),
            false => key.1.clone(),
        };
        if birth {
            let time = at(payload.timestamp)?;
            self.sparkplug
                .born(&key, &payload.metrics, kind == "NBIRTH", time);
        } else if !self.sparkplug.births.lock().contains_key(&key) {
            self.load_birth(&key, &long).await?;
        }
        let resolved =
            (self.sparkplug.resolve(&key, &payload.metrics)).map_err(|alias| Error::NoBirth {
                node: match &key.3 {
                    Some(d) => format!("edge node {} device {d}", key.2),
                    None => format!("edge node {}", key.2),
                },
                alias,
            })?;
        let def = match !wide || birth {
            true => Some(self.sparkplug_table(p.database, &long).await?),
            false => None,
        };
        let seq = payload
            .seq
            .map(|s| Value::Int(s as i64))
            .unwrap_or(Value::Null);
        let text = |v: &Option<String>| v.clone().map_or(Value::Null, Value::Str);
        let rows: Vec<Vec<Value>> = (payload.metrics.iter().zip(&resolved))
            .filter(|_| def.is_some())
            .map(|(m, (name, ty))| {
                let (name, ty) = (name.clone(), *ty);
                let def = def.as_ref().expect("filtered");
                let [int, double, boolean, string, bytes] = value_columns(m, ty);
                // A BIRTH's rows carry its time (its latest rows are its announcement).
                let time = match birth {
                    true => at(payload.timestamp.or(m.timestamp))?,
                    false => at(m.timestamp.or(payload.timestamp))?,
                };
                let named = [
                    Value::Timestamp(time),
                    Value::Str(edge.clone()),
                    text(&key.3),
                    Value::Str(kind.clone()),
                    Value::Str(name),
                    m.alias.map_or(Value::Null, |a| Value::Int(a as i64)),
                    Value::Str(datatype_name(ty).to_string()),
                    int,
                    double,
                    boolean,
                    string,
                    bytes,
                    seq.clone(),
                    Value::Bool(m.is_historical == Some(true)),
                ];
                let mut row = vec![Value::Null; def.columns.len()];
                for ((column, _), v) in COLUMNS.iter().zip(named) {
                    if let Some(i) = def.column_index(column) {
                        row[i] = v;
                    }
                }
                Ok(row)
            })
            .collect::<Result<_>>()?;
        let time = at(payload.timestamp)?;
        let metrics = payload.metrics.len();
        let (def, rows) = match (wide, def) {
            (false, Some(def)) => (def, rows),
            (_, long) => {
                // A BIRTH's long rows first (its announcement), then the message's wide row.
                if let Some(long) = long.filter(|_| !rows.is_empty()) {
                    self.append_journaled(&long, rows, true, None, Vec::new())
                        .await?;
                }
                let own = (time, seq.clone());
                let (def, row) =
                    (self.wide_row(&key, kind, &payload.metrics, &resolved, own)).await?;
                (def, vec![row])
            }
        };
        let receipt = match rows.is_empty() {
            true => WriteReceipt {
                rows: 0,
                lsn: match journal {
                    Some(j) => self.journal(vec![j], true).await?,
                    None => 0,
                },
            },
            false => {
                let journal = journal.into_iter().collect();
                let origin = p.origin.cloned();
                self.append_journaled(&def, rows, true, origin, journal)
                    .await?
            }
        };
        self.sparkplug.seen(&key, kind, time, payload.seq, metrics);
        Ok(Some(receipt))
    }

    /// The group's table, made (with its database) on the first message; one made otherwise
    /// must have Sparkplug's columns.
    async fn sparkplug_table(&self, database: &str, group: &str) -> Result<Arc<crate::TableDef>> {
        let fits = |def: Arc<crate::TableDef>| {
            for (name, ty) in COLUMNS {
                match def.column_index(name).map(|i| def.columns[i].ty) {
                    Some(t) if t == ty => {}
                    _ => {
                        return Err(Error::invalid(format!(
                            "{database}.{group} is not a Sparkplug table: it needs column {name} \\
                             of type {ty:?}"
                        )));
                    }
                }
            }
            Ok(def)
        };
        match self.table_to_write(database, group).await {
            Ok(def) => return fits(def),
            Err(Error::UnknownDatabase { .. }) => {
                let sql = format!("CREATE DATABASE IF NOT EXISTS \"{database}\"");
                crate::QueryPort::execute(self, &sql).await?;
            }
            Err(Error::UnknownTable { .. }) => {}
            Err(e) => return Err(e),
        }
        let columns = COLUMNS.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        fits(self.table_for_columns(database, group, columns).await?)
    }

    /// Reads the latest BIRTH of `key` back from its rows (after a restart, the memory has
    /// none); remembers an empty one when there is none, so that the table is read once.
    async fn load_birth(&self, key: &Key, table: &str) -> Result<()> {
        let (database, group, edge, device) = key;
        let node: Key = (database.clone(), group.clone(), edge.clone(), None);
        let since = match device {
            Some(_) => self.sparkplug.node_births.lock().get(&node).copied(),
            None => None,
        };
        let which = match device {
            Some(_) => "device = $2 AND message = 'DBIRTH'",
            None => "device IS NULL AND message = 'NBIRTH'",
        };
        // Names are table names (letters, digits, _): safe between double quotes.
        let rows = format!(
            "FROM \"{database}\".\"{table}\" WHERE edge_node = $1 AND {which}{}",
            since.map_or(String::new(), |t| format!(
                " AND time >= to_timestamp_micros({t})"
            ))
        );
        let sql = format!(
            "SELECT alias, metric, datatype, time {rows} AND time = (SELECT max(time) {rows})"
        );
        let mut params = vec![ScalarValue::Utf8(Some(edge.clone()))];
        params.extend(device.clone().map(|d| ScalarValue::Utf8(Some(d))));
        let options = QueryOptions {
            params,
            no_result_cache: true,
            ..QueryOptions::default()
        };
        let mut birth = Birth::default();
        let mut born = None;
        match self.query(&sql, &options).await {
            Ok(mut out) => {
                while let Some(batch) = out.stream.next().await {
                    let batch = batch?;
                    let col = |i: usize, ty: &DataType| cast(batch.column(i), ty);
                    let (alias, name) = (col(0, &DataType::Int64)?, col(1, &DataType::Utf8)?);
                    let (ty, time) = (col(2, &DataType::Utf8)?, col(3, &DataType::Int64)?);
                    let alias = alias.as_any().downcast_ref::<Int64Array>().expect("cast");
                    let name = name.as_any().downcast_ref::<StringArray>().expect("cast");
                    let ty = ty.as_any().downcast_ref::<StringArray>().expect("cast");
                    let time = time.as_any().downcast_ref::<Int64Array>().expect("cast");
                    for i in 0..batch.num_rows() {
                        if name.is_null(i) {
                            continue;
                        }
                        let ty = (0..35)
                            .find(|n| !ty.is_null(i) && datatype_name(*n) == ty.value(i))
                            .unwrap_or(0);
                        let name = name.value(i).to_string();
                        birth.types.insert(name.clone(), ty);
                        if !alias.is_null(i) {
                            birth.aliases.insert(alias.value(i) as u64, (name, ty));
                        }
                        born = Some(time.value(i));
                    }
                }
            }
            Err(Error::UnknownTable { .. } | Error::UnknownDatabase { .. }) => {}
            Err(e) => return Err(e),
        }
        if let (None, Some(t)) = (device, born) {
            self.sparkplug.node_births.lock().entry(node).or_insert(t);
        }
        self.sparkplug
            .births
            .lock()
            .entry(key.clone())
            .or_insert(birth);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::payload::{Metric, Value as V};
    use super::{parse_topic, value_columns};
    use crate::types::Value;

    #[test]
    fn topics_and_values() {
        assert_eq!(
            parse_topic("spBv1.0/plant/DDATA/edge1/pump"),
            Some(("plant", "DDATA", "edge1", Some("pump")))
        );
        assert_eq!(
            parse_topic("spBv1.0/plant/NBIRTH/edge1"),
            Some(("plant", "NBIRTH", "edge1", None))
        );
        assert_eq!(parse_topic("spBv1.0/plant"), None);
        assert_eq!(parse_topic("plant/NBIRTH/edge1"), None);
        assert_eq!(super::table_name("Plant-1.a"), "Plant_1_a");
        assert_eq!(super::table_name("7\" OR"), "_7__OR");
        let metric = |value| Metric {
            name: None,
            alias: Some(1),
            timestamp: None,
            datatype: None,
            is_historical: None,
            is_null: None,
            value: Some(value),
        };
        // Int8 -1 travels as 0xFF in a uint32; Int64 -5 as its two's complement.
        assert_eq!(value_columns(&metric(V::Int(0xFF)), 1)[0], Value::Int(-1));
        assert_eq!(value_columns(&metric(V::Int(0xFF)), 5)[0], Value::Int(255));
        assert_eq!(
            value_columns(&metric(V::Long(-5i64 as u64)), 4)[0],
            Value::Int(-5)
        );
        assert_eq!(
            value_columns(&metric(V::Float(1.5)), 9)[1],
            Value::Float(1.5)
        );
        assert_eq!(
            value_columns(&metric(V::Boolean(true)), 11)[2],
            Value::Bool(true)
        );
    }
}

//! What the MQTT broker calls to turn one message into rows: tables made or widened from
//! JSON messages, and writes with columns fixed by the topic.

use crate::error::{Error, Result};
use crate::ingest::decode::{Format, decode_message, infer_json_columns};
use crate::ingest::origin::Origin;
use crate::ports::{LineProtocolWrite, RejectedLine, WriteReceipt};
use crate::query::ddl::{CreateTable, TableRef};
use crate::store::catalog::{ColumnDef, TableDef};
use crate::store::partition::PartitionFn;
use crate::types::ColumnType;
use crate::{Engine, now_micros};
use std::sync::Arc;

/// Field names that make a time column, in order of preference; the first one free names
/// the arrival-time column of a table whose messages carry no time.
const TIME_NAMES: [&str; 3] = ["ts", "time", "timestamp"];

impl Engine {
    /// Decodes one message for `def` ([`decode_message`], `fixed` being the (column index,
    /// text) values the topic sets) and stores its rows as one durable append, with the
    /// bridged message's `origin` if it is one.
    pub async fn write_message(
        &self,
        def: &TableDef,
        format: Format,
        body: &[u8],
        fixed: &[(usize, String)],
        origin: Option<Origin>,
    ) -> Result<WriteReceipt> {
        let rows = decode_message(def, format, body, now_micros(), fixed)?;
        self.append(def, rows, true, origin).await
    }

    /// The table a JSON message is stored in, made to fit it.
    ///
    /// When `database.table` exists, top-level fields it has no column for are added as
    /// nullable columns (the inferred types of [`infer_json_columns`]; a table with
    /// `json_mappings` is left as it is). When it does not, it is created from the inferred
    /// columns, every one nullable: the time column is the first field named `ts`, `time`
    /// or `timestamp` holding an RFC 3339 string or an integer epoch (seconds, ms, µs or ns by
    /// magnitude), typed Timestamp; without one a `ts` Timestamp column is added in front
    /// and filled with each row's arrival time. The table is partitioned by day
    /// (`yyyymmdd`) of its time column. The database must exist. Concurrent calls for the
    /// same new table all succeed and see one table.
    pub async fn table_for_json(
        &self,
        database: &str,
        table: &str,
        body: &[u8],
    ) -> Result<Arc<TableDef>> {
        let fields = infer_json_columns(body)?;
        self.table_for_columns(database, table, fields).await
    }

    /// The table `database.table`, made with `fields` (see [`Engine::table_for_json`]) or
    /// widened with those it lacks.
    pub(crate) async fn table_for_columns(
        &self,
        database: &str,
        table: &str,
        fields: Vec<(String, ColumnType)>,
    ) -> Result<Arc<TableDef>> {
        let name = TableRef {
            database: database.into(),
            table: table.into(),
        };
        match self.table_to_write(database, table).await {
            Ok(_) => {}
            Err(Error::UnknownTable { .. }) => {
                self.create_table(new_table(name.clone(), &fields)?, false)?;
            }
            Err(e) => return Err(e),
        }
        // Created by us or by a concurrent caller: either way, widen it to this message.
        let def = self.table(database, table)?;
        if def
            .options
            .contains_key(crate::ingest::decode::JSON_MAPPINGS)
        {
            return Ok(def);
        }
        let new: Vec<ColumnDef> = fields
            .into_iter()
            .filter(|(n, _)| def.column_index(n).is_none())
            .map(|(name, ty)| ColumnDef {
                name,
                ty,
                nullable: true,
            })
            .collect();
        if new.is_empty() {
            return Ok(def);
        }
        self.add_columns(&name, &new, true)?;
        self.table(database, table)
    }
}

/// `CREATE TABLE IF NOT EXISTS` for a table inferred from a message's `fields`.
impl Engine {
    /// Stores InfluxDB line protocol as InfluxDB's write API does: each measurement is a
    /// table of `database`, timestamps are in units of `ns_per_unit` nanoseconds. In a
    /// database listed in `mqtt.auto_create_databases` (or all, with `*`) a missing table is
    /// made from its lines (`time`, tags as strings, fields typed as written, partitioned by
    /// day) and a table gains nullable columns for new tags and fields. Every line is decoded
    /// before anything is stored; then each measurement's rows are one durable append. With
    /// `partial`, a line that does not parse or fit is reported (its number, text and why)
    /// and the others stored; without it, it refuses the whole text.
    /// `user` needs INSERT on the database (and the `[[acl]]` write rules' leave).
    pub async fn write_line_protocol(
        &self,
        user: Option<&str>,
        database: &str,
        text: &str,
        ns_per_unit: i64,
        partial: bool,
    ) -> Result<LineProtocolWrite> {
        use crate::ports::Logins;
        let auto =
            (self.config.mqtt.auto_create_databases.iter()).any(|d| d == database || d == "*");
        let mut rejected = Vec::new();
        let keep = partial.then_some(&mut rejected);
        let groups = crate::ingest::decode::by_measurement_keeping(text, ns_per_unit, keep)?;
        let mut decoded = Vec::with_capacity(groups.len());
        for mut m in groups {
            let need = crate::access::Need::Insert {
                database,
                table: &m.name,
            };
            self.authorize(user, need)?;
            let def = match (self.table_to_write(database, &m.name).await, auto) {
                (Ok(def), false) => def,
                (Ok(_) | Err(Error::UnknownTable { .. }), true) => {
                    let columns = std::mem::take(&mut m.columns);
                    self.table_for_columns(database, &m.name, columns).await?
                }
                (Err(e), _) => return Err(e),
            };
            let now = now_micros();
            let lp = Format::LineProtocol;
            let rows = match decode_message(&def, lp, m.text.as_bytes(), now, &[]) {
                Ok(rows) => rows,
                // Partial: the lines that decode are kept, each other one is named.
                Err(_) if partial => {
                    let mut rows = Vec::new();
                    for (j, line) in m.text.lines().enumerate() {
                        match decode_message(&def, lp, line.as_bytes(), now, &[]) {
                            Ok(r) => rows.extend(r),
                            Err(e) => rejected.push(m.in_whole_text(renumber(e, j + 1))),
                        }
                    }
                    rows
                }
                Err(e) => return Err(m.in_whole_text(e)),
            };
            if !rows.is_empty() {
                decoded.push((def, rows, m.lines));
            }
        }
        let mut out = LineProtocolWrite::default();
        let mut written = Vec::with_capacity(decoded.len());
        for (def, rows, numbers) in decoded {
            out.rows += self.append(&def, rows, true, None).await?.rows;
            written.push((def.name.clone(), numbers));
        }
        let lines: Vec<&str> = text.split('\n').collect();
        out.rejected = (rejected.into_iter())
            .map(|e| {
                let line = match &e {
                    Error::BadRow { line, .. } | Error::BadPayload { line, .. } => *line,
                    _ => 0,
                };
                let original = lines.get(line.wrapping_sub(1)).copied().unwrap_or("");
                RejectedLine {
                    line,
                    text: original.trim_end_matches('\r').to_string(),
                    error: e.to_string(),
                }
            })
            .collect();
        out.rejected.sort_by_key(|r| r.line);
        let refused: std::collections::HashSet<usize> =
            out.rejected.iter().map(|r| r.line).collect();
        out.stored = (written.into_iter())
            .map(|(table, numbers)| {
                let kept = (numbers.into_iter())
                    .filter(|n| !refused.contains(n))
                    .filter_map(|n| lines.get(n - 1))
                    .map(|l| l.trim_end_matches('\r').trim());
                (table, kept.collect::<Vec<_>>().join("\n"))
            })
            .collect();
        Ok(out)
    }
}

/// `e` as the error of line `line`.
fn renumber(e: Error, line: usize) -> Error {
    match e {
        Error::BadRow { column, reason, .. } => Error::BadRow {
            line,
            column,
            reason,
        },
        Error::BadPayload { reason, .. } => Error::BadPayload { line, reason },
        other => other,
    }
}

fn new_table(name: TableRef, fields: &[(String, ColumnType)]) -> Result<CreateTable> {
    let mut columns: Vec<ColumnDef> = fields
        .iter()
        .map(|(n, ty)| ColumnDef {
            name: n.clone(),
            ty: *ty,
            nullable: true,
        })
        .collect();
    let named = |want: &str| {
        columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(want))
    };
    let time = TIME_NAMES.iter().find_map(|want| {
        named(want).filter(|&i| {
            matches!(
                columns[i].ty,
                ColumnType::Timestamp | ColumnType::Int64 | ColumnType::UInt64
            )
        })
    });
    let time_name = match time {
        Some(i) => {
            columns[i].ty = ColumnType::Timestamp;
            columns[i].name.clone()
        }
        None => {
            let free = TIME_NAMES
                .iter()
                .find(|n| named(n).is_none())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "cannot create {}.{}: fields ts, time and timestamp are not times, so no time column can be added",
                        name.database, name.table
                    ))
                })?;
            columns.insert(
                0,
                ColumnDef {
                    name: free.to_string(),
                    ty: ColumnType::Timestamp,
                    nullable: true,
                },
            );
            free.to_string()
        }
    };
    Ok(CreateTable {
        name,
        columns,
        partition: PartitionFn::Yyyymmdd { days: 1 },
        partition_column: time_name,
        ttl_secs: None,
        options: Default::default(),
        if_not_exists: true,
    })
}

#[cfg(test)]
mod tests;

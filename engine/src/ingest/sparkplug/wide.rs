//! The wide layout (`mqtt.sparkplug_layout = "wide"`): a row per message in the group's
//! table, a column per metric named after it (characters other than letters, digits and `_`
//! become `_`; a name that is one of the fixed columns gets `m_` before it) and typed by its
//! datatype; a metric first seen adds its column. Metrics without a scalar type (data sets,
//! templates, arrays) are left out.

use super::{COLUMNS, Key, payload::Metric, table_name, value_columns};
use crate::Engine;
use crate::error::{Error, Result};
use crate::store::catalog::TableDef;
use crate::types::{ColumnType, Value};
use std::sync::Arc;

/// The wide table's own columns, before the metrics'.
const FIXED: [&str; 5] = ["time", "edge_node", "device", "message", "seq"];

/// The column type of a Tahu datatype (`None`: not stored in the wide layout).
fn column_type(datatype: u32) -> Option<ColumnType> {
    Some(match datatype {
        1..=8 => ColumnType::Int64,
        9 | 10 => ColumnType::Float64,
        11 => ColumnType::Bool,
        12 | 14 | 15 => ColumnType::String,
        13 => ColumnType::Timestamp,
        17 | 18 => ColumnType::Binary,
        _ => return None,
    })
}

/// The column of a metric.
fn column_name(metric: &str) -> String {
    let name = table_name(metric);
    match FIXED.contains(&name.as_str()) {
        true => format!("m_{name}"),
        false => name,
    }
}

impl Engine {
    /// The message's row in the wide table `key.1`, made or widened for its metrics.
    pub(super) async fn wide_row(
        &self,
        key: &Key,
        kind: &str,
        metrics: &[Metric],
        resolved: &[(String, u32)],
        (time, seq): (i64, Value),
    ) -> Result<(Arc<TableDef>, Vec<Value>)> {
        let (database, table) = (&key.0, &key.1);
        let fixed = FIXED.map(|f| COLUMNS.iter().find(|(n, _)| *n == f).expect("a column"));
        let mut fields: Vec<(String, ColumnType)> =
            fixed.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        let mut values = Vec::new();
        for (m, (name, ty)) in metrics.iter().zip(resolved) {
            let Some(column_ty) = column_type(*ty) else {
                continue;
            };
            let [int, double, boolean, text, bytes] = value_columns(m, *ty);
            let value = match column_ty {
                ColumnType::Int64 => int,
                ColumnType::Float64 => double,
                ColumnType::Bool => boolean,
                ColumnType::String => text,
                ColumnType::Binary => bytes,
                _ => match int {
                    Value::Int(ms) => Value::Timestamp(ms.saturating_mul(1000)),
                    _ => Value::Null,
                },
            };
            let column = column_name(name);
            fields.push((column.clone(), column_ty));
            values.push((column, column_ty, value));
        }
        let def = self.table_for_columns(database, table, fields).await?;
        let mut row = vec![Value::Null; def.columns.len()];
        let text = |v: Option<&String>| v.cloned().map_or(Value::Null, Value::Str);
        let own = [
            Value::Timestamp(time),
            Value::Str(key.2.clone()),
            text(key.3.as_ref()),
            Value::Str(kind.to_string()),
            seq,
        ];
        // A table made otherwise (with JSON mappings, say) may lack a column: refused.
        let index = |column: &str| {
            def.column_index(column)
                .ok_or_else(|| Error::invalid(format!("{database}.{table} has no column {column}")))
        };
        for (column, v) in FIXED.iter().zip(own) {
            row[index(column)?] = v;
        }
        for (column, ty, v) in values {
            let i = index(&column)?;
            if def.columns[i].ty != ty {
                return Err(Error::invalid(format!(
                    "{database}.{table}.{column} is {:?}; metric {column} came as {ty:?}",
                    def.columns[i].ty
                )));
            }
            row[i] = v;
        }
        Ok((def, row))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn metric_columns() {
        assert_eq!(
            super::column_name("Node Control/Rebirth"),
            "Node_Control_Rebirth"
        );
        assert_eq!(super::column_name("time"), "m_time");
        assert_eq!(super::column_type(3), Some(crate::types::ColumnType::Int64));
        assert_eq!(super::column_type(16), None);
    }
}

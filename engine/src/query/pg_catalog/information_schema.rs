//! `information_schema` as PostgreSQL clients read it: `tables`, `columns` and `schemata`
//! with PostgreSQL's type names (`double precision`, `timestamp without time zone`), which
//! Grafana reads to find a table's time and value columns. DataFusion's own
//! `information_schema` names Arrow types (`Float64`), which those clients do not know.

use crate::error::Result;
use crate::store::catalog::CatalogData;
use crate::types::ColumnType;
use datafusion::arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::datasource::MemTable;
use std::collections::HashSet;
use std::sync::Arc;

/// PostgreSQL's name of `ty` (`data_type`) and of its underlying type (`udt_name`).
fn pg_names(ty: ColumnType) -> (&'static str, &'static str) {
    use ColumnType::*;
    match ty {
        Bool => ("boolean", "bool"),
        Int8 | Int16 | UInt8 => ("smallint", "int2"),
        Int32 | UInt16 => ("integer", "int4"),
        Int64 | UInt32 => ("bigint", "int8"),
        UInt64 => ("numeric", "numeric"),
        Float32 => ("real", "float4"),
        Float64 => ("double precision", "float8"),
        String => ("text", "text"),
        Binary => ("bytea", "bytea"),
        Timestamp => ("timestamp without time zone", "timestamp"),
        Date => ("date", "date"),
    }
}

/// A table of text columns (and the `Int32` ones named in `ints`) from its rows.
fn table(names: &[&str], ints: &[&str], rows: Vec<Vec<Option<String>>>) -> Result<MemTable> {
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| match ints.contains(n) {
                true => Field::new(*n, DataType::Int32, true),
                false => Field::new(*n, DataType::Utf8, true),
            })
            .collect::<Vec<_>>(),
    ));
    let columns: Vec<ArrayRef> = (0..names.len())
        .map(|i| -> ArrayRef {
            let values = rows.iter().map(|r| r[i].as_deref());
            match ints.contains(&names[i]) {
                true => Arc::new(
                    values
                        .map(|v| v.and_then(|v| v.parse().ok()))
                        .collect::<Int32Array>(),
                ),
                false => Arc::new(values.collect::<StringArray>()),
            }
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    Ok(MemTable::try_new(schema, vec![vec![batch]])?)
}

/// The `information_schema` of the databases in `readable`, as the catalog is now.
pub(super) fn schema(
    cat: &CatalogData,
    readable: &HashSet<String>,
) -> Result<Arc<dyn SchemaProvider>> {
    let s = |v: &str| Some(v.to_string());
    let databases = || cat.databases.iter().filter(|(d, _)| readable.contains(*d));
    let schemata = databases()
        .map(|(d, _)| vec![s("sluice"), s(d), s("sluice")])
        .collect();
    let tables = databases()
        .flat_map(|(d, ts)| ts.keys().map(move |t| (d, t)))
        .map(|(d, t)| vec![s("sluice"), s(d), s(t), s("BASE TABLE")])
        .collect();
    let mut columns = Vec::new();
    for (d, ts) in databases() {
        for (t, def) in ts {
            // A rollup shows the columns its queries answer with.
            let answered = cat.rollups.get(&def.id).map(|r| r.answer_columns(def));
            for (i, c) in answered.as_ref().unwrap_or(&def.columns).iter().enumerate() {
                let (data_type, udt) = pg_names(c.ty);
                columns.push(vec![
                    s("sluice"),
                    s(d),
                    s(t),
                    s(&c.name),
                    Some((i + 1).to_string()),
                    None,
                    s(if c.nullable { "YES" } else { "NO" }),
                    s(data_type),
                    s(udt),
                ]);
            }
        }
    }
    let info = MemorySchemaProvider::new();
    let tables_of = [
        (
            "schemata",
            table(
                &["catalog_name", "schema_name", "schema_owner"],
                &[],
                schemata,
            )?,
        ),
        (
            "tables",
            table(
                &["table_catalog", "table_schema", "table_name", "table_type"],
                &[],
                tables,
            )?,
        ),
        (
            "columns",
            table(
                &[
                    "table_catalog",
                    "table_schema",
                    "table_name",
                    "column_name",
                    "ordinal_position",
                    "column_default",
                    "is_nullable",
                    "data_type",
                    "udt_name",
                ],
                &["ordinal_position"],
                columns,
            )?,
        ),
    ];
    for (name, t) in tables_of {
        info.register_table(name.to_string(), Arc::new(t))?;
    }
    Ok(Arc::new(info))
}

#[cfg(test)]
mod tests {
    use super::pg_names;
    use crate::types::ColumnType;

    #[test]
    fn type_names_are_postgresqls() {
        assert_eq!(pg_names(ColumnType::Float64).0, "double precision");
        assert_eq!(pg_names(ColumnType::Timestamp).1, "timestamp");
        assert_eq!(pg_names(ColumnType::String).0, "text");
    }
}

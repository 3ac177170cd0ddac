//! Tables for decoder tests.

use crate::store::catalog::{ColumnDef, TableDef};
use crate::store::partition::PartitionFn;
use crate::types::ColumnType;

/// A table of `columns` (name, type, nullable), partitioned by `ymdh` of column 0 when it is
/// a time, else by its raw value.
pub(crate) fn table_of(id: u64, columns: &[(&str, ColumnType, bool)]) -> TableDef {
    let partition = if columns[0].1.is_time() {
        PartitionFn::Ymdh { hours: 1 }
    } else {
        PartitionFn::Raw
    };
    TableDef {
        id,
        database: "iot".into(),
        name: "readings".into(),
        columns: columns
            .iter()
            .map(|(name, ty, nullable)| ColumnDef {
                name: name.to_string(),
                ty: *ty,
                nullable: *nullable,
            })
            .collect(),
        partition,
        partition_column: 0,
        ttl_secs: None,
        options: Default::default(),
    }
}

/// `table` with a `json_mappings` option.
pub(super) fn with_mapping(mut table: TableDef, mapping: &str) -> TableDef {
    table
        .options
        .insert(super::JSON_MAPPINGS.into(), mapping.into());
    table
}

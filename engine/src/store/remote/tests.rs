use super::*;
use crate::store::buffer::PartitionBuffer;
use crate::store::state::ShardRows;
use crate::types::{ColumnType, Value};
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use std::sync::Arc;

fn table_schema(width: usize) -> SchemaRef {
    let fields = (0..width).map(|i| Field::new(format!("c{i}"), DataType::Int64, true));
    Arc::new(Schema::new(fields.collect::<Vec<_>>()))
}

/// A shard's buffer holding, for each log index 1..=5, two rows of value 10 * index.
fn buffer(schema: &SchemaRef) -> PartitionBuffer {
    let types = vec![ColumnType::Int64; schema.fields().len()];
    let mut b = PartitionBuffer::with_marks(schema.clone(), &types);
    for lsn in 1..=5u64 {
        for _ in 0..2 {
            let row: Vec<Value> = (0..types.len())
                .map(|_| Value::Int(10 * lsn as i64))
                .collect();
            b.push(lsn, &row, None);
        }
    }
    b
}

fn values(batches: &[RecordBatch], column: usize) -> Vec<Option<i64>> {
    (batches.iter())
        .flat_map(|b| {
            b.column(column)
                .as_primitive::<Int64Type>()
                .iter()
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rows_are_cut_at_this_nodes_flushed_index_and_fitted_to_its_schema() {
    let schema = table_schema(2);
    let b = buffer(&schema);
    assert_eq!(b.lsn_starts(), vec![(1, 0), (2, 2), (3, 4), (4, 6), (5, 8)]);
    let answer = RowsAnswer {
        manifest_index: 42,
        parts: vec![RemotePart {
            shard: 3,
            partition: 7,
            starts: b.lsn_starts(),
            columns: vec![0, 1],
            batches: b.chunks(&schema).into_iter().map(|c| c.batch).collect(),
        }],
        columns: vec![0, 1],
    };
    let back = RowsAnswer::decode(&answer.encode(&schema).unwrap()).unwrap();
    assert_eq!(back.manifest_index, 42);
    assert_eq!(back.parts.len(), 1);
    assert_eq!((back.parts[0].shard, back.parts[0].partition), (3, 7));
    assert_eq!(back.parts[0].starts, answer.parts[0].starts);
    let remote = Remote {
        shards: [3].into(),
        parts: back.parts,
    };
    assert!(!remote.holds(3) && remote.holds(1));

    // This node has installed the files holding shard 3's entries up to index 3 in
    // partition 7: only the rows of 4 and 5 are the remote's to give.
    let wider = table_schema(3);
    let mut parts = BTreeMap::new();
    let types = vec![ColumnType::Int64; 3];
    let mut p = Partition {
        buffer: PartitionBuffer::new(wider.clone(), &types),
        frozen: None,
        files: Vec::new(),
        flushed_lsn: 0,
        shards: BTreeMap::new(),
    };
    p.shards.insert(
        3,
        ShardRows {
            buffer: PartitionBuffer::with_marks(wider.clone(), &types),
            flushed: 3,
        },
    );
    parts.insert(7, p);
    // A query projecting columns 1 and 2 (2 was added after the replica's rows).
    let projected = Arc::new(wider.project(&[1, 2]).unwrap());
    let rows = remote
        .rows_of(&parts, |_| true, &projected, Some(&[1, 2]))
        .unwrap();
    assert_eq!(
        values(&rows, 0),
        vec![Some(40), Some(40), Some(50), Some(50)]
    );
    assert_eq!(values(&rows, 1), vec![None; 4]);
    // A partition this node has no files of: every row; one not admitted: none.
    let rows = remote
        .rows_of(&BTreeMap::new(), |_| true, &schema, None)
        .unwrap();
    assert_eq!(values(&rows, 0).len(), 10);
    assert!(
        remote
            .rows_of(&parts, |k| k != 7, &schema, None)
            .unwrap()
            .is_empty()
    );
    // Everything already in files here: nothing.
    parts
        .get_mut(&7)
        .unwrap()
        .shards
        .get_mut(&3)
        .unwrap()
        .flushed = 5;
    assert!(
        remote
            .rows_of(&parts, |_| true, &projected, Some(&[1, 2]))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_damaged_answer_is_an_error() {
    let schema = table_schema(1);
    let bytes = RowsAnswer::default().encode(&schema).unwrap();
    assert!(RowsAnswer::decode(&bytes).unwrap().parts.is_empty());
    assert!(RowsAnswer::decode(&bytes[..5]).is_err());
}

//! Applying rows to partition buffers (the step between fsync and ack), nyct_lite-shaped rows.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_engine::internals::PartitionBuffer;
use sluice_engine::types::{ColumnType, Value};
use std::hint::black_box;
use std::sync::Arc;

fn bench(c: &mut Criterion) {
    use ColumnType::*;
    let types = [
        String, Timestamp, Timestamp, Int8, Float32, Float32, Float32, Int8, Float32, Float32,
        Int8, Float32, Float32, Float32, Float32, Float32, Float32, Float32,
    ];
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(
        types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                datafusion::arrow::datatypes::Field::new(format!("c{i}"), t.arrow(), true)
            })
            .collect::<Vec<_>>(),
    ));
    let row: Vec<Value> = types
        .iter()
        .map(|t| match t {
            String => Value::Str("CMT".into()),
            Timestamp => Value::Timestamp(1_454_247_900_000_000),
            Int8 => Value::Int(1),
            _ => Value::Float(12.5),
        })
        .collect();
    let mut g = c.benchmark_group("buffer_apply");
    const N: usize = 10_000;
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("nyct_row_x10000", |b| {
        b.iter(|| {
            let mut buf = PartitionBuffer::new(schema.clone(), &types);
            for i in 0..N {
                buf.push(i as u64 + 1, black_box(&row), Some(1));
            }
            black_box(buf.rows)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

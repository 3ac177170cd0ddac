//! Decoding one device reading (the payload of one MQTT message) into a row: CSV, JSON and
//! line protocol, as `mqtt_load` and `paho_load` send them.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_engine::Format;
use sluice_engine::TableDef;
use sluice_engine::internals::{ColumnDef, PartitionFn, decode_message};
use sluice_engine::types::ColumnType;
use std::hint::black_box;

fn table() -> TableDef {
    use ColumnType::*;
    let columns = [
        ("ts", Timestamp),
        ("device", String),
        ("seq", Int64),
        ("temp", Float64),
    ];
    TableDef {
        id: 1,
        database: "bench".into(),
        name: "readings".into(),
        columns: (columns.iter())
            .map(|(name, ty)| ColumnDef {
                name: name.to_string(),
                ty: *ty,
                nullable: true,
            })
            .collect(),
        partition: PartitionFn::Ymdh { hours: 1 },
        partition_column: 0,
        ttl_secs: None,
        options: Default::default(),
    }
}

fn bench(c: &mut Criterion) {
    let table = table();
    let now = 1_700_000_000_000_000;
    let mut g = c.benchmark_group("decode_one_reading");
    g.throughput(Throughput::Elements(1));
    let payloads: [(&str, Format, &[u8]); 3] = [
        ("csv", Format::Csv, b"1700000000123,dev-3,12,21.2"),
        (
            "json",
            Format::Json,
            br#"{"device":"dev-3","seq":12,"temp":21.2}"#,
        ),
        (
            "line_protocol",
            Format::LineProtocol,
            b"readings,device=dev-3 seq=12i,temp=21.2 1700000000123000000",
        ),
    ];
    for (name, format, body) in payloads {
        g.bench_function(name, |b| {
            b.iter(|| decode_message(&table, format, black_box(body), now, &[]).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

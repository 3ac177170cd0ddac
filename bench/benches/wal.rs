//! WAL append throughput with group commit: C appenders, one row each per append, fsync on.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_conf::WalConfig;
use sluice_engine::WriteRecord;
use sluice_engine::internals::{RecordSink, Wal};
use sluice_engine::types::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Discard;
impl RecordSink for Discard {
    fn apply(&self, _: u64, _: &WriteRecord) {}
}

fn row(i: i64) -> Arc<WriteRecord> {
    Arc::new(WriteRecord {
        table_id: 1,
        ncols: 3,
        rows: vec![vec![
            Value::Timestamp(i),
            Value::Str(format!("device-{}", i % 100)),
            Value::Float(i as f64),
        ]],
        origin: None,
    })
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("wal_append_fsync");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for appenders in [1usize, 32, 256] {
        const PER_ITER: u64 = 2048;
        g.throughput(Throughput::Elements(PER_ITER));
        g.bench_function(format!("{appenders}_appenders"), |b| {
            let dir = tempfile::tempdir().unwrap();
            let wal = Arc::new(
                Wal::start(
                    dir.path(),
                    &WalConfig::default(),
                    1,
                    65536,
                    Arc::new(Discard),
                )
                .unwrap(),
            );
            b.iter_custom(|iters| {
                let wal = wal.clone();
                rt.block_on(async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let per = PER_ITER as usize / appenders;
                        let mut tasks = Vec::new();
                        for a in 0..appenders {
                            let wal = wal.clone();
                            tasks.push(tokio::spawn(async move {
                                for i in 0..per {
                                    wal.append(row((a * per + i) as i64)).await.unwrap();
                                }
                            }));
                        }
                        for t in tasks {
                            t.await.unwrap();
                        }
                    }
                    start.elapsed()
                })
            });
            wal.close();
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

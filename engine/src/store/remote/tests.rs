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
        summaries: Vec::new(),
        files: Default::default(),
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
fn contradictory_partition_bounds_from_another_node_name_no_rows() {
    let def = crate::ingest::decode::testutil::table_of(1, &[("v", ColumnType::Int64, true)]);
    let table = TableState::new(Arc::new(def));
    let request = RowsRequest {
        table_id: 1,
        shard: 0,
        lo: 9,
        hi: 3,
        only: None,
        columns: None,
        latest: false,
        partial: None,
        summary: None,
        asked_by: None,
    };
    let answer = serve(&table, &request, || 7).unwrap();
    assert!(answer.parts.is_empty());
    assert_eq!(answer.manifest_index, 7);
}

#[test]
fn a_damaged_answer_is_an_error() {
    let schema = table_schema(1);
    let bytes = RowsAnswer::default().encode(&schema).unwrap();
    assert!(RowsAnswer::decode(&bytes).unwrap().parts.is_empty());
    assert!(RowsAnswer::decode(&bytes[..5]).is_err());
    // A partial answer is not taken for rows, nor rows for it.
    let schema = table_schema(2);
    let states = RecordBatch::try_new(
        schema.clone(),
        (0..2)
            .map(|_| Arc::new(datafusion::arrow::array::Int64Array::from(vec![1, 2])) as ArrayRef)
            .collect(),
    )
    .unwrap();
    let partial = PartialAnswer {
        manifest_index: 9,
        flushed: vec![(7, 3), (8, 0)],
        rows: 5,
        files_read: 2,
        states: vec![states.clone()],
    };
    let encoded = partial.encode().unwrap();
    let back = PartialAnswer::decode(&encoded).unwrap();
    assert_eq!((back.manifest_index, back.rows, back.files_read), (9, 5, 2));
    assert_eq!(back.flushed, partial.flushed);
    assert_eq!(back.states, vec![states]);
    assert!(PartialAnswer::decode(&encoded[..20]).is_err());
    assert!(PartialAnswer::decode(&bytes).is_err());
    let empty = PartialAnswer::default().encode().unwrap();
    assert!(PartialAnswer::decode(&empty).unwrap().states.is_empty());
}

/// A cluster's reader as a test sets it: shard 5 is held elsewhere, and its replica holds
/// `rows` (or does not answer).
struct Fake {
    rows: parking_lot::Mutex<Option<RowsAnswer>>,
    /// Shard 5's partial aggregates, as its replica would answer them.
    partial: parking_lot::Mutex<Option<PartialAnswer>>,
    /// Shard 5's synopses, as its replica would answer them, and the times asked.
    summary: parking_lot::Mutex<Option<SummaryAnswer>>,
    summaries_asked: std::sync::atomic::AtomicU64,
    /// Shard 5's commit index, as its leader would tell it.
    version: std::sync::atomic::AtomicU64,
    /// The node asked first for shard 5 (this node is node 1), the files its partial
    /// aggregates were given, and whether it says it read them.
    holder: Option<u64>,
    files_given: std::sync::atomic::AtomicU64,
    reads_files: std::sync::atomic::AtomicBool,
}

impl Fake {
    fn new(rows: Option<RowsAnswer>) -> Self {
        Self {
            rows: parking_lot::Mutex::new(rows),
            partial: Default::default(),
            summary: Default::default(),
            summaries_asked: 0.into(),
            version: 1.into(),
            holder: None,
            files_given: 0.into(),
            reads_files: false.into(),
        }
    }
}

#[async_trait]
impl ShardReader for Fake {
    fn remote_shards(&self) -> BTreeSet<u32> {
        [5].into()
    }

    async fn read(&self, request: RowsRequest) -> Result<RowsAnswer> {
        assert_eq!(request.shard, 5);
        self.rows.lock().clone().ok_or_else(|| Error::Replication {
            reason: "shard 5's unflushed rows could not be read: node 2: unreachable".into(),
        })
    }

    async fn partial(&self, request: RowsRequest) -> Result<PartialAnswer> {
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(request.shard, 5);
        let q = request.partial.unwrap();
        assert!(q.sql.contains("DISTINCT"));
        let files = q.files.len() as u64;
        self.files_given.fetch_add(files, Relaxed);
        let read = if self.reads_files.load(Relaxed) {
            files
        } else {
            0
        };
        let answer = self.partial.lock().clone();
        answer
            .map(|a| PartialAnswer {
                files_read: read,
                ..a
            })
            .ok_or_else(|| Error::Replication {
                reason: "the query cannot be aggregated in parts here".into(),
            })
    }

    fn me(&self) -> u64 {
        1
    }

    fn asked_first(&self, _shard: u32) -> Option<u64> {
        self.holder
    }

    async fn summary(&self, request: RowsRequest) -> Result<SummaryAnswer> {
        assert_eq!(request.shard, 5);
        let q = request.summary.unwrap();
        let by_device = q.keys == vec![crate::query::groups::GroupKey::Column(1)];
        if by_device {
            (self.summaries_asked).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let answer = self.summary.lock().clone().filter(|_| by_device);
        answer.ok_or_else(|| Error::Replication {
            reason: "the shard's rows cannot be summarized by their synopses here".into(),
        })
    }

    async fn versions(&self) -> Option<Vec<(u32, u64)>> {
        let v = self.version.load(std::sync::atomic::Ordering::Relaxed);
        Some(vec![(5, v)])
    }

    fn shards_of(
        &self,
        _def: &crate::store::catalog::TableDef,
        _keys: &[usize],
        _batch: &RecordBatch,
    ) -> Option<Vec<u32>> {
        None
    }
}

async fn query(e: &crate::engine::Engine, sql: &str) -> Result<String> {
    use crate::ports::{QueryOptions, QueryPort};
    use futures::TryStreamExt;
    let out = QueryPort::query(e, sql, &QueryOptions::default()).await?;
    let batches: Vec<_> = out.stream.try_collect().await?;
    Ok(datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string())
}

/// An engine in a new directory, aggregates run in parts however few rows are elsewhere,
/// with table `name` (time, device, temp; daily partitions).
async fn engine_with(name: &str) -> (tempfile::TempDir, Arc<crate::engine::Engine>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sluice_conf::Config {
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    config.query.split_min_rows = 0;
    let e = crate::engine::Engine::open(config).await.unwrap();
    let create = format!(
        "CREATE TABLE {name} (time TIMESTAMP, device STRING, temp DOUBLE) \
         PARTITION BY yyyymmdd(time)"
    );
    query(&e, &create).await.unwrap();
    (dir, e)
}

/// A node holding some shards answers with its own rows and the rows the other shards'
/// replicas send (scans, synopsis answers and `EXPLAIN` alike), and a shard whose replicas
/// do not answer fails the query with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_add_the_rows_held_elsewhere_or_name_the_shard_they_miss() {
    use datafusion::arrow::array::{Float64Array, StringArray, TimestampMicrosecondArray};
    let (_dir, e) = engine_with("t.m").await;
    let insert = "INSERT INTO t.m VALUES ('2024-05-01 10:00:00', 'a', 1.0), \
                  ('2024-05-01 10:00:01', 'b', 2.0)";
    query(&e, insert).await.unwrap();
    let rollup = "CREATE ROLLUP t.per_minute AS SELECT date_bin('1 minute', time) AS bucket, \
                  device, count(*) AS n, max(temp) AS hi FROM t.m GROUP BY 1, 2";
    query(&e, rollup).await.unwrap();
    let def = e.table("t", "m").unwrap();
    let at = 1_714_557_600_000_000i64;
    let key = def.partition.key(&crate::types::Value::Timestamp(at));
    let schema = e.store.tables.get(def.id).unwrap().schema();
    let tz = match schema.field(0).data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => panic!("{other}"),
    };
    // Entries 7 and 8 of shard 5: one row each, at the same minute, devices c and a.
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(
                TimestampMicrosecondArray::from(vec![at + 2_000_000, at + 3_000_000])
                    .with_timezone_opt(tz),
            ),
            Arc::new(StringArray::from(vec!["c", "a"])),
            Arc::new(Float64Array::from(vec![30.0, 40.0])),
        ],
    )
    .unwrap();
    let answer = RowsAnswer {
        manifest_index: 0,
        columns: vec![0, 1, 2],
        parts: vec![RemotePart {
            shard: 5,
            partition: key,
            starts: vec![(7, 0), (8, 1)],
            columns: vec![0, 1, 2],
            batches: vec![batch],
        }],
    };
    let fake = Arc::new(Fake::new(Some(answer.clone())));
    let _ = e.store.reader.set(fake.clone());
    assert!(e.store.partial());
    let counted = query(&e, "SELECT count(*) AS n, max(temp) AS hi FROM t.m")
        .await
        .unwrap();
    assert!(counted.contains("| 4 | 40.0 |"), "{counted}");
    let grouped = "SELECT device, count(*) AS n FROM t.m GROUP BY device ORDER BY device";
    let grouped = query(&e, grouped).await.unwrap();
    assert!(
        grouped.contains("| a      | 2 |") && grouped.contains("| c      | 1 |"),
        "{grouped}"
    );
    let rows = query(
        &e,
        "SELECT device FROM t.m WHERE temp > 1.5 ORDER BY device",
    )
    .await
    .unwrap();
    assert_eq!(rows.matches("| ").count(), 4, "{rows}");
    // A query synopses answer adds the replica's synopses of its rows instead of the rows
    // (here a made-up count of c, to tell them apart); synopses cut at another flushed
    // index than this node's (a flush landed in between) are asked for again, and after
    // the last try the shard's rows are read.
    let summary = |flushed| SummaryAnswer {
        flushed: vec![(key, flushed)],
        rows: 7,
        groups: vec![(
            vec![crate::query::groups::WireKey::Str("c".into())],
            7,
            vec![],
        )],
        ..SummaryAnswer::default()
    };
    let asked = || {
        fake.summaries_asked
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = asked();
    *fake.summary.lock() = Some(summary(0));
    let by_device = |name: &str| {
        format!("SELECT device, count(*) AS {name} FROM t.m GROUP BY device ORDER BY device")
    };
    let out = query(&e, &by_device("k")).await.unwrap();
    assert!(
        out.contains("| a      | 1 |") && out.contains("| c      | 7 |"),
        "{out}"
    );
    *fake.summary.lock() = Some(summary(6));
    let out = query(&e, &by_device("j")).await.unwrap();
    assert!(
        out.contains("| a      | 2 |") && out.contains("| c      | 1 |"),
        "{out}"
    );
    assert_eq!(
        asked() - before,
        1 + 2,
        "asked once, then twice before the rows were read"
    );
    // A `WHERE PARTS` list picks partitions by what this node knows: rows, not synopses.
    *fake.summary.lock() = Some(summary(0));
    let parts = "SELECT device, count(*) AS w FROM t.m WHERE PARTS 20240501 GROUP BY device \
                 ORDER BY device";
    let out = query(&e, parts).await.unwrap();
    assert!(
        out.contains("| a      | 2 |") && out.contains("| c      | 1 |"),
        "{out}"
    );
    assert_eq!(asked() - before, 1 + 2, "not asked for a WHERE PARTS list");
    *fake.summary.lock() = None;
    // An aggregate no synopsis answers runs in parts, the replica's part as its states.
    // One cut at another flushed index than this node's (a flush landed in between) is
    // asked for again, and after the last try the shard's rows are read: counted once.
    let stale = PartialAnswer {
        flushed: vec![(key, 6)],
        rows: 2,
        ..PartialAnswer::default()
    };
    *fake.partial.lock() = Some(stale);
    let distinct = "SELECT device, count(DISTINCT temp) AS d FROM t.m GROUP BY device \
                    ORDER BY device";
    let out = query(&e, distinct).await.unwrap();
    assert!(
        out.contains("| a      | 2 |") && out.contains("| c      | 1 |"),
        "{out}"
    );
    let plan = query(&e, &format!("EXPLAIN ANALYZE {distinct}"))
        .await
        .unwrap();
    assert!(
        plan.contains("SluiceSplitAggregate: partial aggregates of shard 5 on its replicas")
            && plan.contains("asked_again=2")
            && plan.contains("remote_partials=0")
            && plan.contains("remote_shards_read=1"),
        "{plan}"
    );
    *fake.partial.lock() = None;
    let out = query(&e, distinct).await.unwrap();
    assert!(out.contains("| a      | 2 |"), "{out}");
    // A rollup folds its source's rows held elsewhere too.
    let per_minute = "SELECT device, n, hi FROM t.per_minute ORDER BY device";
    let per_minute = query(&e, per_minute).await.unwrap();
    assert!(per_minute.contains("| a      | 2 | 40.0 |"), "{per_minute}");
    assert!(per_minute.contains("| c      | 1 | 30.0 |"), "{per_minute}");
    let plan = query(&e, "EXPLAIN SELECT * FROM t.m").await.unwrap();
    assert!(
        plan.contains("unflushed rows of shard 5 from its replicas"),
        "{plan}"
    );

    // A kept result holds while shard 5 stands still, and not once it moved.
    let count = "SELECT count(*) AS n FROM t.m";
    assert!(query(&e, count).await.unwrap().contains("| 4 |"));
    let mut one_more = answer;
    let b = &one_more.parts[0].batches[0];
    one_more.parts[0].batches = vec![b.clone(), b.slice(0, 1)];
    one_more.parts[0].starts.push((9, 2));
    *fake.rows.lock() = Some(one_more);
    assert!(query(&e, count).await.unwrap().contains("| 4 |"), "kept");
    fake.version.store(2, std::sync::atomic::Ordering::Relaxed);
    let moved = query(&e, count).await.unwrap();
    assert!(moved.contains("| 5 |"), "{moved}");

    // The replica does not answer: the query fails, naming the shard.
    let (_dir, e) = engine_with("t.m").await;
    query(&e, insert).await.unwrap();
    let _ = e.store.reader.set(Arc::new(Fake::new(None)));
    for sql in ["SELECT count(*) FROM t.m", "SELECT * FROM t.m"] {
        let err = query(&e, sql).await.unwrap_err().to_string();
        assert!(err.contains("shard 5"), "{sql}: {err}");
    }
}

/// A replica given a share of the files says how many it read: one that read none (an
/// older version, which does not know of files) is refused and every file is read here,
/// so nothing is missed; one that read them has them left out here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_left_to_a_replica_only_when_it_read_them() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_dir, e) = engine_with("t.f").await;
    // 24 daily partitions: a file each after the flush, about half of them given to node 2.
    let values: Vec<String> = (0..24)
        .map(|d| format!("('2024-05-{:02} 10:00:00', 'a', {d}.0)", d + 1))
        .collect();
    let insert = format!("INSERT INTO t.f VALUES {}", values.join(", "));
    query(&e, &insert).await.unwrap();
    query(&e, "FLUSH TABLE t.f").await.unwrap();
    let fake = Arc::new(Fake {
        holder: Some(2),
        ..Fake::new(Some(RowsAnswer::default()))
    });
    *fake.partial.lock() = Some(PartialAnswer::default());
    let _ = e.store.reader.set(fake.clone());
    let sql = |name: &str| {
        format!(
            "SELECT device, count(DISTINCT temp) AS d, count(*) AS {name} FROM t.f GROUP BY device"
        )
    };
    let out = query(&e, &sql("n")).await.unwrap();
    assert!(out.contains("| a      | 24 | 24 |"), "{out}");
    let given = fake.files_given.load(Relaxed);
    assert!((1..24).contains(&given), "{given}");
    let plan = query(&e, &format!("EXPLAIN ANALYZE {}", sql("m")))
        .await
        .unwrap();
    assert!(
        plan.contains("remote_files=0") && plan.contains("remote_shards_read=1"),
        "{plan}"
    );
    // This replica says it read its files (and, made up, aggregated nothing of them): they
    // are left out here, so the answer lacks their rows.
    fake.reads_files.store(true, Relaxed);
    let before = fake.files_given.load(Relaxed);
    let out = query(&e, &sql("k")).await.unwrap();
    let left = 24 - (fake.files_given.load(Relaxed) - before);
    assert!(
        out.contains(&format!("| a      | {left} | {left} |")),
        "{out}"
    );
    assert!(left < 24, "{out}");
}

//! Tests of `planner`.

use crate::engine::Engine;
use crate::ingest::decode::Format;
use crate::ports::{QueryOptions, QueryPort};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use futures::TryStreamExt;
use std::sync::Arc;

/// Row `i` of the test table: 50 devices in turn, a rare one now and then, an id per
/// row, ten rows a second from 11:00.
fn row(i: usize) -> (String, String, String, f64) {
    let device = match i % 7919 {
        0 => "rare".to_string(),
        _ => format!("dev-{}", i % 50),
    };
    let micros = i as i64 * 100_000;
    let ts = chrono::DateTime::from_timestamp_micros(1_714_561_200_000_000 + micros)
        .unwrap()
        .format("%Y-%m-%d %H:%M:%S%.6f")
        .to_string();
    (ts, device, format!("r-{i}"), (i % 1000) as f64 / 10.0)
}

/// The table [`write`] fills.
const READINGS: &str =
    "CREATE TABLE t.r (ts TIMESTAMP, device STRING, id STRING, temp DOUBLE) PARTITION BY ymdh(ts)";

/// An engine in a new directory (kept while the first value lives) with `ddl` run, and
/// the hot cache of that size, if given.
async fn engine(ddl: &str, hot_cache: Option<usize>) -> (tempfile::TempDir, Arc<Engine>) {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), hot_cache).await;
    e.execute(ddl).await.unwrap();
    (dir, e)
}

/// The engine over `dir`, with a hot cache of `hot_cache` bytes (default when `None`).
async fn open(dir: &std::path::Path, hot_cache: Option<usize>) -> Arc<Engine> {
    let mut config = sluice_conf::Config {
        data_dir: dir.to_path_buf(),
        ..Default::default()
    };
    if let Some(bytes) = hot_cache {
        config.query.hot_cache_bytes = sluice_conf::MemoryBudget::Bytes(bytes);
    }
    Engine::open(config).await.unwrap()
}

async fn write(e: &Engine, rows: std::ops::Range<usize>) {
    let body: String = rows
        .map(|i| {
            let (ts, d, id, temp) = row(i);
            format!("{ts},{d},{id},{temp}\n")
        })
        .collect();
    write_csv(e, "r", body).await;
}

/// Stores the CSV rows `body` in table `t.{table}`.
async fn write_csv(e: &Engine, table: &str, body: String) {
    let def = e.table("t", table).unwrap();
    e.write_message(&def, Format::Csv, body.as_bytes(), &[], None)
        .await
        .unwrap();
}

/// The answer to `sql`, computed (not a kept result), as a text table.
async fn computed(e: &Engine, sql: &str) -> String {
    let options = QueryOptions {
        no_result_cache: true,
        ..Default::default()
    };
    let out = QueryPort::query(e, sql, &options).await.unwrap();
    let batches: Vec<_> = out.stream.try_collect().await.unwrap();
    datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

/// count and sum of `temp` over the query's rows.
async fn count_sum(e: &Engine, sql: &str, small: bool) -> (i64, Option<f64>) {
    count_sum_with(e, sql, small, true).await
}

/// [`count_sum`], with kept results allowed or not.
async fn count_sum_with(e: &Engine, sql: &str, small: bool, fresh: bool) -> (i64, Option<f64>) {
    let options = QueryOptions {
        small,
        no_result_cache: fresh,
        ..Default::default()
    };
    let out = QueryPort::query(e, sql, &options).await.unwrap();
    let batches: Vec<_> = out.stream.try_collect().await.unwrap();
    let b = batches.iter().find(|b| b.num_rows() > 0).unwrap();
    let n = b.column(0).as_primitive::<Int64Type>().value(0);
    let s = b.column(1).as_primitive::<Float64Type>();
    (n, (!s.is_null(0)).then(|| s.value(0)))
}

/// Runs `sql` and returns the in-memory rows its scan passed on (after the indexes).
async fn memory_rows(e: &Engine, sql: &str) -> usize {
    metric(e, sql, "SluiceScan", "memory_rows").await
}

/// Runs `sql` and returns the sum of the metric `name` of its nodes named `node`.
async fn metric(e: &Engine, sql: &str, node: &'static str, name: &'static str) -> usize {
    use datafusion::physical_plan::ExecutionPlan;
    let session = e.session("default", false).unwrap();
    let (planned, _) = e.plan(&session, "default", sql, None).await.unwrap();
    let plan = super::optimize_at(&session.state, &planned.plan, Some(chrono::Utc::now())).unwrap();
    let physical = session.state.create_physical_plan(&plan).await.unwrap();
    datafusion::physical_plan::collect(physical.clone(), session.task.clone())
        .await
        .unwrap();
    fn sum(p: &Arc<dyn ExecutionPlan>, node: &str, name: &str) -> usize {
        let own = match p.name() == node {
            true => p.metrics().and_then(|m| m.sum_by_name(name)),
            false => None,
        };
        let below = p.children().into_iter().map(|c| sum(c, node, name));
        own.map_or(0, |m| m.as_usize()) + below.sum::<usize>()
    }
    sum(&physical, node, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn number_comparisons_answered_by_synopses_match_the_scan() {
    let (_dir, e) = engine(
        "CREATE TABLE t.n (ts TIMESTAMP, device STRING, x DOUBLE, f FLOAT, k INT) PARTITION BY ymdh(ts)",
        None,
    )
    .await;
    // Floats with both zeros, infinities, NULLs and (in the first 10,000 rows only, so
    // later chunks are decided by their synopses) NaN; integers with NULLs.
    let rows = |range: std::ops::Range<usize>| -> String {
        range
            .map(|i| {
                let x = match i % 10 {
                    0 => "-1.5".to_string(),
                    1 => "-0.0".into(),
                    2 => "0.0".into(),
                    3 => "2.5".into(),
                    4 if i < 10_000 => "NaN".into(),
                    5 => "inf".into(),
                    6 => "-inf".into(),
                    7 => String::new(),
                    8 => "7".into(),
                    _ => format!("{}", i % 1000),
                };
                let x = if i >= 12_000 && i % 10 >= 5 {
                    "3".into()
                } else {
                    x
                };
                let k = match i % 17 {
                    0 => String::new(),
                    n => format!("{}", n as i64 - 3),
                };
                let ts = chrono::DateTime::from_timestamp_micros(
                    1_714_561_200_000_000 + i as i64 * 100_000,
                )
                .unwrap()
                .format("%Y-%m-%d %H:%M:%S%.6f");
                let device = ["a", "b", "c"][i % 3];
                format!("{ts},{device},{x},{x},{k}\n")
            })
            .collect()
    };
    let write = |range| write_csv(&e, "n", rows(range));
    let mut filters = Vec::new();
    for op in ["<", "<=", ">", ">=", "="] {
        for v in ["-1.5", "0", "-0.0", "2.5", "7", "1000", "-1000"] {
            filters.push(format!("x {op} {v}"));
            filters.push(format!("f {op} {v}"));
        }
        for v in ["-3", "0", "5", "100"] {
            filters.push(format!("k {op} {v}"));
        }
    }
    filters.push("x > 0 AND x <= 500".into());
    filters.push("device = 'b' AND x >= 2.5".into());
    filters.push("device = 'c' AND k = 4 AND f < 100".into());
    filters.push("device IN ('a', 'c') AND x = 3".into());
    let check = |stage: &'static str| {
        let filters = filters.clone();
        let e = e.clone();
        async move {
            for filter in &filters {
                let of = |k: &str| {
                    format!(
                        "SELECT count(*) AS n, count(x) AS cx, {k} AS s, min(k) AS lo, max(k) AS hi FROM t.n WHERE {filter}"
                    )
                };
                // `sum(k + 0)` is no plain column: the scan answers.
                let scanned = computed(&e, &of("sum(k + 0)")).await;
                let synopsis = of("sum(k)");
                assert_eq!(computed(&e, &synopsis).await, scanned, "{filter} ({stage})");
                let from = |name| metric(&e, &synopsis, "SluiceSynopsisExec", name);
                assert_eq!(
                    (from("from_synopsis").await, from("from_scan").await),
                    (1, 0),
                    "{filter} ({stage}): answered from synopses"
                );
            }
        }
    };
    write(0..20_000).await;
    check("buffered").await;
    e.execute("FLUSH TABLE t.n").await.unwrap();
    write(20_000..25_000).await;
    check("flushed and buffered").await;
    // The same answers again, from the kept per-filter synopses.
    check("kept").await;
    e.shutdown().await.unwrap();
}

/// GROUP BY over few-valued columns is answered from group synopses (of files, sealed
/// chunks, and the rows of the others) with the answer a scan gives; filters on the
/// grouped columns and time bounds are decided group by group.
#[tokio::test]
async fn group_by_answered_by_group_synopses_matches_the_scan() {
    group_by_case(None).await;
    // Files not in the hot cache are answered only by their group synopses.
    group_by_case(Some(0)).await;
}

async fn group_by_case(hot_cache: Option<usize>) {
    let hot = hot_cache.is_none();
    let (dir, e) = engine(
        "CREATE TABLE t.g (ts TIMESTAMP, device STRING, id STRING, kind INT, x DOUBLE, f FLOAT) PARTITION BY ymdh(ts)",
        hot_cache,
    )
    .await;
    let rows = |range: std::ops::Range<usize>| -> String {
        range
            .map(|i| {
                let x = match i % 11 {
                    0 => "-1.5".to_string(),
                    1 => "-0.0".into(),
                    2 => String::new(),
                    3 if i == 14 => "NaN".into(),
                    4 => "inf".into(),
                    _ => format!("{}", i % 1000),
                };
                let kind = match i % 13 {
                    0 => String::new(),
                    n => format!("{}", n as i64 % 4 - 1),
                };
                let device = match i % 7 {
                    0 => "",
                    n => ["a", "b", "c"][n % 3],
                };
                let ts = chrono::DateTime::from_timestamp_micros(
                    1_714_561_200_000_000 + i as i64 * 200_000,
                )
                .unwrap()
                .format("%Y-%m-%d %H:%M:%S%.6f");
                format!("{ts},{device},id-{i},{kind},{x},{x}\n")
            })
            .collect()
    };
    let write = |range| write_csv(&e, "g", rows(range));
    // (group columns, filter, whether the files' group synopses answer it whole: the
    // rows of chunks, and of files in the hot cache, answer the others)
    let queries = [
        ("device", "", true),
        ("kind", "", true),
        ("device, kind", "", true),
        ("kind, device", "kind > 0", true),
        ("device", "kind <= 1 AND kind >= 0", true),
        ("kind", "device IN ('a', 'c')", true),
        ("device", "device = 'b' AND kind = 2", true),
        ("kind", "ts >= '2024-05-01 12:00:00'", true),
        ("date(ts)", "", true),
        ("date(ts), kind", "kind > 0", true),
        // Bounds inside a file's time range.
        (
            "kind",
            "ts >= '2024-05-01 11:10:00' AND ts < '2024-05-01 11:50:00'",
            false,
        ),
        ("device, kind", "ts < '2024-05-01 11:05:00'", false),
        // Not decided group by group: a number comparison on another column.
        ("kind", "x > 100", false),
        // A column with a value per row is no key of a file's group synopses.
        ("id", "kind = 2", false),
    ];
    // `sidecars`: whether the files' group synopses can be read.
    let check = |e: Arc<Engine>, stage: &'static str, flushed: bool, sidecars: bool| {
        async move {
            for (group, filter, whole_files) in queries {
                let filter = match filter {
                    "" => String::new(),
                    f => format!("WHERE {f}"),
                };
                let of = |k: &str| {
                    format!(
                        "SELECT {group}, count(*) AS n, count(x) AS cx, {k} AS s, min(kind) AS lo, max(ts) AS hi, avg(kind) AS a, sum(f) AS sf FROM t.g {filter} GROUP BY {group} ORDER BY {group}"
                    )
                };
                // `sum(kind + 0)` is no plain column: the scan answers.
                let scanned = computed(&e, &of("sum(kind + 0)")).await;
                let synopsis = of("sum(kind)");
                let stage = format!("{stage}, hot cache {hot_cache:?}");
                assert_eq!(
                    computed(&e, &synopsis).await,
                    scanned,
                    "{group} {filter} ({stage})"
                );
                assert!(
                    scanned.lines().count() > 4,
                    "{group} {filter}: some groups\n{scanned}"
                );
                let from = |name| metric(&e, &synopsis, "SluiceSynopsisExec", name);
                let answered = (whole_files && sidecars) || hot || !flushed;
                assert_eq!(
                    (from("from_synopsis").await, from("from_scan").await),
                    (answered as usize, !answered as usize),
                    "{group} {filter} ({stage})"
                );
            }
        }
    };
    write(0..20_000).await;
    check(e.clone(), "buffered", false, true).await;
    e.execute("FLUSH TABLE t.g").await.unwrap();
    write(20_000..26_000).await;
    check(e.clone(), "flushed and buffered", true, true).await;
    e.shutdown().await.unwrap();
    if hot {
        return;
    }
    let reopen = || open(dir.path(), hot_cache);
    // After a restart, the files' group synopses are read from their sidecar objects.
    let e = reopen().await;
    check(e.clone(), "reopened", true, true).await;
    e.shutdown().await.unwrap();
    // Files without them (written before them, or torn) are answered by the scan.
    fn sidecars(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            match path.is_dir() {
                true => sidecars(&path, out),
                false if path.to_string_lossy().ends_with(".groups") => out.push(path),
                false => {}
            }
        }
    }
    let mut found = Vec::new();
    sidecars(dir.path(), &mut found);
    assert!(!found.is_empty());
    std::fs::remove_file(&found[0]).unwrap();
    for path in &found[1..] {
        let bytes = std::fs::read(path).unwrap();
        std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
    }
    let e = reopen().await;
    check(e.clone(), "no sidecars", true, false).await;
    e.shutdown().await.unwrap();
}

/// `now()` is read when each query runs, not when the session was made: a row in a
/// one-second window leaves it once time has passed.
#[tokio::test]
async fn now_is_the_time_of_each_query() {
    let (_dir, e) = engine(
        "CREATE TABLE t.n (ts TIMESTAMP, v DOUBLE) PARTITION BY ymdh(ts)",
        None,
    )
    .await;
    let now = |e: Arc<Engine>| async move {
        let out = QueryPort::query(&*e, "SELECT now()", &QueryOptions::default())
            .await
            .unwrap();
        let batches: Vec<_> = out.stream.try_collect().await.unwrap();
        let c = batches[0]
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::TimestampNanosecondType>();
        c.value(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let first = now(e.clone()).await;
    // Polled until 20 ms have passed by the queries' own clock (never, when frozen).
    let mut second = now(e.clone()).await;
    while second < first + 20_000_000 && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        second = now(e.clone()).await;
    }
    assert!(second >= first + 20_000_000, "{first} then {second}");
    // Two seconds ahead: inside the one-second window for the next three seconds, so
    // the first answers are certain however slow the machine.
    let def = e.table("t", "n").unwrap();
    let ahead = chrono::Utc::now() + chrono::Duration::seconds(2);
    let ts = ahead.format("%Y-%m-%d %H:%M:%S%.6f");
    e.write_message(
        &def,
        Format::Csv,
        format!("{ts},1.5\n").as_bytes(),
        &[],
        None,
    )
    .await
    .unwrap();
    // Answered from synopses (a plan kept, its synopsis node reading the clock each run),
    // and from a scan (`v` is not aggregated plainly: optimized each run), with kept
    // results allowed or not: each sees the window move.
    let kept = "SELECT count(*), sum(v) FROM t.n WHERE ts > now() - INTERVAL '1 second'";
    let per_run = "SELECT count(*), sum(v + 0) FROM t.n WHERE ts > now() - INTERVAL '1 second'";
    for sql in [kept, per_run] {
        for small in [false, true] {
            for fresh in [false, true] {
                let got = count_sum_with(&e, sql, small, fresh).await;
                assert_eq!(got, (1, Some(1.5)), "{sql}");
            }
        }
    }
    // Then each is polled until the row has left the window (about three seconds).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for sql in [kept, per_run] {
        for small in [false, true] {
            for fresh in [false, true] {
                let mut got = count_sum_with(&e, sql, small, fresh).await;
                while got != (0, None) && std::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    got = count_sum_with(&e, sql, small, fresh).await;
                }
                assert_eq!(got, (0, None), "{sql}");
            }
        }
    }
    let is_kept = |sql: &str| (e.planner.reusable.lock().keys()).any(|k| k.1 == sql);
    assert!(is_kept(kept));
    assert!(!is_kept(per_run));
}

/// With no hot cache a flushed file cannot be filtered from chunk indexes: an aggregate
/// over one device then runs the scan it replaced, and gives the same answer; over whole
/// partitions the files' stored synopses still answer.
#[tokio::test]
async fn synopsis_falls_back_to_the_scan() {
    let (_dir, e) = engine(READINGS, Some(0)).await;
    write(&e, 0..5_000).await;
    e.execute("FLUSH TABLE t.r").await.unwrap();
    write(&e, 5_000..6_000).await;
    let dev = |i: &usize| row(*i).1 == "dev-7";
    let want: Vec<f64> = (0..6_000).filter(dev).map(|i| row(i).3).collect();
    let sql = "SELECT count(*), sum(temp) FROM t.r WHERE device = 'dev-7'";
    for small in [false, true] {
        let (n, sum) = count_sum(&e, sql, small).await;
        assert_eq!(n as usize, want.len());
        assert!((sum.unwrap() - want.iter().sum::<f64>()).abs() < 1e-6);
    }
    let from = |sql, name| metric(&e, sql, "SluiceSynopsisExec", name);
    assert_eq!(
        (
            from(sql, "from_synopsis").await,
            from(sql, "from_scan").await
        ),
        (0, 1)
    );
    // The same with a bound through now(): bound to the run's time in the scan too.
    let recent = "SELECT count(*), sum(temp) FROM t.r WHERE device = 'dev-7' AND ts > now() - INTERVAL '100000 days'";
    assert_eq!(count_sum(&e, recent, true).await.0 as usize, want.len());
    assert_eq!(
        (
            from(recent, "from_synopsis").await,
            from(recent, "from_scan").await
        ),
        (0, 1)
    );
    let all = "SELECT count(*), sum(temp) FROM t.r";
    assert_eq!(count_sum(&e, all, false).await.0, 6_000);
    assert_eq!(
        (
            from(all, "from_synopsis").await,
            from(all, "from_scan").await
        ),
        (1, 0)
    );
    e.shutdown().await.unwrap();
}

/// Every query answers as a filter over all rows would: in buffers (sealed chunks and
/// the unsealed tail), in hot files, and from plans kept and run again after more rows.
#[tokio::test]
async fn indexed_chunks_and_kept_plans_give_every_matching_row() {
    let (_dir, e) = engine(READINGS, None).await;
    type Pred = fn(&(String, String, String, f64)) -> bool;
    let cases: Vec<(&str, Pred)> = vec![
        ("device = 'dev-7'", |r| r.1 == "dev-7"),
        ("'dev-7' = device", |r| r.1 == "dev-7"),
        ("device IN ('dev-7', 'rare')", |r| {
            r.1 == "dev-7" || r.1 == "rare"
        }),
        ("device = 'dev-7' OR device = 'rare'", |r| {
            r.1 == "dev-7" || r.1 == "rare"
        }),
        // Not one equality per side: wider than `device IN (...)`.
        ("(device = 'dev-7' AND temp > 50) OR device = 'rare'", |r| {
            (r.1 == "dev-7" && r.3 > 50.0) || r.1 == "rare"
        }),
        (
            "(device = 'dev-7' AND id LIKE 'r-1%') OR device = 'rare'",
            |r| (r.1 == "dev-7" && r.2.starts_with("r-1")) || r.1 == "rare",
        ),
        ("device = 'dev-7' AND temp < 0", |_| false),
        ("device = 'dev-7' AND temp >= 99.9", |r| {
            r.1 == "dev-7" && r.3 >= 99.9
        }),
        ("device = 'rare'", |r| r.1 == "rare"),
        ("device = 'nobody'", |_| false),
        ("id = 'r-12345'", |r| r.2 == "r-12345"),
        (
            "ts >= '2024-05-01 11:20:00' AND ts < '2024-05-01 11:25:00'",
            |r| r.0.as_str() >= "2024-05-01 11:20:00" && r.0.as_str() < "2024-05-01 11:25:00",
        ),
        ("device = 'dev-3' AND ts > '2024-05-01 11:30:00'", |r| {
            r.1 == "dev-3" && r.0.as_str() > "2024-05-01 11:30:00"
        }),
        ("device = 'dev-3' AND temp > 50", |r| {
            r.1 == "dev-3" && r.3 > 50.0
        }),
        // A cast that rounds is no bound on the stored times.
        ("CAST(ts AS TIMESTAMP(0)) = '2024-05-01 11:20:00'", |r| {
            r.0.starts_with("2024-05-01 11:20:00.")
        }),
    ];
    let check = |written: usize| {
        let e = e.clone();
        let cases = cases.clone();
        async move {
            for (filter, pred) in &cases {
                let want: Vec<f64> = (0..written).map(row).filter(pred).map(|r| r.3).collect();
                // Rows through the scan: the same rows.
                let sql = format!("SELECT count(*), sum(temp + 0) FROM t.r WHERE {filter}");
                let (n, _) = count_sum(&e, &sql, false).await;
                assert_eq!(
                    n as usize,
                    want.len(),
                    "{filter} after {written} rows, scanned"
                );
                let want: Vec<f64> = (0..written).map(row).filter(pred).map(|r| r.3).collect();
                let sql = format!("SELECT count(*), sum(temp) FROM t.r WHERE {filter}");
                for small in [false, true] {
                    let (n, sum) = count_sum(&e, &sql, small).await;
                    assert_eq!(n as usize, want.len(), "{filter} after {written} rows");
                    let expected = want.iter().sum::<f64>();
                    let got = sum.unwrap_or(0.0);
                    assert!(
                        (got - expected).abs() < 1e-6,
                        "{filter}: {got} vs {expected}"
                    );
                }
            }
        }
    };
    // 20,000 rows: two sealed chunks and an unsealed tail of one partition.
    write(&e, 0..20_000).await;
    check(20_000).await;
    let dev7 = "SELECT temp FROM t.r WHERE device = 'dev-7'";
    let tail = 20_000 % crate::store::buffer::TAIL_ROWS;
    assert!(memory_rows(&e, dev7).await <= (20_000 - tail) / 50 + 1 + tail);
    let nobody = "SELECT temp FROM t.r WHERE device = 'nobody'";
    assert_eq!(memory_rows(&e, nobody).await, tail);
    // A reading no chunk's synopsis of that device admits: only the tail is read.
    let cold = "SELECT temp FROM t.r WHERE device = 'dev-7' AND temp < 0";
    assert_eq!(memory_rows(&e, cold).await, tail);
    // The kept plans run again and see the rows written since (the second partition too).
    write(&e, 20_000..40_000).await;
    check(40_000).await;
    // Flushed: the hot cache's file slices are indexed the same way.
    e.execute("FLUSH TABLE t.r").await.unwrap();
    check(40_000).await;
    let dev7_rows = (0..40_000).filter(|i| row(*i).1 == "dev-7").count();
    assert_eq!(memory_rows(&e, dev7).await, dev7_rows);
    // A bound through now() (compared via a cast) skips every slice outside it.
    let recent = "SELECT count(*), sum(temp) FROM t.r WHERE ts > now() - INTERVAL '1 day'";
    assert_eq!(count_sum(&e, recent, true).await, (0, None));
    let recent = "SELECT temp FROM t.r WHERE ts > now() - INTERVAL '1 day'";
    assert_eq!(memory_rows(&e, recent).await, 0);
    // The counts above filtered only by equalities and time bounds were answered from
    // synopses, flushed files (in the hot cache) included, not by the scan they fall back
    // to; the others by a scan.
    for (filter, _) in &cases {
        let sql = format!("SELECT count(*), sum(temp) FROM t.r WHERE {filter}");
        let from = |name| metric(&e, &sql, "SluiceSynopsisExec", name);
        let scanned = ["AND temp > 50) OR", "CAST", "LIKE"]
            .iter()
            .any(|w| filter.contains(w));
        let want = match scanned {
            // A temp bound inside an OR, a rounding cast or a LIKE: no synopsis node.
            true => (0, 0),
            false => (1, 0),
        };
        assert_eq!(
            (from("from_synopsis").await, from("from_scan").await),
            want,
            "{sql}"
        );
    }
    // Text has no order in a synopsis: its max is left to the scan, not to a node that
    // would fall back at every run.
    let text = "SELECT max(id) FROM t.r WHERE device = 'dev-7'";
    let from = |name| metric(&e, text, "SluiceSynopsisExec", name);
    assert_eq!(
        (from("from_synopsis").await, from("from_scan").await),
        (0, 0)
    );
    e.shutdown().await.unwrap();
}

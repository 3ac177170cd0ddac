//! End-to-end query benchmark (issue 4): JoinBase's eight nyct_lite queries and its alert
//! query against a real `sluice serve` over HTTP, and against DuckDB (a native in-memory
//! table, in-process, `bench/duckdb_queries.py`) on the same data, in the same run. Checks
//! that the answers agree and prints each latency, each rate, and the ratios.
//!
//! Steps: generate the data set as CSV files ([`sluice_bench::nyct`], deterministic), load
//! it into Sluice over `POST /v1/write` from a few connections and `FLUSH TABLE`, run each
//! query once to warm up and then three times (best of three, the whole HTTP response read),
//! run the alert query back to back from 1 and from 4 keep-alive connections for a fixed
//! time; stop Sluice; then the same in DuckDB (and chDB with `--clickhouse`) from the same
//! files, so each system has the machine to itself while it is measured.
//!
//! `cargo build --release -p sluice -p sluice-bench --bins`, then
//! `~/.cache/sluice-target/release/query_bench --rows 200000` (default: the full 10,906,860).

use anyhow::{Context, Result, bail};
use clap::Parser;
use sluice_bench::Sluice;
use sluice_bench::answer::{self, Cell, Rows};
use sluice_bench::nyct::{self, Generator};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Rows in the data set.
    #[arg(long, default_value_t = nyct::FULL_ROWS)]
    rows: usize,
    /// Seed of the data set.
    #[arg(long, default_value_t = 2016)]
    seed: u64,
    /// The sluice binary (default: the one built next to this runner).
    #[arg(long)]
    sluice: Option<PathBuf>,
    /// Seconds each alert-query rate is measured for.
    #[arg(long, default_value_t = 5.0)]
    duration_secs: f64,
    /// Concurrent HTTP writes while loading Sluice.
    #[arg(long, default_value_t = 4)]
    load_connections: usize,
    /// Work in this directory and keep what is made there, instead of a temporary one: the
    /// CSV files in `csv/` (reused by later runs with the same --rows and --seed) and each
    /// run's Sluice and chDB data in a new `run-*/` (about 70 bytes a row; delete old ones).
    #[arg(long)]
    keep_data_dir: Option<PathBuf>,
    /// Also measure chDB (ClickHouse in-process, PyPI `chdb`), if it can be installed.
    #[arg(long)]
    clickhouse: bool,
    /// The Python that runs DuckDB.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Send `benchmark.nyct_lite` instead of `nyct_lite` with `?db=benchmark`, for a server
    /// that has no `db` parameter yet. Without it the queries are sent as written.
    #[arg(long)]
    qualify_table: bool,
    /// Ask Sluice to compute every answer (`cache=off`) instead of returning the kept
    /// result of an identical query over unchanged tables: measures the execution path.
    #[arg(long)]
    no_result_cache: bool,
    /// Only measure the alert-query rate against a server already running at this address
    /// (host:port of its HTTP listener, table `benchmark.nyct_lite` loaded): for profiling.
    #[arg(long)]
    alert_only: Option<String>,
}

/// One benchmark query in each system's spelling.
#[derive(Debug)]
struct Query {
    name: &'static str,
    /// JoinBase's text, sent to Sluice as written.
    sluice: &'static str,
    /// `dt'..'` as `TIMESTAMP '..'`, `date(x)` as `CAST(x AS DATE)`, `WHERE PARTS a..b` of
    /// the `ymdh12` partitions as the pickup range they cover.
    duckdb: &'static str,
    /// ClickHouse's: `toDateTime('..', 'UTC')`, `toDate(x)`.
    clickhouse: &'static str,
    /// Whether the query orders its rows (else answers are compared as sets).
    ordered: bool,
}

static QUERIES: [Query; 8] = [
    Query {
        name: "Q1",
        sluice: "select count(passenger_count) from nyct_lite",
        duckdb: "select count(passenger_count) from nyct_lite",
        clickhouse: "select count(passenger_count) from nyct_lite",
        ordered: false,
    },
    Query {
        name: "Q2",
        sluice: "select sum(passenger_count) from nyct_lite",
        duckdb: "select sum(passenger_count) from nyct_lite",
        clickhouse: "select sum(passenger_count) from nyct_lite",
        ordered: false,
    },
    Query {
        name: "Q3",
        sluice: "select sum(total_amount) from nyct_lite",
        duckdb: "select sum(total_amount) from nyct_lite",
        clickhouse: "select sum(total_amount) from nyct_lite",
        ordered: false,
    },
    Query {
        name: "Q4",
        sluice: "select payment_type,avg(passenger_count) from nyct_lite group by payment_type",
        duckdb: "select payment_type,avg(passenger_count) from nyct_lite group by payment_type",
        clickhouse: "select payment_type,avg(passenger_count) from nyct_lite group by payment_type",
        ordered: false,
    },
    Query {
        name: "Q5",
        sluice: "select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",
        duckdb: "select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",
        clickhouse: "select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",
        ordered: false,
    },
    Query {
        name: "Q6",
        sluice: "select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",
        duckdb: "select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",
        clickhouse: "select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",
        ordered: false,
    },
    Query {
        name: "Q7",
        sluice: "SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < dt'2016-02-01 00:00:00' GROUP BY rate_code ORDER BY rate_code",
        duckdb: "SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < TIMESTAMP '2016-02-01 00:00:00' GROUP BY rate_code ORDER BY rate_code",
        clickhouse: "SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < toDateTime('2016-02-01 00:00:00', 'UTC') GROUP BY rate_code ORDER BY rate_code",
        ordered: true,
    },
    Query {
        name: "Q8",
        sluice: "SELECT date(pickup_datetime), avg(fare_amount) FROM nyct_lite where parts 2016010100..2016010800 WHERE passenger_count = 1 GROUP BY date(pickup_datetime)",
        duckdb: "SELECT CAST(pickup_datetime AS DATE), avg(fare_amount) FROM nyct_lite WHERE pickup_datetime >= TIMESTAMP '2016-01-01 00:00:00' AND pickup_datetime < TIMESTAMP '2016-01-08 00:00:00' AND passenger_count = 1 GROUP BY CAST(pickup_datetime AS DATE)",
        clickhouse: "SELECT toDate(pickup_datetime), avg(fare_amount) FROM nyct_lite WHERE pickup_datetime >= toDateTime('2016-01-01 00:00:00', 'UTC') AND pickup_datetime < toDateTime('2016-01-08 00:00:00', 'UTC') AND passenger_count = 1 GROUP BY toDate(pickup_datetime)",
        ordered: false,
    },
];

/// Refunds in the last half-day partition: JoinBase's alert query.
static ALERT: Query = Query {
    name: "alert",
    sluice: "select count(total_amount) from nyct_lite where parts 2016013112 where total_amount<0",
    duckdb: "select count(total_amount) from nyct_lite where pickup_datetime >= TIMESTAMP '2016-01-31 12:00:00' and pickup_datetime < TIMESTAMP '2016-02-01 00:00:00' and total_amount<0",
    clickhouse: "select count(total_amount) from nyct_lite where pickup_datetime >= toDateTime('2016-01-31 12:00:00', 'UTC') and pickup_datetime < toDateTime('2016-02-01 00:00:00', 'UTC') and total_amount<0",
    ordered: false,
};

/// The queries timed one by one: the eight, then the alert query (so its answer is checked
/// too).
fn timed_queries() -> impl Iterator<Item = &'static Query> {
    QUERIES.iter().chain(std::iter::once(&ALERT))
}

/// Rows per CSV file, and so per HTTP write: about 4 MB, well under `http.max_body_bytes`.
const ROWS_PER_FILE: usize = 30_000;
/// Longest any one query may take before it counts as failed.
const QUERY_TIMEOUT: Duration = Duration::from_secs(300);
/// Concurrent clients the alert-query rate of Sluice is measured with.
const ALERT_CLIENTS: [usize; 2] = [1, 4];

/// A query's best time and its answer.
#[derive(Debug)]
struct Timed {
    ms: f64,
    rows: Rows,
}

/// What one system did; failures are kept as messages so one failing query does not stop
/// the run.
#[derive(Debug)]
struct Report {
    system: &'static str,
    version: String,
    load_secs: f64,
    /// In the order of [`timed_queries`].
    queries: Vec<Result<Timed, String>>,
    /// Alert queries per second with a description of how they were sent.
    alert: Vec<(String, Result<f64, String>)>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(addr) = &args.alert_only {
        return alert_only(addr, &args);
    }
    let tmp;
    let dir = match &args.keep_data_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let started = Instant::now();
    let files = generate(&dir.join("csv"), args.rows, args.seed)?;
    eprintln!(
        "data: {} rows ({} in late 2017), seed {}, {} files, {:.1} MB, ready in {:.1} s",
        args.rows,
        Generator::new(args.rows, args.seed).late_rows(),
        args.seed,
        files.len(),
        files
            .iter()
            .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
            .sum::<u64>() as f64
            / 1e6,
        started.elapsed().as_secs_f64()
    );
    // A fresh directory for the systems' own data, kept only with --keep-data-dir.
    let run = match &args.keep_data_dir {
        Some(d) => tempfile::Builder::new()
            .prefix("run-")
            .tempdir_in(d)?
            .keep(),
        None => dir.join("run"),
    };
    std::fs::create_dir_all(&run)?;

    let bin = Sluice::binary(args.sluice.as_deref())?;
    let rt = sluice_bench::runtime()?;
    let ours = rt.block_on(run_sluice(&bin, &run, &files, &args))?;

    let script = run.join("duckdb_queries.py");
    std::fs::write(&script, include_str!("../../duckdb_queries.py"))?;
    let glob = dir.join("csv").join("nyct_lite-*.csv");
    let mut peers = Vec::new();
    let mut peer_failures = Vec::new();
    let mut engines = vec![("duckdb", "duckdb")];
    if args.clickhouse {
        engines.push(("chdb", "chdb"));
    }
    for (engine, package) in engines {
        match run_peer(engine, package, &script, &glob, &run, &args) {
            Ok(r) => peers.push(r),
            Err(e) => peer_failures.push(format!("{engine}: {e:#}")),
        }
    }
    print_report(&args, &ours, &peers, &peer_failures);
    Ok(())
}

/// The data set as CSV files in `dir`, written on all cores; files left by an earlier run
/// with the same parameters are reused.
fn generate(dir: &Path, rows: usize, seed: u64) -> Result<Vec<PathBuf>> {
    let n_files = rows.div_ceil(ROWS_PER_FILE);
    let paths: Vec<PathBuf> = (0..n_files)
        .map(|i| dir.join(format!("nyct_lite-{i:05}.csv")))
        .collect();
    let manifest = dir.join("MANIFEST");
    let want = format!(
        "nyct_lite generator v{} rows={rows} seed={seed} rows_per_file={ROWS_PER_FILE}\n",
        nyct::VERSION
    );
    if std::fs::read_to_string(&manifest).is_ok_and(|m| m == want) {
        return Ok(paths);
    }
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::remove_file(&manifest);
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("nyct_lite-") && name.ends_with(".csv") {
            std::fs::remove_file(&path)?;
        }
    }
    let g = Generator::new(rows, seed);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (g, paths) = (&g, &paths);
                s.spawn(move || -> Result<()> {
                    let mut text = String::new();
                    for (i, path) in paths.iter().enumerate().skip(t).step_by(threads) {
                        text.clear();
                        let start = i * ROWS_PER_FILE;
                        g.write_csv(start..(start + ROWS_PER_FILE).min(rows), &mut text);
                        std::fs::write(path, &text)
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("generator thread panicked"))
    })?;
    std::fs::write(&manifest, want)?;
    Ok(paths)
}

async fn run_sluice(bin: &Path, dir: &Path, files: &[PathBuf], args: &Args) -> Result<Report> {
    let sluice = Sluice::start(bin, dir)?;
    sluice.sql(nyct::DDL).await?;
    let load_secs = load(&sluice, files, args.load_connections).await?;
    let count = answer::rows_from_objects(
        sluice
            .sql("SELECT count(*) AS n FROM benchmark.nyct_lite")
            .await?
            .as_bytes(),
    )?;
    if count != vec![vec![Cell::Int(args.rows as i128)]] {
        bail!(
            "Sluice holds {count:?} rows after loading, not {}",
            args.rows
        );
    }
    eprintln!(
        "Sluice: {} rows loaded and flushed in {load_secs:.1} s ({:.0} rows/s)",
        args.rows,
        args.rows as f64 / load_secs
    );

    let url = format!(
        "http://{}/v1/sql?format=json&db=benchmark{}",
        sluice.http,
        if args.no_result_cache {
            "&cache=off"
        } else {
            ""
        }
    );
    let text = |q: &Query| {
        if args.qualify_table {
            q.sluice.replacen("nyct_lite", "benchmark.nyct_lite", 1)
        } else {
            q.sluice.to_string()
        }
    };
    let client = http_client()?;
    let mut queries = Vec::new();
    for q in timed_queries() {
        let r = best_of_3(&client, &url, &text(q)).await;
        match &r {
            Ok(t) => eprintln!("Sluice {}: {:.2} ms", q.name, t.ms),
            Err(e) => eprintln!("Sluice {}: {e}", q.name),
        }
        queries.push(r);
    }
    let duration = Duration::from_secs_f64(args.duration_secs);
    let alert = alert_rates(&sluice.http, &url, &text(&ALERT), duration).await;
    for (how, r) in &alert {
        match r {
            Ok(qps) => eprintln!("Sluice alert, {how}: {qps:.0} q/s"),
            Err(e) => eprintln!("Sluice alert, {how}: {e}"),
        }
    }
    Ok(Report {
        system: "Sluice",
        version: bin.display().to_string(),
        load_secs,
        queries,
        alert,
    })
}

/// The alert-query rate alone, from 1 and from 4 clients, against a running server.
fn alert_only(addr: &str, args: &Args) -> Result<()> {
    let cache = if args.no_result_cache {
        "&cache=off"
    } else {
        ""
    };
    let url = format!("http://{addr}/v1/sql?format=json&db=benchmark{cache}");
    let duration = Duration::from_secs_f64(args.duration_secs);
    let rt = sluice_bench::runtime()?;
    let mut failed = None;
    for (how, r) in rt.block_on(alert_rates(addr, &url, ALERT.sluice, duration)) {
        match r {
            Ok(qps) => println!("Sluice alert, {how}: {qps:.0} q/s"),
            Err(e) => {
                println!("Sluice alert, {how}: {e}");
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => bail!("the alert query failed: {e}"),
        None => Ok(()),
    }
}

/// The alert query's rate from each of `ALERT_CLIENTS` lean clients, then from one client
/// of the async HTTP client library (for comparison with earlier runs).
async fn alert_rates(
    addr: &str,
    url: &str,
    sql: &str,
    duration: Duration,
) -> Vec<(String, Result<f64, String>)> {
    let path = url
        .find("/v1/")
        .map_or("/v1/sql", |at| &url[at..])
        .to_string();
    let mut out = Vec::new();
    for clients in ALERT_CLIENTS {
        let (a, p, q) = (addr.to_string(), path.clone(), sql.to_string());
        let r = tokio::task::spawn_blocking(move || lean_rate(&a, &p, &q, clients, duration))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        let how = format!(
            "{clients} client{} over HTTP (keep-alive)",
            if clients == 1 { "" } else { "s" }
        );
        out.push((how, r));
    }
    let r = rate(url, sql, 1, duration).await;
    out.push(("1 client over HTTP, reqwest (async)".to_string(), r));
    out
}

/// Writes every file into the table from `connections` concurrent keep-alive connections,
/// then flushes it; returns the seconds it all took.
async fn load(sluice: &Sluice, files: &[PathBuf], connections: usize) -> Result<f64> {
    let url = Arc::new(format!(
        "http://{}/v1/write/benchmark/nyct_lite",
        sluice.http
    ));
    let files = Arc::new(files.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections.max(1) {
        let (url, files, next) = (url.clone(), files.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let client = http_client()?;
            while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                let body = tokio::fs::read(path).await?;
                let r = client
                    .post(url.as_str())
                    .header("content-type", "text/csv")
                    .body(body)
                    .send()
                    .await?;
                if r.status() != 204 {
                    bail!(
                        "writing {}: {} {}",
                        path.display(),
                        r.status(),
                        r.text().await?
                    );
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    sluice.sql("FLUSH TABLE benchmark.nyct_lite").await?;
    Ok(start.elapsed().as_secs_f64())
}

fn http_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(QUERY_TIMEOUT)
        .pool_max_idle_per_host(1)
        .build()?)
}

/// Runs one query; returns the milliseconds until the whole response was read, and the
/// body. A failure is the server's error message.
async fn post_sql(
    client: &reqwest::Client,
    url: &str,
    sql: &str,
) -> Result<(f64, bytes::Bytes), String> {
    let t = Instant::now();
    let r = client
        .post(url)
        .body(sql.to_string())
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = r.status();
    let body = r
        .bytes()
        .await
        .map_err(|e| format!("reading the response: {e}"))?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(format!("HTTP {}: {message}", status.as_u16()));
    }
    Ok((ms, body))
}

/// One warm-up run (whose answer is kept), then the best of three.
async fn best_of_3(client: &reqwest::Client, url: &str, sql: &str) -> Result<Timed, String> {
    let (_, body) = post_sql(client, url, sql).await?;
    let rows =
        answer::rows_from_objects(&body).map_err(|e| format!("unreadable JSON answer: {e}"))?;
    let mut ms = f64::INFINITY;
    for _ in 0..3 {
        ms = ms.min(post_sql(client, url, sql).await?.0);
    }
    Ok(Timed { ms, rows })
}

/// Queries per second from `clients` blocking keep-alive connections, one thread each,
/// each sending `sql` back to back for `duration` (after one warm-up query); every answer
/// must be the warm-up's. The load generator is kept lean (a request made once, the
/// response read straight from the socket), as `wrk` or `ab` are, so that what is measured
/// is the server: the async client below spends about 50 µs of the shared CPUs per
/// request, more than the server does.
fn lean_rate(
    addr: &str,
    path: &str,
    sql: &str,
    clients: usize,
    duration: Duration,
) -> Result<f64, String> {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{sql}",
        sql.len()
    );
    let warm = LeanConn::open(addr)?.ask(request.as_bytes())?;
    let start = Instant::now();
    let deadline = start + duration;
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (addr, request, warm) = (addr.to_string(), request.clone(), warm.clone());
            std::thread::spawn(move || {
                let mut conn = LeanConn::open(&addr)?;
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let body = conn.ask(request.as_bytes())?;
                    if body != warm {
                        return Err(format!(
                            "an answer differs from the first: {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                    n += 1;
                }
                Ok(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t
            .join()
            .map_err(|_| "a client thread panicked".to_string())??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// One blocking HTTP/1.1 keep-alive connection.
struct LeanConn {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl LeanConn {
    fn open(addr: &str) -> Result<Self, String> {
        let stream =
            std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(QUERY_TIMEOUT));
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 << 10),
        })
    }

    /// Sends `request`, returns the body of a 200 answer (content-length or chunked).
    fn ask(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        use std::io::Read;
        let io = |e: std::io::Error| format!("HTTP connection: {e}");
        self.stream.write_all(request).map_err(io)?;
        self.buf.clear();
        let (status, head, length, chunked) = loop {
            self.fill().map_err(io)?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut r = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head) = r
                .parse(&self.buf)
                .map_err(|e| format!("bad HTTP answer: {e}"))?
            {
                let header = |name: &str| {
                    (r.headers.iter())
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| h.value)
                };
                let length = header("content-length")
                    .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
                let chunked =
                    header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked"));
                break (r.code.unwrap_or(0), head, length, chunked);
            }
        };
        let body = match (length, chunked) {
            (Some(n), _) => {
                while self.buf.len() < head + n {
                    self.fill().map_err(io)?;
                }
                self.buf[head..head + n].to_vec()
            }
            (None, true) => {
                let mut body = Vec::new();
                let mut at = head;
                loop {
                    let Some(eol) = find_crlf(&self.buf[at..]) else {
                        self.fill().map_err(io)?;
                        continue;
                    };
                    let size = std::str::from_utf8(&self.buf[at..at + eol])
                        .ok()
                        .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
                        .ok_or("bad chunk size")?;
                    let need = at + eol + 2 + size + 2;
                    while self.buf.len() < need {
                        self.fill().map_err(io)?;
                    }
                    body.extend_from_slice(&self.buf[at + eol + 2..at + eol + 2 + size]);
                    at = need;
                    if size == 0 {
                        break;
                    }
                }
                body
            }
            // No body: informational, 204 and 304 answers.
            (None, false) if status < 200 || status == 204 || status == 304 => Vec::new(),
            (None, false) => {
                let mut rest = Vec::new();
                self.stream.read_to_end(&mut rest).map_err(io)?;
                self.buf.extend_from_slice(&rest);
                self.buf[head..].to_vec()
            }
        };
        if status != 200 {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body)
    }

    fn fill(&mut self) -> std::io::Result<()> {
        use std::io::Read;
        let mut piece = [0u8; 16 << 10];
        let n = self.stream.read(&mut piece)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&piece[..n]);
        Ok(())
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// Queries per second from `clients` connections of the async HTTP client (reqwest), each
/// sending `sql` back to back for `duration` (after one warm-up query).
async fn rate(url: &str, sql: &str, clients: usize, duration: Duration) -> Result<f64, String> {
    let warm = http_client().map_err(|e| e.to_string())?;
    post_sql(&warm, url, sql).await?;
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, sql) = (url.to_string(), sql.to_string());
        tasks.push(tokio::spawn(async move {
            let client = http_client().map_err(|e| e.to_string())?;
            let mut n = 0u64;
            while Instant::now() < deadline {
                post_sql(&client, &url, &sql).await?;
                n += 1;
            }
            Ok::<_, String>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Runs `bench/duckdb_queries.py` for `engine`, installing its PyPI package first if needed.
fn run_peer(
    engine: &str,
    package: &str,
    script: &Path,
    glob: &Path,
    dir: &Path,
    args: &Args,
) -> Result<Report> {
    ensure_python_package(&args.python, package)?;
    let spell = |q: &Query| match engine {
        "chdb" => q.clickhouse,
        _ => q.duckdb,
    };
    let request = serde_json::json!({
        "engine": engine,
        "csv_glob": glob,
        "work_dir": dir,
        "duration_secs": args.duration_secs,
        "queries": timed_queries().map(|q| serde_json::json!({"name": q.name, "sql": spell(q)})).collect::<Vec<_>>(),
        "alert": {"name": ALERT.name, "sql": spell(&ALERT)},
    });
    let mut child = Command::new(&args.python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", args.python))?;
    child
        .stdin
        .take()
        .context("no stdin")?
        .write_all(request.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{} exited with {}", script.display(), out.status);
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{engine}'s output is not JSON"))?;
    if v["rows"].as_u64() != Some(args.rows as u64) {
        bail!("{engine} loaded {} rows, not {}", v["rows"], args.rows);
    }
    let mut queries = Vec::new();
    for q in v["queries"]
        .as_array()
        .context("no queries in the output")?
    {
        queries.push(match (&q["error"], q["ms"].as_f64()) {
            (serde_json::Value::String(e), _) => Err(e.clone()),
            (_, Some(ms)) => Ok(Timed {
                ms,
                rows: answer::rows_from_arrays(&q["rows"])?,
            }),
            _ => Err(format!("no time in {q}")),
        });
    }
    let a = &v["alert"];
    let qps = match (&a["error"], a["qps"].as_f64()) {
        (serde_json::Value::String(e), _) => Err(e.clone()),
        (_, Some(qps)) => Ok(qps),
        _ => Err(format!("no rate in {a}")),
    };
    let name = match engine {
        "chdb" => "chDB",
        _ => "DuckDB",
    };
    Ok(Report {
        system: name,
        version: format!(
            "{} ({} threads)",
            v["version"].as_str().unwrap_or("(unknown version)"),
            v["threads"]
        ),
        load_secs: v["load_secs"].as_f64().unwrap_or(f64::NAN),
        queries,
        alert: vec![("1 client thread, in-process".to_string(), qps)],
    })
}

/// Makes `import package` work, with pip if it does not yet.
fn ensure_python_package(python: &str, package: &str) -> Result<()> {
    let importable = || {
        Command::new(python)
            .args(["-c", &format!("import {package}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if importable() {
        return Ok(());
    }
    eprintln!("installing {package} with pip");
    let _ = Command::new(python)
        .args(["-m", "pip", "install", "--quiet", package])
        .status();
    if !importable() {
        bail!("python package {package} is missing and pip could not install it");
    }
    Ok(())
}

fn print_report(args: &Args, ours: &Report, peers: &[Report], failures: &[String]) {
    let ratio = |a: f64, b: f64| format!("{:.2}x", a / b);
    let short = |e: &str| {
        let line = e.lines().next().unwrap_or("");
        let cut: String = line.chars().take(40).collect();
        let more = if cut.len() < line.len() { "..." } else { "" };
        format!("error: {cut}{more}")
    };
    let systems: Vec<&Report> = std::iter::once(ours).chain(peers).collect();
    println!();
    println!("nyct_lite: {} rows, seed {}", args.rows, args.seed);
    for r in &systems {
        println!("{}: {}", r.system, r.version);
    }
    for f in failures {
        println!("peer skipped: {f}");
    }

    println!();
    println!("| load | seconds | rows/s | Sluice time / its time |");
    println!("|---|---|---|---|");
    for r in &systems {
        println!(
            "| {} | {:.1} | {:.0} | {} |",
            r.system,
            r.load_secs,
            args.rows as f64 / r.load_secs,
            ratio(ours.load_secs, r.load_secs)
        );
    }

    println!();
    print!("| query | Sluice ms |");
    for p in peers {
        print!(" {0} ms | Sluice / {0} |", p.system);
    }
    println!(" answers |");
    println!("|---|---|{}---|", "---|---|".repeat(peers.len()));
    let mut notes = Vec::new();
    for (i, q) in timed_queries().enumerate() {
        print!("| {} |", q.name);
        let mine = &ours.queries[i];
        match mine {
            Ok(t) => print!(" {:.2} |", t.ms),
            Err(e) => print!(" {} |", short(e)),
        }
        for p in peers {
            match (&p.queries[i], mine) {
                (Ok(t), Ok(m)) => print!(" {:.2} | {} |", t.ms, ratio(m.ms, t.ms)),
                (Ok(t), Err(_)) => print!(" {:.2} | - |", t.ms),
                (Err(e), _) => print!(" {} | - |", short(e)),
            }
        }
        for r in &systems {
            if let Err(e) = &r.queries[i] {
                notes.push(format!("{} {}: {e}", q.name, r.system));
            }
        }
        // Every answer against the first one there is (Sluice's, unless it failed).
        let answers: Vec<(&str, &Timed)> = systems
            .iter()
            .filter_map(|r| r.queries[i].as_ref().ok().map(|t| (r.system, t)))
            .collect();
        let verdict = match answers.split_first() {
            None => "-".to_string(),
            Some((_, [])) => "(nothing to compare)".to_string(),
            Some(((first, reference), others)) => {
                let mut differ = Vec::new();
                for (other, t) in others {
                    let d = answer::differences(&reference.rows, &t.rows, q.ordered, 5);
                    if !d.is_empty() {
                        differ.push(*other);
                    }
                    for line in d {
                        notes.push(format!("{} mismatch, {first} vs {other}: {line}", q.name));
                    }
                }
                let all: Vec<&str> = answers.iter().map(|a| a.0).collect();
                if differ.is_empty() {
                    format!("agree ({})", all.join(", "))
                } else {
                    format!("DIFFER ({} vs {first})", differ.join(", "))
                }
            }
        };
        println!(" {verdict} |");
    }

    println!();
    let last = ALERT_CLIENTS[ALERT_CLIENTS.len() - 1];
    println!(
        "| alert query for {:.0} s | q/s | Sluice 1 client / it | Sluice {last} clients / it |",
        args.duration_secs,
    );
    println!("|---|---|---|---|");
    let sluice_qps: Vec<Option<f64>> = ours.alert.iter().map(|a| a.1.clone().ok()).collect();
    for r in &systems {
        for (how, qps) in &r.alert {
            match qps {
                Ok(qps) => {
                    let peer = !std::ptr::eq(*r, ours);
                    let vs = |s: Option<f64>| match s {
                        Some(s) if peer => ratio(s, *qps),
                        _ => "-".to_string(),
                    };
                    println!(
                        "| {}, {how} | {qps:.0} | {} | {} |",
                        r.system,
                        vs(sluice_qps[0]),
                        vs(sluice_qps[ALERT_CLIENTS.len() - 1])
                    );
                }
                Err(e) => {
                    println!("| {}, {how} | {} | - | - |", r.system, short(e));
                    notes.push(format!("alert rate {}, {how}: {e}", r.system));
                }
            }
        }
    }
    println!();
    println!(
        "Query times: one warm-up, then the best of 3; Sluice's over HTTP until the whole \
         response is read, the others' in-process. A ratio above 1x means Sluice took longer \
         (load, queries) or answered more queries per second (alert rate)."
    );
    for n in notes {
        println!("{n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A server that answers each request on one connection with the next of `answers`,
    /// written a few bytes at a time, so the client must put them together.
    fn serve(answers: Vec<&'static [u8]>) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            for a in answers {
                let _ = s.read(&mut buf).unwrap();
                for piece in a.chunks(7) {
                    s.write_all(piece).unwrap();
                    s.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        addr
    }

    #[test]
    fn the_lean_client_reads_sized_chunked_and_error_answers() {
        let addr = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n[{\"n\":209}]",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[{\"n\"\r\n6;x=1\r\n:209}]\r\n0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 9\r\n\r\nno table.",
        ]);
        let mut c = LeanConn::open(&addr).unwrap();
        let req = b"POST /v1/sql HTTP/1.1\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(c.ask(req).unwrap(), b"[{\"n\":209}]");
        assert_eq!(c.ask(req).unwrap(), b"[{\"n\":209}]");
        assert_eq!(c.ask(req).unwrap_err(), "HTTP 400: no table.");
        // The server hung up: a clear error, not a hang or a panic.
        assert!(c.ask(req).unwrap_err().contains("HTTP connection"));
    }
}

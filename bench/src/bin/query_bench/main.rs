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

mod cluster;
mod lean;
mod peer;
mod queries;
mod report;
mod sluice;

use anyhow::{Context, Result};
use clap::Parser;
use peer::run_peer;
use report::print_report;
use sluice::{alert_only, run_sluice};
use sluice_bench::Sluice;
use sluice_bench::answer::Rows;
use sluice_bench::nyct::{self, Generator};
use std::path::{Path, PathBuf};
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
    /// With `--cluster`: also print `EXPLAIN ANALYZE` of each timed query on the single node
    /// and on node 1 (computed), to see where a cluster query's time goes.
    #[arg(long)]
    explain: bool,
    /// Measure the timed queries on every node of an N-node cluster (on this machine)
    /// against one node, instead of Sluice against DuckDB.
    #[arg(long, default_value_t = 0)]
    cluster: usize,
    /// Only measure the alert-query rate against a server already running at this address
    /// (host:port of its HTTP listener, table `benchmark.nyct_lite` loaded): for profiling.
    #[arg(long)]
    alert_only: Option<String>,
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
    /// In the order of [`timed_queries`](queries::timed_queries).
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
    if args.cluster > 1 {
        return rt.block_on(cluster::run_cluster(&bin, &run, &files, &args));
    }
    let ours = rt.block_on(run_sluice(&bin, &run, &files, &args))?;

    let script = run.join("duckdb_queries.py");
    std::fs::write(&script, include_str!("../../../duckdb_queries.py"))?;
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

//! Measuring Sluice: loading the data over HTTP, timing each query, and the alert-query
//! rate from lean blocking clients and from the async HTTP client.

use super::lean::LeanConn;
use super::queries::{ALERT, Query, timed_queries};
use super::{ALERT_CLIENTS, Args, QUERY_TIMEOUT, Report, Timed};
use anyhow::{Result, bail};
use sluice_bench::Sluice;
use sluice_bench::answer::{self, Cell};
use sluice_bench::nyct;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub(super) async fn run_sluice(
    bin: &Path,
    dir: &Path,
    files: &[PathBuf],
    args: &Args,
) -> Result<Report> {
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

    let url = query_url(&sluice, args);
    let queries = timed_all(&sluice, args, "Sluice").await?;
    let duration = Duration::from_secs_f64(args.duration_secs);
    let alert = alert_rates(&sluice.http, &url, &text(&ALERT, args), duration).await;
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

/// Where the queries go, with `args`' options.
fn query_url(sluice: &Sluice, args: &Args) -> String {
    let cache = if args.no_result_cache {
        "&cache=off"
    } else {
        ""
    };
    format!(
        "http://{}/v1/sql?format=json&db=benchmark{cache}",
        sluice.http
    )
}

/// The text of `q` sent to Sluice.
pub(super) fn text(q: &Query, args: &Args) -> String {
    match args.qualify_table {
        true => q.sluice.replacen("nyct_lite", "benchmark.nyct_lite", 1),
        false => q.sluice.to_string(),
    }
}

/// Each timed query's best of three on `sluice` (printed as `who`'s), and its answer.
pub(super) async fn timed_all(
    sluice: &Sluice,
    args: &Args,
    who: &str,
) -> Result<Vec<Result<Timed, String>>> {
    let url = query_url(sluice, args);
    let client = http_client()?;
    let mut queries = Vec::new();
    for q in timed_queries() {
        let r = best_of_3(&client, &url, &text(q, args)).await;
        match &r {
            Ok(t) => eprintln!("{who} {}: {:.2} ms", q.name, t.ms),
            Err(e) => eprintln!("{who} {}: {e}", q.name),
        }
        queries.push(r);
    }
    Ok(queries)
}

/// The alert-query rate alone, from 1 and from 4 clients, against a running server.
pub(super) fn alert_only(addr: &str, args: &Args) -> Result<()> {
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
pub(super) async fn load(sluice: &Sluice, files: &[PathBuf], connections: usize) -> Result<f64> {
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

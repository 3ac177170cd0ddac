//! Measuring the peers (DuckDB, chDB): `bench/duckdb_queries.py` run on the same files.

use super::queries::{ALERT, Query, timed_queries};
use super::{Args, Report, Timed};
use anyhow::{Context, Result, bail};
use sluice_bench::answer;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `bench/duckdb_queries.py` for `engine`, installing its PyPI package first if needed.
pub(super) fn run_peer(
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

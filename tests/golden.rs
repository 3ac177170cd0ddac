//! Golden tests: every `tests/golden/*.slt` file runs against a fresh server (the real binary,
//! over HTTP) with fast compaction and retention, and every answer must equal the file's.
//!
//! The format is a small sqllogictest dialect; records are separated by blank lines:
//!
//! ```text
//! # a comment
//! env SLUICE_QUERY_HOT_CACHE_BYTES=0   (server settings for this file)
//!
//! statement ok
//! CREATE TABLE ...
//!
//! statement error <text the error message must contain>
//! SELECT ...
//!
//! write <db>.<table>
//! <CSV rows, stored as one durable write>
//!
//! query [rowsort]
//! SELECT ...
//! ----
//! <expected rows as CSV, no header; `rowsort` sorts both sides first>
//!
//! eventually
//! SELECT ...
//! ----
//! <expected rows: the query is repeated until it returns them (at most 30 s)>
//!
//! explain [analyze]
//! SELECT ...
//! ----
//! <lines that must each appear in EXPLAIN's output; EXPLAIN ANALYZE's is asked again until
//!  they do (at most 30 s: its figures may wait on work in the background)>
//!
//! restart
//! <nothing: the server is killed (SIGKILL) and started again on its data>
//! ```

mod common;

use common::{Server, eventually_eq};
use std::path::Path;

#[derive(Debug)]
enum Record {
    Statement {
        sql: String,
        error: Option<String>,
    },
    Write {
        db: String,
        table: String,
        body: String,
    },
    Query {
        sql: String,
        sort: bool,
        expected: Vec<String>,
    },
    Eventually {
        sql: String,
        expected: Vec<String>,
    },
    Explain {
        sql: String,
        analyze: bool,
        expected: Vec<String>,
    },
    Restart,
}

/// Parses a file into (line number, record).
fn parse(text: &str) -> Vec<(usize, Record)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_end();
        if line.is_empty() || line.starts_with('#') || line.starts_with("env ") {
            i += 1;
            continue;
        }
        let at = i + 1;
        let head = line;
        i += 1;
        let mut body = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() && lines[i] != "----" {
            body.push(lines[i]);
            i += 1;
        }
        let mut expected = Vec::new();
        if i < lines.len() && lines[i] == "----" {
            i += 1;
            while i < lines.len() && !lines[i].trim().is_empty() {
                expected.push(lines[i].to_string());
                i += 1;
            }
        }
        let sql = body.join("\n");
        let mut words = head.split_whitespace();
        let record = match words.next() {
            Some("statement") => match words.next() {
                Some("ok") => Record::Statement { sql, error: None },
                Some("error") => Record::Statement {
                    sql,
                    error: Some(head.splitn(3, ' ').nth(2).unwrap_or("").to_string()),
                },
                other => panic!("line {at}: statement {other:?}?"),
            },
            Some("write") => {
                let target = words.next().expect("write db.table");
                let (db, table) = target.split_once('.').expect("write db.table");
                Record::Write {
                    db: db.into(),
                    table: table.into(),
                    body: sql,
                }
            }
            Some("query") => Record::Query {
                sql,
                sort: words.next() == Some("rowsort"),
                expected,
            },
            Some("eventually") => Record::Eventually { sql, expected },
            Some("explain") => Record::Explain {
                sql,
                analyze: words.next() == Some("analyze"),
                expected,
            },
            Some("restart") => Record::Restart,
            other => panic!("line {at}: unknown record {other:?}"),
        };
        out.push((at, record));
    }
    out
}

/// Result rows as CSV lines, without the header.
async fn csv_rows(s: &Server, sql: &str) -> Result<Vec<String>, String> {
    let r = s.sql_fmt(sql, "csv").await;
    if r.status != 200 {
        return Err(format!("HTTP {}: {}", r.status, r.body));
    }
    Ok(r.body.lines().skip(1).map(str::to_string).collect())
}

async fn run_file(path: &Path) {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        ("SLUICE_COMPACTION_MIN_FILES", "4"),
        ("SLUICE_COMPACTION_INTERVAL", "200ms"),
        ("SLUICE_RETENTION_INTERVAL", "200ms"),
        ("SLUICE_BUFFER_CHECK_INTERVAL", "100ms"),
    ];
    for line in text.lines() {
        if let Some(kv) = line.strip_prefix("env ") {
            env.push(kv.split_once('=').expect("env KEY=VALUE"));
        }
    }
    let mut s = Server::start(dir.path(), &env);
    for (at, record) in parse(&text) {
        let place = format!("{name}:{at}");
        match record {
            Record::Statement { sql, error: None } => {
                let r = s.sql(&sql).await;
                assert_eq!(r.status, 200, "{place}: {sql}\n{}", r.body);
            }
            Record::Statement {
                sql,
                error: Some(want),
            } => {
                let r = s.sql(&sql).await;
                assert_ne!(r.status, 200, "{place}: expected an error: {sql}");
                assert!(
                    r.body.contains(&want),
                    "{place}: error should contain {want:?}, got {}",
                    r.body
                );
            }
            Record::Write { db, table, body } => {
                let r = s.write(&db, &table, "text/csv", body).await;
                assert_eq!(r.status, 204, "{place}: write: {}", r.body);
            }
            Record::Query {
                sql,
                sort,
                mut expected,
            } => {
                let mut got = csv_rows(&s, &sql)
                    .await
                    .unwrap_or_else(|e| panic!("{place}: {sql}\n{e}"));
                if sort {
                    got.sort();
                    expected.sort();
                }
                assert_eq!(got, expected, "{place}: {sql}");
            }
            Record::Eventually { sql, expected } => {
                let want = Ok(expected);
                eventually_eq(&format!("{place}: {sql}"), 30, &want, || csv_rows(&s, &sql)).await;
            }
            Record::Restart => {
                s.kill9();
                s = Server::start(dir.path(), &env);
            }
            Record::Explain {
                sql,
                analyze,
                expected,
            } => {
                let how = if analyze {
                    "EXPLAIN ANALYZE"
                } else {
                    "EXPLAIN"
                };
                let plan = || async {
                    let rows = s.rows(&format!("{how} {sql}")).await;
                    (rows.iter())
                        .map(|r| r["plan"].as_str().unwrap_or("").to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                // What a run measures may wait on work in the background (a cache filling):
                // asked again, for at most 30 s (a plain EXPLAIN is asked once).
                let secs = if analyze { 30 } else { 0 };
                let found = common::poll(secs, || async {
                    let plan = plan().await;
                    match expected.iter().find(|w| !plan.contains(w.as_str())) {
                        Some(want) => Err(format!("should contain {want:?}:\n{plan}")),
                        None => Ok(()),
                    }
                })
                .await;
                if let Err(why) = found {
                    panic!("{place}: {how} {sql}\n{why}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no golden files in {}", dir.display());
    for f in files {
        run_file(&f).await;
    }
}

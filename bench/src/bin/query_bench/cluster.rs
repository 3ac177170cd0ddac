//! `--cluster N`: the timed queries on every node of an N-node cluster (all on this
//! machine; each node keeps replicas of only its shards, replication factor 3), loaded
//! through node 1, against one node loaded alike, in the same run. Prints each node's best
//! of three per query, its ratio to the single node's, and whether its answer is the
//! single node's.

use super::Args;
use super::queries::timed_queries;
use super::sluice::{load, timed_all};
use anyhow::{Result, bail};
use sluice_bench::Sluice;
use sluice_bench::nyct;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) async fn run_cluster(
    bin: &Path,
    dir: &Path,
    files: &[PathBuf],
    args: &Args,
) -> Result<()> {
    let single = {
        let s = Sluice::start(bin, &dir.join("single"))?;
        s.sql(nyct::DDL).await?;
        load(&s, files, args.load_connections).await?;
        let timed = timed_all(&s, args, "single node").await?;
        explain(&s, args, "single node").await?;
        timed
    };
    let nodes =
        sluice_bench::start_cluster(bin, dir, args.cluster, Duration::from_secs(60)).await?;
    nodes[0].sql(nyct::DDL).await?;
    let secs = load(&nodes[0], files, args.load_connections).await?;
    eprintln!(
        "cluster: {} rows loaded through node 1 and flushed in {secs:.1} s",
        args.rows
    );
    let mut per_node = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        per_node.push(timed_all(n, args, &format!("node {}", i + 1)).await?);
    }
    explain(&nodes[0], args, "cluster node 1").await?;
    println!(
        "\n{}-node cluster against one node, {} rows{}: best of 3 per query (ms), ratio",
        args.cluster,
        args.rows,
        if args.no_result_cache {
            ", computed (cache=off)"
        } else {
            ""
        }
    );
    let mut header = "| query | one node |".to_string();
    for i in 1..=nodes.len() {
        header.push_str(&format!(" node {i} |"));
    }
    println!("{header}");
    println!("|---|---|{}", "---|".repeat(nodes.len()));
    let mut differ = Vec::new();
    for (q, query) in timed_queries().enumerate() {
        let Ok(one) = &single[q] else {
            println!("| {} | failed | |", query.name);
            continue;
        };
        let mut line = format!("| {} | {:.2} |", query.name, one.ms);
        for (i, node) in per_node.iter().enumerate() {
            match &node[q] {
                Ok(t) => {
                    line.push_str(&format!(" {:.2} ({:.2}x) |", t.ms, t.ms / one.ms));
                    let d = sluice_bench::answer::differences(&one.rows, &t.rows, query.ordered, 3);
                    if !d.is_empty() {
                        differ.push(format!(
                            "{} on node {}: {}",
                            query.name,
                            i + 1,
                            d.join("; ")
                        ));
                    }
                }
                Err(e) => {
                    line.push_str(" failed |");
                    differ.push(format!("{} on node {}: {e}", query.name, i + 1));
                }
            }
        }
        println!("{line}");
    }
    match differ.is_empty() {
        true => {
            println!("every node answered every query as the single node did");
            Ok(())
        }
        false => bail!(
            "answers differ from the single node's: {}",
            differ.join("; ")
        ),
    }
}

/// With `--explain`: each timed query's `EXPLAIN ANALYZE` on `s` (computed), printed.
async fn explain(s: &Sluice, args: &Args, who: &str) -> Result<()> {
    if !args.explain {
        return Ok(());
    }
    for query in timed_queries() {
        let q = query.sluice.replacen("nyct_lite", "benchmark.nyct_lite", 1);
        let plan = s.sql_uncached(&format!("EXPLAIN ANALYZE {q}")).await?;
        println!("\n{who} {}:\n{}", query.name, plan.replace("\\n", "\n"));
    }
    Ok(())
}

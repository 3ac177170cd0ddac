//! The report: load times, query times with their ratios and answer checks, alert rates.

use super::queries::timed_queries;
use super::{ALERT_CLIENTS, Args, Report, Timed};
use sluice_bench::answer;

pub(super) fn print_report(args: &Args, ours: &Report, peers: &[Report], failures: &[String]) {
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

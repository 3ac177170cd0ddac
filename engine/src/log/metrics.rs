//! The log's own figures for `/metrics`: what was appended, how records group into commits,
//! how long each `fdatasync` and each group's apply took. Counted by the writer and apply
//! threads with relaxed atomics (a few per group commit, none per record).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket bounds of the records in one group commit.
const GROUP_RECORDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];
/// Bucket bounds, in seconds, of one `fdatasync` or one group's apply.
const LATENCY_SECONDS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25,
];

/// A Prometheus histogram over fixed bounds: counts per bucket (not cumulative; summed when
/// rendered), the sum of the observations (in millionths, to stay an integer) and their count.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    sum_millionths: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_millionths: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    pub(crate) fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let millionths = (v * 1e6).round() as u64;
        self.sum_millionths.fetch_add(millionths, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends the histogram in Prometheus text format.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_millionths.load(Ordering::Relaxed) as f64 / 1e6;
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// The write-ahead log's figures.
#[derive(Debug)]
pub(crate) struct LogMetrics {
    /// Records made durable.
    appends: AtomicU64,
    /// Bytes written to segments (frames, not the zeros written ahead).
    bytes: AtomicU64,
    /// Records per group commit.
    group_records: Histogram,
    /// Seconds per `fdatasync` of a group.
    sync_seconds: Histogram,
    /// Seconds to apply a group to the buffers (after its sync, before its acknowledgements).
    apply_seconds: Histogram,
    /// Seconds a leader waited for more records before its sync (see the log's pace).
    wait_seconds: Histogram,
    /// Records that joined a group while its leader waited.
    gathered: AtomicU64,
}

impl Default for LogMetrics {
    fn default() -> Self {
        Self {
            appends: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            group_records: Histogram::new(GROUP_RECORDS),
            sync_seconds: Histogram::new(LATENCY_SECONDS),
            apply_seconds: Histogram::new(LATENCY_SECONDS),
            wait_seconds: Histogram::new(LATENCY_SECONDS),
            gathered: AtomicU64::new(0),
        }
    }
}

impl LogMetrics {
    /// A group of `records` in `bytes` was written; its sync took `sync` (`None`: durability
    /// is off and nothing was synced).
    pub(crate) fn committed(&self, records: u64, bytes: u64, sync: Option<Duration>) {
        self.appends.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.group_records.observe(records as f64);
        if let Some(d) = sync {
            self.sync_seconds.observe(d.as_secs_f64());
        }
    }

    /// A group was applied in `took`.
    pub(crate) fn applied(&self, took: Duration) {
        self.apply_seconds.observe(took.as_secs_f64());
    }

    /// A leader waited `took` for more records before its sync, and `gathered` joined.
    pub(crate) fn waited(&self, took: Duration, gathered: usize) {
        self.wait_seconds.observe(took.as_secs_f64());
        self.gathered.fetch_add(gathered as u64, Ordering::Relaxed);
    }

    /// Appends the figures in Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        let appends = self.appends.load(Ordering::Relaxed);
        let bytes = self.bytes.load(Ordering::Relaxed);
        let gathered = self.gathered.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP sluice_wal_appends_total Records made durable in the write-ahead log.\n\
             # TYPE sluice_wal_appends_total counter\nsluice_wal_appends_total {appends}\n\
             # HELP sluice_wal_bytes_total Bytes of records written to the write-ahead log.\n\
             # TYPE sluice_wal_bytes_total counter\nsluice_wal_bytes_total {bytes}\n\
             # HELP sluice_wal_wait_gathered_total Records that joined a group commit while \
             its leader waited for more before the sync.\n\
             # TYPE sluice_wal_wait_gathered_total counter\n\
             sluice_wal_wait_gathered_total {gathered}"
        );
        self.group_records.render(
            out,
            "sluice_wal_group_records",
            "Records per group commit (one write and one fdatasync).",
        );
        self.sync_seconds.render(
            out,
            "sluice_wal_fsync_seconds",
            "Seconds per fdatasync of a group commit.",
        );
        self.apply_seconds.render(
            out,
            "sluice_wal_apply_seconds",
            "Seconds to apply a durable group to the in-memory buffers and complete its appends.",
        );
        self.wait_seconds.render(
            out,
            "sluice_wal_wait_seconds",
            "Seconds a group commit's leader waited for more records before its fdatasync \
             (records came one at a time with the log idle in between).",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let m = LogMetrics::default();
        m.committed(1, 100, Some(Duration::from_micros(150)));
        m.committed(40, 4000, Some(Duration::from_millis(3)));
        m.committed(2, 10, None);
        m.applied(Duration::from_micros(30));
        m.waited(Duration::from_micros(900), 3);
        let mut text = String::new();
        m.render(&mut text);
        assert!(text.contains("sluice_wal_appends_total 43\n"), "{text}");
        assert!(text.contains("sluice_wal_bytes_total 4110\n"), "{text}");
        // Groups of 1, 2 and 40 records: 1 at le=1, 2 at le=2, all 3 from le=64 on.
        assert!(
            text.contains("sluice_wal_group_records_bucket{le=\"1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_group_records_bucket{le=\"2\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_group_records_bucket{le=\"32\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_group_records_bucket{le=\"64\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_group_records_count 3\n"),
            "{text}"
        );
        // Two syncs (the unsynced group is not one): 150 µs and 3 ms.
        assert!(
            text.contains("sluice_wal_fsync_seconds_bucket{le=\"0.0001\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_fsync_seconds_bucket{le=\"0.0002\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_fsync_seconds_bucket{le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_fsync_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_fsync_seconds_sum 0.00315\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_apply_seconds_count 1\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_wait_seconds_bucket{le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("sluice_wal_wait_gathered_total 3\n"),
            "{text}"
        );
    }
}

//! Broker counters, rendered as Prometheus text for `/metrics`.

use crate::router::Gauges;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the ack-latency histogram buckets.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

/// Counters; all relaxed atomics, read only for reporting.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) connections: AtomicU64,
    pub(crate) connections_total: AtomicU64,
    pub(crate) packets_in: AtomicU64,
    pub(crate) messages_in: AtomicU64,
    pub(crate) messages_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) rows_stored: AtomicU64,
    pub(crate) dead_letters: AtomicU64,
    /// Copies of messages queued for other nodes of a cluster (one per node).
    pub(crate) relayed_out: AtomicU64,
    /// Messages other nodes relayed here.
    pub(crate) relayed_in: AtomicU64,
    ack_buckets: [AtomicU64; BUCKETS.len() + 1],
    ack_sum_nanos: AtomicU64,
    ack_count: AtomicU64,
    /// Bucket counts when [`Metrics::recent_ack_quantiles`] last looked, and when.
    ack_seen: parking_lot::Mutex<([u64; BUCKETS.len() + 1], Option<std::time::Instant>)>,
}

/// Appends plain figures (name, help, value) as Prometheus text: a counter when the name
/// ends in `_total`, else a gauge.
pub(crate) fn render_values<'a>(
    out: &mut String,
    values: impl IntoIterator<Item = (&'a str, &'a str, u64)>,
) {
    for (name, help, v) in values {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    }
}

impl Metrics {
    /// Records the time from a PUBLISH's arrival to its ack being ready.
    pub(crate) fn observe_ack(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(BUCKETS.len());
        self.ack_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.ack_sum_nanos
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.ack_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Ack latency p50 and p99 in milliseconds over the acks since the previous call at
    /// least a second ago (the live page asks every second), interpolated within buckets;
    /// `None` when there were none.
    pub(crate) fn recent_ack_quantiles(&self) -> Option<(f64, f64)> {
        // Read under the lock, so two readers cannot store counts older than another's.
        let mut seen = self.ack_seen.lock();
        let now: Vec<u64> = (self.ack_buckets.iter())
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let delta: Vec<u64> = (now.iter().zip(seen.0))
            .map(|(n, s)| n.saturating_sub(s))
            .collect();
        if seen
            .1
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            seen.0.copy_from_slice(&now);
            seen.1 = Some(std::time::Instant::now());
        }
        let total: u64 = delta.iter().sum();
        if total == 0 {
            return None;
        }
        let quantile = |q: f64| {
            let rank = q * total as f64;
            let mut below = 0u64;
            for (i, n) in delta.iter().enumerate() {
                if *n > 0 && (below + n) as f64 >= rank {
                    let lo = if i == 0 { 0.0 } else { BUCKETS[i - 1] };
                    // The overflow bucket has no upper bound: report its lower one.
                    let hi = BUCKETS.get(i).copied().unwrap_or(lo);
                    let within = (rank - below as f64) / *n as f64;
                    return (lo + (hi - lo) * within) * 1000.0;
                }
                below += n;
            }
            BUCKETS[BUCKETS.len() - 1] * 1000.0
        };
        Some((quantile(0.5), quantile(0.99)))
    }

    /// (name, help, value) of every plain counter and gauge.
    pub(crate) fn values(&self, state: &Gauges) -> Vec<(&'static str, &'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            (
                "sluice_mqtt_connections",
                "Open MQTT connections",
                g(&self.connections),
            ),
            (
                "sluice_mqtt_connections_total",
                "MQTT connections accepted since start",
                g(&self.connections_total),
            ),
            (
                "sluice_mqtt_sessions",
                "MQTT sessions, online and offline",
                state.sessions,
            ),
            (
                "sluice_mqtt_sessions_online",
                "MQTT sessions with a connection attached",
                state.online,
            ),
            (
                "sluice_mqtt_subscriptions",
                "Subscriptions of all sessions (one per session and filter)",
                state.subscriptions,
            ),
            (
                "sluice_mqtt_queued_messages",
                "Messages queued for sessions, not yet sent",
                state.queued,
            ),
            (
                "sluice_mqtt_inflight_messages",
                "QoS 1/2 messages sent to sessions and not yet acknowledged",
                state.inflight,
            ),
            (
                "sluice_mqtt_dropped_messages",
                "Messages dropped from full offline queues (mqtt.max_queued_messages) of the sessions there are now",
                state.dropped,
            ),
            (
                "sluice_mqtt_retained_messages",
                "Retained messages",
                state.retained,
            ),
            (
                "sluice_mqtt_packets_received_total",
                "MQTT packets received",
                g(&self.packets_in),
            ),
            (
                "sluice_mqtt_messages_received_total",
                "PUBLISH messages received",
                g(&self.messages_in),
            ),
            (
                "sluice_mqtt_messages_sent_total",
                "PUBLISH messages sent to subscribers",
                g(&self.messages_out),
            ),
            (
                "sluice_mqtt_bytes_received_total",
                "Bytes received on MQTT connections",
                g(&self.bytes_in),
            ),
            (
                "sluice_mqtt_bytes_sent_total",
                "Bytes sent on MQTT connections",
                g(&self.bytes_out),
            ),
            (
                "sluice_mqtt_rows_stored_total",
                "Rows stored from MQTT messages",
                g(&self.rows_stored),
            ),
            (
                "sluice_mqtt_dead_letters_total",
                "Messages refused and kept in system.dead_letters",
                g(&self.dead_letters),
            ),
            (
                "sluice_mqtt_relayed_out_total",
                "Copies of messages sent to other cluster nodes' subscribers (one per node)",
                g(&self.relayed_out),
            ),
            (
                "sluice_mqtt_relayed_in_total",
                "Messages other cluster nodes sent to this node's subscribers",
                g(&self.relayed_in),
            ),
            (
                "sluice_mqtt_relay_dropped_total",
                "Messages for a cluster node dropped while it did not answer (its queue full)",
                state.relay_dropped,
            ),
        ]
    }

    /// Prometheus text exposition.
    pub(crate) fn render(&self, state: &Gauges) -> String {
        let mut out = String::new();
        render_values(&mut out, self.values(state));
        let name = "sluice_mqtt_ack_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} From PUBLISH received to its ack ready (stored durably)\n# TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.ack_buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.ack_buckets[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.ack_sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            out,
            "{name}_sum {sum}\n{name}_count {}",
            self.ack_count.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_quantiles_cover_the_acks_since_the_last_look() {
        let m = Metrics::default();
        assert_eq!(m.recent_ack_quantiles(), None);
        for _ in 0..98 {
            m.observe_ack(Duration::from_micros(700)); // bucket 0.5..1 ms
        }
        for _ in 0..2 {
            m.observe_ack(Duration::from_millis(40)); // bucket 25..50 ms
        }
        let (p50, p99) = m.recent_ack_quantiles().unwrap();
        assert!((0.5..=1.0).contains(&p50), "{p50}");
        assert!((25.0..=50.0).contains(&p99), "{p99}");
        // Looked at just now: the next look within a second still counts from before.
        assert!(m.recent_ack_quantiles().is_some());
    }
}

//! Sluice benchmarks.
//!
//! - `benches/wal.rs` (criterion): WAL appends with group commit, many appenders at once.
//! - `benches/apply.rs` (criterion): applying rows to partition buffers.
//! - `src/bin/http_write.rs`: end to end, N single-row HTTP writes from C connections against
//!   the real binary, with PostgreSQL doing single-row durable INSERTs from C connections
//!   (pgbench) in the same run, and the ratio.
//! - `src/bin/mqtt_load.rs`: end to end, C MQTT connections publishing one reading per
//!   message at QoS 0 or 1 into the real binary, and into Mosquitto in the same run.

/// Kills and reaps a child process (a server under test) when dropped.
#[derive(Debug)]
pub struct Killer(pub std::process::Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

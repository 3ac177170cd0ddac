//! When the leader of a group commit waits for more records before its sync.
//!
//! A sync costs the same CPU for one record as for many (here ~47 µs of a virtual CPU per
//! `fdatasync`, far more than the rest of a message's path). Records that come faster than
//! a commit takes group by themselves: those that come during one sync go in the next. A
//! fleet of devices each publishing now and then does not: its messages come one at a time
//! with the log idle in between, and each would be synced alone. So when records come
//! sparsely (the mean gap between them at least twice a commit's time) but one is expected
//! within `wal.max_commit_delay`, the leader waits up to that long, or until a few
//! have joined, before it syncs (PostgreSQL's `commit_delay`, measured instead of set).
//!
//! Only a *patient* record's leader waits: one whose sender is not waiting for it in a tight
//! loop ([`patiently`]: the broker marks a message that came from a client with nothing in
//! flight, long after its last acknowledgement, as a fleet's devices publish). A device that
//! sends its next message as soon as the last is acknowledged would lose the wait on every
//! message; when one of its records joins a waiting group, the wait ends at once. Waiting
//! also pays only when others come meanwhile: a wait that gained nothing makes the leaders
//! skip waiting for a number of groups, doubling each time it happens again (up to
//! [`MOST_REST`]).

use std::time::{Duration, Instant};

tokio::task_local! {
    /// Set while a patient append runs (see [`patiently`]).
    static PATIENT: bool;
}

/// Runs `append` (a future that appends to the log) as *patient*: its sender is in no hurry
/// (a device that publishes now and then, not one waiting for this acknowledgement to send
/// its next message), so its group commit may wait a little for more records before its
/// sync (`wal.max_commit_delay`).
pub async fn patiently<F: Future>(append: F) -> F::Output {
    PATIENT.scope(true, append).await
}

/// Whether the append being queued now runs under [`patiently`].
pub(super) fn patient() -> bool {
    PATIENT.try_with(|p| *p).unwrap_or(false)
}

/// Records a waiting leader hopes to gather (its own included): it syncs once this many are
/// queued, or once its wait is over.
pub(super) const GATHER: usize = 4;
/// The longest run of groups led without waiting after waits that gained nothing.
const MOST_REST: u32 = 1024;
/// The weight of the newest gap in the mean gap between records.
const WEIGHT: f64 = 1.0 / 8.0;

/// What the log knows of how records come.
#[derive(Debug)]
pub(super) struct Pace {
    /// The longest wait (zero: never wait).
    most: Duration,
    /// When the last record came.
    last: Option<Instant>,
    /// The mean gap between records, in seconds (a moving average).
    gap: Option<f64>,
    /// The mean time a group commit took (write and sync), in seconds.
    commit: f64,
    /// Groups still to lead without waiting.
    rest: u32,
    /// The rest after the next wait that gains nothing.
    backoff: u32,
}

impl Pace {
    /// A pace that waits at most `most` (zero: never).
    pub(super) fn new(most: Duration) -> Self {
        Self {
            most,
            last: None,
            gap: None,
            commit: 0.0,
            rest: 0,
            backoff: 1,
        }
    }

    /// A pace that has seen records come `gap` apart, and commits take no time.
    #[cfg(test)]
    pub(super) fn sparse(most: Duration, gap: Duration) -> Self {
        Self {
            gap: Some(gap.as_secs_f64()),
            ..Self::new(most)
        }
    }

    /// A record came now (called as it is queued); the clock is read only when the log may
    /// wait at all.
    pub(super) fn arrived_now(&mut self) {
        if !self.most.is_zero() {
            self.arrived(Instant::now());
        }
    }

    /// A record came at `now`.
    fn arrived(&mut self, now: Instant) {
        if let Some(last) = self.last.replace(now) {
            let gap = now.saturating_duration_since(last).as_secs_f64();
            self.gap = Some(match self.gap {
                Some(mean) => mean + (gap - mean) * WEIGHT,
                None => gap,
            });
        }
    }

    /// A group commit took `took` (write and sync).
    pub(super) fn committed(&mut self, took: Duration) {
        self.commit += (took.as_secs_f64() - self.commit) * WEIGHT;
    }

    /// How long the leader of a group of one record should wait for more, if at all.
    pub(super) fn wait(&mut self) -> Option<Duration> {
        let gap = self.gap?;
        let most = self.most.as_secs_f64();
        // Busy: records come during each commit and group by themselves. Or so sparse
        // that none is expected within the longest wait.
        if gap < 2.0 * self.commit || gap > most {
            return None;
        }
        if self.rest > 0 {
            self.rest -= 1;
            return None;
        }
        Some(Duration::from_secs_f64(
            (gap * (GATHER - 1) as f64).min(most),
        ))
    }

    /// A wait gathered `gained` records besides the leader's.
    pub(super) fn waited(&mut self, gained: usize) {
        if gained == 0 {
            self.rest = self.backoff;
            self.backoff = (self.backoff * 2).min(MOST_REST);
        } else {
            self.backoff = 1;
        }
    }
}

impl super::Shared {
    /// Before leading a group of one patient record: waits for more when records come
    /// sparsely but more are expected soon (see above), until [`GATHER`] are queued, an
    /// impatient one is, or the wait ends.
    pub(super) async fn linger(&self) {
        let gathered = self.gathered.notified();
        tokio::pin!(gathered);
        let wait = {
            let mut q = self.queue.lock();
            if q.waiting.len() != 1 || !q.waiting[0].patient {
                return;
            }
            let Some(wait) = q.pace.wait() else {
                return;
            };
            gathered.as_mut().enable();
            q.lingering = true;
            wait
        };
        let started = std::time::Instant::now();
        let _ = tokio::time::timeout(wait, gathered).await;
        let gained = {
            let mut q = self.queue.lock();
            q.lingering = false;
            let gained = q.waiting.len().saturating_sub(1);
            q.pace.waited(gained);
            gained
        };
        self.metrics.waited(started.elapsed(), gained);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paced(gap_us: u64, commit_us: u64) -> Pace {
        let mut p = Pace::new(Duration::from_millis(1));
        let start = Instant::now();
        for i in 0..64 {
            p.arrived(start + Duration::from_micros(gap_us * i));
        }
        for _ in 0..64 {
            p.committed(Duration::from_micros(commit_us));
        }
        p
    }

    #[test]
    fn waits_only_when_records_come_sparsely_but_within_reach() {
        // A fleet: a record every 300 µs, commits of 100 µs.
        let wait = paced(300, 100).wait().expect("waits");
        assert_eq!(wait, Duration::from_micros(900));
        // Busy: a record every 50 µs groups by itself.
        assert_eq!(paced(50, 100).wait(), None);
        // Up to the longest wait.
        assert_eq!(paced(600, 100).wait(), Some(Duration::from_millis(1)));
        // None expected within it.
        assert_eq!(paced(5_000, 100).wait(), None);
        // Never, when the longest wait is zero.
        let mut off = Pace::new(Duration::ZERO);
        off.arrived_now();
        off.arrived_now();
        assert_eq!(off.wait(), None);
    }

    #[test]
    fn waits_that_gain_nothing_back_off() {
        let mut p = paced(300, 100);
        let mut waits = 0;
        for _ in 0..4_000 {
            if p.wait().is_some() {
                waits += 1;
                p.waited(0);
            }
        }
        // 1 + 1 + 2 + 4 + ... + 1024 groups between the first waits, then every 1,025th.
        assert!((10..=16).contains(&waits), "{waits} waits");
        // A wait that gathers resets the rest.
        p.rest = 0;
        p.waited(2);
        assert!(p.wait().is_some());
        assert!(p.wait().is_some());
    }
}

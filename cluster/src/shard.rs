//! A data shard's state machine ([`ShardStateMachine`]): its rows, applied to the engine's
//! buffers in log order with re-sent copies dropped by write id; its snapshot, the log
//! position up to which its rows are in files on the shared store.

use crate::raft::sm::GroupState;
use crate::raft::types::{Command, Response, from_cbor, to_cbor};
use crate::writes::WRITE_HEADER;
use bytes::Bytes;
use parking_lot::Mutex;
use sluice_engine::Engine;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How many recent write ids a shard remembers per writer to drop re-sent copies (a
/// multiple of 64).
const DEDUP_WINDOW: u64 = 1 << 20;
/// Incarnations (runs) of one writer node whose write ids a shard remembers.
const INCARNATIONS_KEPT: usize = 4;

/// What a shard's snapshot holds: its log up to `through` is in files the metadata group
/// had installed by its entry `manifest_index`. With it, the duplicate filter as of entry
/// `applied` (at or after `through`) and the copies it dropped after `through`: the entries
/// after `through` are applied again after a restore, and must drop the same copies.
#[derive(serde::Serialize, serde::Deserialize)]
struct ShardSnapshot {
    through: u64,
    manifest_index: u64,
    applied: u64,
    seen: Vec<((u64, u64), Recent)>,
    dropped: Vec<(u64, [u8; WRITE_HEADER])>,
}

/// After a restore, until entry `upto`: the copies to drop are known (`dropped`, by log
/// index and write header), and the filter already holds every write up to `upto`.
struct Replay {
    upto: u64,
    dropped: HashSet<(u64, [u8; WRITE_HEADER])>,
}

/// A data shard's state: its rows, in the engine's buffers and files.
pub(crate) struct ShardStateMachine {
    shard: u32,
    engine: Weak<Engine>,
    /// The last log index applied.
    applied: AtomicU64,
    /// (writer node, incarnation) -> the writes of it applied recently.
    seen: Mutex<HashMap<(u64, u64), Recent>>,
    /// Copies dropped since the last snapshot's position: (log index, write header).
    dropped: Mutex<Vec<(u64, [u8; WRITE_HEADER])>>,
    /// Set by a restore, while the entries the snapshot's filter already holds come again.
    replay: Mutex<Option<Replay>>,
    /// Whether `replay` is set: read per write, so the lock is taken only after a restore.
    replaying: AtomicBool,
}

/// One writer incarnation's recent write ids: a bit per sequence number in the window
/// below the highest seen (128 KiB), decided from the log alone so every replica drops the
/// same copies.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Recent {
    max: u64,
    bits: Vec<u64>,
}

impl Recent {
    fn new(first: u64) -> Self {
        let mut r = Self {
            max: first,
            bits: vec![0; (DEDUP_WINDOW / 64) as usize],
        };
        r.flip(first);
        r
    }

    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % DEDUP_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn flip(&mut self, seq: u64) {
        let (w, b) = Self::slot(seq);
        self.bits[w] ^= b;
    }

    /// Records `seq`; whether it was recorded before. A sequence number older than the
    /// window is taken as new: a duplicate row is better than a lost one.
    fn insert(&mut self, seq: u64) -> bool {
        if seq > self.max {
            if seq - self.max >= DEDUP_WINDOW {
                self.bits.fill(0);
            } else {
                for s in self.max + 1..=seq {
                    let (w, b) = Self::slot(s);
                    self.bits[w] &= !b;
                }
            }
            self.max = seq;
            self.flip(seq);
            return false;
        }
        if self.max - seq >= DEDUP_WINDOW {
            return false;
        }
        let (w, b) = Self::slot(seq);
        let seen = self.bits[w] & b != 0;
        self.bits[w] |= b;
        seen
    }
}

impl ShardStateMachine {
    pub(crate) fn new(shard: u32, engine: Weak<Engine>) -> Self {
        Self {
            shard,
            engine,
            applied: AtomicU64::new(0),
            seen: Mutex::new(HashMap::new()),
            dropped: Mutex::new(Vec::new()),
            replay: Mutex::new(None),
            replaying: AtomicBool::new(false),
        }
    }

    /// Whether the write with this header, in the entry at `index`, is a copy of one
    /// applied before; remembered until a snapshot covers `index`.
    fn is_copy(&self, index: u64, header: &[u8; WRITE_HEADER]) -> bool {
        let replayed = if self.replaying.load(Ordering::Acquire) {
            let mut replay = self.replay.lock();
            match replay.as_ref() {
                Some(r) if index <= r.upto => Some(r.dropped.contains(&(index, *header))),
                _ => {
                    *replay = None;
                    self.replaying.store(false, Ordering::Release);
                    None
                }
            }
        } else {
            None
        };
        let copy = replayed.unwrap_or_else(|| self.seen_before(header));
        if copy {
            self.dropped.lock().push((index, *header));
        }
        copy
    }

    /// The snapshot of this shard for entries up to `through`.
    fn snapshot_at(&self, through: u64, manifest_index: u64) -> ShardSnapshot {
        let replay = self.replay.lock();
        let mut dropped = self.dropped.lock();
        dropped.retain(|(i, _)| *i > through);
        let mut all = dropped.clone();
        let mut applied = self.applied.load(Ordering::Acquire);
        if let Some(r) = replay.as_ref() {
            // Mid-replay the filter is at `upto`, and the copies still to come are known.
            applied = applied.max(r.upto);
            let pending = r.dropped.iter().filter(|(i, _)| *i > through);
            all.extend(pending.filter(|d| !dropped.contains(d)));
        }
        let seen = self.seen.lock();
        ShardSnapshot {
            through,
            manifest_index,
            applied,
            seen: seen.iter().map(|(k, r)| (*k, r.clone())).collect(),
            dropped: all,
        }
    }

    /// Takes the duplicate filter of a snapshot.
    fn restore_filter(&self, snap: &ShardSnapshot) {
        *self.seen.lock() = snap.seen.iter().cloned().collect();
        *self.dropped.lock() = snap.dropped.clone();
        *self.replay.lock() = Some(Replay {
            upto: snap.applied,
            dropped: snap.dropped.iter().copied().collect(),
        });
        self.replaying.store(true, Ordering::Release);
        self.applied.store(snap.through, Ordering::Release);
    }

    /// Whether the write with this header was applied before (a re-sent copy).
    fn seen_before(&self, header: &[u8]) -> bool {
        let word = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().unwrap_or_default());
        let (writer, seq) = ((word(0), word(8)), word(16));
        let mut seen = self.seen.lock();
        if let Some(r) = seen.get_mut(&writer) {
            return r.insert(seq);
        }
        // A writer's new incarnation (it restarted): forget all but its latest few.
        let mut older: Vec<u64> = (seen.keys())
            .filter(|(node, _)| *node == writer.0)
            .map(|(_, inc)| *inc)
            .collect();
        older.sort_unstable();
        while older.len() >= INCARNATIONS_KEPT {
            seen.remove(&(writer.0, older.remove(0)));
        }
        seen.insert(writer, Recent::new(seq));
        false
    }
}

impl GroupState for ShardStateMachine {
    fn apply(&self, index: u64, command: &Command) -> Response {
        self.applied.store(index, Ordering::Release);
        let Command::Write(body) = command else {
            return Response::default();
        };
        let Some(engine) = self.engine.upgrade() else {
            return Response::default();
        };
        let (mut writes, mut error) = (Vec::new(), None);
        let mut rest = &body[..];
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = u32::from_le_bytes(*len) as usize;
            let Some((entry, tail)) = tail.split_at_checked(len) else {
                error = Some("a truncated write in a shard entry".to_string());
                break;
            };
            rest = tail;
            let Some((header, payload)) = entry.split_first_chunk::<WRITE_HEADER>() else {
                continue;
            };
            if !self.is_copy(index, header) {
                writes.push(payload);
            }
        }
        let (rows, failed) = engine.apply_replicated(self.shard, index, &writes);
        if let Some(e) = failed {
            error.get_or_insert(e.to_string());
        }
        Response { rows, error }
    }

    /// The position up to which the shard's rows are all in installed files.
    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)> {
        let applied = self.applied.load(Ordering::Acquire);
        let (through, manifest_index) = match self.engine.upgrade() {
            Some(e) => (
                e.shard_persisted_through(self.shard).unwrap_or(applied),
                e.manifest_index(),
            ),
            None => (0, 0),
        };
        let data = to_cbor(&self.snapshot_at(through, manifest_index))?;
        Ok((Some(through), Bytes::from(data)))
    }

    /// Catching up from the shared store: the files (named by the manifest the metadata
    /// group brings) hold the shard's rows up to the snapshot; only later entries follow.
    fn restore(&self, data: &[u8]) -> io::Result<()> {
        let snap: ShardSnapshot = from_cbor(data)?;
        let engine = self
            .engine
            .upgrade()
            .ok_or_else(|| io::Error::other("shutting down"))?;
        engine
            .restore_shard(self.shard, snap.through, snap.manifest_index)
            .map_err(io::Error::other)?;
        self.restore_filter(&snap);
        tracing::info!(
            shard = self.shard,
            through = snap.through,
            "shard restored from the shared store"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(writer: u64, seq: u64) -> [u8; WRITE_HEADER] {
        let mut h = [0; WRITE_HEADER];
        h[..8].copy_from_slice(&writer.to_le_bytes());
        h[8..16].copy_from_slice(&1u64.to_le_bytes());
        h[16..].copy_from_slice(&seq.to_le_bytes());
        h
    }

    /// A shard restored from a snapshot whose position is behind the entries its filter
    /// had seen drops exactly the copies the original dropped, when those entries come again
    /// and after them (also when the snapshot is taken again mid-replay).
    #[test]
    fn a_restored_shard_drops_the_same_copies() {
        // Re-sent copies: entry 3 of 1's write, 5 of 2's (straddling the snapshot at 2), 7
        // of 3's (after everything the snapshot saw), 8 of 1's again.
        let log: Vec<(u64, [u8; WRITE_HEADER])> = [(1, 1), (2, 2), (3, 1), (4, 3), (5, 2)]
            .into_iter()
            .chain([(6, 4), (7, 3), (8, 1), (9, 5)])
            .map(|(i, seq)| (i, header(7, seq)))
            .collect();
        let original = ShardStateMachine::new(0, Weak::new());
        let want: Vec<bool> = log.iter().map(|(i, h)| original.is_copy(*i, h)).collect();
        assert_eq!(
            want,
            [false, false, true, false, true, false, true, true, false]
        );

        let source = ShardStateMachine::new(0, Weak::new());
        for (i, h) in &log[..5] {
            source.is_copy(*i, h);
        }
        source.applied.store(5, Ordering::Release);
        let snap = source.snapshot_at(2, 0);
        let bytes = to_cbor(&snap).unwrap();
        let restored = ShardStateMachine::new(0, Weak::new());
        restored.restore_filter(&from_cbor(&bytes).unwrap());
        let got: Vec<bool> = log[2..]
            .iter()
            .map(|(i, h)| restored.is_copy(*i, h))
            .collect();
        assert_eq!(got, want[2..]);

        // Again, from a snapshot taken after replaying entry 3 only.
        let again = ShardStateMachine::new(0, Weak::new());
        again.restore_filter(&snap);
        again.is_copy(log[2].0, &log[2].1);
        again.applied.store(3, Ordering::Release);
        let snap = again.snapshot_at(3, 0);
        let last = ShardStateMachine::new(0, Weak::new());
        last.restore_filter(&snap);
        let got: Vec<bool> = log[3..].iter().map(|(i, h)| last.is_copy(*i, h)).collect();
        assert_eq!(got, want[3..]);
    }

    #[test]
    fn recent_write_ids_drop_copies_within_the_window() {
        let mut r = Recent::new(10);
        assert!(r.insert(10), "the first one again");
        assert!(!r.insert(12));
        assert!(!r.insert(11), "an earlier one arriving late is new");
        assert!(r.insert(11) && r.insert(12));
        // Far ahead: everything before is forgotten, and bits reused by the ring are clear.
        let far = 12 + DEDUP_WINDOW;
        assert!(!r.insert(far));
        assert!(!r.insert(far - 1));
        assert!(r.insert(far - 1));
        assert!(
            !r.insert(12),
            "older than the window: kept rather than lost"
        );
        assert!(!r.insert(far + 100));
        assert!(!r.insert(far + 50), "a slot cleared by moving ahead");
    }
}

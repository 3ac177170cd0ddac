//! openraft's storage test suite against the durable log and the state machine, plus what the
//! suite does not check: that the log and snapshots survive a reopen, and that a torn tail is
//! cut off.

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::impls::leader_id_adv::LeaderId;
use openraft::storage::{IOFlushed, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::type_config::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::{Entry, LogId, RaftLogReader, StorageError};
use parking_lot::Mutex;
use sluice_cluster::{
    Command, GroupId, GroupState, LogStore, LogWriter, Response, StateMachine, Tc, to_cbor,
};
use std::io;
use std::path::Path;
use std::sync::Arc;

const SHARD: GroupId = GroupId::Shard(0);

/// Applies commands to a list (snapshots are the list in CBOR-free form: one line each).
#[derive(Debug, Default, Clone)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl GroupState for Lines {
    fn apply(&self, index: u64, command: &Command) -> Response {
        self.0.lock().push(format!("{index}:{command}"));
        Response {
            rows: 1,
            error: None,
        }
    }

    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)> {
        Ok((None, Bytes::from(self.0.lock().join("\n"))))
    }

    fn restore(&self, data: &[u8]) -> io::Result<()> {
        let text = std::str::from_utf8(data).map_err(io::Error::other)?;
        *self.0.lock() = text.lines().map(str::to_string).collect();
        Ok(())
    }
}

struct Builder;

impl StoreBuilder<Tc, LogStore, StateMachine<Lines>, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine<Lines>), StorageError<Tc>> {
        let dir = tempfile::tempdir().map_err(io_err)?;
        let writer = LogWriter::open(&dir.path().join("raft.log")).map_err(io_err)?;
        let log = LogStore::open(SHARD, &writer);
        let sm = StateMachine::open(&dir.path().join("sm"), Lines::default()).map_err(io_err)?;
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(Builder).await.unwrap();
}

fn io_err(e: io::Error) -> StorageError<Tc> {
    StorageError::from_io_error(openraft::ErrorSubject::Store, openraft::ErrorVerb::Write, e)
}

fn log_id(term: u64, index: u64) -> LogIdOf<Tc> {
    LogId::new(LeaderId { term, node_id: 1 }, index)
}

fn entry(term: u64, index: u64) -> EntryOf<Tc> {
    Entry::new_normal(
        log_id(term, index),
        Command::Write(Bytes::from(format!("rows {index}"))),
    )
}

/// Appends `entries` and waits until they are durable.
async fn append(log: &mut LogStore, entries: Vec<EntryOf<Tc>>) {
    let (tx, rx) = Tc::oneshot();
    log.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

async fn indexes(log: &mut LogStore) -> Vec<u64> {
    let entries = log.try_get_log_entries(0..u64::MAX).await.unwrap();
    entries.iter().map(|e| e.index()).collect()
}

/// The node's log writer on `path` with `group`'s log (and the writer, to open more groups).
fn open(path: &Path, group: GroupId) -> (Arc<LogWriter>, LogStore) {
    let writer = LogWriter::open(path).unwrap();
    let log = LogStore::open(group, &writer);
    (writer, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_survives_reopening_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.log");
    let (writer, mut log) = open(&path, SHARD);
    // Another group's records go to the same file, between this one's.
    let mut meta = LogStore::open(GroupId::Meta, &writer);
    append(&mut meta, (1..=4).map(|i| entry(5, i)).collect()).await;
    // And a group that leaves the node is gone after a reopen.
    let mut gone = LogStore::open(GroupId::Shard(7), &writer);
    append(&mut gone, (1..=4).map(|i| entry(1, i)).collect()).await;
    writer.remove(GroupId::Shard(7)).await.unwrap();
    append(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
    meta.save_vote(&VoteOf::<Tc>::new_committed(5, 2))
        .await
        .unwrap();
    log.save_vote(&VoteOf::<Tc>::new_committed(2, 1))
        .await
        .unwrap();
    // A new leader overwrites 8.. with its own entries; 1..=3 are purged.
    log.truncate_after(Some(log_id(1, 7))).await.unwrap();
    append(&mut log, vec![entry(2, 8), entry(2, 9)]).await;
    meta.purge(log_id(5, 1)).await.unwrap();
    log.purge(log_id(1, 3)).await.unwrap();
    log.save_committed(Some(log_id(2, 8))).await.unwrap();
    // Everything queued so far is on disk once a later append is.
    append(&mut log, vec![entry(2, 10)]).await;
    drop((writer, log, meta, gone));

    let (writer, mut log) = open(&path, SHARD);
    assert_eq!(indexes(&mut log).await, (4..=10).collect::<Vec<_>>());
    let e = log.try_get_log_entries(8..9).await.unwrap();
    assert_eq!(e[0].log_id(), log_id(2, 8));
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(VoteOf::<Tc>::new_committed(2, 1))
    );
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 8)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(2, 10)));
    let mut meta = LogStore::open(GroupId::Meta, &writer);
    assert_eq!(indexes(&mut meta).await, vec![2, 3, 4]);
    assert_eq!(
        meta.read_vote().await.unwrap(),
        Some(VoteOf::<Tc>::new_committed(5, 2))
    );
    // A group never written to is empty, and so is the removed one.
    let mut none = LogStore::open(GroupId::Shard(9), &writer);
    assert_eq!(none.get_log_state().await.unwrap().last_log_id, None);
    let mut gone = LogStore::open(GroupId::Shard(7), &writer);
    assert_eq!(indexes(&mut gone).await, Vec::<u64>::new());
    drop((writer, log, meta, none, gone));

    // A crash leaves the space reserved past the records: zeros, read as the clean end.
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len + (1 << 20)).unwrap();
    drop(f);
    let (writer, mut log) = open(&path, SHARD);
    assert_eq!(indexes(&mut log).await, (4..=10).collect::<Vec<_>>());
    drop((writer, log));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);

    // A crash in the middle of writing the last record: it was never acknowledged, and
    // opening cuts it off (and appending goes on after it).
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let (writer, mut log) = open(&path, SHARD);
    assert_eq!(indexes(&mut log).await, (4..=9).collect::<Vec<_>>());
    append(&mut log, vec![entry(3, 10)]).await;
    drop((writer, log));
    let (writer, mut log) = open(&path, SHARD);
    assert_eq!(indexes(&mut log).await, (4..=10).collect::<Vec<_>>());
    let e = log.try_get_log_entries(10..11).await.unwrap();
    assert_eq!(e[0].log_id(), log_id(3, 10));
    let mut meta = LogStore::open(GroupId::Meta, &writer);
    assert_eq!(indexes(&mut meta).await, vec![2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_group_is_forgotten_and_a_rewrite_keeps_every_live_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.log");
    // Rewritten once 16 KiB or more, at most a quarter live.
    let writer = LogWriter::open_with(&path, 16 << 10).unwrap();
    let mut a = LogStore::open(GroupId::Shard(1), &writer);
    let mut b = LogStore::open(GroupId::Shard(2), &writer);
    let mut gone = LogStore::open(GroupId::Shard(3), &writer);
    append(&mut gone, (1..=5).map(|i| entry(1, i)).collect()).await;
    writer.remove(GroupId::Shard(3)).await.unwrap();
    let refused = gone.save_vote(&VoteOf::<Tc>::new_committed(2, 1)).await;
    assert!(refused.is_err(), "a removed group's log takes no writes");
    drop(gone);

    a.save_vote(&VoteOf::<Tc>::new_committed(1, 1))
        .await
        .unwrap();
    for i in 1..=300 {
        append(&mut a, vec![entry(1, i)]).await;
        append(&mut b, vec![entry(1, i)]).await;
    }
    b.save_committed(Some(log_id(1, 290))).await.unwrap();
    let before = writer.bytes();
    assert!(before > 16 << 10, "{before} bytes");
    a.purge(log_id(1, 290)).await.unwrap();
    b.purge(log_id(1, 295)).await.unwrap();
    // The rewrite runs on the writer thread right after the batch that queued it: the first
    // append may share that batch, the second is written after the rewrite.
    append(&mut a, vec![]).await;
    append(&mut a, vec![entry(1, 301)]).await;
    let now = writer.bytes();
    assert!(now < before / 4, "not rewritten: {now} of {before} bytes");
    drop((writer, a, b));
    // Closed, the file gives back the space reserved past its records.
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len < before / 4, "{len} of {before} bytes on disk");

    let writer = LogWriter::open(&path).unwrap();
    let mut a = LogStore::open(GroupId::Shard(1), &writer);
    let mut b = LogStore::open(GroupId::Shard(2), &writer);
    let mut gone = LogStore::open(GroupId::Shard(3), &writer);
    assert_eq!(indexes(&mut a).await, (291..=301).collect::<Vec<_>>());
    assert_eq!(indexes(&mut b).await, (296..=300).collect::<Vec<_>>());
    assert_eq!(
        a.read_vote().await.unwrap(),
        Some(VoteOf::<Tc>::new_committed(1, 1))
    );
    assert_eq!(b.read_committed().await.unwrap(), Some(log_id(1, 290)));
    let state = b.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 295)));
    assert_eq!(indexes(&mut gone).await, Vec::<u64>::new());
}

/// A record of the old layout (a file per group: no group in the record).
fn old_record(out: &mut Vec<u8>, kind: u8, cbor: &[u8]) {
    let mut body = vec![kind];
    body.extend_from_slice(cbor);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_the_old_layout_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.log");
    let mut bytes = Vec::new();
    for i in 1..=6 {
        old_record(&mut bytes, 1, &to_cbor(&entry(1, i)).unwrap());
    }
    old_record(
        &mut bytes,
        2,
        &to_cbor(&VoteOf::<Tc>::new_committed(1, 1)).unwrap(),
    );
    old_record(&mut bytes, 5, &to_cbor(&log_id(1, 2)).unwrap());
    std::fs::write(&old, &bytes).unwrap();

    let path = dir.path().join("raft.log");
    let writer = LogWriter::open(&path).unwrap();
    writer.take_over(SHARD, &old).await.unwrap();
    drop(writer);
    // A crash during the copy: its closing record (17 bytes) and the end of its last entry
    // never reached the disk. The old file is still there, and the copy is made again.
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 17 - 5).unwrap();
    drop(f);
    let writer = LogWriter::open(&path).unwrap();
    writer.take_over(SHARD, &old).await.unwrap();
    let mut log = LogStore::open(SHARD, &writer);
    assert_eq!(indexes(&mut log).await, (3..=6).collect::<Vec<_>>());
    append(&mut log, vec![entry(2, 7)]).await;
    // Taken over already (a crash before the old file was deleted): nothing changes.
    writer.take_over(SHARD, &old).await.unwrap();
    drop((writer, log));

    let (_writer, mut log) = open(&path, SHARD);
    assert_eq!(indexes(&mut log).await, (3..=7).collect::<Vec<_>>());
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(VoteOf::<Tc>::new_committed(1, 1))
    );
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sm");
    let mut sm = StateMachine::open(&path, Lines::default()).unwrap();
    let entries: Vec<_> = (1..=3).map(|i| Ok((entry(1, i), None))).collect();
    sm.apply(futures::stream::iter(entries)).await.unwrap();
    let built = sm.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 3)));
    drop(sm);

    let lines = Lines::default();
    let mut sm = StateMachine::open(&path, lines.clone()).unwrap();
    // Transient: nothing applied until openraft installs the kept snapshot.
    assert_eq!(sm.applied_state().await.unwrap().0, None);
    let kept = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(kept.meta, built.meta);
    sm.install_snapshot(&kept.meta, kept.snapshot)
        .await
        .unwrap();
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 3)));
    assert_eq!(
        *lines.0.lock(),
        vec!["1:write(6 bytes)", "2:write(6 bytes)", "3:write(6 bytes)"]
    );
}

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
use sluice_cluster::{Apply, Command, LogStore, LogWriter, Response, StateMachine, Tc};
use std::io;
use std::sync::Arc;

/// Applies commands to a list (snapshots are the list in CBOR-free form: one line each).
#[derive(Debug, Default, Clone)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Apply for Lines {
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
        let writer = LogWriter::start().map_err(io_err)?;
        let log = LogStore::open(&dir.path().join("log"), writer).map_err(io_err)?;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_survives_reopening_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let writer = LogWriter::start().unwrap();
    let mut log = LogStore::open(&path, writer.clone()).unwrap();
    append(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
    log.save_vote(&VoteOf::<Tc>::new_committed(2, 1))
        .await
        .unwrap();
    // A new leader overwrites 8.. with its own entries; 1..=3 are purged.
    log.truncate_after(Some(log_id(1, 7))).await.unwrap();
    append(&mut log, vec![entry(2, 8), entry(2, 9)]).await;
    log.purge(log_id(1, 3)).await.unwrap();
    log.save_committed(Some(log_id(2, 8))).await.unwrap();
    // Everything queued so far is on disk once a later append is.
    append(&mut log, vec![entry(2, 10)]).await;
    drop(log);

    let mut log = LogStore::open(&path, writer.clone()).unwrap();
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
    drop(log);

    // A crash in the middle of writing the last record: it was never acknowledged, and
    // opening cuts it off (and appending goes on after it).
    let file = path.join("raft.log");
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let mut log = LogStore::open(&path, writer.clone()).unwrap();
    assert_eq!(indexes(&mut log).await, (4..=9).collect::<Vec<_>>());
    append(&mut log, vec![entry(3, 10)]).await;
    drop(log);
    let mut log = LogStore::open(&path, writer).unwrap();
    assert_eq!(indexes(&mut log).await, (4..=10).collect::<Vec<_>>());
    let e = log.try_get_log_entries(10..11).await.unwrap();
    assert_eq!(e[0].log_id(), log_id(3, 10));
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

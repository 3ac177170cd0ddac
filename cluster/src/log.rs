//! A group's raft log on local disk, with one group commit for every group of a node.
//!
//! Each group keeps one append-only file, `raft.log`, of records
//! `[body length u32][crc32 of body u32][body]`, the body being a kind byte and CBOR:
//! an entry, the vote, the committed log id, a truncation or a purge. Opening replays the
//! file into memory (entries stay in memory until purged: a shard's log is purged once its
//! rows are in Parquet); a torn record at the end (a crash during a write that was never
//! acknowledged) is cut off.
//!
//! Writes go through the node's [`LogWriter`]: one thread that takes everything queued, by
//! every group, writes it, syncs each file written once, then reports each append durable to
//! openraft (the single-node WAL's discipline: log, then apply, then ack). Entries are
//! readable from memory as soon as `append` returns; their callback fires after the sync. The
//! vote and truncations wait for their sync before returning. Once purged records make up
//! most of a large file it is rewritten with what is live, through the same thread, so the
//! rewrite lands in order with the appends before and after it.

use crate::types::{Tc, from_cbor, to_cbor};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::{LogState, RaftLogReader};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use tokio::sync::oneshot;

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const COMMITTED: u8 = 3;
const TRUNCATE: u8 = 4;
const PURGE: u8 = 5;
/// Largest record body accepted on replay (a longer length is a torn or corrupt record).
const MAX_BODY: usize = 256 << 20;
/// A file is rewritten once it is at least this large...
const REWRITE_MIN: u64 = 64 << 20;
/// ...and at most this share of it is live.
const REWRITE_LIVE_SHARE: u64 = 4;
/// Most jobs written before one sync.
const MAX_BATCH: usize = 8192;

/// The node's log writer: one thread doing every group's writes and syncs (see the module
/// docs). It stops once every [`LogStore`] using it is gone.
#[derive(Debug)]
pub struct LogWriter {
    tx: Mutex<mpsc::Sender<Job>>,
}

struct Job {
    file: Arc<GroupFile>,
    op: Op,
    done: Done,
}

enum Op {
    Append(Vec<u8>),
    /// Replace the whole file with these records.
    Rewrite(Vec<u8>),
}

enum Done {
    Flushed(IOFlushed<Tc>),
    Signal(oneshot::Sender<io::Result<()>>),
    Nothing,
}

impl Done {
    fn complete(self, result: io::Result<()>) {
        match self {
            Done::Flushed(cb) => cb.io_completed(result),
            Done::Signal(tx) => {
                let _ = tx.send(result);
            }
            Done::Nothing => {
                if let Err(e) = result {
                    tracing::error!(error = %e, "raft log write failed");
                }
            }
        }
    }
}

/// One group's file, written only by the writer thread.
#[derive(Debug)]
struct GroupFile {
    path: PathBuf,
    /// `Err`: a write failed, so the file may end in a partial record; nothing more is
    /// written to it (openraft stops the group on the error).
    file: Mutex<Result<File, String>>,
}

impl LogWriter {
    /// Starts the writer thread.
    pub fn start() -> io::Result<Arc<Self>> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sluice-raft-log".into())
            .spawn(move || write_loop(rx))?;
        Ok(Arc::new(Self { tx: Mutex::new(tx) }))
    }

    fn submit(&self, job: Job) {
        if let Err(mpsc::SendError(job)) = self.tx.lock().send(job) {
            job.done
                .complete(Err(io::Error::other("the raft log writer stopped")));
        }
    }
}

fn write_loop(rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        // Write everything in order, then sync each file once.
        let mut results: Vec<io::Result<()>> = Vec::with_capacity(batch.len());
        let mut touched: Vec<Arc<GroupFile>> = Vec::new();
        for job in &batch {
            let mut guard = job.file.file.lock();
            let r = match &mut *guard {
                Err(e) => Err(io::Error::other(e.clone())),
                Ok(f) => match &job.op {
                    Op::Append(bytes) => f.write_all(bytes),
                    Op::Rewrite(bytes) => rewrite(&job.file.path, bytes).map(|new| *f = new),
                },
            };
            if let Err(e) = &r {
                *guard = Err(format!("writing {}: {e}", job.file.path.display()));
            }
            drop(guard);
            if !touched.iter().any(|t| Arc::ptr_eq(t, &job.file)) {
                touched.push(job.file.clone());
            }
            results.push(r);
        }
        for t in &touched {
            let mut guard = t.file.lock();
            if let Ok(f) = &*guard
                && let Err(e) = f.sync_data()
            {
                *guard = Err(format!("syncing {}: {e}", t.path.display()));
            }
        }
        for (job, r) in batch.into_iter().zip(results) {
            // A job is durable only if its file synced after it was written.
            let r = r.and_then(|()| match &*job.file.file.lock() {
                Ok(_) => Ok(()),
                Err(e) => Err(io::Error::other(e.clone())),
            });
            job.done.complete(r);
        }
    }
}

/// Writes `bytes` as the new content of `path` (through a synced temporary file renamed over
/// it) and returns it open for appending.
fn rewrite(path: &Path, bytes: &[u8]) -> io::Result<File> {
    replace_synced(path, bytes)?;
    let mut f = OpenOptions::new().append(true).open(path)?;
    f.seek(SeekFrom::End(0))?;
    Ok(f)
}

/// Replaces `path` with `bytes` durably: a synced temporary file renamed over it, then the
/// directory synced.
pub(crate) fn replace_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One group's raft log (and its own reader: clones share it).
#[derive(Debug, Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    file: Arc<GroupFile>,
    writer: Arc<LogWriter>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Entries by index, each with its record's size in the file.
    entries: BTreeMap<u64, (EntryOf<Tc>, u64)>,
    last_purged: Option<LogIdOf<Tc>>,
    vote: Option<VoteOf<Tc>>,
    committed: Option<LogIdOf<Tc>>,
    /// Bytes in the file, and the bytes of the records still live.
    file_bytes: u64,
    live_bytes: u64,
}

impl State {
    fn apply(&mut self, kind: u8, body: &[u8], size: u64) -> io::Result<()> {
        match kind {
            ENTRY => {
                let e: EntryOf<Tc> = from_cbor(body)?;
                self.cut_from(e.index());
                self.live_bytes += size;
                self.entries.insert(e.index(), (e, size));
            }
            VOTE => self.vote = Some(from_cbor(body)?),
            COMMITTED => self.committed = from_cbor(body)?,
            TRUNCATE => {
                let after: Option<LogIdOf<Tc>> = from_cbor(body)?;
                self.cut_from(after.map_or(0, |l| l.index() + 1));
            }
            PURGE => {
                let upto: LogIdOf<Tc> = from_cbor(body)?;
                self.purge(upto);
            }
            k => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown raft log record kind {k}"),
                ));
            }
        }
        self.file_bytes += size;
        Ok(())
    }

    /// Drops the entries at `index` and after.
    fn cut_from(&mut self, index: u64) {
        // Appending after the last entry (the usual case) cuts nothing.
        if (self.entries.last_key_value()).is_none_or(|(last, _)| *last < index) {
            return;
        }
        for (_, (_, size)) in self.entries.split_off(&index) {
            self.live_bytes -= size;
        }
    }

    fn purge(&mut self, upto: LogIdOf<Tc>) {
        let rest = self.entries.split_off(&(upto.index() + 1));
        for (_, (_, size)) in std::mem::replace(&mut self.entries, rest) {
            self.live_bytes -= size;
        }
        self.last_purged = Some(upto);
    }

    /// Every live record, as a rewritten file holds them.
    fn snapshot(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(v) = &self.vote {
            record(&mut out, VOTE, &to_cbor(v)?);
        }
        if self.committed.is_some() {
            record(&mut out, COMMITTED, &to_cbor(&self.committed)?);
        }
        if let Some(p) = &self.last_purged {
            record(&mut out, PURGE, &to_cbor(p)?);
        }
        for (e, _) in self.entries.values() {
            record(&mut out, ENTRY, &to_cbor(e)?);
        }
        Ok(out)
    }
}

/// Appends one record to `out`; returns its size.
fn record(out: &mut Vec<u8>, kind: u8, cbor: &[u8]) -> u64 {
    let len = 1 + cbor.len();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(cbor);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(cbor);
    (8 + len) as u64
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, replaying it; writes go through `writer`.
    pub fn open(dir: &Path, writer: Arc<LogWriter>) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("raft.log");
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut state = State::default();
        let mut at = 0usize;
        while at < bytes.len() {
            let Some(rec) = bytes.get(at..at + 8) else {
                break;
            };
            let len = u32::from_le_bytes(rec[0..4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_le_bytes(rec[4..8].try_into().expect("4 bytes"));
            let Some(body) = (len > 0 && len <= MAX_BODY)
                .then(|| bytes.get(at + 8..at + 8 + len))
                .flatten()
            else {
                break;
            };
            if crc32fast::hash(body) != crc {
                break;
            }
            state.apply(body[0], &body[1..], (8 + len) as u64)?;
            at += 8 + len;
        }
        if at < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                at,
                dropped = bytes.len() - at,
                "raft log tail cut: a torn record that was never acknowledged"
            );
            file.set_len(at as u64)?;
            file.sync_all()?;
        }
        sync_dir(dir)?;
        file.seek(SeekFrom::End(0))?;
        let file = Arc::new(GroupFile {
            path,
            file: Mutex::new(Ok(file)),
        });
        Ok(Self {
            shared: Arc::new(Shared {
                file,
                writer,
                state: Mutex::new(state),
            }),
        })
    }

    /// Queues one record, the state already changed under the same lock (so the file's
    /// order is the state's order).
    fn write(&self, st: &mut State, kind: u8, cbor: &[u8], done: Done) {
        let mut bytes = Vec::with_capacity(cbor.len() + 9);
        st.file_bytes += record(&mut bytes, kind, cbor);
        self.submit(Op::Append(bytes), done);
    }

    fn submit(&self, op: Op, done: Done) {
        self.shared.writer.submit(Job {
            file: self.shared.file.clone(),
            op,
            done,
        });
    }

    /// Rewrites the file when most of a large one is purged records.
    fn maybe_rewrite(&self, st: &mut State) -> io::Result<()> {
        if st.file_bytes < REWRITE_MIN || st.live_bytes * REWRITE_LIVE_SHARE > st.file_bytes {
            return Ok(());
        }
        let bytes = st.snapshot()?;
        st.file_bytes = bytes.len() as u64;
        self.submit(Op::Rewrite(bytes), Done::Nothing);
        Ok(())
    }
}

async fn signalled(rx: oneshot::Receiver<io::Result<()>>) -> io::Result<()> {
    rx.await
        .unwrap_or_else(|_| Err(io::Error::other("the raft log writer stopped")))
}

impl RaftLogReader<Tc> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<Tc>>, io::Error> {
        let st = self.shared.state.lock();
        Ok(st
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<Tc>>, io::Error> {
        Ok(self.shared.state.lock().vote)
    }
}

impl RaftLogStorage<Tc> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<Tc>, io::Error> {
        let st = self.shared.state.lock();
        let last = st.entries.values().next_back().map(|(e, _)| e.log_id());
        Ok(LogState {
            last_purged_log_id: st.last_purged,
            last_log_id: last.or(st.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<Tc>) -> Result<(), io::Error> {
        let cbor = to_cbor(vote)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.state.lock();
            st.vote = Some(*vote);
            self.write(&mut st, VOTE, &cbor, Done::Signal(tx));
        }
        signalled(rx).await
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<Tc>>) -> Result<(), io::Error> {
        let cbor = to_cbor(&committed)?;
        let mut st = self.shared.state.lock();
        st.committed = committed;
        self.write(&mut st, COMMITTED, &cbor, Done::Nothing);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<Tc>>, io::Error> {
        Ok(self.shared.state.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<Tc>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<Tc>> + Send,
        I::IntoIter: Send,
    {
        let mut bytes = Vec::new();
        let mut added = Vec::new();
        for e in entries {
            let size = record(&mut bytes, ENTRY, &to_cbor(&e)?);
            added.push((e, size));
        }
        let mut st = self.shared.state.lock();
        for (e, size) in added {
            st.cut_from(e.index());
            st.live_bytes += size;
            st.file_bytes += size;
            st.entries.insert(e.index(), (e, size));
        }
        self.submit(Op::Append(bytes), Done::Flushed(callback));
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogIdOf<Tc>>) -> Result<(), io::Error> {
        let cbor = to_cbor(&last)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.state.lock();
            st.cut_from(last.map_or(0, |l| l.index() + 1));
            self.write(&mut st, TRUNCATE, &cbor, Done::Signal(tx));
        }
        signalled(rx).await
    }

    async fn purge(&mut self, upto: LogIdOf<Tc>) -> Result<(), io::Error> {
        let cbor = to_cbor(&upto)?;
        let mut st = self.shared.state.lock();
        st.purge(upto);
        self.write(&mut st, PURGE, &cbor, Done::Nothing);
        self.maybe_rewrite(&mut st)
    }
}

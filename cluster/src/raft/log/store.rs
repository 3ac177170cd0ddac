//! The log as openraft reads and writes it ([`LogStore`]): one group's entries, vote and purge point kept in memory and written through the node's [`LogWriter`].

use super::*;

/// One group's raft log (and its own reader: clones share it).
#[derive(Debug, Clone)]
pub struct LogStore {
    shared: Arc<GroupLog>,
}

impl LogStore {
    /// `group`'s log in the node's file (empty if the file has none); writes go through
    /// `writer`.
    pub fn open(group: GroupId, writer: &Arc<LogWriter>) -> Self {
        let k = key(group);
        let g = writer.inner.groups.lock().entry(k).or_default().clone();
        Self {
            shared: Arc::new(GroupLog {
                key: k,
                group: g,
                writer: writer.clone(),
            }),
        }
    }

    fn inner(&self) -> &Inner {
        &self.shared.writer.inner
    }

    /// Queues one record, the state already changed under the lock held (so the file's
    /// order is the state's order).
    fn write(&self, _locked: &mut State, kind: u8, cbor: &[u8], done: Done) {
        let mut bytes = Vec::with_capacity(cbor.len() + HEAD);
        record(&mut bytes, kind, self.shared.key, cbor);
        self.shared.writer.queue(bytes, done);
    }

    /// Moves the node's live byte count by this group's change from `before`.
    fn relive(&self, before: u64, st: &State) {
        let live = &self.inner().live_bytes;
        if st.live_bytes >= before {
            live.fetch_add(st.live_bytes - before, Ordering::Relaxed);
        } else {
            live.fetch_sub(before - st.live_bytes, Ordering::Relaxed);
        }
    }

    /// Queues a rewrite when most of a large file is purged records.
    fn maybe_rewrite(&self) {
        let inner = self.inner();
        let file = inner.file_bytes.load(Ordering::Relaxed);
        let live = inner.live_bytes.load(Ordering::Relaxed);
        if file < inner.rewrite_min
            || live * REWRITE_LIVE_SHARE > file
            || inner.rewriting.swap(true, Ordering::Relaxed)
        {
            return;
        }
        self.shared.writer.submit(Job {
            op: Op::Rewrite,
            done: Done::Nothing,
        });
    }
}

impl RaftLogReader<Tc> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<Tc>>, io::Error> {
        let st = self.shared.group.state.lock();
        Ok(st
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<Tc>>, io::Error> {
        Ok(self.shared.group.state.lock().vote)
    }
}

impl RaftLogStorage<Tc> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<Tc>, io::Error> {
        let st = self.shared.group.state.lock();
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
            let mut st = self.shared.group.state.lock();
            st.refuse_removed()?;
            st.vote = Some(*vote);
            self.write(&mut st, VOTE, &cbor, Done::Signal(tx));
        }
        signalled(rx).await
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<Tc>>) -> Result<(), io::Error> {
        let cbor = to_cbor(&committed)?;
        let mut st = self.shared.group.state.lock();
        st.refuse_removed()?;
        st.committed = committed;
        self.write(&mut st, COMMITTED, &cbor, Done::Nothing);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<Tc>>, io::Error> {
        Ok(self.shared.group.state.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<Tc>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<Tc>> + Send,
        I::IntoIter: Send,
    {
        let mut bytes = Vec::new();
        let mut added = Vec::new();
        for e in entries {
            bytes.reserve(HEAD + entry_size_hint(&e));
            let size = record_cbor(&mut bytes, ENTRY, self.shared.key, &e)?;
            added.push((e, size));
        }
        let mut st = self.shared.group.state.lock();
        st.refuse_removed()?;
        let before = st.live_bytes;
        for (e, size) in added {
            st.insert(e, size);
        }
        self.relive(before, &st);
        self.shared.writer.queue(bytes, Done::Flushed(callback));
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogIdOf<Tc>>) -> Result<(), io::Error> {
        let cbor = to_cbor(&last)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.group.state.lock();
            st.refuse_removed()?;
            let before = st.live_bytes;
            st.cut_from(last.map_or(0, |l| l.index() + 1));
            self.relive(before, &st);
            self.write(&mut st, TRUNCATE, &cbor, Done::Signal(tx));
        }
        signalled(rx).await
    }

    async fn purge(&mut self, upto: LogIdOf<Tc>) -> Result<(), io::Error> {
        let cbor = to_cbor(&upto)?;
        {
            let mut st = self.shared.group.state.lock();
            st.refuse_removed()?;
            let before = st.live_bytes;
            st.purge(upto);
            self.relive(before, &st);
            self.write(&mut st, PURGE, &cbor, Done::Nothing);
        }
        self.maybe_rewrite();
        Ok(())
    }
}

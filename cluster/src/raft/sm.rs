//! A group's state machine: committed commands go, in log order, to a [`GroupState`] (for a data
//! shard, the engine's tables; for the metadata group, the catalog).
//!
//! The state machine itself is transient: after a restart openraft restores it from the last
//! snapshot (kept in `<dir>/snapshot`, written through a synced temporary file) and applies
//! the committed entries after it again. A snapshot is the [`GroupState`]'s own bytes with the
//! log position and membership they stand for. The position may be behind the last applied
//! entry: a data shard's snapshot stands for the entries whose rows are in Parquet files
//! (the newer ones are only in memory, and in the log).

use crate::raft::types::{Command, Response, Tc, as_bytes, from_cbor, to_cbor};
use bytes::Bytes;
use futures::TryStreamExt;
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StoredMembership};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a group's committed commands take effect.
pub trait GroupState: Send + Sync + 'static {
    /// Applies the command committed at `index` (called once per index, in order; again
    /// after a restart for the entries after the last snapshot).
    fn apply(&self, index: u64, command: &Command) -> Response;

    /// The applied state as bytes [`GroupState::restore`] takes back, and the index of the last
    /// entry they stand for: `None` for every entry applied so far, `Some(i)` when they
    /// cover only the entries up to `i` (the later ones are applied again after a restore).
    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)>;

    /// Replaces everything applied with a snapshot's bytes.
    fn restore(&self, data: &[u8]) -> io::Result<()>;
}

/// One group's state machine (clones share it; a clone is also its snapshot builder).
#[derive(Debug)]
pub struct StateMachine<A> {
    inner: Arc<Inner<A>>,
}

impl<A> Clone for StateMachine<A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

#[derive(Debug)]
struct Inner<A> {
    path: PathBuf,
    apply: A,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_applied: Option<LogIdOf<Tc>>,
    membership: StoredMembershipOf<Tc>,
    /// Memberships replaced since the last snapshot, oldest first: a snapshot behind the
    /// last applied entry carries the one in force at its position.
    earlier_memberships: Vec<StoredMembershipOf<Tc>>,
    /// The first applied entry of each leader since the last snapshot: gives the log id
    /// (leader and index) of any entry applied since.
    leader_starts: Vec<LogIdOf<Tc>>,
    snapshot: Option<Stored>,
}

impl State {
    /// The log id of applied entry `index`, if it is at or after the last snapshot.
    fn log_id_at(&self, index: u64) -> Option<LogIdOf<Tc>> {
        let start = self.leader_starts.iter().rev().find(|l| l.index <= index)?;
        Some(LogIdOf::<Tc>::new(start.leader_id, index))
    }

    /// The membership in force at entry `index`.
    fn membership_at(&self, index: u64) -> StoredMembershipOf<Tc> {
        let applies = |m: &StoredMembershipOf<Tc>| m.log_id().is_none_or(|l| l.index <= index);
        std::iter::once(&self.membership)
            .chain(self.earlier_memberships.iter().rev())
            .find(|m| applies(m))
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets leaders and memberships that no snapshot after `index` can need.
    fn forget_before(&mut self, index: u64) {
        let keep_from = self.leader_starts.iter().rposition(|l| l.index <= index);
        if let Some(i) = keep_from {
            self.leader_starts.drain(..i);
        }
        let old = |m: &StoredMembershipOf<Tc>| m.log_id().is_some_and(|l| l.index <= index);
        let last_old = self.earlier_memberships.iter().rposition(old);
        if let Some(i) = last_old {
            self.earlier_memberships.drain(..i);
        }
    }
}

/// A snapshot as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    meta: SnapshotMetaOf<Tc>,
    #[serde(with = "as_bytes")]
    data: Bytes,
}

impl<A: GroupState> StateMachine<A> {
    /// Opens the state machine kept in `dir`: nothing applied yet, the last snapshot (if any)
    /// ready for openraft to restore.
    pub fn open(dir: &Path, apply: A) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("snapshot");
        let snapshot = match std::fs::read(&path) {
            Ok(bytes) => Some(from_cbor::<Stored>(&bytes)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                apply,
                state: Mutex::new(State {
                    snapshot,
                    ..State::default()
                }),
            }),
        })
    }

    /// Keeps `stored` as the current snapshot, durably.
    async fn keep(&self, stored: Stored) -> io::Result<()> {
        let bytes = to_cbor(&stored)?;
        let path = self.inner.path.clone();
        tokio::task::spawn_blocking(move || crate::raft::log::replace_synced(&path, &bytes))
            .await
            .map_err(io::Error::other)??;
        self.inner.state.lock().snapshot = Some(stored);
        Ok(())
    }
}

impl<A: GroupState> RaftSnapshotBuilder<Tc> for StateMachine<A> {
    type SnapshotData = Bytes;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<Tc, Bytes>, io::Error> {
        // Taken under the lock, so the data and the position agree (apply takes it too).
        let stored = {
            let mut st = self.inner.state.lock();
            let (upto, data) = self.inner.apply.snapshot()?;
            let last = match upto {
                None => st.last_applied,
                Some(i) if st.last_applied.is_some_and(|l| l.index <= i) => st.last_applied,
                Some(i) => st.log_id_at(i),
            };
            let previous = st.snapshot.as_ref().and_then(|s| s.meta.last_log_id);
            if last.is_none() || last.map(|l| l.index) <= previous.map(|l| l.index) {
                // Nothing newer to stand for: the current snapshot stays.
                if let Some(s) = &st.snapshot {
                    return Ok(SnapshotOf::<Tc, Bytes> {
                        meta: s.meta.clone(),
                        snapshot: s.data.clone(),
                    });
                }
            }
            let at = last.map_or(0, |l| l.index);
            let membership = st.membership_at(at);
            st.forget_before(at);
            Stored {
                meta: SnapshotMetaOf::<Tc> {
                    last_log_id: last,
                    last_membership: membership,
                },
                data,
            }
        };
        self.keep(stored.clone()).await?;
        Ok(SnapshotOf::<Tc, Bytes> {
            meta: stored.meta,
            snapshot: stored.data,
        })
    }
}

impl<A: GroupState> RaftStateMachine<Tc> for StateMachine<A> {
    type SnapshotData = Bytes;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<Tc>>, StoredMembershipOf<Tc>), io::Error> {
        let st = self.inner.state.lock();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: futures::Stream<Item = Result<EntryResponder<Tc>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let log_id = entry.log_id();
            let response = {
                let mut st = self.inner.state.lock();
                if (st.leader_starts.last()).is_none_or(|l| l.leader_id != log_id.leader_id) {
                    st.leader_starts.push(log_id);
                }
                st.last_applied = Some(log_id);
                match &entry.payload {
                    EntryPayload::Blank => Response::default(),
                    EntryPayload::Normal(c) => self.inner.apply.apply(log_id.index(), c),
                    EntryPayload::Membership(m) => {
                        let next = StoredMembership::new(Some(log_id), m.clone());
                        let replaced = std::mem::replace(&mut st.membership, next);
                        st.earlier_memberships.push(replaced);
                        Response::default()
                    }
                }
            };
            if let Some(r) = responder {
                r.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<Tc>,
        snapshot: Bytes,
    ) -> Result<(), io::Error> {
        self.inner.apply.restore(&snapshot)?;
        let already = {
            let mut st = self.inner.state.lock();
            st.last_applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
            st.earlier_memberships.clear();
            st.leader_starts = meta.last_log_id.into_iter().collect();
            (st.snapshot.as_ref()).is_some_and(|s| s.meta == *meta && s.data == snapshot)
        };
        if !already {
            let stored = Stored {
                meta: meta.clone(),
                data: snapshot,
            };
            self.keep(stored).await?;
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<SnapshotOf<Tc, Bytes>>, io::Error> {
        let st = self.inner.state.lock();
        Ok(st.snapshot.clone().map(|s| SnapshotOf::<Tc, Bytes> {
            meta: s.meta,
            snapshot: s.data,
        }))
    }
}

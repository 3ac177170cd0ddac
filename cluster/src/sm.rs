//! A group's state machine: committed commands go, in log order, to an [`Apply`] (for a data
//! shard, the engine's tables; for the metadata group, the catalog).
//!
//! The state machine itself is transient: after a restart openraft restores it from the last
//! snapshot (kept in `<dir>/snapshot`, written through a synced temporary file) and applies
//! the committed entries after it again. A snapshot is the [`Apply`]'s own bytes (for a
//! shard, the manifest of its Parquet files in the shared store) with the log position and
//! membership they stand for.

use crate::types::{Command, Response, Tc, as_bytes, from_cbor, to_cbor};
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
pub trait Apply: Send + Sync + 'static {
    /// Applies the command committed at `index` (called once per index, in order; again
    /// after a restart for the entries after the last snapshot).
    fn apply(&self, index: u64, command: &Command) -> Response;

    /// Everything applied so far, as bytes [`Apply::restore`] takes back.
    fn snapshot(&self) -> io::Result<Bytes>;

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
    snapshot: Option<Stored>,
}

/// A snapshot as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    meta: SnapshotMetaOf<Tc>,
    #[serde(with = "as_bytes")]
    data: Bytes,
}

impl<A: Apply> StateMachine<A> {
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
        tokio::task::spawn_blocking(move || crate::log::replace_synced(&path, &bytes))
            .await
            .map_err(io::Error::other)??;
        self.inner.state.lock().snapshot = Some(stored);
        Ok(())
    }
}

impl<A: Apply> RaftSnapshotBuilder<Tc> for StateMachine<A> {
    type SnapshotData = Bytes;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<Tc, Bytes>, io::Error> {
        // Taken under the lock, so the data and the position agree (apply takes it too).
        let stored = {
            let st = self.inner.state.lock();
            Stored {
                meta: SnapshotMetaOf::<Tc> {
                    last_log_id: st.last_applied,
                    last_membership: st.membership.clone(),
                },
                data: self.inner.apply.snapshot()?,
            }
        };
        self.keep(stored.clone()).await?;
        Ok(SnapshotOf::<Tc, Bytes> {
            meta: stored.meta,
            snapshot: stored.data,
        })
    }
}

impl<A: Apply> RaftStateMachine<Tc> for StateMachine<A> {
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
                st.last_applied = Some(log_id);
                match &entry.payload {
                    EntryPayload::Blank => Response::default(),
                    EntryPayload::Normal(c) => self.inner.apply.apply(log_id.index(), c),
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(log_id), m.clone());
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

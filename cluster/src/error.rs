//! Why a cluster node could not start.

use crate::raft::types::GroupId;
use std::io;

/// Why [`crate::Cluster::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node's directory, listener or a group's files.
    #[error("{what}: {source}")]
    Io {
        /// What was being opened.
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A raft group could not be formed.
    #[error("initializing raft group {group}: {reason}")]
    Initialize {
        /// The group.
        group: GroupId,
        /// openraft's error, as it reports it.
        reason: String,
    },
    /// This node id was removed from the cluster and cannot come back.
    #[error("node {node} was removed from the cluster (a node id is not used again)")]
    Removed {
        /// The node id.
        node: u64,
    },
    /// Stopped while waiting to be added to the cluster.
    #[error("stopped before joining the cluster")]
    Stopped,
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

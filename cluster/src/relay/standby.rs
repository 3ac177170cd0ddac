//! Calls about the standby copies of the nodes' broker journals ([`STANDBY`]): each node's
//! broker ships its journal records to another node, which keeps a copy of that node's
//! sessions (the broker's `standby` module says what they hold and how they are used).
//! This crate only carries the calls; their bodies are the broker's encoding.

use super::Relay;
use crate::raft::net::{Frame, STANDBY};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::time::Duration;

/// How long a standby call may take (a copy of a node's whole session state is one answer).
const STANDBY_TIMEOUT: Duration = Duration::from_secs(10);

impl Relay {
    /// Whether peer `node` answers: not known to be down (a peer never called counts as
    /// answering).
    pub(super) fn answering(&self, node: u64) -> bool {
        let peers = self.peers.lock();
        peers.get(&node).is_none_or(|p| !p.known.borrow().down)
    }

    /// Calls `node` with a standby call; its answer, or `None`.
    pub(super) fn call_standby(&self, node: u64, call: Bytes) -> BoxFuture<'static, Option<Bytes>> {
        let me = self.me.clone();
        Box::pin(async move {
            let me = me.upgrade()?;
            let frame = Frame::raw(STANDBY, &call);
            match me.node.call(node, frame, STANDBY_TIMEOUT).await {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::debug!(node, error = %e, "a standby call not answered");
                    None
                }
            }
        })
    }

    /// Answers a [`STANDBY`] call: the broker's answer.
    pub(super) async fn serve_standby(&self, body: Bytes) -> Result<Vec<u8>, String> {
        let Some(sink) = self.sink.get().cloned() else {
            return Err(format!("node {}'s broker has not started", self.node.id()));
        };
        sink.standby(body).await
    }
}

//! The threads plain MQTT connections run on: each one a tokio current-thread runtime, the
//! connections spread over them as they are accepted. A device's message is then read,
//! stored (the group commit's leader writes and syncs on this same thread, see the WAL's
//! gathering), acknowledged and routed without crossing to another thread: on a
//! multi-threaded runtime, each message woke parked workers several times, which cost more
//! CPU than the rest of its path. Queries, HTTP, bridges and TLS or WebSocket connections
//! stay on the main runtime; a message for a subscriber on another thread wakes that thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// The connection threads; they stop when this is dropped (their connections must have
/// ended by then).
#[derive(Debug)]
pub(crate) struct Reactors {
    handles: Vec<Handle>,
    next: AtomicUsize,
    stop: CancellationToken,
}

impl Reactors {
    /// Starts `threads` threads (0: half the cores, at least one).
    pub(crate) fn start(threads: usize) -> std::io::Result<Arc<Self>> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            n => n,
        };
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("sluice-mqtt-{i}"))
                .spawn(move || rt.block_on(stop.cancelled()))?;
        }
        Ok(Arc::new(Self {
            handles,
            next: AtomicUsize::new(0),
            stop,
        }))
    }

    /// The thread for the next connection (in turn).
    pub(crate) fn pick(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.handles[i % self.handles.len()]
    }
}

impl Drop for Reactors {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

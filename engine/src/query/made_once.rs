//! A value one run of a plan makes once and all its partitions wait for ([`MadeOnce`]):
//! a scan's snapshot on a cluster node that reads other nodes' rows first.

use datafusion::error::{DataFusionError, Result as DfResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Made by a task of its own, started by the first partition to ask. Made inline by that
/// partition, its end would wake the others' tasks into its worker's LIFO slot, which no
/// other worker steals, and they would all run on one core (a grouped aggregate over
/// 500,000 rows on other nodes: 14.0-15.2 ms, 10.8-13.6 made apart); woken from the task
/// that made it, all but one go to the queue the other workers steal from.
#[derive(Debug)]
pub(crate) struct MadeOnce<T> {
    value: OnceLock<Result<T, Arc<DataFusionError>>>,
    started: AtomicBool,
    ready: tokio::sync::watch::Sender<bool>,
}

impl<T> Default for MadeOnce<T> {
    fn default() -> Self {
        Self {
            value: OnceLock::new(),
            started: AtomicBool::new(false),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl<T: Send + Sync + 'static> MadeOnce<T> {
    /// The value, once made.
    pub(crate) fn get(&self) -> Option<DfResult<&T>> {
        (self.value.get()).map(|v| v.as_ref().map_err(|e| DataFusionError::Shared(e.clone())))
    }

    /// Sets the value made without waiting (the first setter wins).
    pub(crate) fn set(&self, value: T) {
        self.started.store(true, Ordering::Release);
        let _ = self.value.set(Ok(value));
        self.ready.send_replace(true);
    }

    /// The value, `make` run on a task of its own by the first to ask.
    pub(crate) async fn get_or_spawn<F>(self: &Arc<Self>, make: F) -> DfResult<&T>
    where
        F: Future<Output = DfResult<T>> + Send + 'static,
    {
        if !self.started.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move {
                use futures::FutureExt;
                let made = std::panic::AssertUnwindSafe(make).catch_unwind().await;
                let made = made.unwrap_or_else(|_| {
                    Err(DataFusionError::Internal(
                        "making a run's snapshot panicked".into(),
                    ))
                });
                let _ = me.value.set(made.map_err(Arc::new));
                me.ready.send_replace(true);
            });
        }
        let mut ready = self.ready.subscribe();
        let dropped = |_| DataFusionError::Internal("a run's snapshot was dropped".into());
        ready.wait_for(|r| *r).await.map_err(dropped)?;
        self.get()
            .unwrap_or_else(|| Err(DataFusionError::Internal("no snapshot".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every waiter gets the one value made (once), the error it failed with, or an error
    /// when making it panicked; a value set without waiting is what all get.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_partition_gets_the_one_value_or_its_error() {
        let made = Arc::new(MadeOnce::<u64>::default());
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let waiters = (0..4).map(|_| {
            let (made, calls) = (made.clone(), calls.clone());
            tokio::spawn(async move {
                let make = async move {
                    calls.fetch_add(1, Ordering::Relaxed);
                    Ok(7)
                };
                *made.get_or_spawn(make).await.unwrap()
            })
        });
        for w in futures::future::join_all(waiters).await {
            assert_eq!(w.unwrap(), 7);
        }
        assert_eq!(calls.load(Ordering::Relaxed), 1);

        let failed = Arc::new(MadeOnce::<u64>::default());
        let e = async { Err(DataFusionError::Execution("shard 5 unreachable".into())) };
        let err = failed.get_or_spawn(e).await.unwrap_err().to_string();
        assert!(err.contains("shard 5 unreachable"), "{err}");
        assert!(failed.get().is_some_and(|r| r.is_err()));

        let panicked = Arc::new(MadeOnce::<u64>::default());
        let boom = async { panic!("boom") };
        let err = panicked.get_or_spawn(boom).await.unwrap_err().to_string();
        assert!(err.contains("panicked"), "{err}");

        let set = Arc::new(MadeOnce::<u64>::default());
        set.set(3);
        let unused = async { Ok(9) };
        assert_eq!(*set.get_or_spawn(unused).await.unwrap(), 3);
    }
}

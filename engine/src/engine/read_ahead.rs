//! A cluster query's read barrier taken alongside the query instead of before it: the
//! query runs on this node's state while the leaders are asked where their groups stand,
//! and its answer goes out only once they say this node had already applied everything
//! (else it is run again after the barrier).

use super::Engine;
use crate::error::Result;
use crate::log::WriteLog;
use crate::ports::{QueryOptions, QueryOutput};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use futures::future::BoxFuture;
use std::sync::atomic::Ordering;

/// Whether `sql` only reads (a `SELECT`): only such a statement may be run before its
/// barrier and, when the barrier says its reads were behind, run again.
pub(crate) fn only_reads(sql: &str) -> bool {
    let text = sql.trim_start_matches(|c: char| c.is_whitespace() || c == '(');
    text.get(..6)
        .is_some_and(|w| w.eq_ignore_ascii_case("select"))
        && text[6..].starts_with(|c: char| c.is_whitespace() || c == '*' || c == '(')
}

/// After a query read ahead of its barrier found this node behind (writes were arriving),
/// queries take the barrier first for this long: under a steady stream of writes a node
/// is mostly behind by a few entries, and running a query twice costs more than waiting.
const PAUSE_AFTER_BEHIND_MICROS: i64 = 1_000_000;

/// Microseconds on a clock that does not go back, from one pause after its first use (so
/// that 0 is "never").
fn steady_micros() -> i64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let since = START.get_or_init(std::time::Instant::now).elapsed();
    since.as_micros() as i64 + PAUSE_AFTER_BEHIND_MICROS
}

impl Engine {
    /// Whether a query may run ahead of its barrier now (none found this node behind
    /// lately).
    pub(crate) fn may_read_ahead(&self) -> bool {
        let behind = self.read_behind_at.load(Ordering::Relaxed);
        steady_micros().saturating_sub(behind) >= PAUSE_AFTER_BEHIND_MICROS
    }

    /// Runs `sql` on this node's state as it stands now while `ahead` (from
    /// [`WriteLog::read_ahead`], sampled before) asks the leaders whether that state already
    /// holds every write acknowledged before the query: then the answer stands, and its
    /// first batches (read meanwhile) go out; else it is dropped unread and the query runs
    /// again after [`WriteLog::read_barrier`]. The state only grows, so every row read from
    /// the sampled point on is at least as new as the barrier would have made it.
    pub(crate) async fn query_ahead(
        &self,
        sql: &str,
        options: &QueryOptions,
        mut ahead: BoxFuture<'_, bool>,
        log: &dyn WriteLog,
    ) -> Result<QueryOutput> {
        let mut confirmed = None;
        let run = Engine::query(self, sql, options);
        tokio::pin!(run);
        let out = tokio::select! {
            ok = &mut ahead => {
                confirmed = Some(ok);
                run.await
            }
            out = &mut run => out,
        };
        // What the query read while the leaders were asked, held until they answer.
        let (mut read, mut ended, mut out) = (Vec::new(), false, out);
        let ok = match confirmed {
            Some(ok) => ok,
            None => loop {
                let next = async {
                    match out.as_mut() {
                        Ok(o) if !ended => o.stream.next().await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    ok = &mut ahead => break ok,
                    batch = next => match batch {
                        Some(b) => read.push(b),
                        None => ended = true,
                    },
                }
            },
        };
        let counter = match ok {
            true => &self.reads_ahead,
            false => &self.reads_again,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if !ok {
            drop(out);
            (self.read_behind_at).store(steady_micros(), Ordering::Relaxed);
            log.read_barrier().await?;
            return Engine::query(self, sql, options).await;
        }
        // A query that failed on a state that was up to date fails.
        let out = out?;
        if read.is_empty() {
            return Ok(out);
        }
        let head = futures::stream::iter(read);
        let stream = RecordBatchStreamAdapter::new(out.schema.clone(), head.chain(out.stream));
        Ok(QueryOutput {
            schema: out.schema,
            stream: Box::pin(stream),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::only_reads;
    use crate::engine::Engine;
    use crate::log::WriteLog;
    use crate::log::wal::record::WriteRecord;
    use crate::ports::{QueryOptions, QueryPort};
    use crate::store::catalog::TableDef;
    use futures::TryStreamExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Weak};

    /// A log whose barrier brings a write this node had not applied (a row stored then).
    struct Behind {
        engine: Weak<Engine>,
        barriers: AtomicU64,
    }

    #[async_trait::async_trait]
    impl WriteLog for Behind {
        async fn append(
            &self,
            _: &TableDef,
            _: Vec<Arc<WriteRecord>>,
            _: bool,
        ) -> crate::Result<Option<u64>> {
            unreachable!("the test writes through the engine's own log")
        }

        async fn read_barrier(&self) -> crate::Result<()> {
            self.barriers.fetch_add(1, Ordering::SeqCst);
            let e = self.engine.upgrade().unwrap();
            let insert = "INSERT INTO t.m VALUES ('2024-05-01 10:00:09', 9)";
            QueryPort::query(&*e, insert, &QueryOptions::default()).await?;
            Ok(())
        }

        fn evaluates_alerts(&self) -> bool {
            true
        }
    }

    async fn rows(e: &Engine, sql: &str, ahead: bool, log: &Behind) -> usize {
        let options = QueryOptions::default();
        // The leaders' answer comes while the query runs: after a number of polls (each
        // turn of `query_ahead`'s wait reads a batch first), not after a time.
        let mut polls = 64;
        let answer = Box::pin(futures::future::poll_fn(move |cx| {
            if polls == 0 {
                return std::task::Poll::Ready(ahead);
            }
            polls -= 1;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }));
        let out = e.query_ahead(sql, &options, answer, log).await.unwrap();
        let batches: Vec<_> = out.stream.try_collect().await.unwrap();
        batches.iter().map(|b| b.num_rows()).sum()
    }

    /// A query whose barrier finds this node up to date answers from what it read meanwhile
    /// (every batch of it); one that finds it behind runs again after the barrier and sees
    /// the write the barrier brought.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_read_ahead_stands_only_when_the_node_was_up_to_date() {
        let dir = tempfile::tempdir().unwrap();
        let config = sluice_conf::Config {
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let e = Engine::open(config).await.unwrap();
        let q = |sql: &'static str| {
            let e = e.clone();
            async move {
                QueryPort::query(&*e, sql, &QueryOptions::default())
                    .await
                    .unwrap()
            }
        };
        q("CREATE DATABASE t").await;
        q("CREATE TABLE t.m (time TIMESTAMP, v BIGINT) PARTITION BY yyyymmdd(time)").await;
        q("INSERT INTO t.m VALUES ('2024-05-01 10:00:00', 1)").await;
        let log = Behind {
            engine: Arc::downgrade(&e),
            barriers: AtomicU64::new(0),
        };
        let all = "SELECT * FROM t.m";
        assert_eq!(rows(&e, all, true, &log).await, 1);
        assert_eq!(log.barriers.load(Ordering::SeqCst), 0);
        assert_eq!(
            rows(&e, all, false, &log).await,
            2,
            "run again after the barrier"
        );
        assert_eq!(log.barriers.load(Ordering::SeqCst), 1);
        // Rows read (some or all) before the answer comes: none lost or doubled.
        let many = "SELECT unnest(range(1, 100001)) AS n";
        assert_eq!(rows(&e, many, true, &log).await, 100_000);
        assert_eq!(rows(&e, many, false, &log).await, 100_000);
        let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
        assert_eq!((load(&e.reads_ahead), load(&e.reads_again)), (2, 2));
        // A failure on an up-to-date state is the query's answer.
        let err = e
            .query_ahead(
                "SELECT * FROM t.nope",
                &QueryOptions::default(),
                Box::pin(async { true }),
                &log,
            )
            .await;
        assert!(err.is_err());
    }

    #[test]
    fn selects_only() {
        for sql in [
            "select 1",
            "  SELECT * FROM t",
            "(select a from t)",
            "Select\n1",
            "select*from t",
        ] {
            assert!(only_reads(sql), "{sql}");
        }
        for sql in [
            "selected",
            "INSERT INTO t SELECT 1",
            "with x as (select 1) select * from x",
            "DELETE FROM t",
            "CREATE TABLE t AS SELECT 1",
            "sel",
            "",
        ] {
            assert!(!only_reads(sql), "{sql}");
        }
    }
}

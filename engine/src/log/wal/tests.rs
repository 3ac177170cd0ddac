//! Tests of `wal`.

use super::*;
use crate::types::Value;

#[derive(Default)]
struct Collect(parking_lot::Mutex<Vec<(u64, WriteRecord)>>);
impl RecordSink for Collect {
    fn apply(&self, lsn: u64, record: &WriteRecord) {
        self.0.lock().push((lsn, record.clone()));
    }
}

fn rec(i: i64) -> Arc<WriteRecord> {
    Arc::new(WriteRecord {
        table_id: 7,
        ncols: 2,
        rows: vec![vec![Value::Int(i), Value::Str(format!("row {i}"))]],
        origin: None,
    })
}

/// A log in `dir` with `n` one-row records appended.
async fn filled(dir: &Path, segment_bytes: u64, n: i64) -> Wal {
    let wal = Wal::start(
        dir,
        &config(segment_bytes),
        1,
        16,
        Arc::new(Collect::default()),
    )
    .unwrap();
    for i in 0..n {
        wal.append(rec(i)).await.unwrap();
    }
    wal
}

fn config(segment_bytes: u64) -> WalConfig {
    WalConfig {
        segment_bytes,
        ..WalConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_replay_in_lsn_order() {
    let dir = tempfile::tempdir().unwrap();
    let applied = Arc::new(Collect::default());
    let wal = Arc::new(Wal::start(dir.path(), &config(256), 1, 1024, applied.clone()).unwrap());
    let mut tasks = Vec::new();
    for i in 0..200 {
        let wal = wal.clone();
        tasks.push(tokio::spawn(
            async move { wal.append(rec(i)).await.unwrap() },
        ));
    }
    let mut lsns: Vec<u64> = Vec::new();
    for t in tasks {
        lsns.push(t.await.unwrap());
    }
    lsns.sort();
    assert_eq!(lsns, (1..=200).collect::<Vec<_>>());
    // Sequential appends make one group each, so small segments rotate.
    for i in 200..220 {
        wal.append(rec(i)).await.unwrap();
    }
    wal.close();
    assert!(wal.segments().0 > 1, "small segments rotate");
    let live = applied.0.lock().clone();
    let mut replayed = Vec::new();
    let report = replay(
        dir.path(),
        |lsn, r| replayed.push((lsn, r.clone())),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(replayed, live);
    assert_eq!(report.next_lsn, 221);
    assert!(report.cut.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_appended_together_get_consecutive_lsns() {
    let dir = tempfile::tempdir().unwrap();
    let applied = Arc::new(Collect::default());
    let wal = Arc::new(Wal::start(dir.path(), &config(1 << 20), 1, 64, applied.clone()).unwrap());
    let mut tasks = Vec::new();
    for b in 0..20i64 {
        let w = wal.clone();
        tasks.push(tokio::spawn(async move {
            let batch = (0..10).map(|i| rec(b * 10 + i)).collect();
            w.append_all(batch, true).await.unwrap()
        }));
        let w = wal.clone();
        tasks.push(tokio::spawn(async move {
            w.append(rec(1000 + b)).await.unwrap()
        }));
    }
    let mut lasts = Vec::new();
    for t in tasks {
        lasts.push(t.await.unwrap());
    }
    assert_eq!(wal.applied_lsn(), 220);
    wal.close();
    let live = applied.0.lock().clone();
    let lsns: Vec<u64> = live.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=220).collect::<Vec<_>>());
    // Each batch's ten records sit together, in order, ending at the LSN it returned.
    for (b, last) in lasts.iter().step_by(2).enumerate() {
        let rows: Vec<_> = (live.iter())
            .filter(|(l, _)| (last - 9..=*last).contains(l))
            .map(|(_, r)| r.rows[0][0].clone())
            .collect();
        let want: Vec<_> = (0..10).map(|i| Value::Int(b as i64 * 10 + i)).collect();
        assert_eq!(rows, want);
    }
    let mut replayed = Vec::new();
    replay(
        dir.path(),
        |lsn, r| replayed.push((lsn, r.clone())),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(replayed, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tail_is_cut_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let wal = filled(dir.path(), 1 << 20, 10).await;
    wal.close();
    let (_, path) = list_segments(dir.path()).unwrap().pop().unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 3).unwrap();
    let mut n = 0;
    let report = replay(dir.path(), |_, _| n += 1, |_, _| {}).unwrap();
    assert_eq!(n, 9);
    assert!(report.cut.is_some());
    assert_eq!(report.next_lsn, 10);
    // The cut is permanent: a second replay sees a clean log.
    let again = replay(dir.path(), |_, _| {}, |_, _| {}).unwrap();
    assert!(again.cut.is_none());
    assert_eq!(again.records, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preallocated_zero_tail_is_a_clean_end() {
    let dir = tempfile::tempdir().unwrap();
    let wal = filled(dir.path(), 1 << 20, 5).await;
    // A crash now leaves the segment with its preallocated, never-written tail.
    let crashed = tempfile::tempdir().unwrap();
    for (_, path) in list_segments(dir.path()).unwrap() {
        std::fs::copy(&path, crashed.path().join(path.file_name().unwrap())).unwrap();
    }
    wal.close();
    let (_, live) = list_segments(crashed.path()).unwrap().pop().unwrap();
    assert!(
        std::fs::metadata(&live).unwrap().len() >= 1 << 20,
        "segment was preallocated"
    );
    let report = replay(crashed.path(), |_, _| {}, |_, _| {}).unwrap();
    assert_eq!((report.records, report.next_lsn), (5, 6));
    assert!(report.cut.is_none(), "zeros are not a torn record");
    // A clean close gives the unused space back.
    let (_, closed) = list_segments(dir.path()).unwrap().pop().unwrap();
    assert!(std::fs::metadata(&closed).unwrap().len() < 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_before_the_newest_segment_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let wal = filled(dir.path(), 64, 10).await;
    wal.close();
    let segs = list_segments(dir.path()).unwrap();
    assert!(segs.len() > 2);
    let (_, first) = &segs[0];
    let mut bytes = std::fs::read(first).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(first, &bytes).unwrap();
    let err = replay(dir.path(), |_, _| {}, |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("refusing to start"), "{err}");
    // Nothing was deleted: every segment is still there for an operator to inspect.
    assert_eq!(list_segments(dir.path()).unwrap().len(), segs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_keeps_the_needed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let wal = filled(dir.path(), 64, 20).await;
    let (before, _) = wal.segments();
    wal.truncate_before(15).unwrap();
    let (after, first) = wal.segments();
    assert!(after < before);
    assert!(first <= 15);
    wal.close();
    let mut lsns = Vec::new();
    replay(dir.path(), |lsn, _| lsns.push(lsn), |_, _| {}).unwrap();
    assert!(lsns.contains(&15) && lsns.contains(&20));
}

/// Appenders that stop waiting (their task aborted) may hold the next group's lead: the log
/// must still commit everything queued and answer everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_appends_do_not_stall_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let applied = Arc::new(Collect::default());
    let wal = Arc::new(Wal::start(dir.path(), &config(1 << 20), 1, 4096, applied.clone()).unwrap());
    for round in 0..20i64 {
        let mut kept = Vec::new();
        for i in 0..30 {
            let w = wal.clone();
            let t = tokio::spawn(async move { w.append(rec(round * 100 + i)).await.unwrap() });
            if i % 3 == 0 {
                t.abort();
            } else {
                kept.push(t);
            }
        }
        for t in kept {
            tokio::time::timeout(std::time::Duration::from_secs(10), t)
                .await
                .expect("an append waited for a leader that never came")
                .unwrap();
        }
    }
    let last = wal.append(rec(-1)).await.unwrap();
    assert_eq!(wal.applied_lsn(), last);
    wal.close();
    // Whatever was logged was applied, in order, once each.
    let lsns: Vec<u64> = applied.0.lock().iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=last).collect::<Vec<_>>());
}

/// A log whose records came 10 s apart so far: a patient leader waits up to 30 s for more
/// (the longest wait being 60 s).
fn sparse_log(dir: &Path) -> Arc<Wal> {
    let wal = Wal::start(dir, &config(1 << 20), 1, 64, Arc::new(Collect::default())).unwrap();
    wal.shared.queue.lock().pace = sparse_pace();
    Arc::new(wal)
}

/// Records 10 s apart so far, the longest wait 60 s.
fn sparse_pace() -> pace::Pace {
    pace::Pace::sparse(
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(10),
    )
}

/// Appends record `i` on a task of its own, patiently or not.
fn spawn_append(wal: &Arc<Wal>, i: i64, patient: bool) -> tokio::task::JoinHandle<u64> {
    let w = wal.clone();
    tokio::spawn(async move {
        match patient {
            true => patiently(w.append(rec(i))).await.unwrap(),
            false => w.append(rec(i)).await.unwrap(),
        }
    })
}

/// Waits (10 s at most) until a leader waits for more records, having synced nothing past
/// `applied`.
async fn until_a_leader_waits(wal: &Wal, applied: u64) {
    let waiting = async {
        while !wal.shared.queue.lock().lingering {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the leader did not wait");
    assert_eq!(
        wal.applied_lsn(),
        applied,
        "the leader synced without waiting"
    );
}

/// The log's `/metrics` text.
fn metrics_text(wal: &Wal) -> String {
    let mut text = String::new();
    wal.render_metrics(&mut text);
    text
}

/// Checks that the last wait (of 30 s) ended early, with `groups` group commits since the log
/// started and `gathered` records gathered by waits.
fn waited_less_than_its_wait(wal: &Wal, started: std::time::Instant, groups: u64, gathered: usize) {
    let took = started.elapsed();
    assert!(
        took.as_secs() < 20,
        "the leader waited its whole wait: {took:?}"
    );
    let text = metrics_text(wal);
    let count = format!("sluice_wal_group_records_count {groups}\n");
    assert!(text.contains(&count), "{text}");
    let total = format!("sluice_wal_wait_gathered_total {gathered}\n");
    assert!(text.contains(&total), "{text}");
}

/// A patient leader that waits for more records (they came sparsely) syncs as soon as
/// `pace::GATHER` are queued, not at the end of its wait: one group of them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_leader_syncs_once_enough_records_are_queued() {
    let dir = tempfile::tempdir().unwrap();
    let wal = sparse_log(dir.path());
    let started = std::time::Instant::now();
    let first = spawn_append(&wal, 0, true);
    until_a_leader_waits(&wal, 0).await;
    let rest: Vec<_> = (1..pace::GATHER as i64)
        .map(|i| spawn_append(&wal, i, true))
        .collect();
    let mut lsns = vec![first.await.unwrap()];
    for t in rest {
        lsns.push(t.await.unwrap());
    }
    lsns.sort();
    assert_eq!(lsns, (1..=pace::GATHER as u64).collect::<Vec<_>>());
    waited_less_than_its_wait(&wal, started, 1, pace::GATHER - 1);
}

/// A record whose sender waits for it (not patient) neither waits when it leads nor lets a
/// waiting leader wait on: it joins, and the group is synced at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impatient_record_ends_a_wait_and_never_waits() {
    let dir = tempfile::tempdir().unwrap();
    let wal = sparse_log(dir.path());
    let started = std::time::Instant::now();
    // Alone and impatient: synced without a wait.
    assert_eq!(spawn_append(&wal, 0, false).await.unwrap(), 1);
    let text = metrics_text(&wal);
    assert!(text.contains("sluice_wal_wait_seconds_count 0\n"), "{text}");
    // The log still looks sparse (a record every 10 s): a patient leader waits, and an
    // impatient record ends its wait.
    wal.shared.queue.lock().pace = sparse_pace();
    let patient = spawn_append(&wal, 1, true);
    until_a_leader_waits(&wal, 1).await;
    let hurried = spawn_append(&wal, 2, false);
    let mut lsns = vec![patient.await.unwrap(), hurried.await.unwrap()];
    lsns.sort();
    assert_eq!(lsns, vec![2, 3]);
    waited_less_than_its_wait(&wal, started, 2, 1);
}

/// Journal records go in the same group as the writes, in order; their `then` runs with
/// their LSN before the append returns, and replay hands their bytes back.
#[tokio::test]
async fn journal_records_share_the_group_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let applied = Arc::new(Collect::default());
    let wal = Wal::start(dir.path(), &config(1 << 20), 1, 16, applied.clone()).unwrap();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let entry = |text: &str| {
        let seen = seen.clone();
        let text = text.to_string();
        Journal {
            bytes: text.clone().into_bytes(),
            then: Some(Box::new(move |lsn| seen.lock().push((lsn, text)))),
        }
    };
    let last = wal
        .append_entries(vec![rec(1)], vec![entry("a"), entry("b")], true)
        .await
        .unwrap();
    assert_eq!(last, 3);
    assert_eq!(
        *seen.lock(),
        vec![(2, "a".to_string()), (3, "b".to_string())]
    );
    let last = wal
        .append_entries(vec![], vec![entry("c")], true)
        .await
        .unwrap();
    assert_eq!(last, 4);
    assert_eq!(wal.checkpoint(|lsn| lsn), 4);
    wal.close();
    let (mut writes, mut journal) = (Vec::new(), Vec::new());
    replay(
        dir.path(),
        |lsn, _| writes.push(lsn),
        |lsn, bytes| journal.push((lsn, bytes.to_vec())),
    )
    .unwrap();
    assert_eq!(writes, vec![1]);
    assert_eq!(
        journal,
        vec![(2, b"a".to_vec()), (3, b"b".to_vec()), (4, b"c".to_vec())]
    );
}

//! Three nodes on 127.0.0.1, each with its own data directory, TCP listener and log writer,
//! replicate one group: writes committed through the leader are applied once on every node;
//! when the leader stops, another takes over and writes go on; the stopped node comes back
//! from its directory and catches up.

use bytes::Bytes;
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use parking_lot::Mutex;
use sluice_cluster::{Command, GroupId, GroupRaft, GroupState, Node, Response, serve};
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Applied commands, by index (a second apply of an index would show as a duplicate), and
/// a wake-up for whoever waits for them.
#[derive(Debug, Default)]
struct Applied(Mutex<Vec<(u64, String)>>, tokio::sync::Notify);

impl GroupState for Applied {
    fn apply(&self, index: u64, command: &Command) -> Response {
        let Command::Catalog(text) = command else {
            return Response::default();
        };
        self.0.lock().push((index, text.clone()));
        self.1.notify_waiters();
        Response {
            rows: 1,
            error: None,
        }
    }
    fn snapshot(&self) -> io::Result<(Option<u64>, Bytes)> {
        let lines: Vec<String> = (self.0.lock().iter())
            .map(|(i, t)| format!("{i} {t}"))
            .collect();
        Ok((None, Bytes::from(lines.join("\n"))))
    }
    fn restore(&self, data: &[u8]) -> io::Result<()> {
        let text = std::str::from_utf8(data).map_err(io::Error::other)?;
        *self.0.lock() = (text.lines())
            .filter_map(|l| l.split_once(' '))
            .map(|(i, t)| (i.parse().unwrap(), t.to_string()))
            .collect();
        self.1.notify_waiters();
        Ok(())
    }
}

impl Applied {
    fn texts(&self) -> Vec<String> {
        self.0.lock().iter().map(|(_, t)| t.clone()).collect()
    }
}

struct Running {
    node: Arc<Node>,
    raft: GroupRaft,
    applied: Arc<Applied>,
    stop: CancellationToken,
}

async fn start(id: u64, dir: &std::path::Path, listener: TcpListener) -> Running {
    let node = Node::new(id, &dir.join(format!("n{id}"))).unwrap();
    let applied = Arc::new(Applied::default());
    let raft = node
        .open_group(GroupId::Meta, applied.clone(), None)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, node.clone(), stop.clone()));
    Running {
        node,
        raft,
        applied,
        stop,
    }
}

async fn stop(r: Running) {
    r.stop.cancel();
    r.node.shutdown().await;
}

/// Waits until some node of `nodes` is leader and every other one agrees. Polled rather
/// than woken by the metrics: agreement shows in the metrics a moment before the leader
/// takes writes (its lease), which the poll interval covers.
async fn leader(nodes: &BTreeMap<u64, Running>) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen: Vec<Option<u64>> = nodes
            .values()
            .map(|r| r.raft.metrics().borrow_watched().current_leader)
            .collect();
        if let Some(Some(l)) = seen.first()
            && seen.iter().all(|s| *s == Some(*l))
            && nodes.contains_key(l)
        {
            return *l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no agreed leader: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `w<i>` for each `i` of `range` through `raft`, adding them to `want`.
async fn write(raft: &GroupRaft, range: std::ops::Range<u32>, want: &mut Vec<String>) {
    for i in range {
        let text = format!("w{i}");
        let r = raft
            .client_write(Command::Catalog(text.clone()))
            .await
            .unwrap();
        assert_eq!(r.data.rows, 1);
        want.push(text);
    }
}

/// Waits until `r` has applied exactly `want`, in order, woken by each apply.
async fn applied(r: &Running, want: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // Registered before looking, so an apply in between is not missed.
        let change = r.applied.1.notified();
        tokio::pin!(change);
        change.as_mut().enable();
        let got = r.applied.texts();
        if got == want {
            return;
        }
        assert!(
            tokio::time::timeout_at(deadline, change).await.is_ok(),
            "node {} applied {} of {} (first {:?})",
            r.node.id(),
            got.len(),
            want.len(),
            got.first()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_fail_over_and_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut listeners = BTreeMap::new();
    let mut members = BTreeMap::new();
    for id in 1..=3u64 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        members.insert(id, BasicNode::new(l.local_addr().unwrap().to_string()));
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start(id, dir.path(), l).await);
    }
    nodes[&1].raft.initialize(members.clone()).await.unwrap();
    let first = leader(&nodes).await;

    let mut want = Vec::new();
    write(&nodes[&first].raft, 0..200, &mut want).await;
    for r in nodes.values() {
        applied(r, &want).await;
    }

    // The leader stops; the other two elect one of themselves and go on.
    let old = nodes.remove(&first).unwrap();
    stop(old).await;
    let second = leader(&nodes).await;
    assert_ne!(second, first);
    // The new leader dials the stopped node again at the backoff, not in a tight loop (it
    // once retried tens of thousands of times a second, burning a core).
    let before = nodes[&second].node.failed_dials();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let dials = nodes[&second].node.failed_dials() - before;
    assert!(
        dials <= 50,
        "{dials} failed dials to a stopped peer in one second"
    );
    write(&nodes[&second].raft, 200..300, &mut want).await;
    for r in nodes.values() {
        applied(r, &want).await;
    }

    // It comes back from its directory, on its old address, and catches up.
    let addr = members[&first].addr.clone();
    let l = TcpListener::bind(&addr).await.unwrap();
    nodes.insert(first, start(first, dir.path(), l).await);
    let now = leader(&nodes).await;
    write(&nodes[&now].raft, 300..350, &mut want).await;
    for r in nodes.values() {
        applied(r, &want).await;
    }
    for (_, r) in std::mem::take(&mut nodes) {
        stop(r).await;
    }
}

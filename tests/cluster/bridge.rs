//! A bridge runs once per cluster: on the node that runs the cluster's once-per-cluster
//! work (the metadata group's leader), moving to another node when that one dies; what it
//! stores is stored once, redeliveries after the move included.

use super::Cluster;
use crate::common::eventually_eq;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A Mosquitto on a free loopback port, persistence under `dir`; killed when dropped.
pub(crate) struct Mosquitto {
    child: Child,
    port: u16,
}

impl Mosquitto {
    pub(crate) fn start(dir: &Path) -> Mosquitto {
        let port = super::free_port();
        let store = dir.join("mosquitto");
        std::fs::create_dir_all(&store).unwrap();
        let conf = dir.join("mosquitto.conf");
        let mut text = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n\
             persistence_location {}/\nmax_queued_messages 0\n",
            store.display()
        );
        // As root, Mosquitto would switch to its own user, which cannot write our temp dir.
        if unsafe { libc::getuid() } == 0 {
            text.push_str("user root\n");
        }
        std::fs::write(&conf, text).unwrap();
        let binary = match Path::new("/usr/sbin/mosquitto").exists() {
            true => "/usr/sbin/mosquitto",
            false => "mosquitto",
        };
        let child = Command::new(binary)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto (apt-get install mosquitto)");
        crate::common::wait_until(
            10,
            || "mosquitto did not start".into(),
            || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && crate::common::listens(child.id(), port)
            },
        );
        Mosquitto { child, port }
    }

    /// The `[[bridge]]` every node is configured with: `plant/r` lands in `iot.r`.
    pub(crate) fn bridge_config(&self) -> String {
        format!(
            "\n[[bridge]]\nname = \"plant\"\naddress = \"127.0.0.1:{}\"\n\
             topics = [{{ filter = \"plant/#\", qos = 1 }}]\nstrip_prefix = \"plant/\"\n\
             add_prefix = \"/iot/\"\n",
            self.port
        )
    }

    /// Publishes readings of device `b` numbered `seqs` to `plant/r` at QoS 1.
    fn publish(&self, seqs: std::ops::Range<u64>) {
        self.publish_to("plant/r", "b", seqs)
    }

    /// Publishes readings of `device` numbered `seqs` to `topic` at QoS 1.
    fn publish_to(&self, topic: &str, device: &str, seqs: std::ops::Range<u64>) {
        let mut child = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-q", "1", "-t", topic, "-l"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("mosquitto_pub");
        let mut stdin = child.stdin.take().unwrap();
        for seq in seqs {
            writeln!(
                stdin,
                r#"{{"ts": "2026-11-23T13:00:00Z", "device": "{device}", "seq": {seq}}}"#
            )
            .unwrap();
        }
        drop(stdin);
        assert!(child.wait().unwrap().success());
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The node every running node says runs the bridge, when they agree and it is connected
/// there and nowhere else; and what each node said.
async fn agreed_runner(c: &Cluster) -> (Option<u64>, String) {
    let mut said = Vec::new();
    let mut connected = Vec::new();
    let mut seen = String::new();
    for (id, s) in &c.nodes {
        let rows = s.rows("SELECT node, connected FROM system.bridges").await;
        seen += &format!("node {id}: {rows:?}; ");
        let [row] = rows.as_slice() else {
            return (None, seen);
        };
        said.push(row["node"].as_u64());
        if row["connected"].as_bool() == Some(true) {
            connected.push(*id);
        }
    }
    let n = said.first().copied().flatten();
    let agreed = n.filter(|n| said.iter().all(|s| *s == Some(*n)) && connected == [*n]);
    (agreed, seen)
}

/// Waits until the nodes agree on where the bridge runs (see [`agreed_runner`]).
async fn running_on(c: &Cluster) -> u64 {
    let agreed = crate::common::poll(60, || async {
        match agreed_runner(c).await {
            (Some(n), _) => Ok(n),
            (None, seen) => Err(seen),
        }
    })
    .await;
    agreed.unwrap_or_else(|seen| panic!("no one node runs the bridge as every node says: {seen}"))
}

/// Messages published to the bridged broker are stored once; the node running the bridge
/// is killed, another takes it over, and the messages published meanwhile are stored once
/// too.
pub(crate) async fn once_per_cluster(c: &mut Cluster, m: &Mosquitto) {
    // `system.bridges` is for administrators (users exist by now: see `page`).
    let admin = Some(("root", "r"));
    for s in c.nodes.values() {
        s.login(admin);
    }
    let first = running_on(c).await;
    m.publish(3_000_000..3_000_200);
    let q = "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM iot.r WHERE device = 'b'";
    let survivor = *c.nodes.keys().find(|id| **id != first).unwrap();
    rows_once_where(c, survivor, q, 200).await;

    c.nodes.remove(&first).unwrap().kill9();
    m.publish(3_000_200..3_000_400);
    let second = running_on(c).await;
    assert_ne!(second, first, "the bridge moved");
    rows_once_where(c, survivor, q, 400).await;
    c.restart(first);
    c.node(first).login(admin);
    c.settled().await;
}

/// Waits until `q` (`n` rows, `d` distinct) gives `want` for both on node `id`.
async fn rows_once_where(c: &Cluster, id: u64, q: &str, want: u64) {
    eventually_eq(
        &format!("node {id}: {want} bridged rows, each once"),
        60,
        &(Some(want), Some(want)),
        || async {
            let r = c.node(id).rows(q).await;
            (r[0]["n"].as_u64(), r[0]["d"].as_u64())
        },
    )
    .await;
}

/// A bridge added through the admin API of a node that does not run the cluster's bridges
/// runs on the one that does (the metadata group carries it), stores each message once,
/// and is stopped there when it is removed through yet another node.
pub(crate) async fn added_through_the_api_runs_once(c: &Cluster, m: &Mosquitto) {
    let runner = running_on(c).await;
    let others: Vec<u64> = c.nodes.keys().copied().filter(|id| *id != runner).collect();
    let bridge = serde_json::json!({
        "name": "line",
        "address": format!("127.0.0.1:{}", m.port),
        "topics": [{"filter": "line/#", "qos": 1}],
        "strip_prefix": "line/",
        "add_prefix": "/iot/",
    });
    let post = |id: u64, method: reqwest::Method, path: &'static str, body: String| async move {
        let s = c.node(id);
        let r = s.authorized(s.client().request(method, s.url(path)));
        let r = r.body(body).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let (status, text) = post(
        others[0],
        reqwest::Method::POST,
        "/v1/bridges",
        bridge.to_string(),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    // 503 (the metadata group busy, e.g. electing) says to try again: a client would.
    let (status, text) = crate::common::poll(30, || async {
        let (status, text) = post(
            others[1],
            reqwest::Method::POST,
            "/v1/bridges",
            bridge.to_string(),
        )
        .await;
        match status {
            503 => Err(text),
            _ => Ok((status, text)),
        }
    })
    .await
    .unwrap_or_else(|text| (503, text));
    assert_eq!(status, 409, "added once for the whole cluster: {text}");
    let q = "SELECT node, connected FROM system.bridges WHERE name = 'line'";
    for id in c.nodes.keys() {
        eventually_eq(
            &format!("node {id} says where `line` runs"),
            30,
            &(Some(runner), Some(true)),
            || async {
                let r = c.node(*id).rows(q).await;
                let connected = c.node(runner).rows(q).await;
                (
                    r.first().and_then(|r| r["node"].as_u64()),
                    connected.first().and_then(|r| r["connected"].as_bool()),
                )
            },
        )
        .await;
    }
    m.publish_to("line/r", "l", 0..100);
    let q = "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM iot.r WHERE device = 'l'";
    rows_once_where(c, others[1], q, 100).await;
    // A restart asked through a node that does not run it restarts it where it runs (a new
    // connection: its figures start again).
    let (status, text) = post(
        others[1],
        reqwest::Method::POST,
        "/v1/bridges/line/restart",
        String::new(),
    )
    .await;
    assert_eq!(status, 204, "{text}");
    let q2 = "SELECT stored FROM system.bridges WHERE name = 'line'";
    eventually_eq("`line` restarted where it runs", 30, &Some(0), || async {
        c.node(runner)
            .rows(q2)
            .await
            .first()
            .and_then(|r| r["stored"].as_u64())
    })
    .await;
    m.publish_to("line/r", "l", 100..150);
    rows_once_where(c, others[1], q, 150).await;
    let (status, text) = post(
        others[1],
        reqwest::Method::DELETE,
        "/v1/bridges/line",
        String::new(),
    )
    .await;
    assert_eq!(status, 204, "{text}");
    let q = "SELECT count(*) AS n FROM system.bridges WHERE name = 'line'";
    for id in c.nodes.keys() {
        eventually_eq(&format!("node {id} forgets `line`"), 30, &1, || async {
            let r = c.node(*id).rows(q).await;
            (r[0]["n"].as_u64() == Some(0)) as u64
        })
        .await;
    }
}

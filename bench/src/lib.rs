//! Sluice benchmarks.
//!
//! - `benches/wal.rs` (criterion): WAL appends with group commit, many appenders at once.
//! - `benches/apply.rs` (criterion): applying rows to partition buffers.
//! - `src/bin/http_write.rs`: end to end, N single-row HTTP writes from C connections against
//!   the real binary, with PostgreSQL doing single-row durable INSERTs from C connections
//!   (pgbench) in the same run, and the ratio.
//! - `src/bin/mqtt_load.rs`: end to end, C MQTT connections publishing one reading per
//!   message at QoS 0 or 1 into the real binary, and into Mosquitto in the same run.
//!   With `--cluster 3` the same load goes to a three-node cluster and to one node, at each
//!   window of `--inflight`, with the ratios.
//! - `src/bin/paho_load.rs`: end to end, Eclipse Paho for Go (`paho/`, built by the runner)
//!   with one message in flight per connection, as devices publish: 8 and 64 connections,
//!   QoS 0, fleets of 2,000 and 10,000 slow connections, against the real binary and
//!   Mosquitto in the same run; rates, latencies, CPU per message, memory per connection.
//! - `src/bin/cluster_chaos.rs`: three nodes, devices publishing numbered QoS 1 messages
//!   through every node while nodes are killed, restarted, frozen and resumed; every node's
//!   SQL must hold each acknowledged message exactly once.
//! - `src/bin/alert_load.rs`: end to end, the CPU cost of N alerts evaluated every second on
//!   a table receiving R messages/s over MQTT.
//! - `src/bin/query_bench/main.rs`: end to end, JoinBase's nyct_lite queries against the real
//!   binary over HTTP and against DuckDB (`duckdb_queries.py`) on the same data in the same
//!   run, answers compared. Its data comes from [`nyct`], its answers are compared by
//!   [`answer`].

pub mod answer;
pub mod nyct;

/// Kills and reaps a child process (a server under test) when dropped.
#[derive(Debug)]
pub struct Killer(pub std::process::Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `sluice serve` on ports the OS picked, in its own data directory; stopped when
/// dropped.
#[derive(Debug)]
pub struct Sluice {
    process: Killer,
    /// HTTP `host:port`.
    pub http: String,
    /// MQTT `host:port`.
    pub mqtt: String,
    client: reqwest::Client,
}

impl Sluice {
    /// The binary to measure: `explicit`, else the `sluice` built next to the runner.
    pub fn binary(explicit: Option<&std::path::Path>) -> anyhow::Result<std::path::PathBuf> {
        Ok(match explicit {
            Some(p) => p.to_path_buf(),
            None => std::env::current_exe()?.with_file_name("sluice"),
        })
    }

    /// Starts `bin serve` with its data under `dir/sluice` and waits until it listens.
    pub fn start(bin: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<Self> {
        Self::start_with_config(bin, dir, None)
    }

    /// Like [`Sluice::start`], with `config` as the configuration file when given.
    pub fn start_with_config(
        bin: &std::path::Path,
        dir: &std::path::Path,
        config: Option<&str>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(bin);
        if let Some(text) = config {
            std::fs::create_dir_all(dir)?;
            let path = dir.join("sluice.toml");
            std::fs::write(&path, text)?;
            cmd.arg("serve").arg("--config").arg(path);
        } else {
            cmd.arg("serve");
        }
        let mut child = cmd
            .args([
                "--http-listen",
                "127.0.0.1:0",
                "--mqtt-listen",
                "127.0.0.1:0",
                "--pg-listen",
                "",
            ])
            .arg("--data-dir")
            .arg(dir.join("sluice"))
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let process = Killer(child);
        let (mut http, mut mqtt) = (None, None);
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(a) = line.strip_prefix("sluice: mqtt listening on ") {
                mqtt = Some(a.to_string());
            }
            if let Some(a) = line.strip_prefix("sluice: http listening on ") {
                http = Some(a.to_string());
                break;
            }
        }
        Ok(Self {
            process,
            http: http.context("sluice did not start")?,
            mqtt: mqtt.context("sluice printed no MQTT address")?,
            client: reqwest::Client::new(),
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// Runs one statement that must succeed; returns the JSON body.
    pub async fn sql(&self, q: &str) -> anyhow::Result<String> {
        self.sql_at("/v1/sql", q).await
    }

    /// Runs `q` computed: no kept result (`cache=off`).
    pub async fn sql_uncached(&self, q: &str) -> anyhow::Result<String> {
        self.sql_at("/v1/sql?cache=off", q).await
    }

    async fn sql_at(&self, path: &str, q: &str) -> anyhow::Result<String> {
        let r = self
            .client
            .post(format!("http://{}{path}", self.http))
            .body(q.to_string())
            .send()
            .await?;
        let ok = r.status().is_success();
        let text = r.text().await?;
        anyhow::ensure!(ok, "{q}: {text}");
        Ok(text)
    }
}

impl Sluice {
    /// The value of metric `name` on `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = (self.client)
            .get(format!("http://{}/metrics", self.http))
            .send()
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
            .unwrap_or(0.0))
    }
}

/// The configuration files of an `n`-node cluster under `dir` (node `i + 1`'s is the `i`th):
/// node-to-node ports the OS picked, the shared store in `dir/shared`.
pub fn cluster_configs(dir: &std::path::Path, n: usize) -> anyhow::Result<Vec<String>> {
    let ports: Vec<u16> = (0..n)
        .map(|_| {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        })
        .collect::<anyhow::Result<_>>()?;
    let peers: Vec<String> = (ports.iter().enumerate())
        .map(|(i, p)| format!("{} = \"127.0.0.1:{p}\"", i + 1))
        .collect();
    Ok((ports.iter().enumerate())
        .map(|(i, port)| {
            format!(
                "[cluster]\nnode_id = {}\nlisten = \"127.0.0.1:{port}\"\n\
                 shared_store = \"file://{}\"\npeers = {{ {} }}\n",
                i + 1,
                dir.join("shared").display(),
                peers.join(", ")
            )
        })
        .collect())
}

/// Starts an `n`-node cluster of `bin` under `dir` (node `i`'s data in `dir/node<i>`) and
/// waits until every node sees a leader for each of its groups (`within` each).
pub async fn start_cluster(
    bin: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
    within: std::time::Duration,
) -> anyhow::Result<Vec<Sluice>> {
    let mut nodes = Vec::new();
    for (i, config) in cluster_configs(dir, n)?.iter().enumerate() {
        let node_dir = dir.join(format!("node{}", i + 1));
        nodes.push(Sluice::start_with_config(bin, &node_dir, Some(config))?);
    }
    for node in &nodes {
        node.await_leaders(within).await?;
    }
    Ok(nodes)
}

impl Sluice {
    /// Waits until this cluster node sees a leader for each of its groups.
    pub async fn await_leaders(&self, within: std::time::Duration) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let r =
                (self.sql("SELECT count(*) - count(leader) AS missing FROM system.shards")).await;
            match r {
                Ok(r) if r.contains("\"missing\":0") => return Ok(()),
                _ if std::time::Instant::now() > deadline => {
                    anyhow::bail!("no leader for every group in {within:?}: {r:?}")
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }
}

/// The runners' async runtime: two workers, like the machine.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Starts Mosquitto (Debian's package) on a free 127.0.0.1 port with `allow_anonymous`,
/// no persistence and `extra` configuration lines, its file under `dir`; waits until it
/// accepts connections. Returns the process (stopped when dropped) and its port.
pub fn start_mosquitto(dir: &std::path::Path, extra: &str) -> anyhow::Result<(Killer, u16)> {
    start_mosquitto_conf(dir, &format!("persistence false\n{extra}"))
}

/// Like [`start_mosquitto`], with `lines` as the whole configuration but the listener.
pub fn start_mosquitto_conf(dir: &std::path::Path, lines: &str) -> anyhow::Result<(Killer, u16)> {
    use anyhow::Context;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\n{lines}"),
    )?;
    let child = std::process::Command::new("mosquitto")
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting mosquitto (apt-get install mosquitto)")?;
    let process = Killer(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "mosquitto did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok((process, port))
}

/// User + system CPU seconds of process `pid` so far (`/proc/PID/stat`).
pub fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    use anyhow::Context;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at state (field 3).
    let rest = stat.rsplit_once(')').context("odd /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

//! Starts the real `sluice` binary on port 0 in a temporary directory and talks to it over
//! HTTP, as a user would.
#![allow(dead_code, unreachable_pub)]

pub mod browser;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub addr: String,
    /// MQTT `host:port`.
    pub mqtt: String,
    /// MQTT over TLS `host:port`, when configured.
    pub mqtts: Option<String>,
    /// The PostgreSQL protocol's `host:port`, unless turned off.
    pub pg: Option<String>,
    pub dir: PathBuf,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    http: reqwest::Client,
    /// HTTP Basic credentials sent with `sql` and `write` once users exist.
    credentials: std::sync::Mutex<Option<(String, String)>>,
    /// Numbers the MQTT clients this helper makes.
    next_client: std::sync::atomic::AtomicU64,
}

pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

impl Server {
    /// Starts sluice on `dir` with extra `SLUICE_*` variables.
    pub fn start(dir: &Path, env: &[(&str, &str)]) -> Server {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_owned(dir, env)
    }

    fn start_owned(dir: &Path, env: Vec<(String, String)>) -> Server {
        let data = dir.join("data");
        let args = vec![
            "--data-dir".to_string(),
            data.display().to_string(),
            "--http-listen".to_string(),
            "127.0.0.1:0".to_string(),
        ];
        Self::start_args(dir, &args, env)
    }

    /// Starts sluice on `dir` with `toml` as its configuration file.
    pub fn start_with_config(dir: &Path, toml: &str) -> Server {
        let config = dir.join("sluice.toml");
        std::fs::write(&config, toml).unwrap();
        let args = [
            "--config".to_string(),
            config.display().to_string(),
            "--data-dir".to_string(),
            dir.join("data").display().to_string(),
            "--http-listen".to_string(),
            "127.0.0.1:0".to_string(),
        ];
        Self::start_args(dir, &args, Vec::new())
    }

    /// Starts `sluice serve ARGS` with these environment variables.
    pub fn start_args(dir: &Path, args: &[String], env: Vec<(String, String)>) -> Server {
        let mut args = args.to_vec();
        if !args.iter().any(|a| a == "--mqtt-listen") {
            args.extend(["--mqtt-listen".to_string(), "127.0.0.1:0".to_string()]);
        }
        if !args.iter().any(|a| a == "--pg-listen") {
            args.extend(["--pg-listen".to_string(), "127.0.0.1:0".to_string()]);
        }
        let log = dir.join(format!(
            "sluice-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("serve")
            .args(&args)
            .env_remove("RUST_LOG")
            .envs(env.iter().cloned())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = cmd.spawn().expect("start sluice");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut mqtt, mut mqtts, mut pg) = (String::new(), None, None);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("sluice: mqtt listening on ") {
                    mqtt = addr.to_string();
                }
                if let Some(addr) = line.strip_prefix("sluice: mqtts listening on ") {
                    mqtts = Some(addr.to_string());
                }
                if let Some(addr) = line.strip_prefix("sluice: pg listening on ") {
                    pg = Some(addr.to_string());
                }
                let http = (line.strip_prefix("sluice: http listening on "))
                    .or_else(|| line.strip_prefix("sluice: https listening on "));
                if let Some(addr) = http {
                    let _ = tx.send((addr.to_string(), mqtt.clone(), mqtts.clone(), pg.clone()));
                }
            }
        });
        let (addr, mqtt, mqtts, pg) = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "sluice did not start; log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        };
        Server {
            child,
            addr,
            mqtt,
            mqtts,
            pg,
            dir: dir.to_path_buf(),
            log,
            env,
            http: reqwest::Client::new(),
            credentials: Default::default(),
            next_client: Default::default(),
        }
    }

    /// Runs `mosquitto_pub` or `mosquitto_sub` against this server's MQTT port.
    pub fn mosquitto(&self, program: &str, args: &[&str]) -> std::process::Output {
        let port = self.mqtt_port().to_string();
        Command::new(program)
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} (package mosquitto-clients): {e}"))
    }

    /// The MQTT port.
    pub fn mqtt_port(&self) -> u16 {
        self.mqtt.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The MQTT over TLS port, when configured.
    pub fn tls_port(&self) -> Option<u16> {
        self.mqtts.as_ref()?.rsplit(':').next()?.parse().ok()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends these credentials from now on (`None`: none).
    pub fn login(&self, credentials: Option<(&str, &str)>) {
        *self.credentials.lock().unwrap() = credentials.map(|(u, p)| (u.into(), p.into()));
    }

    /// `request` with the credentials set by [`Server::login`].
    pub fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.credentials.lock().unwrap().clone() {
            Some((u, p)) => request.basic_auth(u, Some(p)),
            None => request,
        }
    }

    pub async fn sql(&self, q: &str) -> Reply {
        self.sql_fmt(q, "json").await
    }

    pub async fn sql_fmt(&self, q: &str, format: &str) -> Reply {
        let request = self
            .http
            .post(self.url(&format!("/v1/sql?format={format}")));
        let r = self
            .authorized(request)
            .body(q.to_string())
            .send()
            .await
            .expect("sql request");
        let status = r.status().as_u16();
        Reply {
            status,
            body: r.text().await.unwrap(),
        }
    }

    /// Runs SQL that must succeed and returns its rows.
    pub async fn rows(&self, q: &str) -> Vec<serde_json::Value> {
        let r = self.sql(q).await;
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        r.json().as_array().cloned().unwrap_or_default()
    }

    /// The single number a `SELECT count(*) AS n ...` returns.
    pub async fn count(&self, q: &str) -> u64 {
        let rows = self.rows(q).await;
        rows[0]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_u64()
            .unwrap()
    }

    pub async fn write(
        &self,
        db: &str,
        table: &str,
        content_type: &str,
        body: impl Into<String>,
    ) -> Reply {
        let request = self.http.post(self.url(&format!("/v1/write/{db}/{table}")));
        let r = self
            .authorized(request)
            .header("content-type", content_type)
            .body(body.into())
            .send()
            .await
            .expect("write request");
        let status = r.status().as_u16();
        Reply {
            status,
            body: r.text().await.unwrap(),
        }
    }

    /// Runs a statement that must succeed (200).
    pub async fn sql_ok(&self, q: &str) {
        let r = self.sql(q).await;
        assert_eq!(r.status, 200, "{q}: {}", r.body);
    }

    /// Writes rows that must be accepted (204: durable).
    pub async fn write_ok(
        &self,
        db: &str,
        table: &str,
        content_type: &str,
        body: impl Into<String>,
    ) {
        let r = self.write(db, table, content_type, body).await;
        assert_eq!(r.status, 204, "write to {db}.{table}: {}", r.body);
    }

    /// `/metrics` as text, with the credentials set by [`Server::login`].
    pub async fn metrics(&self) -> String {
        let request = self.authorized(self.http.get(self.url("/metrics")));
        request.send().await.unwrap().text().await.unwrap()
    }

    pub fn client(&self) -> reqwest::Client {
        self.http.clone()
    }

    /// An MQTT 3.1.1 client subscribed (SUBACK received) to `filter`; each message it gets
    /// arrives as (topic, payload as JSON, or null).
    pub async fn subscriber(
        &self,
        filter: &str,
    ) -> (
        rumqttc::AsyncClient,
        tokio::sync::mpsc::UnboundedReceiver<(String, serde_json::Value)>,
    ) {
        self.subscriber_as(filter, |p| serde_json::from_slice(p).unwrap_or_default())
            .await
    }

    /// Like [`Server::subscriber`], each payload as `decode` makes it.
    pub async fn subscriber_as<T: Send + 'static>(
        &self,
        filter: &str,
        decode: fn(&[u8]) -> T,
    ) -> (
        rumqttc::AsyncClient,
        tokio::sync::mpsc::UnboundedReceiver<(String, T)>,
    ) {
        use rumqttc::{Event, Packet};
        let id = format!(
            "watch-{}",
            self.next_client
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", self.mqtt_port());
        o.set_keep_alive(Duration::from_secs(30));
        let (client, mut el) = rumqttc::AsyncClient::new(o, 100);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        client
            .subscribe(filter, rumqttc::QoS::AtLeastOnce)
            .await
            .unwrap();
        tokio::spawn(async move {
            let mut subscribed_tx = Some(subscribed_tx);
            while let Ok(ev) = el.poll().await {
                match ev {
                    Event::Incoming(Packet::SubAck(_)) => {
                        if let Some(t) = subscribed_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Event::Incoming(Packet::Publish(p))
                        if tx.send((p.topic.clone(), decode(&p.payload))).is_err() =>
                    {
                        break;
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(20), subscribed)
            .await
            .expect("SUBACK within 20 s")
            .unwrap();
        (client, rx)
    }

    /// `kill -9`.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(mut self) -> i32 {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut status = None;
        wait_until(
            60,
            || "sluice did not stop on SIGTERM".into(),
            || {
                status = self.child.try_wait().unwrap();
                status.is_some()
            },
        );
        status.and_then(|s| s.code()).unwrap_or(-1)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// An MQTT 5 will to `topic` at QoS 1, not retained, published `delay` seconds after its
/// connection is lost.
pub fn delayed_will(
    topic: &str,
    payload: &str,
    delay: u32,
) -> rumqttc::v5::mqttbytes::v5::LastWill {
    let props = rumqttc::v5::mqttbytes::v5::LastWillProperties {
        delay_interval: Some(delay),
        payload_format_indicator: None,
        message_expiry_interval: None,
        content_type: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
    };
    let qos = rumqttc::v5::mqttbytes::QoS::AtLeastOnce;
    rumqttc::v5::mqttbytes::v5::LastWill::new(topic, payload.to_string(), qos, false, Some(props))
}

/// The bytes of an MQTT 5 CONNECT (clean start, keep-alive 30 s).
pub fn v5_connect(
    client_id: &str,
    will: Option<rumqttc::v5::mqttbytes::v5::LastWill>,
) -> bytes::BytesMut {
    use rumqttc::v5::mqttbytes::v5::{Connect, Packet};
    let mut out = bytes::BytesMut::new();
    Packet::Connect(
        Connect {
            keep_alive: 30,
            client_id: client_id.into(),
            clean_start: true,
            properties: None,
        },
        will,
        None,
    )
    .write(&mut out, None)
    .unwrap();
    out
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns true or the deadline passes.
pub async fn eventually<F, Fut>(what: &str, secs: u64, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_eq(what, secs, &true, check).await;
}

/// Polls `get` until it returns `want` or the deadline passes; a failure shows the last value.
pub async fn eventually_eq<T, F, Fut>(what: &str, secs: u64, want: &T, mut get: F)
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let polled = poll(secs, || {
        let got = get();
        async move {
            let got = got.await;
            match got == *want {
                true => Ok(()),
                false => Err(format!("{got:?}")),
            }
        }
    })
    .await;
    if let Err(last) = polled {
        panic!("timed out waiting for: {what}\nlast: {last}\nwanted: {want:?}");
    }
}

/// Polls `check` until it returns `Ok` (its value is returned) or `secs` pass: then the last
/// `Err` is returned, for the caller to say what it waited for.
pub async fn poll<T, F, Fut>(secs: u64, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        // Between checks, the runtime goes on (a blocking wait here would stall the test's
        // own clients on this thread).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the unlabelled metric `name` in a `/metrics` text ([`Server::metrics`]);
/// 0 when absent.
pub fn metric(metrics: &str, name: &str) -> u64 {
    let line = (metrics.lines()).find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ')));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Waits, in code without a runtime, until `ready` holds; past `secs` it panics with
/// `what()` (which says what did not happen, with any log that tells why).
pub fn wait_until(secs: u64, what: impl Fn() -> String, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ready() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::park_timeout(Duration::from_millis(20));
    }
}

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port` (from `/proc`): a
/// port chosen free may be taken by another test's server before the program meant for it
/// binds it, and a connect alone would not tell.
pub fn listens(pid: u32, port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let inodes: Vec<String> = (table.lines().skip(1))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[1] == local && f[3] == "0A")
        .map(|f| format!("socket:[{}]", f[9]))
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    (fds.flatten())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|link| inodes.iter().any(|i| link.as_os_str() == i.as_str()))
}

/// An argon2 hash of `password`, made by `sluice hash-password` as a user would.
pub fn password_hash(password: &str) -> String {
    use std::io::Write;
    let mut hasher = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sluice hash-password");
    let mut stdin = hasher.stdin.take().unwrap();
    stdin.write_all(format!("{password}\n").as_bytes()).unwrap();
    drop(stdin);
    let out = hasher.wait_with_output().unwrap();
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    hash
}

/// Sends a 3.1.1 CONNECT (with `login`, if any) and a QoS 1 PUBLISH (packet id 7) of
/// `payload` on `topic` over an MQTT WebSocket; returns the two packets the server answers
/// (CONNACK, then PUBACK), in whatever frames they come.
pub async fn publish_over_websocket<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    login: Option<(&str, &str)>,
    topic: &str,
    payload: &str,
) -> Vec<rumqttc::mqttbytes::v4::Packet>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    use rumqttc::mqttbytes::{QoS, v4};
    use tokio_tungstenite::tungstenite::Message;
    let mut out = bytes::BytesMut::new();
    let mut connect = v4::Connect::new("ws-client");
    connect.login = login.map(|(u, p)| v4::Login::new(u, p));
    v4::Packet::Connect(connect)
        .write(&mut out, 1 << 20)
        .unwrap();
    let mut publish = v4::Publish::new(topic, QoS::AtLeastOnce, payload);
    publish.pkid = 7;
    v4::Packet::Publish(publish)
        .write(&mut out, 1 << 20)
        .unwrap();
    ws.send(Message::Binary(out.freeze())).await.unwrap();
    let mut inbound = bytes::BytesMut::new();
    let mut packets = Vec::new();
    while packets.len() < 2 {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("reply over websocket")
            .unwrap()
            .unwrap();
        if let Message::Binary(b) = msg {
            inbound.extend_from_slice(&b);
        }
        while let Ok(p) = v4::Packet::read(&mut inbound, 1 << 20) {
            packets.push(p);
        }
    }
    packets
}

/// A tool `scripts/test.sh` installs under `~/.cache` (`cached`), or the path in `env`;
/// the test fails, saying what makes it, when it is missing.
pub fn installed_tool(env: &str, cached: &str, made_by: &str) -> String {
    let path = std::env::var(env)
        .unwrap_or_else(|_| format!("{}/.cache/{cached}", std::env::var("HOME").expect("HOME")));
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: {made_by}"
    );
    path
}

//! The MQTT session state machine fuzzed over real sockets: hundreds of connections, each a
//! valid CONNECT (3.1.1 or 5.0) followed by a random mix of well-formed, corrupted,
//! truncated and made-up packets (seeded, so a failure can be replayed). The server must
//! close or answer each, never panic, and serve a normal client afterwards. The codec,
//! the payload decoders and the SQL entry have proptest harnesses of their own (broker
//! codec `fuzz`, engine `decode::proptests`, `ddl::tests::fuzz`); `bench/fuzz.sh` runs all
//! of them longer.

mod common;

use bytes::BytesMut;
use common::Server;
use rumqttc::mqttbytes::{QoS, v4};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Up to `max` random bytes.
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const TOPICS: &[&str] = &[
    "/iot/t",
    "a/b",
    "#",
    "+/x",
    "$SYS/x",
    "",
    "a/#/b",
    "/iot/nope",
];

/// One packet: well-formed (3.1.1 codec), then perhaps corrupted or cut short, or made up.
fn packet(rng: &mut Rng) -> Vec<u8> {
    let mut out = BytesMut::new();
    let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize];
    let pkid = rng.below(4) as u16;
    let qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][rng.below(3) as usize];
    let made = match rng.below(9) {
        0 | 1 => {
            let payload = match rng.below(3) {
                0 => br#"{"dev":"fuzz","v":1}"#.to_vec(),
                1 => b"t,dev=x v=1".to_vec(),
                _ => rng.bytes(64),
            };
            let mut p = v4::Publish::new(topic, qos, payload);
            p.pkid = if qos == QoS::AtMostOnce { 0 } else { pkid };
            p.retain = rng.below(4) == 0;
            v4::Packet::Publish(p).write(&mut out, 1 << 20)
        }
        2 => v4::Packet::Subscribe(v4::Subscribe::new(topic, qos)).write(&mut out, 1 << 20),
        3 => {
            let u = v4::Unsubscribe::new(topic);
            v4::Packet::Unsubscribe(u).write(&mut out, 1 << 20)
        }
        4 => v4::Packet::PubRel(v4::PubRel::new(pkid)).write(&mut out, 1 << 20),
        5 => v4::Packet::PubRec(v4::PubRec::new(pkid)).write(&mut out, 1 << 20),
        6 => v4::Packet::PingReq.write(&mut out, 1 << 20),
        7 => {
            // Made up: any type and flags, a length that may lie, any body.
            let mut raw = vec![rng.next() as u8, rng.below(200) as u8];
            raw.extend(rng.bytes(40));
            return raw;
        }
        _ => v4::Packet::Connect(v4::Connect::new("again")).write(&mut out, 1 << 20),
    };
    let mut bytes = match made {
        Ok(_) => out.to_vec(),
        Err(_) => rng.bytes(8),
    };
    match rng.below(6) {
        0 if !bytes.is_empty() => {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
        }
        1 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
        _ => {}
    }
    bytes
}

/// One connection: CONNECT, a random stream, then whatever the server answers until it
/// closes or goes quiet.
async fn session(s: &Server, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let Ok(mut tcp) = tokio::net::TcpStream::connect(&s.mqtt).await else {
        return;
    };
    let id = format!("fuzz-{seed}");
    let mut stream = match rng.below(2) {
        0 => common::v5_connect(&id, None).to_vec(),
        _ => {
            let mut out = BytesMut::new();
            v4::Packet::Connect(v4::Connect::new(id))
                .write(&mut out, 1 << 20)
                .unwrap();
            out.to_vec()
        }
    };
    for _ in 0..1 + rng.below(12) {
        stream.extend(packet(&mut rng));
    }
    let _ = tcp.write_all(&stream).await;
    let mut sink = vec![0u8; 4096];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut sink)).await
    {
        if n == 0 {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn random_packet_streams_never_take_the_broker_down() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE DATABASE iot").await;
    s.sql_ok("CREATE TABLE iot.t (ts TIMESTAMP, dev STRING NOT NULL, v DOUBLE) PARTITION BY yyyymmdd(ts)")
        .await;
    let connections: u64 = std::env::var("FUZZ_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seeds: Vec<u64> = (1..=connections).collect();
    for batch in seeds.chunks(25) {
        futures::future::join_all(batch.iter().map(|&seed| session(&s, seed))).await;
    }
    // Alive, unhurt, and serving a normal client.
    let mut server = s;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited"
    );
    let out = server.mosquitto(
        "mosquitto_pub",
        &["-q", "1", "-t", "/iot/t", "-m", r#"{"dev":"after","v":1}"#],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        server
            .count("SELECT count(*) FROM iot.t WHERE dev = 'after'")
            .await,
        1
    );
    let log = server.log_text();
    assert!(!log.contains("panicked"), "a panic in the log:\n{log}");
}

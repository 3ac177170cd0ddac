//! Lasting subscribers for the chaos runner (`--subscribers N`): MQTT 5 sessions with a
//! session expiry of an hour, subscribed at the run's QoS (`--qos`) to the devices' topic,
//! one on each node in turn. A subscriber whose connection breaks connects to its own node
//! again until it is back, or with `--roam` to the next node (its session follows it
//! there). At the end each must have every message the devices had acknowledged;
//! duplicates are counted (QoS 1 allows them; at QoS 2 each is a failure: a subscriber
//! keeps the packet ids it answered with PUBREC until their PUBREL, as a QoS 2 receiver
//! does, across its connections), and so is each subscriber's longest gap between two
//! deliveries while the devices published.

use super::{NODES, now};
use anyhow::{Result, bail};
use bytes::BytesMut;
use parking_lot::Mutex;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, Connect, ConnectProperties, ConnectReturnCode, Filter, Packet, PubAck, PubComp,
    PubRec, Subscribe,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// What one subscriber received.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// The node its session lives on.
    pub(crate) node: usize,
    pub(crate) seqs: HashSet<u64>,
    pub(crate) copies: u64,
    /// Each delivery's first arrival (seconds into the run, node, DUP, packet id), to say
    /// where a copy's first came from.
    first: HashMap<u64, Arrival>,
    /// The first copies: the copy's arrival and the first one's.
    copied: Vec<(u64, Arrival, Arrival)>,
    /// The longest gap between two deliveries: its length and when it ended (seconds into
    /// the run).
    pub(crate) longest: (f64, f64),
    /// Gaps of over 200 ms between two deliveries: (from, to), seconds into the run, and
    /// the node it was connected to when the gap began.
    pub(crate) gaps: Vec<(f64, f64, usize)>,
    /// First deliveries of a message below one delivered before from the same device (a
    /// device's messages are numbered in the order it sends them; one sent again on a new
    /// connection after its first was stored can come late too), and the most late by.
    pub(crate) reordered: u64,
    behind: u64,
    /// Per device, the highest number delivered.
    highest: HashMap<String, u64>,
    /// The node it is connected to now (with `--roam`, not always its first).
    at: usize,
    /// The last delivery: when, and on which node.
    last: Option<(f64, usize)>,
}

pub(crate) type Shared = Arc<Mutex<Received>>;

/// When a delivery came (seconds into the run), the node its connection was to, its DUP
/// flag and packet id.
type Arrival = (f64, usize, bool, u16);

/// Copies described in the report, per subscriber.
const COPIES_SHOWN: usize = 5;

/// Starts subscriber `i`; returns once it is subscribed.
pub(crate) async fn start(
    i: usize,
    addrs: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
    (roam, qos): (bool, QoS),
) -> Result<(Shared, tokio::task::JoinHandle<()>)> {
    let node = i % NODES;
    let got: Shared = Arc::new(Mutex::new(Received {
        node,
        ..Received::default()
    }));
    let id = format!("chaos-sub-{i}");
    let addr = addrs.lock()[node].clone();
    let (first, _) = connect(&addr, &id, Some(qos)).await?;
    let (g, s) = (got.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut conn = Some(first);
        // QoS 2 packet ids answered with PUBREC and not yet released (PUBREL).
        let mut releasing = HashSet::new();
        // The node it connects to: its own, or with `roam` the next one each time.
        let mut at = node;
        while !s.is_cancelled() {
            let stream = match conn.take() {
                Some(c) => c,
                None => {
                    if roam {
                        at = (at + 1) % NODES;
                    }
                    let addr = addrs.lock()[at].clone();
                    match tokio::time::timeout(Duration::from_secs(2), connect(&addr, &id, None))
                        .await
                    {
                        Ok(Ok((c, present))) => {
                            // A new session: the ids a lost one held mean nothing now.
                            if !present {
                                println!(
                                    "subscriber {i}: its session was not present on node {}",
                                    at + 1
                                );
                                releasing.clear();
                            }
                            c
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    }
                }
            };
            g.lock().at = at;
            receive(stream, &g, &s, &mut releasing).await;
        }
    });
    Ok((got, task))
}

/// Connects `id` (its session kept an hour) and, with `subscribe`, subscribes it at that QoS;
/// whether the session was present.
async fn connect(addr: &str, id: &str, subscribe: Option<QoS>) -> Result<(TcpStream, bool)> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut props = ConnectProperties::new();
    props.session_expiry_interval = Some(3600);
    let connect = Connect {
        keep_alive: 30,
        client_id: id.to_string(),
        clean_start: false,
        properties: Some(props),
    };
    let mut buf = BytesMut::new();
    Packet::Connect(connect, None, None).write(&mut buf, None)?;
    if let Some(qos) = subscribe {
        let mut sub = Subscribe::new(Filter::new("/bench/chaos", qos), None);
        sub.pkid = 1;
        Packet::Subscribe(sub).write(&mut buf, None)?;
    }
    s.write_all(&buf).await?;
    buf.clear();
    let mut connected = false;
    loop {
        match Packet::read(&mut buf, None) {
            Ok(Packet::ConnAck(ConnAck {
                code: ConnectReturnCode::Success,
                session_present,
                ..
            })) if subscribe.is_none() => return Ok((s, session_present)),
            Ok(Packet::ConnAck(ConnAck {
                code: ConnectReturnCode::Success,
                ..
            })) => connected = true,
            Ok(Packet::SubAck(_)) if connected => return Ok((s, false)),
            Ok(other) => bail!("{id}: expected CONNACK and SUBACK, got {other:?}"),
            Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {
                if s.read_buf(&mut buf).await? == 0 {
                    bail!("{id}: connection closed before CONNACK");
                }
            }
            Err(e) => bail!("{e}"),
        }
    }
}

/// Takes deliveries on one connection until it breaks or `stop`; `releasing`: the QoS 2
/// packet ids answered with PUBREC, not yet released.
async fn receive(
    s: TcpStream,
    got: &Shared,
    stop: &CancellationToken,
    releasing: &mut HashSet<u16>,
) {
    let (mut rd, mut wr) = s.into_split();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        let mut acks = BytesMut::new();
        loop {
            match Packet::read(&mut buf, None) {
                Ok(Packet::PubRel(r)) => {
                    releasing.remove(&r.pkid);
                    if Packet::PubComp(PubComp::new(r.pkid, None))
                        .write(&mut acks, None)
                        .is_err()
                    {
                        return;
                    }
                }
                // Sent again (DUP) before its PUBREL: the same message, answered again.
                Ok(Packet::Publish(p))
                    if p.qos == QoS::ExactlyOnce && !releasing.insert(p.pkid) =>
                {
                    if Packet::PubRec(PubRec::new(p.pkid, None))
                        .write(&mut acks, None)
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(Packet::Publish(p)) => {
                    let text = std::str::from_utf8(&p.payload).ok();
                    let mut fields = text.map(|t| t.rsplit(',')).into_iter().flatten();
                    let seq = fields.next().and_then(|n| n.parse::<u64>().ok());
                    let device = fields.next().unwrap_or_default();
                    if let Some(seq) = seq {
                        let mut g = got.lock();
                        let t = now();
                        if let Some((last, on)) = g.last {
                            if t - last > g.longest.0 {
                                g.longest = (t - last, t);
                            }
                            if t - last > 0.2 {
                                g.gaps.push((last, t, on));
                            }
                        }
                        g.last = Some((t, g.at));
                        let here = (t, g.at, p.dup, p.pkid);
                        if g.seqs.insert(seq) {
                            g.first.insert(seq, here);
                            if !g.highest.contains_key(device) {
                                g.highest.insert(device.to_string(), seq);
                            }
                            let highest = g.highest.get_mut(device).expect("inserted");
                            let behind = highest.saturating_sub(seq);
                            *highest = seq.max(*highest);
                            if behind > 0 {
                                g.reordered += 1;
                                g.behind = g.behind.max(behind);
                            }
                        } else {
                            g.copies += 1;
                            if g.copied.len() < COPIES_SHOWN {
                                let first = g.first.get(&seq).copied().unwrap_or_default();
                                g.copied.push((seq, here, first));
                            }
                        }
                    }
                    let ack = match p.qos {
                        QoS::AtMostOnce => None,
                        QoS::AtLeastOnce => Some(Packet::PubAck(PubAck::new(p.pkid, None))),
                        QoS::ExactlyOnce => Some(Packet::PubRec(PubRec::new(p.pkid, None))),
                    };
                    if ack.is_some_and(|a| a.write(&mut acks, None).is_err()) {
                        return;
                    }
                }
                Ok(_) => {}
                Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(_) => return,
            }
        }
        if !acks.is_empty() && wr.write_all(&acks).await.is_err() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(Duration::from_secs(35), rd.read_buf(&mut buf)) => match r {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            },
        }
    }
}

/// The longest delivery gap that overlaps `from..to` among the subscribers connected to
/// another node than `node` (the faulted one) when the gap began.
pub(crate) fn longest_gap(subs: &[Shared], node: usize, (from, to): (f64, f64)) -> f64 {
    (subs.iter())
        .flat_map(|s| s.lock().gaps.clone())
        .filter(|(start, end, at)| *at != node && *end >= from && *start <= to)
        .map(|(start, end, _)| end - start)
        .fold(0.0, f64::max)
}

/// Waits (up to `within`, reset by progress) until every subscriber has every message of
/// `acked`; prints each one's figures and returns whether all did.
pub(crate) async fn report(subs: &[Shared], acked: &HashSet<u64>, within: Duration) -> bool {
    let missing = |s: &Shared| acked.difference(&s.lock().seqs).count();
    let mut left: usize = subs.iter().map(missing).sum();
    let mut since = tokio::time::Instant::now();
    while left > 0 && since.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now_left = subs.iter().map(missing).sum();
        if now_left < left {
            since = tokio::time::Instant::now();
        }
        left = now_left;
    }
    for (i, s) in subs.iter().enumerate() {
        let missed = missing(s);
        let g = s.lock();
        if missed > 0 {
            let mut some: Vec<&u64> = acked.difference(&g.seqs).collect();
            some.sort();
            some.truncate(5);
            println!("subscriber {i} lacks {missed}, among them {some:?}");
        }
        println!(
            "subscriber {i} (node {}): {} of {} acknowledged messages, {} copies, longest gap \
             between deliveries {:.2} s (ended at {:.1} s), {} after a later one of their \
             device (by {} at most)",
            g.node + 1,
            acked.len() - missed,
            acked.len(),
            g.copies,
            g.longest.0,
            g.longest.1,
            g.reordered,
            g.behind
        );
        let said = |(t, node, dup, pkid): Arrival| {
            format!(
                "at {t:.2} s on node {} (DUP {dup}, packet id {pkid})",
                node + 1
            )
        };
        for (seq, copy, first) in &g.copied {
            println!("  copy of {seq}: {}; first {}", said(*copy), said(*first));
        }
    }
    left == 0
}

//! The wire: rumqttc's MQTT 3.1.1 (`v4`) and 5.0 (`v5`) packet codecs behind one packet type.
//!
//! The session layer speaks only MQTT 5 packets ([`Packet`]); a 3.1.1 connection's packets
//! are converted on the way in and out here, so every rule is written once. Properties and
//! reason codes a 3.1.1 client cannot receive are dropped on the way out.

use crate::error::{Error, Result};
use bytes::{Bytes, BytesMut};
use rumqttc::mqttbytes::v4;
use rumqttc::v5::mqttbytes::v5::{self, Packet};
use rumqttc::v5::mqttbytes::{Error as V5Error, QoS};

/// Protocol version of a connection, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// MQTT 3.1.1.
    V4,
    /// MQTT 5.0.
    V5,
}

/// Reads the protocol level of a complete CONNECT frame at the start of `buf`, without
/// consuming it. `Ok(None)`: more bytes are needed.
pub(crate) fn connect_version(buf: &[u8], max_packet: u32) -> Result<Option<(Version, u8)>> {
    match rumqttc::mqttbytes::check(buf.iter(), max_packet as usize) {
        Ok(_) => {}
        Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => return Ok(None),
        Err(rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(n)) => {
            return Err(Error::PacketTooLarge {
                size: n,
                max: max_packet,
            });
        }
        Err(e) => return Err(Error::Malformed(e.to_string())),
    }
    if buf[0] >> 4 != 1 {
        return Err(Error::Protocol("the first packet must be CONNECT".into()));
    }
    fixed_header_flags(buf[0])?;
    // The remaining length is 1-4 bytes, each but the last with the high bit set.
    let start = 1 + buf[1..].iter().take_while(|b| **b & 0x80 != 0).count() + 1;
    let name_len = buf
        .get(start..start + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
        .ok_or_else(|| Error::Malformed("CONNECT too short".into()))?;
    let level = *buf
        .get(start + 2 + name_len)
        .ok_or_else(|| Error::Malformed("CONNECT too short".into()))?;
    // [MQTT-3.1.2-3]: the CONNECT flags' reserved bit must be 0 (a 3.1.1 and a 5.0 rule).
    let flags = buf.get(start + 3 + name_len).copied().unwrap_or(0);
    if (level == 4 || level == 5) && flags & 1 != 0 {
        return Err(Error::Malformed(
            "CONNECT with its reserved flag set [MQTT-3.1.2-3]".into(),
        ));
    }
    match level {
        4 => Ok(Some((Version::V4, level))),
        5 => Ok(Some((Version::V5, level))),
        other => Ok(Some((Version::V4, other))),
    }
}

/// Checks the flags of a fixed header's first byte ([MQTT-2.1.3-1] in 5.0, [MQTT-2.2.2-1]
/// and [MQTT-2.2.2-2] in 3.1.1): PUBREL, SUBSCRIBE and UNSUBSCRIBE carry 0b0010, PUBLISH
/// any QoS but 3, every other packet 0; type 0 is reserved.
fn fixed_header_flags(first: u8) -> Result<()> {
    let (kind, flags) = (first >> 4, first & 0x0F);
    let ok = match kind {
        0 => false,
        3 => (flags >> 1) & 0b11 != 0b11,
        6 | 8 | 10 => flags == 0b0010,
        _ => flags == 0,
    };
    match ok {
        true => Ok(()),
        false => Err(Error::Malformed(format!(
            "fixed header 0x{first:02X}: flags 0b{flags:04b} are not allowed for packet type {kind}"
        ))),
    }
}

/// Takes one packet off the front of `buf`. `Ok(None)`: more bytes are needed.
pub(crate) fn read(
    version: Version,
    buf: &mut BytesMut,
    max_packet: u32,
) -> Result<Option<Packet>> {
    if let Some(&first) = buf.first() {
        fixed_header_flags(first)?;
    }
    match version {
        Version::V5 => {
            // rumqttc reads neither an empty DISCONNECT ("normal") nor one with a reason
            // code and no properties, both of which the spec allows.
            if buf.len() >= 2 && buf[0] == 0xE0 && buf[1] <= 1 {
                if buf[1] == 1 && buf.len() < 3 {
                    return Ok(None);
                }
                let frame = buf.split_to(2 + usize::from(buf[1]));
                let reason_code = match frame.get(2).copied().unwrap_or(0) {
                    0x00 => v5::DisconnectReasonCode::NormalDisconnection,
                    0x04 => v5::DisconnectReasonCode::DisconnectWithWillMessage,
                    _ => v5::DisconnectReasonCode::UnspecifiedError,
                };
                return Ok(Some(Packet::Disconnect(v5::Disconnect {
                    reason_code,
                    properties: None,
                })));
            }
            let before = buf.len();
            match Packet::read(buf, Some(max_packet)) {
                Ok(p) => Ok(Some(p)),
                // rumqttc takes the frame off before parsing it: running short inside a
                // complete frame is a malformed packet, not a wait for more bytes.
                Err(V5Error::InsufficientBytes(_)) if buf.len() < before => Err(Error::Malformed(
                    "a field runs past the end of its packet".into(),
                )),
                Err(V5Error::InsufficientBytes(_)) => Ok(None),
                Err(V5Error::PayloadSizeLimitExceeded { pkt_size, max }) => {
                    Err(Error::PacketTooLarge {
                        size: pkt_size,
                        max,
                    })
                }
                Err(e) => Err(Error::Malformed(e.to_string())),
            }
        }
        Version::V4 => {
            let before = buf.len();
            match v4::Packet::read(buf, max_packet as usize) {
                Ok(p) => Ok(Some(from_v4(p))),
                Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) if buf.len() < before => Err(
                    Error::Malformed("a field runs past the end of its packet".into()),
                ),
                Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => Ok(None),
                Err(rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(n)) => {
                    Err(Error::PacketTooLarge {
                        size: n,
                        max: max_packet,
                    })
                }
                Err(e) => Err(Error::Malformed(e.to_string())),
            }
        }
    }
}

/// Appends `packet` to `out` in the connection's protocol. Packets a 3.1.1 client has no
/// form for (a server DISCONNECT, AUTH) are skipped.
pub(crate) fn write(version: Version, packet: &Packet, out: &mut BytesMut) -> Result<()> {
    let r = match version {
        // rumqttc 0.25 writes a property length its remaining length does not count
        // (`E0 01 rc 00`), so the server's DISCONNECT is written here.
        Version::V5 => match packet {
            Packet::Disconnect(d) => {
                out.extend_from_slice(&[0xE0, 0x02, d.reason_code as u8, 0x00]);
                Ok(())
            }
            p => p.write(out, None).map(|_| ()),
        },
        Version::V4 => match to_v4(packet) {
            Some(p) => p
                .write(out, usize::MAX)
                .map(|_| ())
                .map_err(|e| V5Error::Io(std::io::Error::other(e.to_string()))),
            None => Ok(()),
        },
    };
    r.map_err(|e| Error::Encode(e.to_string()))
}

fn from_v4(p: v4::Packet) -> Packet {
    match p {
        v4::Packet::Connect(c) => {
            let will = c.last_will.map(|w| v5::LastWill {
                topic: Bytes::from(w.topic),
                message: w.message,
                qos: qos_v5(w.qos),
                retain: w.retain,
                properties: None,
            });
            let login = c.login.map(|l| v5::Login {
                username: l.username,
                password: l.password,
            });
            Packet::Connect(
                v5::Connect {
                    keep_alive: c.keep_alive,
                    client_id: c.client_id,
                    clean_start: c.clean_session,
                    properties: None,
                },
                will,
                login,
            )
        }
        v4::Packet::Publish(p) => Packet::Publish(v5::Publish {
            dup: p.dup,
            qos: qos_v5(p.qos),
            retain: p.retain,
            topic: Bytes::from(p.topic),
            pkid: p.pkid,
            payload: p.payload,
            properties: None,
        }),
        v4::Packet::PubAck(a) => Packet::PubAck(v5::PubAck {
            pkid: a.pkid,
            reason: v5::PubAckReason::Success,
            properties: None,
        }),
        v4::Packet::PubRec(a) => Packet::PubRec(v5::PubRec {
            pkid: a.pkid,
            reason: v5::PubRecReason::Success,
            properties: None,
        }),
        v4::Packet::PubRel(a) => Packet::PubRel(v5::PubRel {
            pkid: a.pkid,
            reason: v5::PubRelReason::Success,
            properties: None,
        }),
        v4::Packet::PubComp(a) => Packet::PubComp(v5::PubComp {
            pkid: a.pkid,
            reason: v5::PubCompReason::Success,
            properties: None,
        }),
        v4::Packet::Subscribe(s) => Packet::Subscribe(v5::Subscribe {
            pkid: s.pkid,
            filters: s
                .filters
                .into_iter()
                .map(|f| v5::Filter {
                    path: f.path,
                    qos: qos_v5(f.qos),
                    nolocal: false,
                    preserve_retain: false,
                    retain_forward_rule: v5::RetainForwardRule::OnEverySubscribe,
                })
                .collect(),
            properties: None,
        }),
        v4::Packet::Unsubscribe(u) => Packet::Unsubscribe(v5::Unsubscribe {
            pkid: u.pkid,
            filters: u.topics,
            properties: None,
        }),
        v4::Packet::PingReq => Packet::PingReq(v5::PingReq),
        v4::Packet::PingResp => Packet::PingResp(v5::PingResp),
        v4::Packet::Disconnect => Packet::Disconnect(v5::Disconnect {
            reason_code: v5::DisconnectReasonCode::NormalDisconnection,
            properties: None,
        }),
        // Server-to-client packets a client has no business sending; the session layer
        // treats them as the protocol errors they are.
        v4::Packet::ConnAck(_) => Packet::ConnAck(v5::ConnAck {
            session_present: false,
            code: v5::ConnectReturnCode::ProtocolError,
            properties: None,
        }),
        v4::Packet::SubAck(a) => Packet::SubAck(v5::SubAck {
            pkid: a.pkid,
            return_codes: Vec::new(),
            properties: None,
        }),
        v4::Packet::UnsubAck(a) => Packet::UnsubAck(v5::UnsubAck {
            pkid: a.pkid,
            reasons: Vec::new(),
            properties: None,
        }),
    }
}

fn to_v4(p: &Packet) -> Option<v4::Packet> {
    use v5::ConnectReturnCode as C;
    Some(match p {
        Packet::ConnAck(a) => v4::Packet::ConnAck(v4::ConnAck {
            session_present: a.session_present,
            code: match a.code {
                C::Success => v4::ConnectReturnCode::Success,
                C::UnsupportedProtocolVersion | C::RefusedProtocolVersion => {
                    v4::ConnectReturnCode::RefusedProtocolVersion
                }
                C::ClientIdentifierNotValid | C::BadClientId => v4::ConnectReturnCode::BadClientId,
                C::BadUserNamePassword => v4::ConnectReturnCode::BadUserNamePassword,
                C::NotAuthorized | C::Banned => v4::ConnectReturnCode::NotAuthorized,
                _ => v4::ConnectReturnCode::ServiceUnavailable,
            },
        }),
        Packet::Publish(p) => v4::Packet::Publish(v4::Publish {
            dup: p.dup,
            qos: qos_v4(p.qos),
            retain: p.retain,
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            pkid: p.pkid,
            payload: p.payload.clone(),
        }),
        Packet::PubAck(a) => v4::Packet::PubAck(v4::PubAck { pkid: a.pkid }),
        Packet::PubRec(a) => v4::Packet::PubRec(v4::PubRec { pkid: a.pkid }),
        Packet::PubRel(a) => v4::Packet::PubRel(v4::PubRel { pkid: a.pkid }),
        Packet::PubComp(a) => v4::Packet::PubComp(v4::PubComp { pkid: a.pkid }),
        Packet::SubAck(a) => v4::Packet::SubAck(v4::SubAck {
            pkid: a.pkid,
            return_codes: a
                .return_codes
                .iter()
                .map(|c| match c {
                    v5::SubscribeReasonCode::Success(q) => {
                        v4::SubscribeReasonCode::Success(qos_v4(*q))
                    }
                    _ => v4::SubscribeReasonCode::Failure,
                })
                .collect(),
        }),
        Packet::UnsubAck(a) => v4::Packet::UnsubAck(v4::UnsubAck { pkid: a.pkid }),
        Packet::PingResp(_) => v4::Packet::PingResp,
        _ => return None,
    })
}

fn qos_v5(q: rumqttc::mqttbytes::QoS) -> QoS {
    match q {
        rumqttc::mqttbytes::QoS::AtMostOnce => QoS::AtMostOnce,
        rumqttc::mqttbytes::QoS::AtLeastOnce => QoS::AtLeastOnce,
        rumqttc::mqttbytes::QoS::ExactlyOnce => QoS::ExactlyOnce,
    }
}

fn qos_v4(q: QoS) -> rumqttc::mqttbytes::QoS {
    match q {
        QoS::AtMostOnce => rumqttc::mqttbytes::QoS::AtMostOnce,
        QoS::AtLeastOnce => rumqttc::mqttbytes::QoS::AtLeastOnce,
        QoS::ExactlyOnce => rumqttc::mqttbytes::QoS::ExactlyOnce,
    }
}

#[cfg(test)]
mod fuzz {
    //! Arbitrary bytes through the packet path: reading must end in a packet, "more bytes
    //! needed" or an error, never a panic or a loop. `FUZZ_CASES` runs longer
    //! (bench/fuzz.sh).
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512)
    }

    /// Frames that look like MQTT: a real packet type with any flags, a well-formed
    /// remaining length, and any body.
    fn framed() -> impl Strategy<Value = Vec<u8>> {
        (
            1u8..16,
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..120),
        )
            .prop_map(|(kind, flags, body)| {
                let mut out = vec![(kind << 4) | (flags & 0x0f)];
                let mut len = body.len();
                loop {
                    let byte = (len % 128) as u8;
                    len /= 128;
                    out.push(if len > 0 { byte | 0x80 } else { byte });
                    if len == 0 {
                        break;
                    }
                }
                out.extend(body);
                out
            })
    }

    fn read_all(bytes: &[u8]) {
        for version in [Version::V4, Version::V5] {
            let _ = connect_version(bytes, 1024);
            let mut buf = BytesMut::from(bytes);
            // Each Ok(Some) consumes at least one byte, so this ends.
            for _ in 0..=bytes.len() {
                match read(version, &mut buf, 1024) {
                    Ok(Some(_)) if !buf.is_empty() => continue,
                    _ => break,
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            read_all(&bytes);
        }

        #[test]
        fn mqtt_like_frames_never_panic(frames in prop::collection::vec(framed(), 1..6)) {
            read_all(&frames.concat());
        }
    }
}

//! Reading the CONNECT packet (and refusing what cannot be served) and answering with CONNACK.

use crate::BrokerState;
use crate::codec::{self, Version};
use crate::error::{Error, Result};
use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5::*;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

pub(super) async fn read_connect<R, W>(
    shared: &BrokerState,
    rd: &mut R,
    wr: &mut W,
    buf: &mut BytesMut,
) -> Result<Option<(Version, Packet)>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let max = shared.config.max_packet_size;
    loop {
        if let Some((version, level)) = codec::connect_version(buf, max)? {
            if level != 4 && level != 5 {
                tracing::debug!(level, "unsupported MQTT protocol level");
                send_connack(
                    wr,
                    Version::V4,
                    ConnectReturnCode::UnsupportedProtocolVersion,
                    false,
                    None,
                )
                .await?;
                return Ok(None);
            }
            return match codec::read(version, buf, max) {
                Ok(Some(p)) => Ok(Some((version, p))),
                Ok(None) => Err(Error::Malformed("incomplete CONNECT".into())),
                Err(e) => {
                    if version == Version::V5 {
                        let code = match e {
                            Error::PacketTooLarge { .. } => ConnectReturnCode::PacketTooLarge,
                            _ => ConnectReturnCode::MalformedPacket,
                        };
                        let _ = send_connack(wr, version, code, false, None).await;
                    }
                    Err(e)
                }
            };
        }
        if super::read_scratch(rd, buf).await? == 0 {
            return Ok(None);
        }
    }
}

pub(super) async fn send_connack<W: AsyncWrite + Unpin>(
    wr: &mut W,
    version: Version,
    code: ConnectReturnCode,
    session_present: bool,
    properties: Option<ConnAckProperties>,
) -> Result<()> {
    let mut out = BytesMut::new();
    codec::write(
        version,
        &Packet::ConnAck(ConnAck {
            session_present,
            code,
            properties,
        }),
        &mut out,
    )?;
    wr.write_all(&out).await?;
    wr.flush().await?;
    Ok(())
}

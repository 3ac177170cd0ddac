//! A byte-stream protocol over WebSocket: MQTT at `/mqtt`. Each WebSocket connection becomes
//! one in-memory duplex stream handed to the protocol's handler; binary frames carry the
//! bytes both ways, so the protocol layer cannot tell it from TCP.

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Takes over one connection's byte stream (e.g. the broker serving it).
pub type StreamHandler = Arc<dyn Fn(DuplexStream, SocketAddr) + Send + Sync>;

#[derive(Clone)]
struct WsState {
    subprotocol: &'static str,
    handler: StreamHandler,
}

/// A route at `path` that upgrades to WebSocket with `subprotocol` and hands the stream to
/// `handler`.
pub fn stream_route(path: &str, subprotocol: &'static str, handler: StreamHandler) -> Router {
    Router::new().route(path, get(upgrade)).with_state(WsState {
        subprotocol,
        handler,
    })
}

async fn upgrade(
    ws: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(s): State<WsState>,
) -> Response {
    ws.protocols([s.subprotocol])
        .on_upgrade(move |socket| pump(socket, peer, s.handler))
}

async fn pump(socket: WebSocket, peer: SocketAddr, handler: StreamHandler) {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    handler(theirs, peer);
    let (mut rd, mut wr) = tokio::io::split(ours);
    let (mut sink, mut stream) = socket.split();
    let inbound = async move {
        while let Some(Ok(msg)) = stream.next().await {
            match msg {
                Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                Message::Binary(_) => {}
                Message::Close(_) => break,
                // Text frames are not MQTT; pings are answered by the library.
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    };
    let outbound = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n]));
                    if sink.send(frame).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sink.close().await;
    };
    // The broker closing its side ends the WebSocket; the client leaving ends the stream.
    let inbound = tokio::spawn(inbound);
    outbound.await;
    inbound.abort();
}

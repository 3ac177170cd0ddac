//! HTTPS: the HTTP listener's connections wrapped in TLS. Handshakes run beside the accept
//! loop, each with a deadline, so a client that connects and says nothing never holds up
//! others; a failed handshake is logged and its connection dropped.

use axum::serve::Listener;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Handshakes allowed at once; past this, accepting waits for some to finish.
const MAX_HANDSHAKES: usize = 1024;
/// Longest a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A finished handshake: the TLS stream and the peer's address (`None`: it failed).
type Handshake<L> = Option<(TlsStream<<L as Listener>::Io>, <L as Listener>::Addr)>;

/// A listener whose connections are TLS streams.
pub(crate) struct TlsListener<L: Listener> {
    inner: L,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Handshake<L>>,
}

impl<L: Listener> TlsListener<L> {
    pub(crate) fn new(inner: L, acceptor: TlsAcceptor) -> Self {
        Self {
            inner,
            acceptor,
            handshakes: JoinSet::new(),
        }
    }
}

impl<L> Listener for TlsListener<L>
where
    L: Listener,
    L::Addr: std::fmt::Debug + Send + 'static,
{
    type Io = TlsStream<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                (io, addr) = self.inner.accept(), if self.handshakes.len() < MAX_HANDSHAKES => {
                    let acceptor = self.acceptor.clone();
                    self.handshakes.spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                            Ok(Ok(stream)) => Some((stream, addr)),
                            Ok(Err(e)) => {
                                tracing::debug!(peer = ?addr, error = %e, "HTTPS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(peer = ?addr, "HTTPS handshake timed out");
                                None
                            }
                        }
                    });
                }
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

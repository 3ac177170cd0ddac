//! The HTTP listener's guards: a limit on open connections ([`Limited`]) and HTTPS
//! ([`TlsListener`]). TLS handshakes run beside the accept loop, each with a deadline, so a
//! client that connects and says nothing never holds up others; a failed handshake is
//! logged and its connection dropped.

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

/// A listener that keeps at most `max` connections open: one past it is closed as soon as
/// it is accepted.
pub(crate) struct Limited<L> {
    inner: L,
    open: std::sync::Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl<L> Limited<L> {
    pub(crate) fn new(inner: L, max: usize) -> Self {
        let open = std::sync::Arc::new(tokio::sync::Semaphore::new(max));
        Self { inner, open, max }
    }
}

/// A connection holding its place among the open ones until dropped.
pub(crate) struct Counted<T> {
    io: T,
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl<L> Listener for Limited<L>
where
    L: Listener,
    L::Io: Unpin,
    L::Addr: std::fmt::Debug,
{
    type Io = Counted<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = self.inner.accept().await;
            match self.open.clone().try_acquire_owned() {
                Ok(place) => return (Counted { io, _place: place }, addr),
                Err(_) => {
                    tracing::warn!(peer = ?addr, max = self.max, "HTTP connection closed: http.max_connections are open")
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

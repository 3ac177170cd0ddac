//! Busy-polling HTTP connections: a lone client sending requests back to back gets its next
//! request read by a thread that is still awake.
//!
//! Between two requests of a back-to-back client (an alert loop, a dashboard refresh), the
//! server's thread would park and its CPU go idle; the next request then has to wake it. On
//! a virtual machine that wake-up (an inter-processor interrupt to a halted vCPU) costs tens
//! of microseconds, more than answering an alert query: on 2 vCPUs such a query, ~20 µs of
//! server time, ran at ~7k requests/s from one client, ~17k with both processes pinned to
//! one CPU. So after a response has gone out, a connection keeps reading its socket without
//! blocking, yielding the CPU between reads, for up to the listener's budget before it
//! parks, when:
//! - its last gap between requests was within the budget (an idle keep-alive connection,
//!   a browser's, stops after one miss and starts again once a request follows quickly);
//! - no other connection has read a request within the last [`QUIET`]: with several
//!   clients the CPUs are busy and wake-ups cost little, so the CPU goes to requests;
//! - no other connection is spinning.
//!
//! It stops as soon as another connection reads a request.

use axum::serve::Listener;
use parking_lot::Mutex;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How long after another connection's request a connection does not spin.
const QUIET: Duration = Duration::from_millis(5);

/// What the connections of one listener share.
#[derive(Debug)]
struct SpinState {
    /// The origin of the times below.
    epoch: Instant,
    /// The last two connections that read a request, each with when it last did (µs since
    /// `epoch`), the latest first.
    readers: Mutex<[(u64, u64); 2]>,
    /// Set while one connection spins.
    spinning: AtomicBool,
    /// Spins that read a request, and spins that ran out of budget.
    caught: AtomicU64,
    missed: AtomicU64,
}

impl SpinState {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Whether a connection other than `id` read a request within [`QUIET`].
    fn others_active(&self, id: u64) -> bool {
        let since = self.now_us().saturating_sub(QUIET.as_micros() as u64);
        let readers = self.readers.lock();
        readers.iter().any(|&(by, at)| by != id && at > since)
    }

    /// Connection `id` read (part of) a request.
    fn read_by(&self, id: u64) {
        let now = self.now_us();
        let mut readers = self.readers.lock();
        if readers[0].0 != id {
            readers[1] = readers[0];
        }
        readers[0] = (id, now);
    }
}

/// A TCP listener whose connections busy-poll for up to `budget` between requests.
pub(crate) struct SpinListener {
    inner: TcpListener,
    budget: Duration,
    shared: Arc<SpinState>,
    next_id: u64,
}

impl SpinListener {
    /// `budget` zero turns spinning off.
    pub(crate) fn new(inner: TcpListener, budget: Duration) -> Self {
        let shared = SpinState {
            epoch: Instant::now(),
            readers: Mutex::new([(0, 0); 2]),
            spinning: AtomicBool::new(false),
            caught: AtomicU64::new(0),
            missed: AtomicU64::new(0),
        };
        Self {
            inner,
            budget,
            shared: Arc::new(shared),
            next_id: 0,
        }
    }

    /// Spins so far that read a request, and that ran out of budget (or gave way).
    #[cfg(test)]
    fn spins(&self) -> Arc<SpinState> {
        self.shared.clone()
    }
}

impl Listener for SpinListener {
    type Io = SpinStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (tcp, addr) = Listener::accept(&mut self.inner).await;
        self.next_id += 1;
        let stream = SpinStream {
            tcp,
            id: self.next_id,
            budget: self.budget,
            shared: self.shared.clone(),
            idle_since: None,
            eager: true,
            wrote: false,
        };
        (stream, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// One accepted connection; see the module docs.
pub(crate) struct SpinStream {
    tcp: TcpStream,
    /// Unique among the listener's connections, from 1.
    id: u64,
    budget: Duration,
    shared: Arc<SpinState>,
    /// When a read first found nothing to read since the last response went out.
    idle_since: Option<Instant>,
    /// Whether the last gap between requests was within the budget.
    eager: bool,
    /// Bytes were written since data was last read: a response (or its start) went out.
    /// hyper also reads while a request is being answered, to notice a client hanging up;
    /// those reads must not spin, as the response is not out yet.
    wrote: bool,
}

impl SpinStream {
    pub(crate) fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.tcp.set_nodelay(nodelay)
    }

    /// Notes a write: once (part of) a response is out, the client's turn begins, and the
    /// gap to its next request is counted from here (not from a read that found nothing
    /// while the request was being answered).
    fn after_write(&mut self, r: &Poll<io::Result<usize>>) {
        if matches!(r, Poll::Ready(Ok(n)) if *n > 0) {
            self.wrote = true;
            self.idle_since = None;
        }
    }

    /// Reads without blocking until data comes, the budget is spent, or another connection
    /// reads a request. `None` when nothing came.
    fn spin(&mut self, buf: &mut ReadBuf<'_>) -> Option<io::Result<()>> {
        if self.shared.others_active(self.id) || self.shared.spinning.swap(true, Ordering::Acquire)
        {
            return None;
        }
        let deadline = Instant::now() + self.budget;
        // Read the socket itself: tokio's `try_read` answers from the readiness its driver
        // last saw, which the driver's thread updates only once it wakes, as it would
        // without spinning. The socket is non-blocking, so this read never waits.
        let socket = socket2::SockRef::from(&self.tcp);
        let dst = buf.initialize_unfilled();
        let result = loop {
            match io::Read::read(&mut &*socket, dst) {
                Ok(n) => break Some(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Some(Err(e)),
            }
            if Instant::now() >= deadline || self.shared.others_active(self.id) {
                break None;
            }
            // A client on this CPU gets it at once.
            std::thread::yield_now();
        };
        self.shared.spinning.store(false, Ordering::Release);
        let counter = match result {
            Some(_) => &self.shared.caught,
            None => &self.shared.missed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result.map(|r| r.map(|n| buf.advance(n)))
    }
}

impl AsyncRead for SpinStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let filled = buf.filled().len();
        let mut result = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if result.is_pending() {
            // The gap to the next request starts now, before any spin.
            let idle_since = *this.idle_since.get_or_insert_with(Instant::now);
            if this.eager && this.wrote && !this.budget.is_zero() {
                match this.spin(buf) {
                    Some(r) => result = Poll::Ready(r),
                    // Ran out (not merely gave way at once): this gap was too long.
                    None => this.eager = idle_since.elapsed() < this.budget,
                }
            }
        }
        match &result {
            Poll::Pending => {}
            Poll::Ready(Ok(())) if buf.filled().len() > filled => {
                if let Some(since) = this.idle_since.take() {
                    this.eager = since.elapsed() <= this.budget;
                }
                this.wrote = false;
                this.shared.read_by(this.id);
            }
            Poll::Ready(_) => {}
        }
        result
    }
}

impl AsyncWrite for SpinStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.tcp).poll_write(cx, buf);
        this.after_write(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        this.after_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::post;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Longest any one step of these tests may take.
    const STEP: Duration = Duration::from_secs(20);

    /// Serves a route echoing the body on 127.0.0.1, through a [`SpinListener`].
    async fn serve(budget: Duration) -> (std::net::SocketAddr, Arc<SpinState>) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = SpinListener::new(tcp, budget);
        let shared = listener.spins();
        let app = Router::new().route(
            "/echo",
            post(|body: String| async move { format!("echo:{body}") }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, shared)
    }

    /// Sends one request, whole or as its head then (after `pause`) its body, and returns
    /// the response's body.
    async fn ask(conn: &mut TcpStream, body: &str, pause: Option<Duration>) -> String {
        let head = format!(
            "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let send = async {
            match pause {
                None => conn.write_all(format!("{head}{body}").as_bytes()).await,
                Some(pause) => {
                    conn.write_all(head.as_bytes()).await?;
                    tokio::time::sleep(pause).await;
                    conn.write_all(body.as_bytes()).await
                }
            }
        };
        tokio::time::timeout(STEP, send).await.unwrap().unwrap();
        tokio::time::timeout(STEP, response(conn)).await.unwrap()
    }

    /// Reads one `200` response with a content length; returns its body.
    async fn response(conn: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let len: usize = (head.lines())
                .find_map(|l| l.strip_prefix("content-length:"))
                .expect("a content length")
                .trim()
                .parse()
                .unwrap();
            if buf.len() >= end + 4 + len {
                assert_eq!(buf.len(), end + 4 + len, "bytes after the response");
                return String::from_utf8(buf[end + 4..].to_vec()).unwrap();
            }
        }
    }

    async fn connect(addr: std::net::SocketAddr) -> TcpStream {
        let conn = TcpStream::connect(addr).await.unwrap();
        conn.set_nodelay(true).unwrap();
        conn
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_client_sending_back_to_back_is_read_by_spinning() {
        // A budget far above any turnaround, so that spins catch requests on a slow machine.
        let (addr, shared) = serve(Duration::from_millis(50)).await;
        let mut conn = connect(addr).await;
        for i in 0..300 {
            assert_eq!(
                ask(&mut conn, &format!("q{i}"), None).await,
                format!("echo:q{i}")
            );
        }
        // A request may also come before the read (then nothing spins), and on a busy
        // machine some more than the budget after: only a spin that waits for a response
        // that is not out yet misses every time.
        let caught = shared.caught.load(Ordering::Relaxed);
        let missed = shared.missed.load(Ordering::Relaxed);
        assert!(
            caught > missed,
            "{caught} spins read a request, {missed} ran out"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_in_pieces_or_after_a_pause_are_answered() {
        let (addr, shared) = serve(Duration::from_millis(2)).await;
        let mut conn = connect(addr).await;
        for i in 0..20 {
            let body = format!("r{i}");
            let pause = (i % 2 == 0).then_some(Duration::from_millis(10));
            assert_eq!(ask(&mut conn, &body, pause).await, format!("echo:{body}"));
            if i % 5 == 4 {
                // Longer than the budget: the spin after this response runs out.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert!(shared.missed.load(Ordering::Relaxed) >= 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_hanging_up_while_spun_for_is_closed_and_others_go_on() {
        let (addr, _shared) = serve(Duration::from_millis(50)).await;
        for i in 0..5 {
            let mut conn = connect(addr).await;
            assert_eq!(ask(&mut conn, "x", None).await, "echo:x");
            conn.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let n = tokio::time::timeout(STEP, conn.read_to_end(&mut rest)).await;
            assert_eq!(n.unwrap().unwrap(), 0, "connection {i}: {rest:?}");
        }
    }

    /// Two clients of the server at `addr` taking turns, each answer checked.
    async fn take_turns(addr: std::net::SocketAddr) {
        let mut clients = [connect(addr).await, connect(addr).await];
        for i in 0..50 {
            for (name, conn) in ["a", "b"].iter().zip(&mut clients) {
                let body = format!("{name}{i}");
                assert_eq!(ask(conn, &body, None).await, format!("echo:{body}"));
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn several_clients_are_answered_and_a_zero_budget_never_spins() {
        let (addr, shared) = serve(Duration::ZERO).await;
        take_turns(addr).await;
        let spins = shared.caught.load(Ordering::Relaxed) + shared.missed.load(Ordering::Relaxed);
        assert_eq!(spins, 0);
        // With a budget, two clients taking turns are answered alike.
        take_turns(serve(Duration::from_millis(50)).await.0).await;
    }
}

//! A connection's socket: reads through the thread's scratch buffer, writes from the
//! connection's output buffer.

use crate::BrokerState;
use bytes::BytesMut;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// The largest read: what the thread's scratch buffer holds.
const MAX_READ: usize = 64 * 1024;

thread_local! {
    /// Each worker thread's read buffer: a read lands here and what it got is copied to the
    /// connection's buffer, so a connection waiting for data holds none.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; MAX_READ].into_boxed_slice());
}

/// Reads what the socket has (at most [`MAX_READ`] bytes) and appends it to `buf`; 0 at the
/// end of the stream.
pub(crate) fn read_scratch<'a, R: AsyncRead + Unpin>(
    rd: &'a mut R,
    buf: &'a mut BytesMut,
) -> impl Future<Output = std::io::Result<usize>> + 'a {
    std::future::poll_fn(move |cx| {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut got = tokio::io::ReadBuf::new(scratch);
            std::task::ready!(Pin::new(&mut *rd).poll_read(cx, &mut got))?;
            buf.extend_from_slice(got.filled());
            std::task::Poll::Ready(Ok(got.filled().len()))
        })
    })
}

/// Takes the `n` bytes written (0: a flush) off `out`; whether any were.
pub(super) fn wrote(shared: &BrokerState, out: &mut BytesMut, n: usize) -> bool {
    if n == 0 {
        return false;
    }
    shared
        .metrics
        .bytes_out
        .fetch_add(n as u64, Ordering::Relaxed);
    bytes::Buf::advance(out, n);
    // Give a large buffer back (a burst of deliveries grew it).
    if out.is_empty() && out.capacity() > 16 * 1024 {
        *out = BytesMut::new();
    }
    true
}

/// Writes some of `out` (returns how much), or when it is empty flushes the socket (returns
/// 0). A write of nothing with data waiting means the peer is gone.
pub(super) async fn write_some<W: AsyncWrite + Unpin>(
    wr: &mut W,
    out: &[u8],
) -> std::io::Result<usize> {
    if out.is_empty() {
        wr.flush().await?;
        return Ok(0);
    }
    match wr.write(out).await? {
        0 => Err(std::io::ErrorKind::WriteZero.into()),
        n => Ok(n),
    }
}

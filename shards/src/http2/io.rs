//! The `h2` crate on monoio: a socket in monoio's poll mode reads and writes through tokio's
//! I/O traits (readiness from the driver, epoll or io_uring), and [`Rewind`] hands out first the
//! bytes the HTTP/1 front read before it saw the preface.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose first bytes were already read: they are read again before the stream's.
pub(crate) struct Rewind<T> {
    read: Bytes,
    inner: T,
}

impl<T> Rewind<T> {
    pub(crate) fn new(read: Bytes, inner: T) -> Rewind<T> {
        Rewind { read, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            self.read.advance(n);
            if self.read.is_empty() {
                // Read whole: its memory goes back now, not when the connection ends.
                self.read = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of fixed bytes, for the rewind's order.
    struct Fixed(&'static [u8]);

    impl AsyncRead for Fixed {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self.0.len().min(buf.remaining());
            buf.put_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn bytes_already_read_come_first_then_the_stream() {
        let mut rewind = Rewind::new(Bytes::from_static(b"abc"), Fixed(b"def"));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut out = Vec::new();
        let mut space = [0u8; 2];
        loop {
            let mut buf = ReadBuf::new(&mut space);
            assert!(Pin::new(&mut rewind)
                .poll_read(&mut cx, &mut buf)
                .is_ready());
            if buf.filled().is_empty() {
                break;
            }
            out.extend_from_slice(buf.filled());
        }
        assert_eq!(out, b"abcdef");
    }
}

//! A TLS stream in poll style, for the `h2` crate: what a [`super::TlsStream`] becomes when its
//! connection speaks HTTP/2. It keeps the stream's engine, so ciphertext already read and
//! plaintext already decrypted carry over.

use std::io::{self, Write};
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use monoio::net::tcp::stream_poll::TcpStreamPoll;
use rustls::ConnectionCommon;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Engine, Next, KEEP_WRITE_BUFFER};

/// A TLS connection on a poll-style socket.
pub struct TlsPoll<C> {
    io: TcpStreamPoll,
    engine: Engine<C>,
    /// Records on their way out: `outgoing[written..]` is not yet on the socket.
    outgoing: Vec<u8>,
    written: usize,
    close_sent: bool,
}

impl<C, SD> TlsPoll<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>> + Unpin,
    SD: rustls::SideData,
{
    pub(super) fn new(io: TcpStreamPoll, engine: Engine<C>, mut outgoing: Vec<u8>) -> TlsPoll<C> {
        outgoing.clear();
        TlsPoll {
            io,
            engine,
            outgoing,
            written: 0,
            close_sent: false,
        }
    }

    /// Puts every record rustls has ready on the socket.
    fn poll_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.written < self.outgoing.len() {
                let n =
                    ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.written += n;
                continue;
            }
            self.outgoing.clear();
            self.written = 0;
            if !self.engine.session.wants_write() {
                if self.outgoing.capacity() > KEEP_WRITE_BUFFER {
                    self.outgoing = Vec::new();
                }
                return Poll::Ready(Ok(()));
            }
            self.engine.seal_into(&mut self.outgoing)?;
        }
    }

    fn poll_write_slices(
        &mut self,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_records(cx))?;
        let n = self.engine.session.writer().write_vectored(slices)?;
        // The bytes are taken: what the socket does not take now goes with the next flush.
        if let Poll::Ready(Err(error)) = self.poll_records(cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(n))
    }
}

impl<C, SD> AsyncRead for TlsPoll<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>> + Unpin,
    SD: rustls::SideData,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            match this.engine.advance()? {
                Next::Plaintext => {
                    let n = buf.remaining().min(this.engine.plaintext);
                    let copied = this.engine.copy_plaintext(buf.initialize_unfilled_to(n))?;
                    buf.advance(copied);
                    return Poll::Ready(Ok(()));
                }
                Next::End => return Poll::Ready(Ok(())),
                Next::Socket => {
                    let mut buffer = this.engine.take_read_buffer();
                    let mut into = ReadBuf::uninit(buffer.spare_capacity_mut());
                    match Pin::new(&mut this.io).poll_read(cx, &mut into) {
                        Poll::Pending => {
                            this.engine.incoming = buffer;
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(error)) => {
                            this.engine.incoming = buffer;
                            return Poll::Ready(Err(error));
                        }
                        Poll::Ready(Ok(())) => {
                            let n = into.filled().len();
                            // SAFETY: the socket read initialised the first `n` bytes of the
                            // spare capacity (`ReadBuf::filled`).
                            unsafe { buffer.set_len(n) };
                            this.engine.put_read_buffer(buffer)?;
                        }
                    }
                }
            }
        }
    }
}

impl<C, SD> AsyncWrite for TlsPoll<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>> + Unpin,
    SD: rustls::SideData,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_slices(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slices(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_records(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    /// Sends close_notify, then ends the socket's sending side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.close_sent = true;
            this.engine.session.send_close_notify();
        }
        ready!(this.poll_records(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

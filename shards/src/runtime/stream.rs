//! The byte stream beneath a connection, as the fronts, the upstream pools and the upgrade copy
//! see it: anything that reads and writes through the reactor, splits into halves, and can turn
//! into a poll-style stream for the `h2` crate. Plain TCP is one; an encrypting stream is the
//! next. The shortcuts that go straight to the socket (a non-blocking send, a half-close, a peek
//! for a closed idle connection) sit behind [`Socket`], and only a stream whose bytes reach the
//! wire as written offers the send ([`ByteStream::send_now`]), decided by its type, not at run
//! time.

// Three system calls on a socket the caller holds open (see each SAFETY).
#![allow(unsafe_code)]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use monoio::io::{
    AsyncReadRent, AsyncWriteRent, CancelableAsyncReadRent, IntoPollIo, OwnedReadHalf, Split,
};
use monoio::net::TcpStream;

/// A connection's byte stream: what every front, pool and copy is generic over.
pub trait ByteStream:
    AsyncReadRent
    + CancelableAsyncReadRent
    + AsyncWriteRent
    + Split
    + IntoPollIo<PollIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static>
    + 'static
{
    /// The stream is TLS (the request's scheme is `https`).
    const TLS: bool = false;

    /// The socket beneath, for the shortcuts; taken before the stream is split.
    fn socket(&self) -> Socket;

    /// Writes what `socket` takes at once of `bytes`, without waiting; returns how much. Only a
    /// stream whose bytes are the socket's can (plain TCP: [`Socket::send_raw`]); any other
    /// writes nothing here, and its bytes go through the reactor.
    #[inline]
    fn send_now(socket: Socket, bytes: &[u8]) -> usize {
        let _ = (socket, bytes);
        0
    }

    /// Completes when the peer has sent something (bytes, a FIN, an error), without reading it:
    /// a request waiting for a slot watches its client with it.
    fn readable(reader: &OwnedReadHalf<Self>) -> impl Future<Output = io::Result<()>>;
}

impl ByteStream for TcpStream {
    #[inline]
    fn socket(&self) -> Socket {
        Socket {
            fd: self.as_raw_fd(),
        }
    }

    #[inline]
    fn send_now(socket: Socket, bytes: &[u8]) -> usize {
        socket.send_raw(bytes)
    }

    #[inline]
    fn readable(reader: &OwnedReadHalf<TcpStream>) -> impl Future<Output = io::Result<()>> {
        // SAFETY: both halves reach the stream through one `UnsafeCell`. This shared borrow
        // lives only while a request waits for a slot: nothing is written to the peer then, and
        // the read half is not used for anything else until this future is dropped.
        let stream: &TcpStream = unsafe { &*reader.0.get() };
        stream.readable(false)
    }
}

/// Opens byte streams to pods: the upstream pools dial through one.
pub trait Connector {
    type Stream: ByteStream;
    /// What a dial needs to know besides the address: nothing for plain TCP, the TLS settings of
    /// the pod's revision for TLS.
    type Target: ?Sized;

    /// Opens a connection to `addr`, ready for small writes (heads and frames must not wait).
    fn connect(
        &self,
        addr: SocketAddr,
        target: &Self::Target,
    ) -> impl Future<Output = io::Result<Self::Stream>>;

    /// Where a target listed at `addr` is dialled (for logs).
    fn dial_addr(&self, addr: SocketAddr, _target: &Self::Target) -> SocketAddr {
        addr
    }
}

/// Dials plain TCP, with Nagle off.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainTcp;

impl Connector for PlainTcp {
    type Stream = TcpStream;
    type Target = ();

    async fn connect(&self, addr: SocketAddr, _: &()) -> io::Result<TcpStream> {
        let stream = TcpStream::connect_addr(addr).await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

/// The socket beneath a stream, kept beside its halves for the calls that bypass the reactor.
/// It must not outlive the stream it was taken from.
#[derive(Clone, Copy, Debug)]
pub struct Socket {
    fd: RawFd,
}

impl Socket {
    /// The descriptor: the shard's idle set shuts its read side down to close an idle
    /// connection, which ends a read in flight whatever the stream above it.
    #[inline]
    pub fn fd(self) -> RawFd {
        self.fd
    }

    /// Writes what the socket takes at once of `bytes`, without waiting; returns how much.
    /// Private to this module: only a stream whose bytes are the socket's (no framing or
    /// encryption in between) offers it, through [`ByteStream::send_now`].
    ///
    /// Under io_uring a write would otherwise wait for the end of the shard's turn, behind every
    /// other operation queued in it (client writes, each waking a client thread). For the
    /// request a pod has been waiting for, that queue is the idle gap between two of its
    /// requests. A non-blocking `send` puts the bytes on the wire at once; whatever it did not
    /// take (a full socket buffer) or any error is left to the regular write, which reports it.
    #[inline]
    fn send_raw(self, bytes: &[u8]) -> usize {
        // SAFETY: `fd` is a socket owned by the stream this was taken from, open for the call
        // (the caller holds one of its halves); `bytes` is a live slice the kernel only reads.
        // MSG_DONTWAIT makes the call non-blocking whatever the socket's mode; MSG_NOSIGNAL
        // turns a closed peer into EPIPE instead of a signal.
        let n = unsafe {
            libc::send(
                self.fd,
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(n).unwrap_or(0)
    }

    /// Shuts down the sending side: the peer reads the end of what it was sent (a pod's server
    /// that watches for its client, Go's `net/http` or uvicorn, cancels the work, then answers
    /// or closes). Errors are ignored: a connection already gone has nothing to tell.
    #[inline]
    pub fn shut_write(self) {
        // SAFETY: `fd` is a socket owned by the stream this was taken from, open for the call.
        unsafe {
            libc::shutdown(self.fd, libc::SHUT_WR);
        }
    }

    /// Whether the peer closed (or wrote unsolicited bytes on) this idle connection: a
    /// non-blocking `MSG_PEEK` of one byte, which leaves the receive queue as it was.
    pub fn peer_closed_or_spoke(self) -> bool {
        let mut byte = 0u8;
        // SAFETY: `fd` is a socket owned by the stream this was taken from, open for the call;
        // recv with MSG_PEEK|MSG_DONTWAIT only inspects the receive queue and writes at most
        // one byte into `byte`, which outlives the call.
        let n = unsafe {
            libc::recv(
                self.fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            // Nothing to read: the connection is quiet and usable.
            return io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock;
        }
        // 0 = the peer closed it; > 0 = bytes nobody asked for (a late response).
        true
    }
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;

//! Socket helpers of the HTTP/1 front: whole writes that keep their buffer, the non-blocking
//! send that puts a pod's request on the wire before the ring is submitted, and the readiness
//! wait of a queued request. They know sockets and writers, not the client connection
//! (`client::write_out` builds on them).

// A non-blocking send and a readiness wait on sockets the reactor owns (see each SAFETY).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use monoio::buf::IoBuf;
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf};
use monoio::net::TcpStream;

/// Writes all of `out` and clears it, keeping its allocation.
pub(super) async fn write_all<W: AsyncWriteRent>(
    writer: &mut W,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let result = write_rest(writer, out, 0).await;
    out.clear();
    result
}

/// Writes what the socket takes at once of `bytes`, without waiting; returns how much.
///
/// Under io_uring a write would otherwise wait for the end of the shard's turn, behind every
/// other operation queued in it (client writes, each waking a client thread). For the request
/// a pod has been waiting for, that queue is the idle gap between two of its requests. A
/// non-blocking `send` puts the bytes on the wire at once; whatever it did not take (a full
/// socket buffer) or any error is left to the regular write, which reports it.
pub(super) fn send_now(fd: RawFd, bytes: &[u8]) -> usize {
    // SAFETY: `fd` is a socket (a pod connection's, or the client's) owned by the caller and
    // open for the call; `bytes` is a live slice the kernel only reads. MSG_DONTWAIT makes the
    // call non-blocking whatever the socket's mode; MSG_NOSIGNAL turns a closed peer into
    // EPIPE instead of a signal.
    let n = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).unwrap_or(0)
}

/// Shuts down the sending side of a pod connection: the pod reads the end of the request, and a
/// server that watches for its client (Go's `net/http`, uvicorn) cancels the work, then
/// answers or closes. Errors are ignored: a connection already gone has nothing to tell.
pub(super) fn shut_write(fd: RawFd) {
    // SAFETY: `fd` is a pod connection's socket, owned by the caller and open for the call.
    unsafe {
        libc::shutdown(fd, libc::SHUT_WR);
    }
}

/// Writes `out[from..]` and leaves `out` as it was.
pub(super) async fn write_rest<W: AsyncWriteRent>(
    writer: &mut W,
    out: &mut Vec<u8>,
    from: usize,
) -> io::Result<()> {
    let buf = std::mem::take(out);
    let (result, rest) = writer.write_all(buf.slice(from..)).await;
    *out = rest.into_inner();
    result.map(|_| ())
}

/// Completes when the client's socket has something to read (bytes, a FIN, an error), without
/// reading it.
pub(super) async fn client_readable(reader: &OwnedReadHalf<TcpStream>) -> io::Result<()> {
    // SAFETY: both halves reach the stream through one `UnsafeCell`. This shared borrow lives
    // only while a request waits for a slot: nothing is written to the client then, and the read
    // half is not used for anything else until this future is dropped.
    let stream: &TcpStream = unsafe { &*reader.0.get() };
    stream.readable(false).await
}

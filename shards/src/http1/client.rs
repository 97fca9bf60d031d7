//! The client side of an HTTP/1 connection as the front's modules share it: the connection's
//! halves and scratch buffers, what is known of the current request, and the answers the
//! activator writes itself.

use std::future::Future;

use kactivator_h1::{BodyKind, Method, RequestHead, ResponseHead, Version};
use monoio::buf::{IoBuf, IoVecBuf};
use monoio::io::{AsyncWriteRent, Canceller, OwnedReadHalf, OwnedWriteHalf};
use monoio::BufResult;

use super::io::write_rest;
use super::rewrite::{self, ClientSide};
use crate::request::answer::Answer;
use crate::request::outcome::{Next, RequestShape};
use crate::request::peer::Peer;
use crate::request::policy::WaitNote;
use crate::runtime::buffer::InBuf;
use crate::runtime::stream::{ByteStream, Socket};

/// The downstream side of a connection and its reusable scratch buffers.
pub(super) struct ClientConn<S: ByteStream> {
    pub(super) reader: OwnedReadHalf<S>,
    pub(super) writer: ClientWriter<S>,
    pub(super) inbuf: InBuf,
    /// Outbound request head and body bytes on their way to the pod.
    pub(super) request_out: Vec<u8>,
    /// Response bytes on their way to the client.
    pub(super) response_out: Vec<u8>,
    /// The client: its IP for `X-Forwarded-For`, its address for the request log.
    pub(super) peer: Peer,
    /// Interrupts the read-ahead on the client once a response is complete; one per connection,
    /// made by its first exchange (a connection that only waits in a queue never needs one).
    pub(super) canceller: Option<Canceller>,
    pub(super) head: RequestHead,
    pub(super) response_head: ResponseHead,
    pub(super) request_id: String,
    /// This connection closes after the current request: it was told to while idle (evicted at
    /// the connection cap, or the drain ended) and a request had already arrived.
    pub(super) close_after: bool,
}

/// The client's write half, remembering whether anything of the current request's answer was
/// written: a panic that ends a request may answer it with a 500 only while nothing was.
pub(super) struct ClientWriter<S: ByteStream> {
    half: OwnedWriteHalf<S>,
    /// The socket beneath, for [`ClientWriter::send_now`] and the idle set.
    socket: Socket,
    wrote: bool,
}

impl<S: ByteStream> ClientWriter<S> {
    pub(super) fn new(half: OwnedWriteHalf<S>, socket: Socket) -> ClientWriter<S> {
        ClientWriter {
            half,
            socket,
            wrote: false,
        }
    }

    /// Writes what the socket takes at once of `bytes` (a non-blocking send, see
    /// [`ByteStream::send_now`]); returns how much.
    pub(super) fn send_now(&mut self, bytes: &[u8]) -> usize {
        let sent = S::send_now(self.socket, bytes);
        self.wrote |= sent > 0;
        sent
    }

    /// A new request begins: nothing of its answer is written yet.
    pub(super) fn begin(&mut self) {
        self.wrote = false;
    }

    /// The socket beneath (the shard's idle set shuts its read side down to close an idle
    /// connection).
    pub(super) fn socket(&self) -> Socket {
        self.socket
    }

    /// Whether any byte of the current answer was handed to the socket.
    pub(super) fn wrote(&self) -> bool {
        self.wrote
    }

    pub(super) fn into_inner(self) -> OwnedWriteHalf<S> {
        self.half
    }
}

impl<S: ByteStream> AsyncWriteRent for ClientWriter<S> {
    #[inline]
    fn write<T: IoBuf>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        self.wrote = true;
        self.half.write(buf)
    }

    #[inline]
    fn writev<T: IoVecBuf>(&mut self, buf_vec: T) -> impl Future<Output = BufResult<usize, T>> {
        self.wrote = true;
        self.half.writev(buf_vec)
    }

    #[inline]
    fn flush(&mut self) -> impl Future<Output = std::io::Result<()>> {
        self.half.flush()
    }

    #[inline]
    fn shutdown(&mut self) -> impl Future<Output = std::io::Result<()>> {
        self.half.shutdown()
    }
}

/// What the exchange needs to know about the request once its head is consumed.
#[derive(Clone, Copy, Debug)]
pub(super) struct RequestMeta {
    pub(super) method: Method,
    pub(super) version: Version,
    pub(super) body: BodyKind,
    pub(super) keep_alive: bool,
    pub(super) upgrade: bool,
    /// What the activator tells the client of the request's wait, set for each attempt.
    pub(super) note: Option<WaitNote>,
}

impl RequestMeta {
    pub(super) fn of(head: &RequestHead) -> RequestMeta {
        RequestMeta {
            method: head.method,
            version: head.version,
            body: head.body,
            keep_alive: head.keep_alive(),
            upgrade: head.upgrade.is_some(),
            note: None,
        }
    }

    pub(super) fn shape(&self) -> RequestShape {
        RequestShape {
            keep_alive: self.keep_alive,
            bodiless: self.body == BodyKind::Empty,
            upgrade: self.upgrade,
        }
    }

    /// A bodiless, non-upgrade request is written to the pod in one piece and kept in
    /// `request_out` afterwards, so it can be replayed on another pod without a copy.
    pub(super) fn keeps_head(&self) -> bool {
        self.body == BodyKind::Empty && !self.upgrade
    }
}

/// Answers with a response the activator made itself.
pub(super) async fn answer_locally<S: ByteStream>(
    conn: &mut ClientConn<S>,
    response: &Answer<'_>,
    client: ClientSide,
) -> Next {
    conn.response_out.clear();
    rewrite::write_local_response(response, client, &mut conn.response_out);
    match write_out(&mut conn.writer, &mut conn.response_out).await {
        Ok(()) if client.keep_alive => Next::KeepAlive,
        _ => Next::Close,
    }
}

/// Writes all of `out` to the client and clears it, keeping its allocation: what the socket
/// takes at once goes out with a non-blocking send, only the rest through the driver. Under
/// io_uring that saves an operation (its submission, completion and the task's wake-up) on
/// nearly every response, which fits the socket buffer whole; under epoll the driver's write is
/// the same system call.
pub(super) async fn write_out<S: ByteStream>(
    client: &mut ClientWriter<S>,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let sent = client.send_now(out);
    let result = if sent < out.len() {
        write_rest(client, out, sent).await
    } else {
        Ok(())
    };
    out.clear();
    result
}

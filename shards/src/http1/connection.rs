//! One client connection over HTTP/1.1: read a request head, take it through the request path
//! (`lifecycle`, with `front::H1Front` as its HTTP/1 leaves), then read the next one
//! or close. A connection that opens with the HTTP/2 preface goes back to the hub for the
//! HTTP/2 front.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;

use kactivator_h1::{parse_request, HeadError, Method, Parsed, RequestHead, ResponseHead, Version};
use monoio::io::{AsyncWriteRent, Splitable};
use monoio::time::Instant;

use super::client::{write_out, ClientConn, ClientWriter};
use super::front::H1Front;
use super::rewrite::{self, ClientSide};
use crate::lifecycle;
use crate::preface::{self, Preface};
use crate::request::answer::Answer;
use crate::request::deadlines;
use crate::request::outcome::Next;
use crate::request::peer::Peer;
use crate::runtime::buffer::InBuf;
use crate::runtime::contain;
use crate::runtime::race::{race, Either};
use crate::runtime::stream::ByteStream;
use crate::shard::{Shard, FIRST_REQUEST_GRACE};

enum HeadRead {
    Ready,
    Closed,
    Invalid(HeadError),
    /// The connection opened with the HTTP/2 preface: it is the HTTP/2 front's.
    Http2,
}

/// How an HTTP/1 connection ended.
pub(crate) enum Served<S> {
    /// It closed.
    Closed,
    /// It opened with the HTTP/2 preface: it is the HTTP/2 front's, with what was read of it.
    Http2 {
        stream: S,
        read: bytes::Bytes,
        peer: Rc<Peer>,
    },
}

/// Serves one accepted connection until it closes, or until it turns out to be HTTP/2.
///
/// Not an `async fn`: the connection is set up before the future exists, so the future holds the
/// connection state once instead of the arguments and the state side by side (every open
/// connection, idle or queued, pays the future's size).
pub(crate) fn serve_connection<S: ByteStream>(
    shard: Rc<Shard>,
    stream: S,
    peer: SocketAddr,
) -> impl Future<Output = Served<S>> {
    let accepted = Instant::now();
    let stats = shard.stats();
    stats.connections_accepted.increment();
    let socket = stream.socket();
    let (reader, writer) = stream.into_split();
    let mut conn = ClientConn {
        reader,
        writer: ClientWriter::new(writer, socket),
        // Every open connection holds these, idle or queued for a pod, so they start small: a
        // request head usually fits in 2 KiB and the buffer grows to `READ_CHUNK` once a read
        // fills it; the output buffers are allocated on first use (a queued request has not
        // needed either yet) and kept for the next request.
        inbuf: InBuf::default(),
        request_out: Vec::new(),
        response_out: Vec::new(),
        peer: Peer::of(peer).over_tls(S::TLS),
        canceller: None,
        head: RequestHead::default(),
        response_head: ResponseHead::default(),
        request_id: String::new(),
        close_after: false,
    };
    async move {
        let shard = &shard;
        let stats = shard.stats();
        let mut served = false;
        loop {
            match read_request_head(shard, &mut conn, served, accepted).await {
                HeadRead::Ready => {}
                HeadRead::Closed => break,
                HeadRead::Http2 => return take_over(conn),
                HeadRead::Invalid(error) => {
                    stats.bad_requests.increment();
                    let body = format!(
                        "{} {}: {error}\n",
                        error.status(),
                        rewrite::reason_phrase(error.status())
                    );
                    conn.response_out.clear();
                    rewrite::write_local_response(
                        &Answer::error(error.status(), body.as_bytes()),
                        ClientSide {
                            version: Version::Http11,
                            keep_alive: false,
                            head_only: false,
                        },
                        &mut conn.response_out,
                    );
                    let _ = write_out(&mut conn.writer, &mut conn.response_out).await;
                    break;
                }
            }
            stats.requests.increment();
            served = true;
            conn.writer.begin();
            // A panic while serving this request ends the request and the connection, not the
            // shard.
            let handled = contain::catching(handle_request(shard, &mut conn)).await;
            let next = match handled {
                Ok(next) => next,
                Err(panic) => {
                    contain::record(stats, "a request", &*panic);
                    answer_after_panic(&mut conn).await;
                    Next::Close
                }
            };
            // A response that did not say `Connection: close` promised the client it may send
            // again on this connection, draining or not: it waits, idle, for that request (see
            // `read_request_head`); the end of the drain closes it.
            if next == Next::Close {
                break;
            }
            // Idle from here: it can give way to a client waiting at the connection cap.
            shard.wake_paused_accept();
        }
        // Closing the write half sends FIN now rather than when the read half is dropped.
        let _ = conn.writer.shutdown().await;
        Served::Closed
    }
}

/// The connection, found to speak HTTP/2, rejoined with what was read of it for the HTTP/2
/// front.
fn take_over<S: ByteStream>(conn: ClientConn<S>) -> Served<S> {
    let ClientConn {
        reader,
        writer,
        inbuf,
        peer,
        ..
    } = conn;
    match reader.reunite(writer.into_inner()) {
        Ok(stream) => Served::Http2 {
            stream,
            read: bytes::Bytes::copy_from_slice(inbuf.data()),
            peer: Rc::new(peer),
        },
        Err(_) => {
            tracing::warn!("cannot rejoin the halves of a connection for HTTP/2");
            Served::Closed
        }
    }
}

/// After a panic ended a request: a 500 if nothing of an answer was written yet (the
/// connection closes either way; what the panic left in it cannot be trusted).
async fn answer_after_panic<S: ByteStream>(conn: &mut ClientConn<S>) {
    if conn.writer.wrote() {
        return;
    }
    conn.response_out.clear();
    rewrite::write_local_response(
        &Answer::internal_error(),
        ClientSide {
            version: conn.head.version,
            keep_alive: false,
            head_only: conn.head.method == Method::Head,
        },
        &mut conn.response_out,
    );
    let _ = write_out(&mut conn.writer, &mut conn.response_out).await;
}

/// Reads until a request head is complete. `served`: the connection has carried a request
/// before (it is an idle keep-alive connection while nothing is buffered); `accepted`: when it
/// was accepted.
///
/// Timers, as upstream's server (`ReadHeaderTimeout`): a connection's first head must be whole
/// within the head timeout of the accept, so a client that connects and says nothing cannot
/// hold a place under the connection cap for longer; a later head within the head timeout of
/// its first byte. Between requests a keep-alive connection waits without a timer, until its
/// client sends, or it is the longest idle at the connection cap, or the drain ends.
async fn read_request_head<S: ByteStream>(
    shard: &Shard,
    conn: &mut ClientConn<S>,
    served: bool,
    accepted: Instant,
) -> HeadRead {
    let head_timeout = shard.settings.head_timeout;
    // When the head must be whole: set from the accept for the first request, from the first
    // byte for later ones.
    let mut deadline = (!served).then(|| deadlines::later(accepted, head_timeout));
    let mut first_byte = false;
    // Counted among the shard's pending heads from the first read that left it unfinished
    // until it is read or the connection closes (the common head, whole in one read, never is).
    let _pending = PendingHead {
        shard,
        counted: Cell::new(false),
    };
    loop {
        if !conn.inbuf.is_empty() {
            // A connection may open with the HTTP/2 preface instead of a request head (h2c with
            // prior knowledge, on any data port, as upstream).
            let opening = if served {
                Preface::No
            } else {
                preface::preface(conn.inbuf.data())
            };
            match opening {
                Preface::Yes => return HeadRead::Http2,
                Preface::Partial => {}
                Preface::No => match parse_request(conn.inbuf.data(), &mut conn.head) {
                    Ok(Parsed::Complete) => return HeadRead::Ready,
                    Ok(Parsed::Partial) => {}
                    Err(error) => return HeadRead::Invalid(error),
                },
            }
            if !first_byte {
                first_byte = true;
                _pending.count();
                deadline.get_or_insert_with(|| deadlines::later(Instant::now(), head_timeout));
            }
        }
        let read = match deadline {
            // A new connection that has sent nothing yet is not closed under its first request
            // by the drain: it has until `FIRST_REQUEST_GRACE` after every listener closed to
            // send one, and is answered; and until its head deadline in any case.
            Some(deadline) if !served && !first_byte => {
                let stop = async {
                    shard.stopping.wait().await;
                    shard.alarms.at(Instant::now() + FIRST_REQUEST_GRACE).await;
                };
                match race(
                    conn.inbuf.fill(&mut conn.reader),
                    race(shard.alarms.at(deadline), stop),
                )
                .await
                {
                    Either::Left(read) => read,
                    Either::Right(Either::Left(())) => {
                        shard.stats().head_timeouts.increment();
                        return HeadRead::Closed;
                    }
                    Either::Right(Either::Right(())) => return HeadRead::Closed,
                }
            }
            Some(deadline) => {
                match race(conn.inbuf.fill(&mut conn.reader), shard.alarms.at(deadline)).await {
                    Either::Left(read) => read,
                    Either::Right(()) => {
                        shard.stats().head_timeouts.increment();
                        return HeadRead::Closed;
                    }
                }
            }
            // Idle between requests. Told to close (the longest idle at the connection cap, or
            // the drain is over), the socket's read side is shut down: the read ends, with a
            // request that arrived at that moment (served, and the connection closes after it)
            // or with end of file.
            None => {
                let idle = shard.idle.enter(conn.writer.socket().fd());
                let read = conn.inbuf.fill(&mut conn.reader).await;
                if idle.told() {
                    conn.close_after = true;
                }
                read
            }
        };
        match read {
            Ok(0) | Err(_) => return HeadRead::Closed,
            Ok(_) => {}
        }
    }
}

/// A connection's place among the shard's pending heads, given back on drop.
struct PendingHead<'a> {
    shard: &'a Shard,
    counted: Cell<bool>,
}

impl PendingHead<'_> {
    fn count(&self) {
        self.counted.set(true);
        self.shard
            .pending_heads
            .set(self.shard.pending_heads.get() + 1);
    }
}

impl Drop for PendingHead<'_> {
    fn drop(&mut self) {
        if self.counted.get() {
            self.shard
                .pending_heads
                .set(self.shard.pending_heads.get() - 1);
            self.shard.wake_paused_accept();
        }
    }
}

/// One request: through the request path with this connection as its front.
async fn handle_request<S: ByteStream>(shard: &Rc<Shard>, conn: &mut ClientConn<S>) -> Next {
    let arrival = Instant::now();
    let mut front = H1Front::new(conn);
    lifecycle::serve(shard, &mut front, arrival).await
}

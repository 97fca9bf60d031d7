//! One exchange with a pod over HTTP/1.1: the request (head and body) goes out while the
//! response comes back, concurrently, so an early response, `100 Continue` and streaming in both
//! directions all work. Ends in an [`Ended`] that the request path concludes from.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;

use kactivator_h1::{
    encode_last_chunk, parse_response, BodyDecoder, BodyError, BodyKind, Parsed, ResponseHead,
    Version,
};
use monoio::io::{Canceller, OwnedReadHalf, OwnedWriteHalf};
use monoio::time::Instant;

use super::client::write_out;
use super::client::{ClientConn, ClientWriter, RequestMeta};
use super::io::write_rest;
use super::reframe::{reframe, Reframed};
use super::rewrite::{self, client_framing, ClientFraming};
use super::upgrade::splice_upgraded;
use crate::lifecycle::admission::Held;
use crate::request::deadlines::Deadlines;
use crate::request::error::RequestError;
use crate::request::outcome::Ended;
use crate::runtime::buffer::InBuf;
use crate::runtime::late::Ticket;
use crate::runtime::race::{race, Either};
use crate::runtime::stream::{ByteStream, Socket};
use crate::shard::{PodStream, Shard};
use crate::upstream::error::{TransportCause, UpstreamError};
use crate::upstream::pool::{IdleConns, UpstreamConn};

/// While waiting for a response, read ahead at most this much of a pipelined next request.
pub(super) const WATCH_LIMIT: usize = 64 * 1024;

/// How far the request side got; the response side reads it to decide how to stop it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SendPhase {
    /// Head or body still going to the pod.
    Body,
    /// Everything sent; waiting a moment before reading ahead on the client.
    Sent,
    /// A cancelable read on the client is in flight.
    ReadingAhead,
}

/// Why sending the request stopped early.
#[derive(Debug)]
enum SendError {
    /// The client closed or reset its connection.
    ClientGone,
    /// The client's body framing was invalid.
    ClientBody(BodyError),
    /// Writing to the pod failed; the response may still come.
    Upstream,
}

/// How the response side ended.
enum ReceiveError {
    /// Nothing was written to the client yet: it can still get a 502.
    Upstream(UpstreamError),
    /// Nothing was written yet and a timer fired: 504.
    Timeout,
    /// The response started but could not finish: only closing is left.
    Truncated,
}

struct Received {
    status: u16,
    client_keep_alive: bool,
    upstream_reusable: bool,
    upgraded: bool,
}

/// Runs one request/response exchange over `upstream`.
///
/// The moment the pod's response is complete, before its last bytes are relayed, the pod's
/// connection goes back to the pool and its slot (`held`) is given back: the next waiter's
/// request goes out while this client still receives the tail, instead of one write later.
pub(super) async fn exchange<S: ByteStream, U: PodStream>(
    shard: &Rc<Shard>,
    conn: &mut ClientConn<S>,
    idle: &IdleConns<U>,
    mut upstream: UpstreamConn<U>,
    meta: RequestMeta,
    deadlines: Deadlines,
    held: &mut Option<Held<'_>>,
) -> Ended {
    let ClientConn {
        reader,
        writer,
        inbuf,
        request_out,
        response_out,
        response_head,
        request_id,
        canceller,
        ..
    } = &mut *conn;
    let phase = Cell::new(SendPhase::Body);
    // Set once the client may hold bytes of the response other than complete 1xx heads: from
    // then on a broken request body can no longer be answered, only cut short.
    let response_started = Cell::new(false);
    // The response body's payload bytes relayed so far (for the request log).
    let body_bytes = Cell::new(0);
    // Set once the client has gone (or broke its body): the pod's response is then read to
    // its end and discarded, so the slot is held until the pod is done with the request.
    let client_left = Cell::new(false);
    let addr = upstream.addr;
    let pod_socket = upstream.socket();
    // The request side borrows the pod's write half only until everything is sent; it puts it
    // back here so the connection can return to the pool while the client is still read ahead.
    let upstream_writer = Cell::new(Some(upstream.writer));
    // Late (`LATE_AFTER` in), the client is read ahead and the first-byte deadline armed; an
    // exchange done sooner arms no timer at all.
    let ticket = shard.late.enter::<S>(Instant::now());
    let (received, sent, tail_written, mut upstream) = {
        let send = send_request(
            request_out,
            meta,
            reader,
            inbuf,
            &upstream_writer,
            pod_socket,
            &phase,
            &ticket,
            canceller.get_or_insert_with(Canceller::new).handle(),
        );
        let mut send = pin!(send);
        let mut sent: Option<Result<(), SendError>> = None;
        let received = {
            let receive = receive_response(
                &mut upstream.reader,
                &mut upstream.inbuf,
                writer,
                response_out,
                response_head,
                meta,
                deadlines,
                &ticket,
                addr,
                shard,
                &response_started,
                &body_bytes,
                &client_left,
            );
            let mut receive = pin!(receive);
            let mut told_pod = false;
            poll_fn(|cx| {
                // The request side goes first. Its last write and the pod's whole response can
                // complete in one batch (io_uring reports both at once); polled second, the
                // request would still look unsent, and a finished keep-alive exchange would
                // close both connections. The client cannot have the whole response yet (its
                // tail is written below), so a client that leaves now really left early.
                if sent.is_none() {
                    if let Poll::Ready(result) = send.as_mut().poll(cx) {
                        sent = Some(result);
                    }
                }
                if matches!(
                    sent,
                    Some(Err(SendError::ClientGone | SendError::ClientBody(_)))
                ) {
                    client_left.set(true);
                }
                if let Poll::Ready(received) = receive.as_mut().poll(cx) {
                    return Poll::Ready(received);
                }
                // ★ A client that left (seen by either side) does not end the pod's work: the
                // pod is told (its request ends here) and its response is read to its end, the
                // slot held until then, so no waiter is handed a pod still busy with an
                // abandoned request. A response already complete needs no telling.
                if client_left.get() && !told_pod {
                    told_pod = true;
                    pod_socket.shut_write();
                }
                Poll::Pending
            })
            .await
        };
        // The request side hands the write half back once everything is sent.
        let mut upstream = match upstream_writer.take() {
            Some(writer) => {
                upstream.writer = writer;
                Some(upstream)
            }
            None => None,
        };
        // The pod is done with this request: its connection (when both directions ended cleanly)
        // and its slot go back before the tail is relayed and before the read-ahead is stopped.
        let mut tail_written = Ok(());
        if let Ok(
            done @ Received {
                upgraded: false, ..
            },
        ) = &received
        {
            // A connection told the request ended early is not clean.
            let reusable = done.upstream_reusable && !client_left.get();
            if let Some(upstream) = upstream.take_if(|_| reusable) {
                U::pool(shard).checkin::<S>(idle, upstream);
            }
            if held.take().is_some_and(Held::give_back) {
                // The slot went to a request queued on this shard: its bytes reach the pod
                // before this tail reaches the client (the pod is what everyone waits for).
                shard.back_of_queue.yield_now().await;
            }
            if client_left.get() {
                response_out.clear();
            } else if !response_out.is_empty() {
                tail_written = write_out(writer, response_out).await;
            }
        }
        // A request side still reading ahead is interrupted without losing bytes; one still sending
        // the body is abandoned, and both connections close. In `Sent` no read is in flight:
        // dropping the request side loses nothing.
        if sent.is_none() && phase.get() == SendPhase::ReadingAhead {
            // Cancelling hands back a fresh canceller that keeps the old one's bookkeeping
            // capacity, so a keep-alive connection allocates nothing here after its first request.
            if let Some(canceller) = canceller {
                *canceller = std::mem::take(canceller).cancel();
            }
            sent = Some(send.await);
        }
        (received, sent, tail_written, upstream)
    };
    let request_complete = phase.get() != SendPhase::Body;
    if matches!(
        sent,
        Some(Err(SendError::ClientGone | SendError::ClientBody(_)))
    ) {
        let error = match sent {
            // The client has the start of the pod's response; a 400 cannot follow it.
            Some(Err(SendError::ClientBody(_))) if response_started.get() => {
                shard.stats().bad_requests.increment();
                return Ended::Truncated {
                    status: response_head.status,
                    body_bytes: body_bytes.get(),
                };
            }
            Some(Err(SendError::ClientBody(error))) => {
                shard.stats().bad_requests.increment();
                RequestError::InvalidBody(error)
            }
            _ => {
                shard.stats().client_aborts.increment();
                RequestError::ClientGone
            }
        };
        return Ended::Failed {
            error,
            request_complete,
        };
    }
    // A write to the client failed while the response was relayed: what it got was cut short.
    if client_left.get() {
        return Ended::Truncated {
            status: response_head.status,
            body_bytes: body_bytes.get(),
        };
    }
    match received {
        Ok(received) if received.upgraded => {
            // An upgrade request ends at its head, so the request side has handed the write half
            // back. From here on it is a byte stream in both directions; no timer applies (★).
            if let Some(upstream) = upstream.as_mut() {
                splice_upgraded(
                    reader,
                    inbuf,
                    writer,
                    &mut upstream.reader,
                    &mut upstream.inbuf,
                    &mut upstream.writer,
                )
                .await;
            }
            Ended::Upgraded
        }
        Ok(received) => Ended::Relayed {
            status: received.status,
            response_keep_alive: received.client_keep_alive,
            request_complete,
            tail_written: tail_written.is_ok(),
            body_bytes: body_bytes.get(),
        },
        Err(ReceiveError::Upstream(error)) => {
            tracing::warn!(request_id = %request_id, pod = %addr, class = error.class(), "{error}");
            Ended::Failed {
                error: RequestError::from(error),
                request_complete,
            }
        }
        Err(ReceiveError::Timeout) => {
            tracing::warn!(request_id = %request_id, pod = %addr, "activator request timeout");
            Ended::Failed {
                error: RequestError::TimedOut,
                request_complete,
            }
        }
        // The status already sent is what the client saw.
        Err(ReceiveError::Truncated) => Ended::Truncated {
            status: response_head.status,
            body_bytes: body_bytes.get(),
        },
    }
}

/// Sends the request head and body to the pod, then watches the client for a disconnect.
#[allow(clippy::too_many_arguments)]
async fn send_request<C: ByteStream, U: ByteStream>(
    out: &mut Vec<u8>,
    meta: RequestMeta,
    reader: &mut OwnedReadHalf<C>,
    inbuf: &mut InBuf,
    upstream_writer: &Cell<Option<OwnedWriteHalf<U>>>,
    pod_socket: Socket,
    phase: &Cell<SendPhase>,
    ticket: &Ticket<'_>,
    cancel: monoio::io::CancelHandle,
) -> Result<(), SendError> {
    let Some(mut upstream) = upstream_writer.take() else {
        return Err(SendError::Upstream);
    };
    let mut decoder = BodyDecoder::new(meta.body);
    let mut trailers: Option<Vec<u8>> = None;
    let chunked = meta.body == BodyKind::Chunked;
    // Once the socket has not taken everything at once it is backed up: trying again first
    // would only add a failed syscall to every write of the body.
    let mut try_now = true;
    loop {
        // Move the body bytes already buffered into `out`, behind the head.
        let progress = reframe(&mut decoder, inbuf, chunked, &mut trailers, out)
            .map_err(SendError::ClientBody)?;
        if !out.is_empty() {
            // The pod's time is what requests queue for: its bytes go out now, not when this
            // shard next submits to the ring (see `ByteStream::send_now`).
            let sent = if try_now {
                U::send_now(pod_socket, out)
            } else {
                0
            };
            try_now = sent == out.len();
            let written = if sent < out.len() {
                write_rest(&mut upstream, out, sent).await
            } else {
                Ok(())
            };
            if !meta.keeps_head() {
                out.clear();
            }
            written.map_err(|_| SendError::Upstream)?;
        }
        match progress {
            Reframed::Finished => break,
            Reframed::OutputFull => continue,
            Reframed::NeedInput => match inbuf.fill(reader).await {
                Ok(0) | Err(_) => return Err(SendError::ClientGone),
                Ok(_) => {}
            },
        }
    }
    upstream_writer.set(Some(upstream));
    phase.set(SendPhase::Sent);
    if meta.upgrade {
        // Bytes after an upgrade request belong to the new protocol; leave them to the splice.
        return Ok(());
    }
    // Read ahead (a pipelined request, or the FIN of a client that gave up) until interrupted.
    // Most responses arrive within microseconds; waiting until the exchange is late first saves
    // a read and its cancellation per request, and a vanished client is still noticed within
    // milliseconds.
    ticket.late().await;
    phase.set(SendPhase::ReadingAhead);
    if read_ahead(reader, inbuf, cancel).await {
        Err(SendError::ClientGone)
    } else {
        Ok(())
    }
}

/// Writes `out` to the client, or discards it once the client has left: a failed write marks it
/// gone, and from then on the pod's response is only read to its end (its slot is held until
/// then, see [`exchange`]). `response_started` is set before the first byte goes out.
async fn relay<C: ByteStream>(
    client: &mut ClientWriter<C>,
    out: &mut Vec<u8>,
    response_started: &Cell<bool>,
    client_left: &Cell<bool>,
) {
    if client_left.get() {
        out.clear();
        return;
    }
    response_started.set(true);
    if write_out(client, out).await.is_err() {
        client_left.set(true);
    }
}

/// Reads ahead on the client (a body, a pipelined request, or the FIN of a client that gave
/// up) until cancelled through `cancel`, which loses no byte. True when the client is gone;
/// false when cancelled or when enough is buffered (reading on would buffer without bound).
pub(super) async fn read_ahead<C: ByteStream>(
    reader: &mut OwnedReadHalf<C>,
    inbuf: &mut InBuf,
    cancel: monoio::io::CancelHandle,
) -> bool {
    loop {
        if inbuf.len() >= WATCH_LIMIT {
            return false;
        }
        match inbuf.fill_cancelable(reader, cancel.clone()).await {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => return false,
            Err(_) => return true,
        }
    }
}

/// Reads the pod's response and relays it to the client.
#[allow(clippy::too_many_arguments)]
async fn receive_response<C: ByteStream, U: ByteStream>(
    upstream: &mut OwnedReadHalf<U>,
    upstream_inbuf: &mut InBuf,
    client: &mut ClientWriter<C>,
    out: &mut Vec<u8>,
    head: &mut ResponseHead,
    meta: RequestMeta,
    deadlines: Deadlines,
    ticket: &Ticket<'_>,
    addr: SocketAddr,
    shard: &Shard,
    response_started: &Cell<bool>,
    body_bytes: &Cell<u64>,
    client_left: &Cell<bool>,
) -> Result<Received, ReceiveError> {
    // The first-byte deadline, armed only once the exchange is late (or at once when it falls
    // before that): most responses start before, and then no timer was ever set.
    let first_byte = deadlines.first_byte;
    let mut overdue = pin!(async {
        if first_byte > ticket.due() {
            ticket.late().await;
        }
        shard.alarms.at(first_byte).await
    });
    // The head, relaying any 1xx on the way.
    loop {
        match parse_response(upstream_inbuf.data(), meta.method, head) {
            Ok(Parsed::Complete) if head.is_informational() && head.status != 101 => {
                if meta.version == Version::Http11 {
                    out.clear();
                    rewrite::write_response_head(
                        head,
                        upstream_inbuf.data(),
                        meta.version,
                        ClientFraming::AsIs,
                        true,
                        None,
                        out,
                    );
                    // A 1xx cut off mid-write leaves the client with a partial head.
                    relay(client, out, response_started, client_left).await;
                    response_started.set(false);
                }
                upstream_inbuf.consume(head.len);
                continue;
            }
            Ok(Parsed::Complete) => break,
            Ok(Parsed::Partial) => {}
            Err(error) => {
                return Err(ReceiveError::Upstream(UpstreamError::MalformedResponse {
                    addr,
                    reason: error.to_string(),
                }))
            }
        }
        let read = match race(upstream_inbuf.fill(upstream), overdue.as_mut()).await {
            Either::Left(read) => read,
            Either::Right(()) => return Err(ReceiveError::Timeout),
        };
        match read {
            Ok(0) if upstream_inbuf.is_empty() => {
                return Err(ReceiveError::Upstream(
                    UpstreamError::ClosedBeforeResponse { addr },
                ))
            }
            Ok(0) => {
                return Err(ReceiveError::Upstream(UpstreamError::MalformedResponse {
                    addr,
                    reason: "connection closed in the middle of the response head".into(),
                }))
            }
            Ok(_) => {}
            Err(error) => {
                return Err(ReceiveError::Upstream(UpstreamError::Receive {
                    addr,
                    cause: TransportCause::of(&error),
                }))
            }
        }
    }

    if head.status == 101 {
        if !meta.upgrade {
            return Err(ReceiveError::Upstream(UpstreamError::UnexpectedSwitch {
                addr,
            }));
        }
        out.clear();
        rewrite::write_response_head(
            head,
            upstream_inbuf.data(),
            meta.version,
            ClientFraming::AsIs,
            true,
            meta.note.as_ref(),
            out,
        );
        upstream_inbuf.consume(head.len);
        relay(client, out, response_started, client_left).await;
        return Ok(Received {
            status: 101,
            client_keep_alive: false,
            upstream_reusable: false,
            upgraded: true,
        });
    }

    let framing = client_framing(head.body, meta.version);
    let upstream_reusable = head.keep_alive() && head.body != BodyKind::UntilClose;
    let client_keep_alive =
        meta.keep_alive && framing != ClientFraming::UntilClose && !shard.is_draining();
    out.clear();
    rewrite::write_response_head(
        head,
        upstream_inbuf.data(),
        meta.version,
        framing,
        client_keep_alive,
        meta.note.as_ref(),
        out,
    );
    upstream_inbuf.consume(head.len);
    let status = head.status;

    let mut decoder = BodyDecoder::new(head.body);
    let mut trailers: Option<Vec<u8>> = None;
    let mut wrote_head = false;
    let chunked = framing == ClientFraming::Chunked;
    loop {
        let progress = match reframe(&mut decoder, upstream_inbuf, chunked, &mut trailers, out) {
            Ok(progress) => progress,
            Err(error) if !wrote_head => {
                return Err(ReceiveError::Upstream(UpstreamError::MalformedResponse {
                    addr,
                    reason: error.to_string(),
                }))
            }
            Err(_) => return Err(ReceiveError::Truncated),
        };
        body_bytes.set(decoder.delivered());
        if progress == Reframed::Finished {
            // The tail stays in `out`: the caller gives the pod back before relaying it.
            return Ok(Received {
                status,
                client_keep_alive,
                upstream_reusable,
                upgraded: false,
            });
        }
        if !out.is_empty() {
            relay(client, out, response_started, client_left).await;
            wrote_head = true;
        }
        // More is already buffered: never wait on the socket for bytes we hold.
        if progress == Reframed::OutputFull {
            continue;
        }
        let deadline = deadlines.next_body_read(Instant::now());
        let read = match race(upstream_inbuf.fill(upstream), shard.alarms.at(deadline)).await {
            Either::Left(read) => read,
            Either::Right(()) => return Err(ReceiveError::Truncated),
        };
        match read {
            Ok(0) => {
                if decoder.finish().is_err() {
                    return Err(ReceiveError::Truncated);
                }
                // Close-delimited body: the end is the pod's FIN.
                if framing == ClientFraming::Chunked {
                    encode_last_chunk(None, out);
                    relay(client, out, response_started, client_left).await;
                }
                return Ok(Received {
                    status,
                    client_keep_alive,
                    upstream_reusable: false,
                    upgraded: false,
                });
            }
            Ok(_) => {}
            Err(_) => return Err(ReceiveError::Truncated),
        }
    }
}

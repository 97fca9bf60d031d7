//! One client connection over HTTP/2: the handshake, then every stream the client opens is
//! spawned as a request on the shard (`stream::serve`) while this task drives the connection
//! (frames in and out, flow control, pings). When the shard starts draining, the client gets
//! GOAWAY at once: it opens new streams elsewhere while the ones open here finish.
//!
//! A connection with no stream open is idle, among the shard's idle connections
//! (`runtime::idle`): at the connection cap the longest idle gives way, and when the drain is
//! over every idle one closes. Either way it sends the final GOAWAY (NO_ERROR, naming the last
//! stream it took) and closes once that is written, without waiting for the client.
//!
//! A connection with no stream open for [`RELEASE_IDLE_AFTER`] gives back the memory of its
//! frame buffers, stream store and frame queues (`h2`'s `release_idle_memory`, our patch in
//! `vendor/h2`): about 30 KiB allocated, which an idle connection would otherwise keep for its
//! whole life.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use futures_util::FutureExt;
use monoio::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite};

use super::io::Rewind;
use super::stream;
use crate::request::peer::Peer;
use crate::runtime::alarm::Alarm;
use crate::runtime::idle::Idle;
use crate::runtime::memory;
use crate::runtime::race::{race, Either};
use crate::runtime::stream::ByteStream;
use crate::shard::Shard;

/// How long an HTTP/2 connection stays with no stream open before it gives back the memory of
/// its frame buffers. Long enough that a client sending one request after another on it does
/// not pay an allocation per request; anything that arrives later (a stream, a PING) allocates
/// again what it needs.
pub const RELEASE_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Streams the client reset before we could take them from the connection, beyond which the
/// connection is closed with ENHANCE_YOUR_CALM (rapid-reset flood; `h2`'s default is 20).
const MAX_PENDING_ACCEPT_RESETS: usize = 50;

/// Serves one HTTP/2 connection until it closes. The caller counted it as an open connection
/// and counts it out afterwards.
pub(crate) async fn serve_connection<T>(shard: Rc<Shard>, io: T, peer: Rc<Peer>)
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let stats = shard.stats();
    stats.h2_connections.increment();
    let settings = shard.settings.h2;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame)
        .max_header_list_size(settings.max_header_list)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS);
    let handshake = race(
        builder.handshake::<T, bytes::Bytes>(io),
        // The client's SETTINGS must follow its preface within the head timeout, as an HTTP/1
        // head must arrive.
        shard
            .alarms
            .at(Instant::now() + shard.settings.head_timeout),
    )
    .await;
    let mut connection = match handshake {
        Either::Left(Ok(connection)) => connection,
        Either::Left(Err(error)) => {
            stats.bad_requests.increment();
            tracing::debug!(shard = shard.index, "HTTP/2 handshake failed: {error}");
            return;
        }
        Either::Right(()) => {
            tracing::debug!(shard = shard.index, "HTTP/2 handshake timed out");
            return;
        }
    };
    let open = Rc::new(OpenStreams::default());
    let mut released = false;
    let mut state = State::default();
    loop {
        let next = match next_stream(&shard, &mut connection, &open, &mut released, state).await {
            Next::Stream(next) => next,
            Next::Drain => {
                // GOAWAY with the highest stream id, a PING, then GOAWAY with the last stream
                // taken: streams already sent still reach us.
                connection.graceful_shutdown();
                state.going_away = true;
                continue;
            }
            Next::Close => {
                // Idle and told to close: at the connection cap, or the drain is over. (The
                // graceful GOAWAY would wait for the client's answer to its PING, which a
                // client that does not read never sends.) The final GOAWAY now, and the
                // connection closes once it is written.
                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
                state.closing = true;
                continue;
            }
        };
        match next {
            Some(Ok((request, respond))) => {
                stats.requests.increment();
                released = false;
                let counted = OpenStream::new(&open);
                monoio::spawn(
                    stream::serve_contained(shard.clone(), request, respond, peer.clone())
                        .map(move |()| drop(counted)),
                );
            }
            Some(Err(error)) => {
                if error.is_io() {
                    tracing::debug!(shard = shard.index, "HTTP/2 connection lost: {error}");
                } else {
                    stats.bad_requests.increment();
                    tracing::debug!(shard = shard.index, "HTTP/2 connection error: {error}");
                }
                break;
            }
            None => break,
        }
    }
}

/// The streams of one connection still being served. The last to end wakes the connection's
/// task, so that it starts counting its idle time.
#[derive(Default)]
struct OpenStreams {
    count: Cell<usize>,
    connection: RefCell<Option<Waker>>,
}

/// One stream, counted among its connection's open ones until dropped.
struct OpenStream(Rc<OpenStreams>);

impl OpenStream {
    fn new(open: &Rc<OpenStreams>) -> OpenStream {
        open.count.set(open.count.get() + 1);
        OpenStream(open.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let left = self.0.count.get() - 1;
        self.0.count.set(left);
        if left == 0 {
            if let Some(waker) = self.0.connection.borrow_mut().take() {
                waker.wake();
            }
        }
    }
}

/// Where a connection is in its closing.
#[derive(Clone, Copy, Default)]
struct State {
    /// Told of the drain (GOAWAY sent).
    going_away: bool,
    /// Closing (the final GOAWAY sent).
    closing: bool,
}

/// What a connection waits for.
#[allow(clippy::large_enum_variant)] // a return value, never stored
enum Next<B: bytes::Buf> {
    /// Its next stream, its end or its error.
    Stream(Accepted<B>),
    /// The shard drains.
    Drain,
    /// Idle and told to close (at the connection cap, or the drain is over).
    Close,
}

/// What `h2` yields when asked for the next stream.
type Accepted<B> =
    Option<Result<(http::Request<h2::RecvStream>, h2::server::SendResponse<B>), h2::Error>>;

/// Drives the connection until its next stream (or its end), until the shard drains (when not
/// going away already), or, while no stream is open, until it is told to close as an idle
/// connection (when not closing already). Meanwhile, once no stream has been open for
/// [`RELEASE_IDLE_AFTER`], the connection gives back its idle memory (`released`), and again
/// whenever something that arrived while it stays idle (a PING, SETTINGS) allocated some.
async fn next_stream<T, B>(
    shard: &Shard,
    connection: &mut h2::server::Connection<T, B>,
    open: &OpenStreams,
    released: &mut bool,
    state: State,
) -> Next<B>
where
    T: AsyncRead + AsyncWrite + Unpin,
    B: bytes::Buf,
{
    let mut draining = pin!(shard.draining.wait());
    let mut alarm: Option<Alarm<'_>> = None;
    let mut idle: Option<Idle<'_>> = None;
    poll_fn(|cx| {
        if let Poll::Ready(next) = connection.poll_accept(cx) {
            return Poll::Ready(Next::Stream(next));
        }
        if !state.going_away && draining.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Next::Drain);
        }
        if open.count.get() > 0 {
            alarm = None;
            idle = None;
            *open.connection.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if !state.closing {
            let entry = idle.get_or_insert_with(|| {
                // Idle from here: it can give way to a client waiting at the connection cap.
                shard.wake_paused_accept();
                shard.idle.enter_waking(cx.waker())
            });
            if entry.told() {
                return Poll::Ready(Next::Close);
            }
            entry.wake_with(cx.waker());
        }
        if *released {
            // Woken while idle: what arrived (a PING, SETTINGS) may have allocated again.
            connection.release_idle_memory();
            memory::released();
        } else {
            let due =
                alarm.get_or_insert_with(|| shard.alarms.at(Instant::now() + RELEASE_IDLE_AFTER));
            if std::pin::Pin::new(due).poll(cx).is_ready() {
                alarm = None;
                connection.release_idle_memory();
                memory::released();
                *released = true;
            }
        }
        Poll::Pending
    })
    .await
}

/// Takes over a connection the HTTP/1 front accepted and found to open with the HTTP/2 preface;
/// `read` is what it read so far (the preface and whatever followed).
pub(crate) async fn take_over<S: ByteStream>(
    shard: Rc<Shard>,
    stream: S,
    read: bytes::Bytes,
    peer: Rc<Peer>,
) {
    match stream.try_into_poll_io() {
        Ok(io) => serve_connection(shard, Rewind::new(read, io), peer).await,
        Err((error, _)) => {
            tracing::warn!(
                shard = shard.index,
                "cannot serve a connection as HTTP/2: {error}"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderValue, Request, Response};

    /// Answers a request with its `x-` fields and its body.
    async fn echo(
        (request, mut respond): (
            http::Request<h2::RecvStream>,
            h2::server::SendResponse<Bytes>,
        ),
    ) {
        let (parts, mut body) = request.into_parts();
        let mut received = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            body.flow_control().release_capacity(chunk.len()).unwrap();
            received.extend_from_slice(&chunk);
        }
        let mut response = Response::builder().status(200);
        for (name, value) in parts.headers.iter() {
            if name.as_str().starts_with("x-") {
                response = response.header(name, value);
            }
        }
        let mut send = respond
            .send_response(response.body(()).unwrap(), false)
            .unwrap();
        send.reserve_capacity(received.len());
        send.send_data(Bytes::from(received), true).unwrap();
    }

    /// Our patch of `h2` (`vendor/h2`): a connection that gave its memory back between every
    /// two requests still carries each one whole, both ways: a header block too big for one
    /// frame (CONTINUATION frames, out of a write buffer allocated again), Huffman-coded values
    /// new to the HPACK tables (the decoder's scratch buffer allocated again), and bodies of
    /// many frames (the read buffer allocated again). `h2`'s own client is the peer.
    #[test]
    fn a_connection_that_gave_its_memory_back_serves_every_request_whole() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (client_io, server_io) = tokio::io::duplex(64 * 1024);
            let server = tokio::task::LocalSet::new();
            let served = server.run_until(async move {
                let serving = tokio::task::spawn_local(async move {
                    let mut connection = h2::server::handshake(server_io).await.unwrap();
                    let mut requests = 0;
                    loop {
                        // Gives back whatever is empty each time the connection waits: between
                        // requests, and between the frames of one.
                        let next = poll_fn(|cx| {
                            let polled = connection.poll_accept(cx);
                            if polled.is_pending() {
                                connection.release_idle_memory();
                            }
                            polled
                        })
                        .await;
                        let Some(next) = next else {
                            break;
                        };
                        requests += 1;
                        tokio::task::spawn_local(echo(next.unwrap()));
                    }
                    requests
                });
                let (mut client, driver) = h2::client::handshake(client_io).await.unwrap();
                let driving = tokio::task::spawn_local(async move {
                    let _ = driver.await;
                });
                for round in 0..6u8 {
                    // A value of 20 000 characters: more than one 16 KiB frame of headers.
                    let big = "k".repeat(20_000 + usize::from(round));
                    let fresh = format!("a value new to the table, round {round}");
                    let body: Vec<u8> = (0..200_000u32).map(|n| (n % 251) as u8 ^ round).collect();
                    let mut request = Request::builder()
                        .method("POST")
                        .uri("http://svc.test/echo")
                        .body(())
                        .unwrap();
                    request
                        .headers_mut()
                        .insert("x-big", HeaderValue::from_str(&big).unwrap());
                    request
                        .headers_mut()
                        .insert("x-fresh", HeaderValue::from_str(&fresh).unwrap());
                    client = client.ready().await.unwrap();
                    let (response, mut send) = client.send_request(request, false).unwrap();
                    send.reserve_capacity(body.len());
                    send.send_data(Bytes::from(body.clone()), true).unwrap();
                    let response = response.await.unwrap();
                    assert_eq!(response.status(), 200);
                    assert_eq!(response.headers()["x-big"], big.as_str());
                    assert_eq!(response.headers()["x-fresh"], fresh.as_str());
                    let mut echoed = Vec::new();
                    let mut received = response.into_body();
                    while let Some(chunk) = received.data().await {
                        let chunk = chunk.unwrap();
                        received
                            .flow_control()
                            .release_capacity(chunk.len())
                            .unwrap();
                        echoed.extend_from_slice(&chunk);
                    }
                    assert!(echoed == body, "round {round}: the body came back changed");
                }
                drop(client);
                let requests = serving.await.unwrap();
                driving.await.unwrap();
                requests
            });
            assert_eq!(served.await, 6);
        });
    }
}

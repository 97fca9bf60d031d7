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
use crate::runtime::alarm::Alarm;
use crate::runtime::idle::Idle;
use crate::runtime::memory;
use crate::runtime::race::{race, Either};
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
pub(crate) async fn serve_connection<T>(shard: Rc<Shard>, io: T, peer_ip: Rc<[u8]>)
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
    let mut going_away = false;
    let open = Rc::new(OpenStreams::default());
    let mut released = false;
    let mut closing = false;
    loop {
        let state = State {
            going_away,
            closing,
        };
        let next = match next_stream(&shard, &mut connection, &open, &mut released, state).await {
            Next::Stream(next) => next,
            Next::Drain => {
                // GOAWAY with the highest stream id, a PING, then GOAWAY with the last stream
                // taken: streams already sent still reach us.
                connection.graceful_shutdown();
                going_away = true;
                continue;
            }
            Next::Close => {
                // Idle and told to close: at the connection cap, or the drain is over. (The
                // graceful GOAWAY would wait for the client's answer to its PING, which a
                // client that does not read never sends.) The final GOAWAY now, and the
                // connection closes once it is written.
                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
                closing = true;
                continue;
            }
        };
        match next {
            Some(Ok((request, respond))) => {
                stats.requests.increment();
                released = false;
                let counted = OpenStream::new(&open);
                monoio::spawn(
                    stream::serve_contained(shard.clone(), request, respond, peer_ip.clone())
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
#[derive(Clone, Copy)]
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
                if shard.accept_paused.get() {
                    // A client waits at the connection cap: this one can give way now.
                    shard.connection_closed.notify_all();
                }
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
pub(crate) async fn take_over(
    shard: Rc<Shard>,
    stream: monoio::net::TcpStream,
    read: bytes::Bytes,
    peer_ip: Rc<[u8]>,
) {
    match stream.try_into_poll_io() {
        Ok(io) => serve_connection(shard, Rewind::new(read, io), peer_ip).await,
        Err((error, _)) => {
            tracing::warn!(
                shard = shard.index,
                "cannot serve a connection as HTTP/2: {error}"
            )
        }
    }
}

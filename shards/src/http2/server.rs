//! One client connection over HTTP/2: the handshake, then every stream the client opens is
//! spawned as a request on the shard (`stream::serve`) while this task drives the connection
//! (frames in and out, flow control, pings). When the shard starts draining, the client gets
//! GOAWAY at once: it opens new streams elsewhere while the ones open here finish.

use std::rc::Rc;

use monoio::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite};

use super::io::Rewind;
use super::stream;
use crate::runtime::race::{race, Either};
use crate::shard::Shard;

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
    loop {
        let next = if going_away {
            connection.accept().await
        } else {
            match race(connection.accept(), shard.draining.wait()).await {
                Either::Left(next) => next,
                Either::Right(()) => {
                    // GOAWAY with the highest stream id, a PING, then GOAWAY with the last
                    // stream taken: streams already sent still reach us.
                    connection.graceful_shutdown();
                    going_away = true;
                    continue;
                }
            }
        };
        match next {
            Some(Ok((request, respond))) => {
                stats.requests.increment();
                monoio::spawn(stream::serve_contained(
                    shard.clone(),
                    request,
                    respond,
                    peer_ip.clone(),
                ));
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

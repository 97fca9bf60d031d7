//! The two upgrade routes: a websocket echo (`/ws`) and a raw byte echo that reports the
//! client's half-close (`/ws-half-close`).
//!
//! Both answer 101 from the request handler and move the connection to a separate task
//! once hyper hands over the socket. That task holds the connection context, so the
//! connection stays counted as open while the upgraded stream lives.

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderValue, CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE,
};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use super::bodies::{empty, text, RouteBody};
use super::ConnectionContext;

/// What the raw echo writes after the client's end of stream.
pub const EOF_MARKER: &[u8] = b"\nEOF-SEEN\n";

/// `/ws`: completes the websocket handshake and echoes every text and binary message.
pub(crate) fn websocket(
    mut request: Request<Incoming>,
    connection: Arc<ConnectionContext>,
) -> Response<RouteBody> {
    let key = request.headers().get(SEC_WEBSOCKET_KEY).cloned();
    let (Some(key), true) = (key, asks_for(request.headers(), "websocket")) else {
        return text(
            StatusCode::UPGRADE_REQUIRED,
            "expected Upgrade: websocket with a Sec-WebSocket-Key\n",
        );
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(after_upgrade(on_upgrade, connection, echo_messages));
    let accept = derive_accept_key(key.as_bytes());
    let mut response = switching_protocols("websocket");
    response.headers_mut().insert(
        SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a valid header value"),
    );
    response
}

/// `/ws-half-close`: a raw upgrade (`Upgrade: echo`) that copies bytes back, and after
/// the client's end of stream writes [`EOF_MARKER`] and shuts down its own write side.
/// The client only sees the marker and then EOF if a proxy forwards half-closes both ways.
pub(crate) fn raw_echo(
    mut request: Request<Incoming>,
    connection: Arc<ConnectionContext>,
) -> Response<RouteBody> {
    if !asks_for(request.headers(), "echo") {
        return text(StatusCode::UPGRADE_REQUIRED, "expected Upgrade: echo\n");
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(after_upgrade(on_upgrade, connection, echo_bytes));
    switching_protocols("echo")
}

/// Waits for hyper to hand over the socket, then runs `serve` on it.
async fn after_upgrade<Serve, Served>(
    on_upgrade: OnUpgrade,
    connection: Arc<ConnectionContext>,
    serve: Serve,
) where
    Serve: FnOnce(TokioIo<Upgraded>) -> Served,
    Served: std::future::Future<Output = std::io::Result<()>>,
{
    match on_upgrade.await {
        Ok(upgraded) => {
            if let Err(error) = serve(TokioIo::new(upgraded)).await {
                tracing::debug!(%error, "upgraded connection failed");
            }
        }
        Err(error) => tracing::debug!(%error, "upgrade did not complete"),
    }
    // Dropped only now, so `connections_open` covers the upgraded stream too.
    drop(connection);
}

async fn echo_messages(io: TokioIo<Upgraded>) -> std::io::Result<()> {
    let mut socket = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    while let Some(message) = socket.next().await {
        // Only data messages are echoed. Tungstenite answers Pings and the peer's Close
        // itself; polling the stream again flushes the Close reply and then ends the
        // stream, which ends this loop.
        let message = message.map_err(std::io::Error::other)?;
        if message.is_text() || message.is_binary() {
            socket.send(message).await.map_err(std::io::Error::other)?;
        }
    }
    Ok(())
}

async fn echo_bytes(mut io: TokioIo<Upgraded>) -> std::io::Result<()> {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = io.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        io.write_all(&buffer[..read]).await?;
    }
    io.write_all(EOF_MARKER).await?;
    // Reaches shutdown(SHUT_WR) on the TCP socket: the peer reads EOF while this side
    // could still read.
    io.shutdown().await
}

fn switching_protocols(protocol: &'static str) -> Response<RouteBody> {
    let mut response = Response::new(empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static(protocol));
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    response
}

/// Whether the request's `Upgrade` header lists `protocol` (case-insensitively).
fn asks_for(headers: &HeaderMap, protocol: &str) -> bool {
    headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|listed| listed.trim().eq_ignore_ascii_case(protocol))
}

//! The HTTP/1 probe, what the upstream activator sends a queue-proxy: `GET /healthz` with
//! `K-Network-Probe: queue` and the activator's user agent, read with the data plane's codec
//! (`kactivator_h1`). One request per exchange; the connection is kept alive when asked and
//! the answer leaves it clean.

use std::net::SocketAddr;

use kactivator_api::headers::{
    NETWORK_PROBE, SERVING_REVISION_NAME, SERVING_REVISION_NAMESPACE, USER_AGENT,
};
use kactivator_api::probe::{HEALTH_PATH, HEALTH_USER_AGENT, QUEUE};
use kactivator_h1::{parse_response, BodyDecoder, BodyEvent, Method, Parsed, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stream::PodStream;
use super::{Answer, Failure, BODY_LIMIT};

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// An HTTP/1.1 connection to a pod, plain or TLS, clean (nothing unread) and idle between
/// probes.
pub(super) struct Connection {
    stream: PodStream,
    buffer: Vec<u8>,
}

impl Connection {
    /// A fresh connection.
    pub(super) fn new(stream: PodStream) -> Connection {
        Connection {
            stream,
            buffer: Vec::new(),
        }
    }

    /// Whether it speaks TLS.
    pub(super) fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }
}

/// One request and its response on `connection`; the connection back when it may carry another.
pub(super) async fn exchange(
    connection: Connection,
    addr: SocketAddr,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    let close = if keep_alive {
        ""
    } else {
        "Connection: close\r\n"
    };
    let request = format!(
        "GET {HEALTH_PATH} HTTP/1.1\r\nHost: {addr}\r\n{NETWORK_PROBE}: {QUEUE}\r\n{USER_AGENT}: {HEALTH_USER_AGENT}\r\n{close}\r\n"
    );
    round_trip(connection, request.as_bytes(), keep_alive).await
}

/// Writes `request` (a whole `GET` request head, blank line included) on `connection` and
/// reads the response: its status, the revision headers and at most [`BODY_LIMIT`] bytes of
/// its body. The connection back when `keep_alive`, the response allows it and nothing is left
/// unread. Shared by the activator's probe above and the queue-proxy's readiness probe.
pub(super) async fn round_trip(
    mut connection: Connection,
    request: &[u8],
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    let Connection { stream, buffer } = &mut connection;
    buffer.clear();
    // The flush sends what TLS still holds (a no-op for plain TCP).
    let written = match stream.write_all(request).await {
        Ok(()) => stream.flush().await,
        Err(error) => Err(error),
    };
    written.map_err(|error| Failure::new(format!("request: {error}"), false))?;
    let mut head = ResponseHead::default();
    loop {
        match parse_response(buffer, Method::Get, &mut head) {
            Ok(Parsed::Complete) if head.is_informational() && head.status != 101 => {
                buffer.drain(..head.len);
                continue;
            }
            Ok(Parsed::Complete) => break,
            Ok(Parsed::Partial) => {}
            Err(error) => return Err(Failure::new(format!("response: {error}"), true)),
        }
        let answered = !buffer.is_empty();
        let read = read_more(stream, buffer)
            .await
            .map_err(|error| Failure::new(format!("response: {error}"), answered))?;
        if read == 0 {
            return Err(Failure::new(
                "response: connection closed before a complete response head".into(),
                answered,
            ));
        }
    }
    let header = |name: &str| head.header(buffer, name).map(<[u8]>::to_vec);
    let mut answer = Answer {
        status: head.status,
        revision_name: header(SERVING_REVISION_NAME),
        revision_namespace: header(SERVING_REVISION_NAMESPACE),
        ..Answer::default()
    };
    let reusable = keep_alive && head.keep_alive();
    buffer.drain(..head.len);
    let mut decoder = BodyDecoder::new(head.body);
    let body_failure = |error: String| Failure::new(format!("body: {error}"), true);
    let mut ended = false;
    loop {
        let (consumed, event) = decoder
            .decode(buffer)
            .map_err(|error| body_failure(error.to_string()))?;
        let idle = consumed == 0 && event.is_none();
        match event {
            Some(BodyEvent::Data(data)) => {
                let room = BODY_LIMIT - answer.body.len();
                if data.len() > room {
                    answer.body.extend_from_slice(&data[..room]);
                    answer.body_truncated = true;
                } else {
                    answer.body.extend_from_slice(data);
                }
            }
            Some(BodyEvent::End) => ended = true,
            Some(BodyEvent::Trailers(_)) | None => {}
        }
        buffer.drain(..consumed);
        if ended || answer.body_truncated {
            break;
        }
        if idle {
            let read = read_more(stream, buffer)
                .await
                .map_err(|error| body_failure(error.to_string()))?;
            if read == 0 {
                // The close ends a close-delimited body; any other body was cut short.
                decoder
                    .finish()
                    .map_err(|error| body_failure(error.to_string()))?;
                break;
            }
        }
    }
    let clean = ended && !answer.body_truncated && buffer.is_empty();
    Ok((answer, (reusable && clean).then_some(connection)))
}

async fn read_more(stream: &mut PodStream, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    buffer.reserve(READ_CHUNK);
    stream.read_buf(buffer).await
}

#[cfg(test)]
mod tests;

//! The h2c probe, for the pods of h2c revisions: the standard gRPC health check,
//! `POST /grpc.health.v1.Health/Check` with one empty `HealthCheckRequest` (the server as a
//! whole), over HTTP/2 with prior knowledge, carrying the queue-proxy probe headers of the
//! HTTP/1 probe too (`K-Network-Probe: queue`, `User-Agent: Knative-Activator-Probe`): a
//! queue-proxy takes any request with that user agent as a probe, whatever its path, and
//! answers 200 `queue`; a plain gRPC server answers the call. [`super::judge`] decides.
//!
//! The connection is h2's client on tokio's `TcpStream`, or on TLS over it for a revision whose
//! pods are dialled over TLS (HTTP/2 by prior knowledge inside TLS, no ALPN, as the data plane
//! and Knative's activator dial them); the control thread runs tokio. h2
//! moves no stream unless its connection future is polled, so each connection has a driver
//! task; the [`Connection`] owns it and aborts it when dropped, which closes the socket. A
//! kept connection carries one probe at a time, like the HTTP/1 one.

use std::net::SocketAddr;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::Reason;
use http::header::CONTENT_TYPE;
use kactivator_api::grpc_health::{self, CHECK_PATH};
use kactivator_api::headers::{
    NETWORK_PROBE, SERVING_REVISION_NAME, SERVING_REVISION_NAMESPACE, USER_AGENT,
};
use kactivator_api::probe::{HEALTH_USER_AGENT, QUEUE};
use tokio::task::JoinHandle;

use super::stream::PodStream;
use super::{Answer, Failure, GrpcStatus, BODY_LIMIT};

/// Largest response head (or trailers) accepted, decoded: far above any probe answer's, and
/// a bound on what a pod can make the prober hold.
const HEAD_LIMIT: u32 = 64 * 1024;

/// An h2c connection to a pod, plain or TLS, idle between probes.
pub(super) struct Connection {
    sender: SendRequest<Bytes>,
    tls: bool,
    /// Polls h2's connection future; aborted on drop.
    driver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Connection {
    /// Opens HTTP/2 on `stream` (the preface and our SETTINGS; a pod that does not speak
    /// HTTP/2 is found out by the first request).
    pub(super) async fn handshake(stream: PodStream) -> Result<Connection, Failure> {
        let tls = stream.is_tls();
        let (sender, connection) = h2::client::Builder::new()
            .max_header_list_size(HEAD_LIMIT)
            // A probe wants one answer, nothing pushed.
            .enable_push(false)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(|error| Failure::new(format!("handshake: {error}"), false))?;
        let driver = tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("h2c probe connection ended: {error}");
            }
        });
        Ok(Connection {
            sender,
            tls,
            driver,
        })
    }

    /// Whether it speaks TLS.
    pub(super) fn is_tls(&self) -> bool {
        self.tls
    }
}

/// One health check on `connection`; the connection back when it may carry another.
pub(super) async fn exchange(
    connection: Connection,
    addr: SocketAddr,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    let headers = [(NETWORK_PROBE, QUEUE), (USER_AGENT, HEALTH_USER_AGENT)];
    check(
        connection,
        addr,
        &headers,
        grpc_health::check_request(),
        keep_alive,
    )
    .await
}

/// One `Health/Check` call on `connection` with `request` (one framed `HealthCheckRequest`)
/// and `headers` beside gRPC's own; the connection back when it may carry another. Shared by
/// the activator's probe above and the queue-proxy's readiness probe.
pub(super) async fn check(
    connection: Connection,
    addr: SocketAddr,
    headers: &[(&str, &str)],
    request: Vec<u8>,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    let failure = |stage: &str, error: h2::Error| {
        Failure::new(
            format!("{stage}: {}", describe(&error)),
            answered_by(&error),
        )
    };
    // A connection the pod closed or sent GOAWAY on while it was idle fails here.
    let mut sender = connection
        .sender
        .clone()
        .ready()
        .await
        .map_err(|error| failure("connection", error))?;
    let mut head = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://{addr}{CHECK_PATH}"))
        .header(CONTENT_TYPE, grpc_health::CONTENT_TYPE)
        .header(grpc_health::TE, grpc_health::TRAILERS);
    for (name, value) in headers {
        head = head.header(*name, *value);
    }
    let head = head
        .body(())
        .map_err(|error| Failure::new(format!("request: {error}"), false))?;
    let (response, mut request_body) = sender
        .send_request(head, false)
        .map_err(|error| failure("request", error))?;
    // A few bytes (a service name is bounded by its decoder): within the initial window of
    // 65,535 bytes every peer grants, so h2 sends them at once.
    request_body
        .send_data(Bytes::from(request), true)
        .map_err(|error| failure("request", error))?;
    let (head, mut body) = response
        .await
        .map_err(|error| failure("response", error))?
        .into_parts();
    let header = |name: &str| {
        head.headers
            .get(name)
            .map(|value| value.as_bytes().to_vec())
    };
    let mut answer = Answer {
        status: head.status.as_u16(),
        revision_name: header(SERVING_REVISION_NAME),
        revision_namespace: header(SERVING_REVISION_NAMESPACE),
        ..Answer::default()
    };
    let body_failure = |error: h2::Error| Failure::new(format!("body: {}", describe(&error)), true);
    while let Some(data) = body.data().await {
        let data = data.map_err(body_failure)?;
        // Give the window back, or a pod's longer answer would stall.
        let _ = body.flow_control().release_capacity(data.len());
        let room = BODY_LIMIT - answer.body.len();
        if data.len() > room {
            answer.body.extend_from_slice(&data[..room]);
            answer.body_truncated = true;
            break;
        }
        answer.body.extend_from_slice(&data);
    }
    let trailers = if answer.body_truncated {
        None
    } else {
        body.trailers().await.map_err(body_failure)?
    };
    // The status is in the trailers, or in the head of a trailers-only answer.
    let status_fields = trailers.as_ref().unwrap_or(&head.headers);
    let field = |name: &str| {
        status_fields
            .get(name)
            .map(|value| value.as_bytes().to_vec())
    };
    let code = field(grpc_health::STATUS);
    let grpc_content = head
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| grpc_health::is_grpc_content_type(value.as_bytes()));
    if grpc_content || code.is_some() {
        answer.grpc = Some(GrpcStatus {
            code,
            message: field(grpc_health::MESSAGE),
        });
    }
    // A cut-short body leaves the stream open (dropping it resets the stream): the
    // connection goes too.
    let ended = !answer.body_truncated && body.is_end_stream();
    Ok((answer, (keep_alive && ended).then_some(connection)))
}

/// An h2 error for a log line, with the HTTP/2 error code by name when there is one
/// (`… (INTERNAL_ERROR)`): h2's own words for the codes do not name them.
fn describe(error: &h2::Error) -> String {
    match error.reason() {
        Some(reason) => format!("{error} ({reason:?})"),
        None => error.to_string(),
    }
}

/// Whether a failed exchange had an answer from the pod: the pod reset this stream (other than
/// with REFUSED_STREAM, which says it did not take the request up). A GOAWAY or a closed or
/// broken connection is no answer: on a kept connection, the probe is made again on a new one.
fn answered_by(error: &h2::Error) -> bool {
    error.is_reset() && error.is_remote() && error.reason() != Some(Reason::REFUSED_STREAM)
}

#[cfg(test)]
mod tests;

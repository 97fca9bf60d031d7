use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Response};
use kactivator_api::grpc_health::{HealthCheckResponse, ServingStatus};
use kactivator_api::RevisionKey;
use kactivator_shards::routing::Protocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::super::tests::{NAMESPACE, REVISION};
use super::super::{probe, probe_on, ProbeResult};
use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);

fn key() -> RevisionKey {
    RevisionKey::new(NAMESPACE, REVISION).unwrap()
}

/// What a test pod got.
#[derive(Debug)]
struct Seen {
    method: http::Method,
    path: String,
    authority: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// What a test pod does with a request.
#[derive(Clone, Debug)]
enum Reply {
    /// A response: status, headers, body (sent in one DATA frame unless empty), trailers.
    Answer {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
        trailers: Option<Vec<(&'static str, String)>>,
    },
    /// `RST_STREAM` with this reason.
    Reset(Reason),
    /// A response head, then DATA forever (until the prober hangs up).
    Endless,
    /// Nothing at all.
    Silent,
}

fn header_map(fields: &[(&'static str, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in fields {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

/// A gRPC answer with status `code`: a message and trailers, or trailers-only without one.
fn grpc(code: u32, message: Option<Vec<u8>>) -> Reply {
    let grpc_content = ("content-type", "application/grpc".to_string());
    let status = ("grpc-status", code.to_string());
    match message {
        Some(body) => Reply::Answer {
            status: 200,
            headers: vec![grpc_content],
            body,
            trailers: Some(vec![status]),
        },
        None => Reply::Answer {
            status: 200,
            headers: vec![grpc_content, status],
            body: Vec::new(),
            trailers: None,
        },
    }
}

fn health(status: ServingStatus) -> Vec<u8> {
    grpc_health::frame(&HealthCheckResponse {
        status: status as i32,
    })
}

/// A pod that speaks only HTTP/2 (h2's server: anything but the preface ends the
/// connection), answering every request with `reply` and reporting each request it got.
/// Counts the connections it accepted; `per_connection` requests each, then GOAWAY.
async fn h2_pod(
    reply: Reply,
    per_connection: usize,
) -> (SocketAddr, Arc<AtomicUsize>, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let (seen_sender, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let (reply, seen_sender) = (reply.clone(), seen_sender.clone());
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(stream).await else {
                    return;
                };
                let mut served = 0;
                while let Some(Ok((request, respond))) = connection.accept().await {
                    let (reply, seen_sender) = (reply.clone(), seen_sender.clone());
                    tokio::spawn(serve(request, respond, reply, seen_sender));
                    served += 1;
                    if served == per_connection {
                        connection.graceful_shutdown();
                    }
                }
            });
        }
    });
    (addr, accepted, seen)
}

async fn serve(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    reply: Reply,
    seen: mpsc::UnboundedSender<Seen>,
) {
    let (parts, mut body) = request.into_parts();
    let mut received = Vec::new();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
        received.extend_from_slice(&data);
    }
    let _ = seen.send(Seen {
        method: parts.method,
        path: parts.uri.path().to_string(),
        authority: parts
            .uri
            .authority()
            .map(|authority| authority.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body: received,
    });
    match reply {
        Reply::Answer {
            status,
            headers,
            body,
            trailers,
        } => {
            let mut response = Response::builder().status(status).body(()).unwrap();
            *response.headers_mut() = header_map(&headers);
            let only_head = body.is_empty() && trailers.is_none();
            let Ok(mut stream) = respond.send_response(response, only_head) else {
                return;
            };
            if !body.is_empty() {
                let _ = stream.send_data(Bytes::from(body), trailers.is_none());
            }
            if let Some(trailers) = trailers {
                let _ = stream.send_trailers(header_map(&trailers));
            }
        }
        Reply::Reset(reason) => respond.send_reset(reason),
        Reply::Endless => {
            let response = Response::builder().status(200).body(()).unwrap();
            let Ok(mut stream) = respond.send_response(response, false) else {
                return;
            };
            let filler = Bytes::from(vec![b'q'; 16 * 1024]);
            loop {
                stream.reserve_capacity(filler.len());
                match std::future::poll_fn(|context| stream.poll_capacity(context)).await {
                    Some(Ok(_)) => {}
                    _ => return,
                }
                if stream.send_data(filler.clone(), false).is_err() {
                    return;
                }
            }
        }
        Reply::Silent => {
            // Hold the stream open until the prober gives up.
            std::future::pending::<()>().await;
        }
    }
}

async fn probe_h2c(addr: SocketAddr) -> ProbeResult {
    probe(addr, &key(), Protocol::H2c, TIMEOUT).await
}

#[tokio::test]
async fn the_probe_is_the_grpc_health_check_with_the_queue_proxy_headers() {
    let (addr, _, mut seen) = h2_pod(grpc(0, Some(health(ServingStatus::Serving))), 1).await;
    assert_eq!(probe_h2c(addr).await, ProbeResult::Healthy);
    let seen = seen.recv().await.unwrap();
    assert_eq!(seen.method, http::Method::POST);
    assert_eq!(seen.path, "/grpc.health.v1.Health/Check");
    assert_eq!(seen.authority, addr.to_string());
    for (name, value) in [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("k-network-probe", "queue"),
        ("user-agent", "Knative-Activator-Probe"),
    ] {
        assert_eq!(seen.headers[name], value, "{name} in {:?}", seen.headers);
    }
    // One uncompressed, empty HealthCheckRequest: the server as a whole.
    assert_eq!(seen.body, [0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn what_passes_over_h2c() {
    for reply in [
        grpc(0, Some(health(ServingStatus::Serving))),
        // A server without the health service (tonic answers trailers-only).
        grpc(12, None),
        // A queue-proxy in front of the pod.
        Reply::Answer {
            status: 200,
            headers: vec![("content-type", "text/plain".into())],
            body: b"queue".to_vec(),
            trailers: None,
        },
    ] {
        let (addr, _, _) = h2_pod(reply.clone(), usize::MAX).await;
        assert_eq!(probe_h2c(addr).await, ProbeResult::Healthy, "{reply:?}");
    }
}

#[tokio::test]
async fn what_fails_over_h2c() {
    let answered = |reason: &str| ProbeResult::Answered {
        status: 200,
        reason: reason.into(),
    };
    for (reply, expected) in [
        (
            grpc(0, Some(health(ServingStatus::NotServing))),
            answered("health NOT_SERVING"),
        ),
        (
            grpc(0, Some(health(ServingStatus::ServiceUnknown))),
            answered("health SERVICE_UNKNOWN"),
        ),
        (grpc(5, None), answered("grpc-status 5 NOT_FOUND")),
        (grpc(14, None), answered("grpc-status 14 UNAVAILABLE")),
        (
            Reply::Answer {
                status: 503,
                headers: Vec::new(),
                body: Vec::new(),
                trailers: None,
            },
            ProbeResult::Answered {
                status: 503,
                reason: "status 503".into(),
            },
        ),
        (
            Reply::Answer {
                status: 200,
                headers: Vec::new(),
                body: b"ok".to_vec(),
                trailers: None,
            },
            answered(r#"body "ok""#),
        ),
    ] {
        let (addr, _, _) = h2_pod(reply.clone(), usize::MAX).await;
        assert_eq!(probe_h2c(addr).await, expected, "{reply:?}");
    }
}

#[tokio::test]
async fn a_reset_stream_is_unhealthy() {
    // What grpcio answers a request it cannot dispatch (the old `GET /healthz`).
    let (addr, _, _) = h2_pod(Reply::Reset(Reason::INTERNAL_ERROR), usize::MAX).await;
    let ProbeResult::Unhealthy(reason) = probe_h2c(addr).await else {
        panic!("a reset is no answer");
    };
    assert!(reason.starts_with("response: "), "{reason}");
    assert!(reason.contains("INTERNAL_ERROR"), "{reason}");
}

#[tokio::test]
async fn another_revisions_headers_over_h2c_mean_the_ip_was_reused() {
    let reply = Reply::Answer {
        status: 200,
        headers: vec![
            ("x-knative-revision-name", "other-00003".into()),
            ("x-knative-revision-namespace", "team".into()),
            ("content-type", "application/grpc".into()),
        ],
        body: health(ServingStatus::Serving),
        trailers: Some(vec![("grpc-status", "0".into())]),
    };
    let (addr, _, _) = h2_pod(reply, usize::MAX).await;
    assert_eq!(
        probe_h2c(addr).await,
        ProbeResult::IpReused {
            namespace: "team".into(),
            revision: "other-00003".into()
        }
    );
}

/// The defect this probe fixes, at the smallest scale: a pod that speaks only HTTP/2 fails
/// an HTTP/1.1 probe however healthy it is, and passes the h2c one.
#[tokio::test]
async fn an_http2_only_pod_fails_an_http1_probe_and_passes_an_h2c_one() {
    let (addr, _, _) = h2_pod(grpc(12, None), usize::MAX).await;
    let over_http1 = probe(addr, &key(), Protocol::Http1, TIMEOUT).await;
    assert_eq!(over_http1.label(), "unhealthy", "{over_http1:?}");
    assert_eq!(probe_h2c(addr).await, ProbeResult::Healthy);
}

#[tokio::test]
async fn an_http1_only_pod_fails_an_h2c_probe() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        // What an HTTP/1.1 server says to the preface: `PRI * HTTP/2.0` is no request.
        let mut buffer = [0u8; 1024];
        let _ = stream.read(&mut buffer).await;
        let _ = stream
            .write_all(b"HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
    });
    let result = probe_h2c(addr).await;
    assert_eq!(result.label(), "unhealthy", "{result:?}");
}

#[tokio::test]
async fn a_healthy_pods_h2_connection_carries_its_next_probes() {
    let (addr, accepted, _) = h2_pod(grpc(12, None), usize::MAX).await;
    let mut kept = None;
    for _ in 0..3 {
        let (result, connection) =
            probe_on(kept, addr, &key(), Protocol::H2c, None, TIMEOUT, true).await;
        assert_eq!(result, ProbeResult::Healthy);
        assert!(connection.is_some(), "kept for the next probe");
        kept = connection;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_kept_h2_connection_the_pod_closed_is_retried_on_a_new_one_without_blame() {
    // One stream per connection, then GOAWAY and close.
    let (addr, accepted, _) = h2_pod(grpc(12, None), 1).await;
    let (result, kept) = probe_on(None, addr, &key(), Protocol::H2c, None, TIMEOUT, true).await;
    assert_eq!(result, ProbeResult::Healthy);
    assert!(kept.is_some());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (result, kept) = probe_on(kept, addr, &key(), Protocol::H2c, None, TIMEOUT, true).await;
    assert_eq!(result, ProbeResult::Healthy);
    assert!(kept.is_some());
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_kept_connection_of_the_other_protocol_is_not_used() {
    let (addr, accepted, _) = h2_pod(grpc(12, None), usize::MAX).await;
    let (_, kept) = probe_on(None, addr, &key(), Protocol::H2c, None, TIMEOUT, true).await;
    let kept = kept.expect("kept");
    // The revision became HTTP/1: its probe does not go over the h2 connection.
    let (result, _) = probe_on(
        Some(kept),
        addr,
        &key(),
        Protocol::Http1,
        None,
        TIMEOUT,
        true,
    )
    .await;
    assert_eq!(result.label(), "unhealthy", "{result:?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unhealthy_pods_h2_connection_is_not_kept_nor_a_one_shot_probes() {
    let (addr, _, _) = h2_pod(grpc(14, None), usize::MAX).await;
    let (result, kept) = probe_on(None, addr, &key(), Protocol::H2c, None, TIMEOUT, true).await;
    assert_eq!(result.label(), "unhealthy");
    assert!(kept.is_none());
    let (addr, _, _) = h2_pod(grpc(12, None), usize::MAX).await;
    let (result, kept) = probe_on(None, addr, &key(), Protocol::H2c, None, TIMEOUT, false).await;
    assert_eq!(result, ProbeResult::Healthy);
    assert!(kept.is_none());
}

#[tokio::test]
async fn a_pod_that_never_answers_times_out() {
    let (addr, _, _) = h2_pod(Reply::Silent, usize::MAX).await;
    let started = std::time::Instant::now();
    let result = probe(addr, &key(), Protocol::H2c, Duration::from_millis(200)).await;
    assert_eq!(
        result,
        ProbeResult::Unhealthy("timed out after 200ms".into())
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_silent_socket_times_out() {
    // Accepts and never says anything, not even SETTINGS.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
        drop(stream);
    });
    let result = probe(addr, &key(), Protocol::H2c, Duration::from_millis(200)).await;
    assert_eq!(
        result,
        ProbeResult::Unhealthy("timed out after 200ms".into())
    );
}

#[tokio::test]
async fn an_endless_body_is_capped_not_buffered() {
    let (addr, _, _) = h2_pod(Reply::Endless, usize::MAX).await;
    let ProbeResult::Answered { status, reason } = probe_h2c(addr).await else {
        panic!("an endless body is not healthy");
    };
    assert_eq!(status, 200);
    assert!(reason.starts_with(r#"body "qqqq"#), "{reason}");
    assert!(reason.ends_with("..."), "{reason}");
}

#[tokio::test]
async fn a_refused_connection_is_unhealthy() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let ProbeResult::Unhealthy(reason) = probe_h2c(addr).await else {
        panic!("nothing listens on {addr}");
    };
    assert!(reason.starts_with("connect: "), "{reason}");
}

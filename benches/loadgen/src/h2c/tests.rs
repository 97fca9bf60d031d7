//! Each test runs the h2c mode against a real h2c server on loopback (the `h2` crate's
//! server side on its own thread) that records what it was sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use h2::server::SendResponse;
use h2::RecvStream;
use http::Response;
use tokio::sync::watch;

use super::*;
use crate::parse_url;

/// How long the server holds answers back waiting for the concurrency a test expects; a
/// client that never reaches it gets its answers late and fails the test's assertion.
const HOLD_LIMIT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Seen {
    /// Requests received.
    requests: AtomicUsize,
    /// Connections accepted.
    connections: AtomicUsize,
    /// The highest number of requests in flight on each connection, by connection.
    max_in_flight_per_connection: Mutex<Vec<usize>>,
    authorities: Mutex<Vec<String>>,
    bodies: Mutex<Vec<Vec<u8>>>,
}

struct Server {
    addr: SocketAddr,
    seen: Arc<Seen>,
}

/// Starts the server. It holds every answer until `hold_until` requests have been in flight
/// at once (over all connections), and closes each connection after answering
/// `requests_per_connection` requests if given.
fn serve(hold_until: usize, requests_per_connection: Option<usize>) -> Server {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let server_seen = Arc::clone(&seen);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let in_flight = Arc::new(AtomicUsize::new(0));
            let (most, _) = watch::channel(0usize);
            let most = Arc::new(most);
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let index = server_seen.connections.fetch_add(1, Ordering::SeqCst);
                server_seen
                    .max_in_flight_per_connection
                    .lock()
                    .unwrap()
                    .push(0);
                let connection = ConnectionState {
                    seen: Arc::clone(&server_seen),
                    index,
                    in_flight_here: Arc::new(AtomicUsize::new(0)),
                    in_flight: Arc::clone(&in_flight),
                    most: Arc::clone(&most),
                    hold_until,
                };
                tokio::spawn(serve_connection(tcp, connection, requests_per_connection));
            }
        });
    });
    Server { addr, seen }
}

#[derive(Clone)]
struct ConnectionState {
    seen: Arc<Seen>,
    index: usize,
    in_flight_here: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    /// The most requests in flight at once so far, over all connections.
    most: Arc<watch::Sender<usize>>,
    hold_until: usize,
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    state: ConnectionState,
    requests_per_connection: Option<usize>,
) {
    let Ok(mut connection) = h2::server::handshake(tcp).await else {
        return;
    };
    let mut answered = Vec::new();
    while let Some(Ok((request, respond))) = connection.accept().await {
        answered.push(tokio::spawn(answer(request, respond, state.clone())));
        if requests_per_connection == Some(answered.len()) {
            for handle in answered.drain(..) {
                let _ = handle.await;
            }
            // Flush the answers, then drop the socket without a GOAWAY.
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                std::future::poll_fn(|cx| connection.poll_closed(cx)).await
            })
            .await;
            return;
        }
    }
}

async fn answer(
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    state: ConnectionState,
) {
    let (head, mut body) = request.into_parts();
    let mut received = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    state.seen.requests.fetch_add(1, Ordering::SeqCst);
    state.seen.authorities.lock().unwrap().push(
        head.uri
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default(),
    );
    state.seen.bodies.lock().unwrap().push(received.clone());

    let here = state.in_flight_here.fetch_add(1, Ordering::SeqCst) + 1;
    {
        let mut maxima = state.seen.max_in_flight_per_connection.lock().unwrap();
        maxima[state.index] = maxima[state.index].max(here);
    }
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.most.send_if_modified(|most| {
        let higher = now > *most;
        *most = (*most).max(now);
        higher
    });
    let mut most = state.most.subscribe();
    let _ = tokio::time::timeout(HOLD_LIMIT, most.wait_for(|m| *m >= state.hold_until)).await;
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    state.in_flight_here.fetch_sub(1, Ordering::SeqCst);

    match head.uri.path() {
        "/unavailable" => {
            let response = Response::builder().status(503).body(()).unwrap();
            let _ = respond.send_response(response, true);
        }
        path @ ("/grpc-ok" | "/grpc-fails") => {
            let grpc = head
                .headers
                .get(CONTENT_TYPE)
                .is_some_and(|v| v == "application/grpc")
                && head.headers.get(TE).is_some_and(|v| v == "trailers")
                && head.method == Method::POST;
            let response = Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "application/grpc")
                .body(())
                .unwrap();
            let Ok(mut stream) = respond.send_response(response, false) else {
                return;
            };
            let _ = stream.send_data(Bytes::from(received), false);
            let mut trailers = HeaderMap::new();
            let (status, message) = match (grpc, path) {
                (false, _) => ("3", "not a gRPC request"),
                (true, "/grpc-ok") => ("0", ""),
                (true, _) => ("13", "boom"),
            };
            trailers.insert("grpc-status", HeaderValue::from_static(status));
            trailers.insert("grpc-message", HeaderValue::from_static(message));
            let _ = stream.send_trailers(trailers);
        }
        _ => {
            let response = Response::builder().status(200).body(()).unwrap();
            if let Ok(mut stream) = respond.send_response(response, false) {
                let _ = stream.send_data(Bytes::from_static(b"ok"), true);
            }
        }
    }
}

fn exchange(url: &str, headers: &[&str], options: &H2Options) -> Exchange {
    let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    Exchange::new(&parse_url(url).unwrap(), &headers, options).unwrap()
}

fn get() -> H2Options {
    H2Options {
        streams: 1,
        body: None,
        grpc: false,
    }
}

fn counts(requests: u64, connections: usize) -> Vec<Limit> {
    (0..connections)
        .map(|i| Limit::Count(crate::requests_for_connection(requests, connections, i)))
        .collect()
}

#[test]
fn connections_carry_the_given_number_of_streams_at_once_and_the_exact_count() {
    let server = serve(8, None);
    let url = format!("http://{}/", server.addr);
    let tally = run(
        server.addr,
        exchange(&url, &[], &get()),
        counts(37, 2),
        4,
        Duration::from_secs(10),
        true,
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.messages);
    assert_eq!(tally.ok, 37);
    assert_eq!(tally.latencies.len(), 37);
    assert_eq!(server.seen.requests.load(Ordering::SeqCst), 37);
    assert_eq!(server.seen.connections.load(Ordering::SeqCst), 2);
    // Two connections, each with exactly four requests in flight at its busiest.
    assert_eq!(
        *server.seen.max_in_flight_per_connection.lock().unwrap(),
        [4, 4]
    );
}

#[test]
fn a_host_header_becomes_the_authority_and_headers_are_sent() {
    let server = serve(1, None);
    let url = format!("http://{}/", server.addr);
    let tally = run(
        server.addr,
        exchange(&url, &["Host: bench.default.svc.cluster.local"], &get()),
        counts(3, 1),
        1,
        Duration::from_secs(10),
        false,
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.messages);
    assert_eq!(tally.ok, 3);
    assert!(tally.latencies.is_empty());
    assert_eq!(
        *server.seen.authorities.lock().unwrap(),
        ["bench.default.svc.cluster.local"; 3]
    );
}

#[test]
fn a_grpc_call_succeeds_only_with_grpc_status_zero() {
    let server = serve(1, None);
    let frame = b"\x00\x00\x00\x00\x04\x0a\x02hi".to_vec();
    let options = H2Options {
        streams: 2,
        body: Some(frame.clone()),
        grpc: true,
    };
    let ok = run(
        server.addr,
        exchange(&format!("http://{}/grpc-ok", server.addr), &[], &options),
        counts(10, 1),
        2,
        Duration::from_secs(10),
        true,
    );
    assert_eq!(ok.errors, 0, "{:?}", ok.messages);
    assert_eq!(ok.ok, 10);
    assert!(server
        .seen
        .bodies
        .lock()
        .unwrap()
        .iter()
        .all(|b| *b == frame));

    let fails = run(
        server.addr,
        exchange(&format!("http://{}/grpc-fails", server.addr), &[], &options),
        counts(4, 1),
        2,
        Duration::from_secs(10),
        true,
    );
    assert_eq!((fails.ok, fails.errors), (0, 4));
    assert!(fails.latencies.is_empty());
    assert!(
        fails.messages[0].contains("grpc-status 13 \"boom\""),
        "{:?}",
        fails.messages
    );
}

#[test]
fn grpc_without_data_sends_the_empty_message() {
    let server = serve(1, None);
    let options = H2Options {
        streams: 1,
        body: None,
        grpc: true,
    };
    let tally = run(
        server.addr,
        exchange(&format!("http://{}/grpc-ok", server.addr), &[], &options),
        counts(1, 1),
        1,
        Duration::from_secs(10),
        false,
    );
    assert_eq!(tally.ok, 1, "{:?}", tally.messages);
    assert_eq!(*server.seen.bodies.lock().unwrap(), [vec![0u8; 5]]);
}

#[test]
fn a_status_other_than_200_is_an_error() {
    let server = serve(1, None);
    let tally = run(
        server.addr,
        exchange(&format!("http://{}/unavailable", server.addr), &[], &get()),
        counts(3, 1),
        1,
        Duration::from_secs(10),
        true,
    );
    assert_eq!((tally.ok, tally.errors), (0, 3));
    assert!(
        tally.messages[0].contains("answered status 503"),
        "{:?}",
        tally.messages
    );
}

#[test]
fn a_closed_connection_is_opened_again_until_the_budget_is_spent() {
    // Each connection answers two requests, then the server drops it.
    let server = serve(1, Some(2));
    let url = format!("http://{}/", server.addr);
    let tally = run(
        server.addr,
        exchange(&url, &[], &get()),
        counts(10, 1),
        1,
        Duration::from_secs(10),
        false,
    );
    assert_eq!(tally.ok + tally.errors, 10, "{:?}", tally.messages);
    assert!(tally.ok >= 4, "ok {} errors {:?}", tally.ok, tally.messages);
    assert!(server.seen.connections.load(Ordering::SeqCst) >= 3);
}

#[test]
fn a_duration_run_ends_at_its_deadline() {
    let server = serve(1, None);
    let url = format!("http://{}/", server.addr);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(200);
    let tally = run(
        server.addr,
        exchange(&url, &[], &get()),
        vec![Limit::Until(deadline); 2],
        3,
        Duration::from_secs(10),
        true,
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.messages);
    assert!(tally.ok > 0);
    assert_eq!(tally.latencies.len(), tally.ok);
    assert!(Instant::now() >= deadline);
}

#[test]
fn a_refused_connection_counts_one_failed_request_per_attempt() {
    // A port nothing listens on: bind, note it, close.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tally = run(
        addr,
        exchange(&format!("http://{addr}/"), &[], &get()),
        counts(3, 1),
        4,
        Duration::from_secs(10),
        true,
    );
    assert_eq!((tally.ok, tally.errors), (0, 3));
    assert!(
        tally.messages[0].contains("connect"),
        "{:?}",
        tally.messages
    );
}

#[test]
fn connection_specific_and_malformed_headers_are_refused() {
    let target = parse_url("http://127.0.0.1:1/").unwrap();
    for header in [
        "Connection: keep-alive",
        "Transfer-Encoding: chunked",
        "te: gzip",
        "Bad Name: x",
    ] {
        let error = Exchange::new(&target, &[header.to_string()], &get()).unwrap_err();
        assert!(error.contains(header), "{error}");
    }
    let exchange = Exchange::new(
        &target,
        &["TE: trailers".to_string(), "X-Thing: 1".to_string()],
        &get(),
    )
    .unwrap();
    assert_eq!(exchange.method, Method::GET);
    assert_eq!(exchange.headers["x-thing"], "1");
}

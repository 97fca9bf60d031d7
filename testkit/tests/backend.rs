//! End-to-end checks of every test-backend route and of its counters, over real sockets.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use kactivator_testkit::backend::{self, BackendConfig, BackendHandle, Stats};
use kactivator_testkit::pattern::{self, find_pattern_mismatch};
use kactivator_testkit::{pattern_checksum, ports};
use support::{get, Connection};
use tokio_tungstenite::tungstenite::Message;

const MEBIBYTE: u64 = 1024 * 1024;

fn start(name: &str) -> BackendHandle {
    backend::spawn(BackendConfig::named(name)).expect("spawn backend")
}

/// Spins until the counters satisfy `condition`. The backend updates them from its own
/// thread, so some conditions (a connection noticed as closed) are only eventually true.
fn wait_for(backend: &BackendHandle, what: &str, condition: impl Fn(&Stats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = backend.stats();
        if condition(&stats) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {stats:?}"
        );
        thread::yield_now();
    }
}

#[test]
fn root_greets_with_the_backend_name() {
    let backend = start("alpha");
    let response = get(backend.addr(), "/");
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "hello from alpha\n");
    assert_eq!(response.header("x-backend"), Some("alpha"));
    assert_eq!(response.header("x-knative-revision-name"), None);
    assert_eq!(response.header("x-knative-revision-namespace"), None);
}

#[test]
fn revision_headers_are_on_every_response() {
    let config = BackendConfig::named("beta").with_revision("hello-00001", "serving");
    let backend = backend::spawn(config).unwrap();
    let mut connection = Connection::open(backend.addr());
    for path in ["/", "/healthz", "/status/503", "/nowhere", "/bytes/10"] {
        let response = connection.get(path);
        assert_eq!(response.header("x-backend"), Some("beta"), "{path}");
        assert_eq!(
            response.header("x-knative-revision-name"),
            Some("hello-00001"),
            "{path}"
        );
        assert_eq!(
            response.header("x-knative-revision-namespace"),
            Some("serving"),
            "{path}"
        );
    }
}

#[test]
fn invalid_names_are_rejected_at_spawn() {
    let error = backend::spawn(BackendConfig::named("bad\nname")).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn healthz_answers_like_a_queue_proxy() {
    let backend = start("probe");
    let mut connection = Connection::open(backend.addr());
    let plain = connection.get("/healthz");
    assert_eq!((plain.status, plain.text().as_str()), (200, "ok"));
    let probe = connection.request("GET", "/healthz", &[("K-Network-Probe", "queue")], &[]);
    assert_eq!((probe.status, probe.text().as_str()), (200, "queue"));
}

fn queue_probe(connection: &mut Connection, path: &str) -> support::Response {
    connection.request("GET", path, &[("K-Network-Probe", "queue")], &[])
}

#[test]
fn queue_probes_are_answered_on_any_path_and_counted_apart_from_requests() {
    let backend = start("probe");
    let mut connection = Connection::open(backend.addr());
    for path in ["/healthz", "/", "/delay/10000"] {
        let probe = queue_probe(&mut connection, path);
        assert_eq!(
            (probe.status, probe.text().as_str()),
            (200, "queue"),
            "{path}"
        );
    }
    // Another probe value is no queue-proxy probe: it goes to the "user container".
    let other = connection.request("GET", "/", &[("K-Network-Probe", "activator")], &[]);
    assert_eq!(other.text(), "hello from probe\n");
    assert_eq!(connection.get("/healthz").text(), "ok");
    let stats = backend.stats();
    assert_eq!((stats.probes, stats.requests), (3, 2), "{stats:?}");
    assert_eq!(backend.probes(), 3);
    assert_eq!(stats.max_in_flight, 1, "probes are never in flight");
    backend.reset_stats();
    assert_eq!(backend.probes(), 0);
}

#[test]
fn probe_answers_follow_set_probe_healthy() {
    let backend = start("flaky");
    let mut connection = Connection::open(backend.addr());
    assert!(backend.probe_healthy());
    backend.set_probe_healthy(false);
    assert!(!backend.probe_healthy());
    let failing = queue_probe(&mut connection, "/healthz");
    assert_eq!((failing.status, failing.body.len()), (503, 0));
    // Requests are still served: only the probe answer changes.
    assert_eq!(connection.get("/").status, 200);
    backend.set_probe_healthy(true);
    let passing = queue_probe(&mut connection, "/healthz");
    assert_eq!((passing.status, passing.text().as_str()), (200, "queue"));
    assert_eq!(backend.stats().probes, 2);
}

#[test]
fn the_revision_identity_can_change_while_running() {
    let backend = start("reused");
    let mut connection = Connection::open(backend.addr());
    let identity = |response: &support::Response| {
        (
            response
                .header("x-knative-revision-namespace")
                .map(str::to_owned),
            response
                .header("x-knative-revision-name")
                .map(str::to_owned),
        )
    };
    assert_eq!(identity(&queue_probe(&mut connection, "/")), (None, None));

    backend.set_revision("team", "other-00002").unwrap();
    let expected = (Some("team".to_owned()), Some("other-00002".to_owned()));
    assert_eq!(identity(&queue_probe(&mut connection, "/")), expected);
    assert_eq!(identity(&connection.get("/")), expected);
    assert_eq!(identity(&connection.get("/status/502")), expected);
    backend.set_probe_healthy(false);
    assert_eq!(identity(&queue_probe(&mut connection, "/")), expected);

    // A value that cannot be a header is refused and changes nothing.
    let error = backend.set_revision("team", "bad\nname").unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(identity(&connection.get("/")), expected);

    backend
        .set_revision_headers(None, Some("other-00002"))
        .unwrap();
    assert_eq!(
        identity(&connection.get("/")),
        (None, Some("other-00002".to_owned()))
    );
    backend.clear_revision();
    assert_eq!(identity(&connection.get("/")), (None, None));
}

#[test]
fn the_configured_revision_can_be_cleared() {
    let config = BackendConfig::named("old-qp").with_revision("hello-00001", "serving");
    let backend = backend::spawn(config).unwrap();
    assert_eq!(
        get(backend.addr(), "/").header("x-knative-revision-name"),
        Some("hello-00001")
    );
    backend.clear_revision();
    assert_eq!(
        get(backend.addr(), "/").header("x-knative-revision-name"),
        None
    );
}

#[test]
fn pods_can_share_a_port_on_distinct_loopback_addresses() {
    let ips = [[127, 0, 0, 2], [127, 0, 0, 3], [127, 0, 0, 4]].map(std::net::IpAddr::from);
    let pods = backend::spawn_on_shared_port(
        ips.iter()
            .enumerate()
            .map(|(index, ip)| (*ip, BackendConfig::named(format!("pod-{index}")))),
    )
    .expect("loopback addresses beyond 127.0.0.1 are bindable");
    let port = pods[0].addr().port();
    for (index, pod) in pods.iter().enumerate() {
        assert_eq!(pod.addr(), std::net::SocketAddr::new(ips[index], port));
        assert_eq!(
            get(pod.addr(), "/").text(),
            format!("hello from pod-{index}\n")
        );
    }
}

#[test]
fn echo_with_content_length_keeps_length_and_type() {
    let backend = start("echo");
    let body: Vec<u8> = (0..100_000).map(pattern::pattern_byte).collect();
    let response = Connection::open(backend.addr()).request(
        "POST",
        "/echo",
        &[("Content-Type", "application/x-test")],
        &body,
    );
    assert_eq!(response.status, 200);
    assert!(!response.chunked());
    assert_eq!(response.header("content-length"), Some("100000"));
    assert_eq!(response.header("content-type"), Some("application/x-test"));
    assert!(response.body == body);
}

#[test]
fn echo_streams_a_chunked_body_back_as_it_arrives() {
    let backend = start("echo");
    let mut connection = Connection::open(backend.addr());
    connection.write(b"POST /echo HTTP/1.1\r\nHost: backend\r\nTransfer-Encoding: chunked\r\n\r\n");
    connection.write(b"5\r\nfirst\r\n");
    // The response head and the first piece arrive while the request is still open: the
    // body is streamed, not collected.
    let (status, headers) = connection.read_head();
    assert_eq!(status, 200);
    assert!(headers
        .iter()
        .any(|(name, value)| name.eq_ignore_ascii_case("transfer-encoding") && value == "chunked"));
    assert_eq!(connection.read_chunk().unwrap(), b"first");
    connection.write(b"6\r\nsecond\r\n0\r\n\r\n");
    assert_eq!(connection.read_chunk().unwrap(), b"second");
    assert_eq!(connection.read_chunk(), None);
    assert!(connection.read_trailers().is_empty());
    // The connection remains usable after the echoed exchange.
    assert_eq!(connection.get("/").status, 200);
}

#[test]
fn headers_reports_the_request_as_json() {
    let backend = start("mirror");
    let response = Connection::open(backend.addr()).request(
        "PUT",
        "/headers?x=1",
        &[("X-One", "1"), ("X-Two", "two")],
        b"12345",
    );
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let report = response.json();
    assert_eq!(report["method"], "PUT");
    assert_eq!(report["uri"], "/headers?x=1");
    assert_eq!(report["version"], "HTTP/1.1");
    assert_eq!(report["body_bytes"], 5);
    let headers: Vec<(String, String)> = report["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_owned(),
                pair[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("host", "backend"),
        ("x-one", "1"),
        ("x-two", "two"),
        ("content-length", "5"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    assert_eq!(headers, expected);
}

#[test]
fn bytes_serves_the_pattern_with_a_length() {
    let backend = start("bytes");
    let response = get(backend.addr(), &format!("/bytes/{MEBIBYTE}"));
    assert_eq!(response.status, 200);
    assert!(!response.chunked());
    assert_eq!(response.header("content-length"), Some("1048576"));
    assert_eq!(response.body.len() as u64, MEBIBYTE);
    assert_eq!(find_pattern_mismatch(0, &response.body), None);
    assert_eq!(
        pattern::checksum(&response.body),
        pattern_checksum(MEBIBYTE)
    );

    let empty = get(backend.addr(), "/bytes/0");
    assert_eq!(empty.header("content-length"), Some("0"));
    assert!(empty.body.is_empty());
}

#[test]
fn chunked_serves_the_pattern_without_a_length() {
    let backend = start("chunked");
    let length = MEBIBYTE + 7;
    let response = get(backend.addr(), &format!("/chunked/{length}"));
    assert_eq!(response.status, 200);
    assert!(response.chunked());
    assert_eq!(response.header("content-length"), None);
    assert_eq!(response.body.len() as u64, length);
    assert_eq!(find_pattern_mismatch(0, &response.body), None);

    let empty = get(backend.addr(), "/chunked/0");
    assert!(empty.chunked());
    assert!(empty.body.is_empty());
}

#[test]
fn sink_checksum_agrees_with_the_pattern() {
    let backend = start("sink");
    let body = get(backend.addr(), &format!("/bytes/{MEBIBYTE}")).body;
    let mut connection = Connection::open(backend.addr());
    let report = connection.request("POST", "/sink", &[], &body).json();
    assert_eq!(report["bytes"], MEBIBYTE);
    assert_eq!(report["checksum"], pattern_checksum(MEBIBYTE));

    // A chunked upload of the same bytes gives the same answer.
    connection.write(b"POST /sink HTTP/1.1\r\nHost: backend\r\nTransfer-Encoding: chunked\r\n\r\n");
    for piece in body.chunks(100_000) {
        connection.write(format!("{:x}\r\n", piece.len()).as_bytes());
        connection.write(piece);
        connection.write(b"\r\n");
    }
    connection.write(b"0\r\n\r\n");
    let report = connection.read_response(false).json();
    assert_eq!(report["bytes"], MEBIBYTE);
    assert_eq!(report["checksum"], pattern_checksum(MEBIBYTE));

    // Order matters: swapping two bytes changes the checksum.
    let mut swapped = body[..1000].to_vec();
    swapped.swap(3, 4);
    let report = connection.request("POST", "/sink", &[], &swapped).json();
    assert_eq!(report["bytes"], 1000);
    assert_ne!(report["checksum"], pattern_checksum(1000));
}

#[test]
fn delay_is_in_flight_while_sleeping() {
    let backend = start("delay");
    let addr = backend.addr();
    let client = thread::spawn(move || get(addr, "/delay/300"));
    wait_for(&backend, "the delayed request to be in flight", |stats| {
        stats.in_flight == 1
    });
    let response = client.join().unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "slept 300\n");
    // Released before the last byte left the backend, so no waiting is needed here.
    let stats = backend.stats();
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.max_in_flight, 1);
    assert_eq!(stats.requests, 1);
}

#[test]
fn five_concurrent_delays_reach_max_in_flight_five() {
    let backend = start("concurrency");
    let _warm_up = get(backend.addr(), "/");
    backend.reset_stats();
    let addr = backend.addr();
    let clients: Vec<_> = (0..5)
        .map(|_| thread::spawn(move || get(addr, "/delay/500")))
        .collect();
    wait_for(&backend, "five requests in flight", |stats| {
        stats.in_flight == 5
    });
    for client in clients {
        assert_eq!(client.join().unwrap().text(), "slept 500\n");
    }
    let stats = backend.stats();
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.max_in_flight, 5);
    assert_eq!(stats.requests, 5);
    assert_eq!(stats.connections_accepted, 5);
}

#[test]
fn in_flight_is_released_when_the_client_disconnects_mid_body() {
    let backend = start("disconnect");
    {
        let mut connection = Connection::open(backend.addr());
        connection.send("GET", "/slow-body/1000/10", &[], &[]);
        let (status, _headers) = connection.read_head();
        assert_eq!(status, 200);
        wait_for(&backend, "the slow body to be in flight", |stats| {
            stats.in_flight == 1
        });
    }
    wait_for(&backend, "the abandoned body to be released", |stats| {
        stats.in_flight == 0 && stats.connections_open == 0
    });
}

#[test]
fn connections_are_counted_and_kept_alive() {
    let backend = start("keepalive");
    {
        let mut connection = Connection::open(backend.addr());
        for _ in 0..3 {
            assert_eq!(connection.get("/").status, 200);
        }
        // An upload to a route that ignores bodies must not cost the connection.
        let upload = vec![7; 200_000];
        let response = connection.request("POST", "/status/202", &[], &upload);
        assert_eq!(response.status, 202);
        assert_eq!(connection.get("/").status, 200);
        let stats = backend.stats();
        assert_eq!(stats.connections_accepted, 1);
        assert_eq!(stats.connections_open, 1);
        assert_eq!(stats.requests, 5);
    }
    wait_for(&backend, "the closed connection to be noticed", |stats| {
        stats.connections_open == 0
    });
    backend.reset_stats();
    let stats = backend.stats();
    assert_eq!((stats.requests, stats.connections_accepted), (0, 0));
}

#[test]
fn status_returns_the_requested_code() {
    let backend = start("status");
    let mut connection = Connection::open(backend.addr());
    for code in [200, 201, 404, 418, 500, 503] {
        let response = connection.get(&format!("/status/{code}"));
        assert_eq!(response.status, code);
        assert_eq!(response.text(), format!("status {code}\n"));
    }
    for code in [204, 304] {
        let response = connection.get(&format!("/status/{code}"));
        assert_eq!(response.status, code);
        assert_eq!(response.header("content-length"), None);
        assert_eq!(response.header("transfer-encoding"), None);
    }
    // Still in step after the bodyless responses.
    assert_eq!(connection.get("/").text(), "hello from status\n");
}

#[test]
fn trailers_are_sent_when_the_client_accepts_them() {
    let backend = start("trailers");
    let mut connection = Connection::open(backend.addr());
    let response = connection.request("GET", "/trailers", &[("TE", "trailers")], &[]);
    assert!(response.chunked());
    assert_eq!(response.text(), "hello\n");
    assert_eq!(response.trailer("x-checksum"), Some("abc"));
    assert_eq!(response.trailer("x-final"), Some("yes"));

    // Hyper drops trailers for clients that did not send `TE: trailers`, but the body is
    // still properly terminated.
    let response = connection.get("/trailers");
    assert!(response.chunked());
    assert_eq!(response.text(), "hello\n");
    assert!(response.trailers.is_empty());
}

#[test]
fn slow_body_streams_kibibyte_frames() {
    let backend = start("slow");
    let response = get(backend.addr(), "/slow-body/3/20");
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-length"), Some("3072"));
    assert_eq!(response.body.len(), 3072);
    assert_eq!(find_pattern_mismatch(0, &response.body), None);
}

#[test]
fn close_ends_the_connection() {
    let backend = start("close");
    let mut connection = Connection::open(backend.addr());
    let response = connection.get("/close");
    assert_eq!(response.text(), "bye\n");
    assert_eq!(response.header("connection"), Some("close"));
    assert!(connection.read_to_end().is_empty());
}

#[test]
fn unknown_paths_get_404() {
    let backend = start("missing");
    let mut connection = Connection::open(backend.addr());
    for path in ["/nope", "/bytes/abc", "/delay", "/slow-body/1"] {
        let response = connection.get(path);
        assert_eq!(response.status, 404, "{path}");
        assert_eq!(response.text(), "no route\n", "{path}");
        assert_eq!(response.header("x-backend"), Some("missing"), "{path}");
    }
}

#[test]
fn half_close_is_reported_after_the_echo() {
    let backend = start("halfclose");
    let mut connection = Connection::open(backend.addr());
    connection.send(
        "GET",
        "/ws-half-close",
        &[("Upgrade", "echo"), ("Connection", "Upgrade")],
        &[],
    );
    let (status, headers) = connection.read_head();
    assert_eq!(status, 101);
    assert!(headers
        .iter()
        .any(|(name, value)| name.eq_ignore_ascii_case("x-backend") && value == "halfclose"));
    connection.write(b"abc");
    connection.shutdown_write();
    assert_eq!(connection.read_to_end(), b"abc\nEOF-SEEN\n");
    wait_for(&backend, "the upgraded connection to close", |stats| {
        stats.connections_open == 0
    });
}

#[test]
fn upgrade_routes_require_their_upgrade_header() {
    let backend = start("upgrades");
    let mut connection = Connection::open(backend.addr());
    assert_eq!(connection.get("/ws").status, 426);
    assert_eq!(connection.get("/ws-half-close").status, 426);
}

#[tokio::test]
async fn websocket_echoes_messages_and_closes() {
    let backend = start("socket");
    let (mut socket, handshake) =
        tokio_tungstenite::connect_async(backend.url("/ws").replace("http", "ws"))
            .await
            .expect("websocket handshake");
    assert_eq!(
        handshake
            .headers()
            .get("x-backend")
            .unwrap()
            .to_str()
            .unwrap(),
        "socket"
    );
    socket.send(Message::text("hello")).await.unwrap();
    assert_eq!(
        socket.next().await.unwrap().unwrap(),
        Message::text("hello")
    );
    socket
        .send(Message::binary(vec![1_u8, 2, 3]))
        .await
        .unwrap();
    assert_eq!(
        socket.next().await.unwrap().unwrap(),
        Message::binary(vec![1_u8, 2, 3])
    );
    socket.send(Message::Ping(vec![9_u8].into())).await.unwrap();
    assert_eq!(
        socket.next().await.unwrap().unwrap(),
        Message::Pong(vec![9_u8].into())
    );
    assert_eq!(backend.stats().connections_open, 1);
    socket.send(Message::Close(None)).await.unwrap();
    assert!(matches!(
        socket.next().await.unwrap().unwrap(),
        Message::Close(_)
    ));
    assert!(socket.next().await.is_none());
}

#[test]
fn shutdown_stops_the_backend() {
    let backend = start("stopping");
    let addr = backend.addr();
    let mut idle = Connection::open(addr);
    assert_eq!(idle.get("/").status, 200);
    backend.shutdown();
    // Open connections are closed, and nobody accepts new ones.
    assert!(idle.read_to_end().is_empty());
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn a_backend_can_be_restarted_on_its_port() {
    let port = ports::free_port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let first = backend::spawn_on(addr, BackendConfig::named("first")).unwrap();
    assert_eq!(first.addr(), addr);
    assert_eq!(get(addr, "/").text(), "hello from first\n");
    drop(first);
    let second = backend::spawn_on(addr, BackendConfig::named("second")).unwrap();
    assert_eq!(get(second.addr(), "/").text(), "hello from second\n");
}

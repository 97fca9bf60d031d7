//! HTTP/1.1 proxying through the real binary to real backends: methods, bodies in both
//! directions, keep-alive, pipelining, header rewriting.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::raw_http1::Framing;
use support::{curl, exchange, get, read_response, read_response_for, revision, Activator};

fn one_backend() -> (backend::BackendHandle, Activator) {
    let backend = backend::spawn(BackendConfig::named("pod-a")).unwrap();
    let activator = Activator::start(&revision("default", "hello", &[backend.addr()], ""));
    (backend, activator)
}

#[test]
fn get_through_knative_headers_and_host_fallback() {
    let (_backend, activator) = one_backend();
    let response = exchange(activator.http, get("hello", "/").as_bytes());
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "hello from pod-a\n");
    assert_eq!(response.header("x-backend"), Some("pod-a"));

    let url = format!("http://{}/", activator.http);
    let (ok, body) = curl(&["-H", "Host: hello.default.svc.cluster.local", &url]);
    assert!(ok);
    assert_eq!(body, b"hello from pod-a\n");
    let (ok, body) = curl(&["-H", "Host: hello.default.svc.cluster.local:80", &url]);
    assert!(ok);
    assert_eq!(body, b"hello from pod-a\n");
}

#[test]
fn outbound_headers_are_rewritten_like_knative() {
    let (backend, activator) = one_backend();
    let request = "GET /headers HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nKnative-Serving-Namespace: default\r\n\
                   Knative-Serving-Revision: hello\r\nX-Run-Id: run-42\r\nX-Request-Id: old\r\nK-Network-Hash: h\r\n\
                   Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nX-Forwarded-For: 10.1.1.1\r\n\r\n";
    let response = exchange(activator.http, request.as_bytes());
    assert_eq!(response.status, 200, "{}", response.text());
    let seen: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    let headers: Vec<(String, String)> = seen["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_string(),
                pair[1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(value("host"), Some(backend.addr().to_string().as_str()));
    assert_eq!(
        value("k-original-host"),
        Some("hello.default.svc.cluster.local")
    );
    assert_eq!(value("k-proxy-request"), Some("activator"));
    assert_eq!(value("x-request-id"), Some("run-42"));
    assert_eq!(value("x-forwarded-for"), Some("10.1.1.1, 127.0.0.1"));
    for gone in [
        "knative-serving-namespace",
        "knative-serving-revision",
        "x-run-id",
        "k-network-hash",
        "x-hop",
        "connection",
    ] {
        assert_eq!(
            value(gone),
            None,
            "{gone} must not reach the pod: {headers:?}"
        );
    }
}

#[test]
fn post_with_content_length_and_chunked_bodies_both_ways() {
    let (_backend, activator) = one_backend();
    let body = "x".repeat(100_000);
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: a\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let response = exchange(activator.http, request.as_bytes());
    assert_eq!(response.status, 200);
    assert_eq!(response.body.len(), body.len());

    // Chunked upload, chunked download (the backend streams /echo back chunked).
    let mut chunked = String::new();
    for piece in ["hello ", "chunked ", "world"] {
        chunked.push_str(&format!("{:x}\r\n{piece}\r\n", piece.len()));
    }
    chunked.push_str("0\r\n\r\n");
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: a\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"
    );
    let response = exchange(activator.http, request.as_bytes());
    assert_eq!(response.status, 200);
    assert_eq!(response.header("transfer-encoding"), Some("chunked"));
    assert_eq!(response.text(), "hello chunked world");

    // curl streams a chunked upload from stdin-like data and reads the echo.
    let url = format!("http://{}/sink", activator.http);
    let (ok, out) = curl(&[
        "-H",
        "Host: hello.default.svc.cluster.local",
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        "abcdef",
        &url,
    ]);
    assert!(ok);
    let sink: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(sink["bytes"], 6);
}

#[test]
fn keep_alive_reuses_one_client_and_one_upstream_connection() {
    let (backend, activator) = one_backend();
    let mut stream = activator.connect();
    let mut buffered = Vec::new();
    for _ in 0..20 {
        stream.write_all(get("hello", "/").as_bytes()).unwrap();
        let response = read_response(&mut stream, &mut buffered).unwrap();
        assert_eq!(response.status, 200);
    }
    // All 20 requests came over one client connection and were sent on one pooled upstream
    // connection: the proxy dialed the pod once (the backend also sees the health prober's
    // own connections, so its accept count is not the measure here).
    assert_eq!(
        activator.metric_sum("kactivator_shard_upstream_connects_total", &[]),
        1.0,
        "{:?}",
        backend.stats()
    );
    assert_eq!(backend.stats().requests, 20);
    assert!(activator.metric_sum("kactivator_shard_upstream_reuses_total", &[]) >= 19.0);
}

#[test]
fn a_peak_above_the_idle_cap_keeps_its_pod_connections_between_rounds() {
    // Eight clients in lockstep rounds, each request held 50 ms at the pod, so each round has
    // eight in flight at once and then none; the pool keeps two per pod for the idle timeout.
    // Every round's connections must be there for the next: a pool that closed what it got
    // back beyond its cap would redial six per round.
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 10;
    let backend = backend::spawn(BackendConfig::named("pod-a")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "hello", &[backend.addr()], ""),
        "max_idle_per_pod = 2\n",
        &["--shards", "1"],
        &[],
    );
    let http = activator.http;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(http).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let mut buffered = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    stream
                        .write_all(get("hello", "/delay/50").as_bytes())
                        .unwrap();
                    let response = read_response(&mut stream, &mut buffered)
                        .unwrap_or_else(|error| panic!("no response in round {round}: {error}"));
                    assert_eq!(response.status, 200, "round {round}");
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let connects = activator.metric_sum("kactivator_shard_upstream_connects_total", &[]);
    assert!(
        connects <= CLIENTS as f64,
        "{connects} dials for {CLIENTS} clients over {ROUNDS} rounds"
    );
    assert_eq!(backend.stats().requests, (CLIENTS * ROUNDS) as u64);
}

#[test]
fn busy_keep_alive_connections_are_never_closed_between_requests() {
    // Fast pod, several clients at once: the pod's response often completes in the same
    // completion batch as the write of the request. A finished exchange must still count as
    // finished, so the client's connection stays open for its next request.
    let (backend, activator) = one_backend();
    let http = activator.http;
    let clients: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(http).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let mut buffered = Vec::new();
                for i in 0..400 {
                    stream.write_all(get("hello", "/").as_bytes()).unwrap();
                    match read_response(&mut stream, &mut buffered) {
                        Ok(response) => assert_eq!(response.status, 200, "request {i}"),
                        Err(error) => panic!("no response {i}: {error}"),
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    assert_eq!(backend.stats().requests, 3200);
    assert_eq!(
        activator.metric_sum("kactivator_shard_connections_accepted_total", &[]),
        8.0
    );
}

#[test]
fn pipelined_requests_get_responses_in_order() {
    let (_backend, activator) = one_backend();
    let mut stream = activator.connect();
    let mut batch = String::new();
    for delay in [30, 0, 10] {
        batch.push_str(&get("hello", &format!("/delay/{delay}")));
    }
    stream.write_all(batch.as_bytes()).unwrap();
    let mut buffered = Vec::new();
    for delay in [30, 0, 10] {
        let response = read_response(&mut stream, &mut buffered).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.text(), format!("slept {delay}\n"));
    }
}

#[test]
fn head_requests_http10_and_connection_close_behave() {
    let (_backend, activator) = one_backend();
    // HEAD: headers only, even though the pod declares a length.
    let mut stream = activator.connect();
    let head = "HEAD /bytes/1000 HTTP/1.1\r\nHost: a\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello\r\n\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    let mut buffered = Vec::new();
    let response = read_response_for(&mut stream, &mut buffered, true).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-length"), Some("1000"));
    // The connection is still usable right after a HEAD.
    stream.write_all(get("hello", "/").as_bytes()).unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buffered).unwrap().text(),
        "hello from pod-a\n"
    );

    // HTTP/1.0 without keep-alive: a 1.0 response, body until close, connection closed.
    let mut stream = activator.connect();
    let old = "GET /chunked/5000 HTTP/1.0\r\nHost: hello.default.svc.cluster.local\r\n\r\n";
    stream.write_all(old.as_bytes()).unwrap();
    let response = read_response(&mut stream, &mut Vec::new()).unwrap();
    let text = String::from_utf8_lossy(&response.raw_head).to_string();
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("transfer-encoding"),
        "{text}"
    );
    assert_eq!(response.framing, Framing::Close, "{text}");
    assert_eq!(response.body.len(), 5000);

    // HTTP/1.0 with keep-alive: the connection stays open.
    let mut stream = activator.connect();
    let keep =
        "GET / HTTP/1.0\r\nHost: hello.default.svc.cluster.local\r\nConnection: keep-alive\r\n\r\n";
    stream.write_all(keep.as_bytes()).unwrap();
    let mut buffered = Vec::new();
    let response = read_response(&mut stream, &mut buffered).unwrap();
    assert_eq!(response.header("connection"), Some("keep-alive"));
    stream.write_all(keep.as_bytes()).unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buffered).unwrap().status,
        200
    );

    // Connection: close from an HTTP/1.1 client is honoured.
    let mut stream = activator.connect();
    let close =
        "GET / HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nConnection: close\r\n\r\n";
    stream.write_all(close.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    assert!(String::from_utf8_lossy(&raw).contains("Connection: close\r\n"));
}

#[test]
fn expect_continue_is_relayed_before_the_body() {
    let (_backend, activator) = one_backend();
    let mut stream = activator.connect();
    let head = "POST /sink HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    // The 100 comes from the pod through the proxy before we send any body byte.
    let mut interim = [0u8; 25];
    stream.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").unwrap();
    let mut buffered = Vec::new();
    let response = read_response(&mut stream, &mut buffered).unwrap();
    assert_eq!(response.status, 200);
    let sink: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(sink["bytes"], 5);
}

#[test]
fn trailers_are_forwarded_to_http11_clients() {
    let (_backend, activator) = one_backend();
    let mut stream = activator.connect();
    let request = "GET /trailers HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nTE: trailers\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    assert!(text.contains("\r\n0\r\nx-checksum: abc\r\n"), "{text}");
    assert!(text.contains("x-final: yes\r\n\r\n"), "{text}");
}

#[test]
fn requests_are_spread_over_pods() {
    let backends: Vec<_> = (0..3)
        .map(|i| backend::spawn(BackendConfig::named(format!("pod-{i}"))).unwrap())
        .collect();
    let addrs: Vec<_> = backends.iter().map(|b| b.addr()).collect();
    let activator = Activator::start(&revision("default", "spread", &addrs, ""));
    let mut stream = activator.connect();
    let mut buffered = Vec::new();
    for _ in 0..30 {
        stream.write_all(get("spread", "/").as_bytes()).unwrap();
        assert_eq!(
            read_response(&mut stream, &mut buffered).unwrap().status,
            200
        );
    }
    for backend in &backends {
        assert!(
            backend.stats().requests >= 5,
            "every pod gets traffic: {:?}",
            backend.stats()
        );
    }
}

#[test]
fn request_metrics_are_counted_per_revision_and_code() {
    let (_backend, activator) = one_backend();
    for path in ["/", "/status/503", "/status/503"] {
        exchange(activator.http, get("hello", path).as_bytes());
    }
    let labels = ["namespace_name=\"default\"", "revision_name=\"hello\""];
    // A request is recorded once its response has been written, so the scrape may race it.
    let all_three = || activator.metric_sum("activator_request_count", &labels) == 3.0;
    assert!(
        support::eventually(Duration::from_secs(5), all_three),
        "{}",
        activator.metrics()
    );
    assert_eq!(
        activator.metric_sum(
            "activator_request_count",
            &[labels[0], labels[1], "response_code=\"200\""]
        ),
        1.0
    );
    assert_eq!(
        activator.metric_sum(
            "activator_request_count",
            &[
                labels[0],
                labels[1],
                "response_code=\"503\"",
                "response_code_class=\"5xx\""
            ]
        ),
        2.0
    );
    assert_eq!(
        activator.metric_sum(
            "activator_request_latencies_count",
            &[labels[0], "response_code=\"503\""]
        ),
        2.0
    );
    let drivers = activator.metrics();
    let expected = std::env::var("KACTIVATOR_DRIVER").unwrap_or_default();
    if expected == "epoll" || expected == "io-uring" {
        assert!(
            drivers.contains(&format!("driver=\"{expected}\"")),
            "{drivers}"
        );
    }
}

#[test]
fn slow_responses_stream_without_buffering() {
    let (_backend, activator) = one_backend();
    let mut stream = TcpStream::connect(activator.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(get("hello", "/slow-body/3/300").as_bytes())
        .unwrap();
    // The head and the first frame arrive long before the last frame is produced.
    let started = std::time::Instant::now();
    let mut first = [0u8; 256];
    let n = stream.read(&mut first).unwrap();
    assert!(n > 0 && String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "first bytes took {:?}",
        started.elapsed()
    );
}

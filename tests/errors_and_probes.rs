//! What the activator answers by itself: probes, unknown revisions, malformed requests, dead
//! pods, and clients that vanish.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use kactivator_testkit::backend::{self, BackendConfig};
use support::{eventually, exchange, get, revision, Activator};

fn with_backend() -> (backend::BackendHandle, Activator) {
    let backend = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision("default", "hello", &[backend.addr()], ""));
    (backend, activator)
}

#[test]
fn every_probe_type_is_answered_locally_with_knatives_bodies() {
    let (backend, activator) = with_backend();
    let cases: [(&str, u16, &str); 6] = [
        ("User-Agent: kube-probe/1.30\r\n", 200, ""),
        ("K-Kubelet-Probe: 1\r\n", 200, ""),
        (
            "K-Network-Probe: probe\r\nK-Network-Hash: 1234\r\n",
            200,
            "",
        ),
        (
            "K-Network-Probe: probe\r\n",
            400,
            "a probe request must contain a non-empty \"K-Network-Hash\" header\n",
        ),
        ("K-Network-Probe: activator\r\n", 200, "activator"),
        (
            "K-Network-Probe: queue\r\n",
            400,
            "unexpected probe header value: \"queue\"\n",
        ),
    ];
    for (headers, status, body) in cases {
        let request = format!(
            "GET /healthz HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\n{headers}\r\n"
        );
        let response = exchange(activator.http, request.as_bytes());
        assert_eq!(
            (response.status, response.text().as_str()),
            (status, body),
            "probe {headers:?}"
        );
        if headers.contains("Hash: 1234") {
            assert_eq!(response.header("k-network-hash"), Some("1234"));
        }
    }
    assert_eq!(backend.stats().requests, 0, "no probe may reach the pod");
    // An empty K-Network-Probe is an ordinary request.
    let response = exchange(
        activator.http,
        b"GET / HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nK-Network-Probe:\r\n\r\n",
    );
    assert_eq!(response.text(), "hello from pod\n");
}

#[test]
fn unknown_revisions_get_knatives_404() {
    let (_backend, activator) = with_backend();
    let response = exchange(activator.http, get("missing", "/").as_bytes());
    assert_eq!(response.status, 404);
    assert_eq!(
        response.text(),
        "Error getting active endpoint: revision.serving.knative.dev \"missing\" not found\n"
    );
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    let response = exchange(
        activator.http,
        b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
    );
    assert_eq!(response.status, 404);
    assert_eq!(
        response.text(),
        "Error getting active endpoint: revision.serving.knative.dev \"\" not found\n"
    );
}

#[test]
fn malformed_requests_get_400_and_the_connection_closes() {
    let (backend, activator) = with_backend();
    let bad: [&[u8]; 5] = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    ];
    for raw in bad {
        let mut stream = activator.connect();
        stream.write_all(raw).unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(
            text.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{:?} → {text}",
            String::from_utf8_lossy(raw)
        );
        assert!(text.contains("Connection: close\r\n"), "{text}");
    }
    assert_eq!(
        backend.stats().requests,
        0,
        "smuggling attempts never reach the pod"
    );
}

#[test]
fn oversized_heads_get_431() {
    let (_backend, activator) = with_backend();
    let mut stream = activator.connect();
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let _ = stream.write_all(huge.as_bytes());
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    assert!(String::from_utf8_lossy(&response)
        .starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
}

#[test]
fn a_dead_pod_gets_502_naming_the_cause() {
    // A port nobody listens on, held so that nobody can: connection refused.
    let refusing = kactivator_testkit::ports::RefusingAddress::new();
    let dead: SocketAddr = refusing.addr();
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "dead", &[dead], "")
    ));
    let response = exchange(activator.http, get("dead", "/").as_bytes());
    assert_eq!(response.status, 502);
    assert_eq!(
        response.text(),
        format!("dial {dead}: connection refused\n")
    );
    // The connection stays usable after a 502 for a bodyless request.
    let mut stream = activator.connect();
    let mut buffered = Vec::new();
    for _ in 0..2 {
        stream.write_all(get("dead", "/").as_bytes()).unwrap();
        assert_eq!(
            support::read_response(&mut stream, &mut buffered)
                .unwrap()
                .status,
            502
        );
    }
}

#[test]
fn a_pod_that_closes_without_answering_gets_502() {
    let (addr, _) = support::raw_pod(|mut stream| {
        let mut buf = [0u8; 1024];
        let _ = stream.read(&mut buf);
        // Close without a byte of response.
    });
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "rude", &[addr], "")
    ));
    let response = exchange(activator.http, get("rude", "/").as_bytes());
    assert_eq!(response.status, 502);
    assert_eq!(
        response.text(),
        format!("reading response from {addr}: connection closed before a response was received\n")
    );
}

#[test]
fn a_pod_that_sends_garbage_gets_502() {
    let (addr, _) = support::raw_pod(|mut stream| {
        let mut buf = [0u8; 1024];
        let _ = stream.read(&mut buf);
        let _ = stream.write_all(b"SPDY/9 what\r\n\r\n");
    });
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "garbage", &[addr], "")
    ));
    let response = exchange(activator.http, get("garbage", "/").as_bytes());
    assert_eq!(response.status, 502);
    assert!(
        response
            .text()
            .starts_with(&format!("malformed response from {addr}:")),
        "{}",
        response.text()
    );
}

#[test]
fn revision_timeout_answers_504_when_nothing_was_written() {
    let backend = backend::spawn(BackendConfig::named("slow")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "slow",
        &[backend.addr()],
        "timeout_seconds = 1",
    ));
    let started = std::time::Instant::now();
    let response = exchange(activator.http, get("slow", "/delay/3000").as_bytes());
    assert_eq!(response.status, 504);
    assert_eq!(response.text(), "activator request timeout");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_client_that_vanishes_mid_body_tears_down_the_pod_connection() {
    let (backend, activator) = with_backend();
    let mut stream = activator.connect();
    let head = "POST /sink HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nContent-Length: 10000000\r\n\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&vec![b'x'; 100_000]).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || backend.stats().in_flight == 1),
        "{:?}",
        backend.stats()
    );
    drop(stream);
    // The pod sees its request end and its connection close; nothing stays open but the one
    // connection the prober keeps to a healthy pod for its next probe.
    assert!(
        eventually(Duration::from_secs(5), || {
            let stats = backend.stats();
            stats.in_flight == 0 && stats.connections_open <= 1
        }),
        "{:?}",
        backend.stats()
    );
    assert!(eventually(Duration::from_secs(5), || activator
        .metric_sum("kactivator_shard_connections_open", &[])
        == 0.0));
    assert!(activator.metric_sum("kactivator_shard_client_aborts_total", &[]) >= 1.0);
}

#[test]
fn a_client_that_vanishes_while_waiting_for_the_response_is_noticed() {
    let (backend, activator) = with_backend();
    let mut stream = activator.connect();
    stream
        .write_all(get("hello", "/delay/5000").as_bytes())
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || backend
        .stats()
        .in_flight
        == 1));
    drop(stream);
    // The activator gives up on the exchange at once instead of waiting 5 s for the pod (the
    // prober may keep one connection to the pod for its next probe).
    assert!(
        eventually(Duration::from_secs(2), || {
            let stats = backend.stats();
            stats.in_flight == 0 && stats.connections_open <= 1
        }),
        "{:?}",
        backend.stats()
    );
}

#[test]
fn a_pooled_connection_the_pod_closed_while_idle_is_not_used() {
    // A pod that answers one request per connection with keep-alive, then closes the idle
    // connection shortly after: the next request must go out on a fresh connection, not fail.
    let (addr, accepted) = support::raw_pod(|mut stream| {
        let mut buf = [0u8; 4096];
        let _ = stream.read(&mut buf);
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        std::thread::sleep(Duration::from_millis(50));
        // Closing an idle keep-alive connection is the pod's right.
    });
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "flaky", &[addr], "")
    ));
    let mut stream = activator.connect();
    let mut buffered = Vec::new();
    for _ in 0..3 {
        stream.write_all(get("flaky", "/").as_bytes()).unwrap();
        let response = support::read_response(&mut stream, &mut buffered).unwrap();
        assert_eq!((response.status, response.text().as_str()), (200, "ok"));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "each request needed a fresh connection"
    );
    assert!(
        activator.metric_sum("kactivator_shard_upstream_stale_discards_total", &[]) >= 2.0,
        "{}",
        activator.metrics()
    );
}

#[test]
fn a_large_single_chunk_followed_by_its_end_completes_at_once() {
    // The pod writes one 300 KB chunk and the terminating chunk in one go, then keeps the
    // connection open: the end is already buffered when the proxy's output fills, and it must
    // be forwarded without waiting for bytes the pod will never send.
    let (addr, _) = support::raw_pod(|mut stream| {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            let size = 300_000;
            let mut response =
                format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size:x}\r\n")
                    .into_bytes();
            response.extend(std::iter::repeat_n(b'z', size));
            response.extend_from_slice(b"\r\n0\r\n\r\n");
            let _ = stream.write_all(&response);
        }
    });
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "bigchunk", &[addr], "timeout_seconds = 20")
    ));
    let mut stream = activator.connect();
    let mut buffered = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        stream.write_all(get("bigchunk", "/").as_bytes()).unwrap();
        let response = support::read_response(&mut stream, &mut buffered).unwrap();
        assert_eq!((response.status, response.body.len()), (200, 300_000));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }
}

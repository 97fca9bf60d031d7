//! HTTP/1.1 edge cases where a differential test against the upstream activator found
//! kactivator short of RFC 9110/9112 (issue 15): Host rules, absolute-form targets, broken
//! chunked bodies, later 1.x minors, unknown transfer codings, CONNECT and h2c upgrades.
//!
//! Each test sends raw bytes on a socket and checks what a user would see: the status line,
//! the body, whether the connection stays open, and what the pod received.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use support::{read_response, revision, Activator, Response};

const HOST: &str = "hello-00001.default.svc.cluster.local";

fn with_backend() -> (BackendHandle, Activator) {
    let backend = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision("default", "hello-00001", &[backend.addr()], ""));
    (backend, activator)
}

/// Sends `raw` on a fresh connection and reads one response.
fn send(activator: &Activator, raw: &str) -> (TcpStream, Response, Vec<u8>) {
    let mut stream = activator.connect();
    stream.write_all(raw.as_bytes()).unwrap();
    let mut buffered = Vec::new();
    let response = read_response(&mut stream, &mut buffered).expect("a response");
    (stream, response, buffered)
}

/// Whether the activator closed the connection: the read ends without another byte.
fn closed(stream: &mut TcpStream, buffered: &[u8]) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    // A reset is a close too.
    let _ = stream.read_to_end(&mut rest);
    buffered.is_empty() && rest.is_empty()
}

/// The answer kactivator writes itself for a request it refuses.
fn assert_refusal(response: &Response, status: u16, body: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    assert_eq!(response.text(), body);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(response.header("connection"), Some("close"));
}

/// The `(name, value)` pairs the test backend's `/headers` saw.
fn seen_headers(response: &Response) -> (serde_json::Value, Vec<(String, String)>) {
    let seen: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    let headers = seen["headers"]
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
    (seen, headers)
}

#[test]
fn an_http11_request_without_host_gets_400_and_never_reaches_the_pod() {
    let (backend, activator) = with_backend();
    let (mut stream, response, buffered) = send(
        &activator,
        "GET / HTTP/1.1\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello-00001\r\n\r\n",
    );
    assert_refusal(
        &response,
        400,
        "400 Bad Request: missing required Host header\n",
    );
    assert!(closed(&mut stream, &buffered));
    assert_eq!(backend.stats().requests, 0);

    // HTTP/1.0 has no Host requirement: served as before.
    let (_stream, response, _) = send(
        &activator,
        "GET / HTTP/1.0\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello-00001\r\n\r\n",
    );
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "hello from pod\n");
}

#[test]
fn two_host_fields_get_400_and_never_reach_the_pod() {
    let (backend, activator) = with_backend();
    for second in ["other-00001.default.svc.cluster.local", HOST] {
        let (mut stream, response, buffered) = send(
            &activator,
            &format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nHost: {second}\r\n\r\n"),
        );
        assert_refusal(&response, 400, "400 Bad Request: too many Host headers\n");
        assert!(closed(&mut stream, &buffered));
    }
    assert_eq!(backend.stats().requests, 0);
}

#[test]
fn an_absolute_form_target_routes_by_its_authority_and_reaches_the_pod_in_origin_form() {
    let (_backend, activator) = with_backend();
    let (_stream, response, _) = send(
        &activator,
        &format!("GET http://{HOST}/ HTTP/1.1\r\nHost: example.com\r\n\r\n"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.text(), "hello from pod\n");

    let (_stream, response, _) = send(
        &activator,
        &format!("GET http://{HOST}/headers?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let (seen, headers) = seen_headers(&response);
    assert_eq!(seen["uri"], "/headers?x=1");
    let original_host: Vec<_> = headers
        .iter()
        .filter(|(name, _)| name == "k-original-host")
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(original_host, [HOST]);

    // An authority with userinfo is not a routing key anyone should trust.
    let (_stream, response, _) = send(
        &activator,
        &format!("GET http://user@{HOST}/ HTTP/1.1\r\nHost: {HOST}\r\n\r\n"),
    );
    assert_refusal(&response, 400, "400 Bad Request: invalid request target\n");
}

#[test]
fn a_malformed_chunk_size_gets_400_and_the_connection_closes() {
    let (_backend, activator) = with_backend();
    let (mut stream, response, buffered) = send(
        &activator,
        &format!(
            "POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
        ),
    );
    assert_refusal(&response, 400, "400 Bad Request: invalid chunk size\n");
    assert!(closed(&mut stream, &buffered));
    assert!(activator.metric_sum("kactivator_shard_bad_requests_total", &[]) >= 1.0);
}

#[test]
fn a_broken_body_after_the_response_started_closes_without_an_answer_appended() {
    // A pod that answers as soon as it has the head, and holds its body open.
    let (addr, _) = support::raw_pod(|mut stream| {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nearly\r\n");
        // Drain until the activator lets go.
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).unwrap_or(0) > 0 {}
    });
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "hello-00001", &[addr], "")
    ));
    let mut stream = activator.connect();
    stream
        .write_all(
            format!("POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
                .as_bytes(),
        )
        .unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while !seen.ends_with(b"early\r\n") {
        let read = stream
            .read(&mut chunk)
            .expect("the start of the pod's response");
        assert!(read > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..read]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200 OK\r\n"));
    stream.write_all(b"zz\r\n").unwrap();
    let _ = stream.read_to_end(&mut seen);
    let text = String::from_utf8_lossy(&seen);
    assert!(text.ends_with("early\r\n"), "{text}");
    assert!(!text.contains("400"), "{text}");
}

#[test]
fn http_1_2_is_served_as_http_1_1_on_a_connection_that_stays_open() {
    let (backend, activator) = with_backend();
    let (mut stream, response, mut buffered) = send(
        &activator,
        &format!("GET / HTTP/1.2\r\nHost: {HOST}\r\n\r\n"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.version, 1);
    assert_eq!(response.text(), "hello from pod\n");
    assert_eq!(response.header("connection"), None);
    stream
        .write_all(format!("GET / HTTP/1.9\r\nHost: {HOST}\r\n\r\n").as_bytes())
        .unwrap();
    let again = read_response(&mut stream, &mut buffered).expect("a second response");
    assert_eq!(again.status, 200);
    assert_eq!(backend.stats().requests, 2);

    // Other versions are still refused.
    let (_stream, response, _) = send(
        &activator,
        &format!("GET / HTTP/2.0\r\nHost: {HOST}\r\n\r\n"),
    );
    assert_eq!(response.status, 505);
}

#[test]
fn an_unknown_transfer_coding_before_chunked_gets_501() {
    let (backend, activator) = with_backend();
    for coding in ["gzip, chunked", "identity, chunked"] {
        let (mut stream, response, buffered) = send(
            &activator,
            &format!("POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: {coding}\r\n\r\n"),
        );
        assert_refusal(
            &response,
            501,
            "501 Not Implemented: unknown transfer coding (only chunked is implemented)\n",
        );
        assert!(response.headers.iter().any(|(_, value)| value == "close"));
        assert!(closed(&mut stream, &buffered));
    }
    // RFC 9112 §6.3: when chunked is not the final coding the length cannot be determined,
    // a 400 that comes before "not implemented".
    for coding in ["chunked, identity", "gzip", "identity", "chunked, gzip"] {
        let (mut stream, response, buffered) = send(
            &activator,
            &format!("POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: {coding}\r\n\r\n"),
        );
        assert_eq!(response.status, 400, "{coding}");
        assert!(response.headers.iter().any(|(_, value)| value == "close"));
        assert!(closed(&mut stream, &buffered));
    }
    // Content-Length with Transfer-Encoding stays a 400, whatever the coding.
    let (_stream, response, _) = send(
        &activator,
        &format!("POST / HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\nhello"),
    );
    assert_eq!(response.status, 400);
    assert_eq!(backend.stats().requests, 0);
}

#[test]
fn connect_is_refused_with_405_and_the_connection_closes_at_once() {
    let (backend, activator) = with_backend();
    let (mut stream, response, buffered) = send(
        &activator,
        &format!("CONNECT {HOST}:80 HTTP/1.1\r\nHost: {HOST}:80\r\n\r\n"),
    );
    assert_refusal(
        &response,
        405,
        "CONNECT is not supported: kactivator is not a forward proxy\n",
    );
    assert_eq!(
        response.header("allow"),
        Some("GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH")
    );
    assert!(closed(&mut stream, &buffered));
    assert_eq!(backend.stats().requests, 0);
}

#[test]
fn an_h2c_upgrade_offer_is_ignored_and_the_request_served_as_http11() {
    let (backend, activator) = with_backend();
    let (mut stream, response, mut buffered) = send(
        &activator,
        &format!(
            "GET /headers HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
             HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
        ),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let (_, headers) = seen_headers(&response);
    for (name, _) in &headers {
        assert!(
            !["upgrade", "http2-settings", "connection"].contains(&name.as_str()),
            "the pod saw {name}: {headers:?}"
        );
    }
    // Still HTTP/1.1: the next request on the connection is served.
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n").as_bytes())
        .unwrap();
    let again = read_response(&mut stream, &mut buffered).expect("a second response");
    assert_eq!(again.status, 200);
    assert_eq!(again.text(), "hello from pod\n");
    assert_eq!(backend.stats().requests, 2);
}

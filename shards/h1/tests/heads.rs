//! Request and response head parsing: table-driven cases and properties over generated input.

use kactivator_h1::{
    parse_request, parse_response, BodyKind, ConnectionTokens, HeadError, Method, Parsed,
    RequestHead, ResponseHead, Version, MAX_HEADERS, MAX_HEAD_BYTES,
};
use proptest::prelude::*;

fn request(raw: &[u8]) -> (Result<Parsed, HeadError>, RequestHead) {
    let mut head = RequestHead::default();
    let result = parse_request(raw, &mut head);
    (result, head)
}

fn request_body(raw: &str) -> Result<BodyKind, HeadError> {
    let (result, head) = request(raw.as_bytes());
    result.map(|parsed| {
        assert_eq!(parsed, Parsed::Complete, "{raw:?}");
        head.body
    })
}

fn response(raw: &[u8], method: Method) -> (Result<Parsed, HeadError>, ResponseHead) {
    let mut head = ResponseHead::default();
    let result = parse_response(raw, method, &mut head);
    (result, head)
}

fn is_malformed(result: &Result<Parsed, HeadError>) -> bool {
    matches!(result, Err(HeadError::Malformed(_)))
}

#[test]
fn simple_get() {
    let raw = b"GET /index.html?q=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\nNEXT";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.len, raw.len() - 4);
    assert_eq!(head.method, Method::Get);
    assert_eq!(head.method_span.of(raw), b"GET");
    assert_eq!(head.target.of(raw), b"/index.html?q=1");
    assert_eq!(head.version, Version::Http11);
    assert_eq!(head.body, BodyKind::Empty);
    assert_eq!(head.connection, ConnectionTokens::default());
    assert!(head.keep_alive());
    assert_eq!(head.upgrade, None);
    assert!(!head.expect_continue);
    assert!(!head.te_trailers);
    assert_eq!(head.header(raw, "host"), Some(&b"example.com"[..]));
    assert_eq!(head.header(raw, "HOST"), Some(&b"example.com"[..]));
    assert_eq!(head.header(raw, "missing"), None);
    let all: Vec<_> = head.headers(raw).collect();
    assert_eq!(
        all,
        [
            (&b"Host"[..], &b"example.com"[..]),
            (&b"Accept"[..], &b"*/*"[..])
        ]
    );
}

#[test]
fn methods() {
    let cases: &[(&str, Method)] = &[
        ("GET", Method::Get),
        ("HEAD", Method::Head),
        ("POST", Method::Post),
        ("PUT", Method::Put),
        ("DELETE", Method::Delete),
        ("OPTIONS", Method::Options),
        ("PATCH", Method::Patch),
        ("CONNECT", Method::Connect),
        ("TRACE", Method::Trace),
        ("PROPFIND", Method::Other),
        ("get", Method::Other),
    ];
    for (method, expected) in cases {
        let raw = format!("{method} / HTTP/1.1\r\nHost: h\r\n\r\n");
        let (result, head) = request(raw.as_bytes());
        assert_eq!(result, Ok(Parsed::Complete), "{method}");
        assert_eq!(head.method, *expected, "{method}");
        assert_eq!(head.method_span.of(raw.as_bytes()), method.as_bytes());
    }
}

#[test]
fn keep_alive_rules() {
    let cases: &[(&str, &str, bool)] = &[
        ("HTTP/1.1", "", true),
        ("HTTP/1.1", "Connection: close\r\n", false),
        ("HTTP/1.1", "Connection: Close\r\n", false),
        ("HTTP/1.1", "Connection: keep-alive\r\n", true),
        ("HTTP/1.1", "Connection: keep-alive, close\r\n", false),
        (
            "HTTP/1.1",
            "Connection: foo\r\nConnection: close\r\n",
            false,
        ),
        ("HTTP/1.0", "", false),
        ("HTTP/1.0", "Connection: keep-alive\r\n", true),
        ("HTTP/1.0", "Connection: Keep-Alive\r\n", true),
        (
            "HTTP/1.0",
            "Connection: keep-alive\r\nConnection: close\r\n",
            false,
        ),
        ("HTTP/1.0", "Connection: upgrade\r\n", false),
    ];
    for (version, fields, expected) in cases {
        let raw = format!("GET / {version}\r\nHost: h\r\n{fields}\r\n");
        let (result, head) = request(raw.as_bytes());
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.keep_alive(), *expected, "{raw:?}");
    }
}

#[test]
fn connection_token_lists() {
    let cases: &[(&str, ConnectionTokens)] = &[
        (
            "Connection: keep-alive, Upgrade\r\n",
            ConnectionTokens {
                close: false,
                keep_alive: true,
                upgrade: true,
            },
        ),
        (
            "Connection: UPGRADE\r\nConnection: Close\r\n",
            ConnectionTokens {
                close: true,
                keep_alive: false,
                upgrade: true,
            },
        ),
        (
            "Connection: ,, foo ,close,\r\n",
            ConnectionTokens {
                close: true,
                keep_alive: false,
                upgrade: false,
            },
        ),
        (
            "Connection: closed, upgrader\r\n",
            ConnectionTokens::default(),
        ),
        ("X-Connection: close\r\n", ConnectionTokens::default()),
    ];
    for (fields, expected) in cases {
        let raw = format!("GET / HTTP/1.1\r\nHost: h\r\n{fields}\r\n");
        let (result, head) = request(raw.as_bytes());
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.connection, *expected, "{raw:?}");
    }
}

#[test]
fn upgrade_detection() {
    let raw = b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert!(head.connection.upgrade);
    assert_eq!(
        head.upgrade.map(|span| span.of(raw)),
        Some(&b"websocket"[..])
    );

    // Upgrade without the Connection token is not an upgrade request (RFC 9110 §7.8).
    let raw = b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.upgrade, None);

    let raw = b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n";
    let (_, head) = request(raw);
    assert!(head.connection.upgrade);
    assert_eq!(head.upgrade, None);

    // RFC 9110 §7.8: Upgrade in an HTTP/1.0 request is ignored.
    let raw = b"GET /chat HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert!(head.connection.upgrade);
    assert_eq!(head.upgrade, None);
}

#[test]
fn expect_continue() {
    let cases: &[(&str, &str, bool)] = &[
        ("HTTP/1.1", "Expect: 100-continue\r\n", true),
        ("HTTP/1.1", "Expect: 100-Continue\r\n", true),
        ("HTTP/1.1", "expect:   100-CONTINUE  \r\n", true),
        ("HTTP/1.1", "Expect: 200-ok\r\n", false),
        ("HTTP/1.1", "", false),
        ("HTTP/1.0", "Expect: 100-continue\r\n", false),
    ];
    for (version, fields, expected) in cases {
        let raw = format!("POST / {version}\r\nHost: h\r\nContent-Length: 1\r\n{fields}\r\n");
        let (result, head) = request(raw.as_bytes());
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.expect_continue, *expected, "{raw:?}");
    }
}

#[test]
fn te_trailers() {
    let cases: &[(&str, bool)] = &[
        ("TE: trailers\r\n", true),
        ("TE: gzip;q=0.5, Trailers\r\n", true),
        ("TE: gzip\r\nte: trailers\r\n", true),
        ("TE: gzip\r\n", false),
        ("Transfer-Encoding: chunked\r\n", false),
        ("", false),
    ];
    for (fields, expected) in cases {
        let raw = format!("GET / HTTP/1.1\r\nHost: h\r\n{fields}\r\n");
        let (result, head) = request(raw.as_bytes());
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.te_trailers, *expected, "{raw:?}");
    }
}

#[test]
fn request_framing() {
    use BodyKind::*;
    use HeadError::*;
    let cases: &[(&str, &str, Result<BodyKind, HeadError>)] = &[
        ("HTTP/1.1", "", Ok(Empty)),
        ("HTTP/1.1", "Content-Length: 0\r\n", Ok(Length(0))),
        ("HTTP/1.1", "Content-Length: 5\r\n", Ok(Length(5))),
        ("HTTP/1.1", "content-length: 007\r\n", Ok(Length(7))),
        // Surrounding whitespace is not part of a field value (RFC 9110 §5.5).
        ("HTTP/1.1", "Content-Length:  5 \r\n", Ok(Length(5))),
        ("HTTP/1.1", "Content-Length: 5, 5\r\n", Ok(Length(5))),
        (
            "HTTP/1.1",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            Ok(Length(5)),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 5, 6\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 5,\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: +5\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: -5\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 5a\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 5 5\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 0x5\r\n",
            Err(InvalidContentLength),
        ),
        ("HTTP/1.1", "Content-Length:\r\n", Err(InvalidContentLength)),
        (
            "HTTP/1.1",
            "Content-Length: 18446744073709551615\r\n",
            Ok(Length(u64::MAX)),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 18446744073709551616\r\n",
            Err(InvalidContentLength),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 99999999999999999999999\r\n",
            Err(InvalidContentLength),
        ),
        ("HTTP/1.1", "Transfer-Encoding: chunked\r\n", Ok(Chunked)),
        ("HTTP/1.1", "Transfer-Encoding: Chunked\r\n", Ok(Chunked)),
        // Only a single bare chunked is implemented; other well-formed codings are 501.
        (
            "HTTP/1.1",
            "Transfer-Encoding: gzip, chunked\r\n",
            Err(UnknownTransferCoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
            Err(UnknownTransferCoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: gzip\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: identity\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: chunked, gzip\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: chunked, identity\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: chunked, chunked\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: chunked;x=1\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: \"chunked\"\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: x;p=\"a, chunked\"\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: g@zip, chunked\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding:\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.1",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            Err(ConflictingFraming),
        ),
        (
            "HTTP/1.1",
            "Content-Length: 5\r\nTransfer-Encoding: gzip\r\n",
            Err(ConflictingFraming),
        ),
        (
            "HTTP/1.0",
            "Transfer-Encoding: chunked\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        (
            "HTTP/1.0",
            "Transfer-Encoding: gzip\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        // CL+TE is checked before the codings.
        (
            "HTTP/1.1",
            "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n",
            Err(ConflictingFraming),
        ),
        // Read as HTTP/1.1.
        ("HTTP/1.2", "Transfer-Encoding: chunked\r\n", Ok(Chunked)),
        (
            "HTTP/1.9",
            "Transfer-Encoding: gzip\r\n",
            Err(UnsupportedTransferEncoding),
        ),
        ("HTTP/1.0", "Content-Length: 3\r\n", Ok(Length(3))),
    ];
    for (version, fields, expected) in cases {
        let raw = format!("POST /upload {version}\r\nHost: x\r\n{fields}\r\n");
        assert_eq!(request_body(&raw), *expected, "{raw:?}");
    }
}

fn request_with_headers(count: usize) -> Vec<u8> {
    let mut raw = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
    for index in 1..count {
        raw.extend_from_slice(format!("X-Field-{index}: {index}\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    raw
}

#[test]
fn header_count_limit() {
    let (result, head) = request(&request_with_headers(MAX_HEADERS));
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.headers.len(), MAX_HEADERS);
    let (result, _) = request(&request_with_headers(MAX_HEADERS + 1));
    assert_eq!(result, Err(HeadError::TooManyHeaders));
    assert_eq!(HeadError::TooManyHeaders.status(), 431);
}

/// A request head of exactly `size` bytes, padded with one long header value.
fn request_of_size(size: usize) -> Vec<u8> {
    let prefix = b"GET / HTTP/1.1\r\nHost: h\r\nX-Padding: ";
    let suffix = b"\r\n\r\n";
    let mut raw = prefix.to_vec();
    raw.resize(size - suffix.len(), b'p');
    raw.extend_from_slice(suffix);
    assert_eq!(raw.len(), size);
    raw
}

#[test]
fn head_size_limit() {
    let at_limit = request_of_size(MAX_HEAD_BYTES);
    let (result, head) = request(&at_limit);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.len, MAX_HEAD_BYTES);

    let mut with_body = at_limit.clone();
    with_body.extend_from_slice(b"body bytes");
    let (result, head) = request(&with_body);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.len, MAX_HEAD_BYTES);

    let over = request_of_size(MAX_HEAD_BYTES + 1);
    assert_eq!(request(&over).0, Err(HeadError::TooLarge));
    assert_eq!(request(&over[..MAX_HEAD_BYTES]).0, Err(HeadError::TooLarge));
    assert_eq!(request(&over[..MAX_HEAD_BYTES - 1]).0, Ok(Parsed::Partial));
    assert_eq!(HeadError::TooLarge.status(), 431);

    // Endless leading empty lines are bounded by the same limit.
    let blank = b"\r\n".repeat(MAX_HEAD_BYTES);
    assert_eq!(request(&blank).0, Err(HeadError::TooLarge));
}

const VALID_REQUESTS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /a/b?c=d HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\nExpect: 100-continue\r\n\r\n",
    b"PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\n\r\n",
    b"GET http://h:8080?q HTTP/1.2\r\nHost: h\r\n\r\n",
    b"\r\n\r\nOPTIONS * HTTP/1.1\r\nHost: h\r\nEmpty:\r\n\r\n",
    b"CONNECT host:443 HTTP/1.1\nHost: host:443\n\n",
];

#[test]
fn every_prefix_is_partial() {
    for raw in VALID_REQUESTS {
        let (result, head) = request(raw);
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.len, raw.len());
        for end in 0..raw.len() {
            assert_eq!(
                request(&raw[..end]).0,
                Ok(Parsed::Partial),
                "{:?}",
                String::from_utf8_lossy(&raw[..end])
            );
        }
    }
}

#[test]
fn leading_empty_lines_are_skipped() {
    let raw = b"\r\n\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.len, raw.len());
    assert_eq!(head.target.of(raw), b"/x");
}

#[test]
fn bare_newlines_are_accepted_in_heads() {
    let raw = b"GET / HTTP/1.1\nHost: h\n\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.header(raw, "host"), Some(&b"h"[..]));
}

#[test]
fn malformed_requests() {
    let cases: &[&[u8]] = &[
        // obs-fold
        b"GET / HTTP/1.1\r\nX-Folded: a\r\n b\r\n\r\n",
        b"GET / HTTP/1.1\r\nX-Folded: a\r\n\tb\r\n\r\n",
        // request-line garbage
        b"GET\r\n\r\n",
        b"GET /\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b" GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
        b"GET / FTP/1.1\r\n\r\n",
        b"GET / http/1.1\r\n\r\n",
        b"GET / HTTP/1.10\r\n\r\n",
        b"GET / HTTP/11\r\n\r\n",
        b"GET / HTTP/1\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\n\r\n",
        // bare CR
        b"GET / HTTP/1.1\rHost: h\r\n\r\n",
        b"\rGET / HTTP/1.1\r\n\r\n",
        // header syntax
        b"GET / HTTP/1.1\r\nBad Name: v\r\n\r\n",
        b"GET / HTTP/1.1\r\nName : v\r\n\r\n",
        b"GET / HTTP/1.1\r\n: v\r\n\r\n",
        b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"GET / HTTP/1.1\r\n Leading: space\r\n\r\n",
    ];
    for raw in cases {
        let (result, _) = request(raw);
        assert!(
            is_malformed(&result),
            "{:?} gave {result:?}",
            String::from_utf8_lossy(raw)
        );
        assert_eq!(result.unwrap_err().status(), 400);
    }
}

#[test]
fn later_http1_minors_are_read_as_http11() {
    for minor in b'2'..=b'9' {
        let mut raw = b"GET /a?b HTTP/1.x\r\nHost: h\r\nX: y\r\n\r\nNEXT".to_vec();
        raw[16] = minor;
        let (result, head) = request(&raw);
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.version, Version::Http11);
        assert!(head.keep_alive());
        assert_eq!(head.len, raw.len() - 4);
        // The spans fit the caller's buffer, not only the copy that was parsed.
        assert_eq!(head.target.of(&raw), b"/a?b");
        assert_eq!(head.header(&raw, "x"), Some(&b"y"[..]));
        assert_eq!(head.authority.map(|a| a.of(&raw)), Some(&b"h"[..]));
        for end in 0..raw.len() - 4 {
            assert_eq!(request(&raw[..end]).0, Ok(Parsed::Partial), "{end}");
        }
    }
    // Read as 1.1, so Host is required.
    assert_eq!(
        request(b"GET / HTTP/1.2\r\n\r\n").0,
        Err(HeadError::MissingHost)
    );
}

/// (request head, expected result, expected authority)
type HostCase = (
    &'static str,
    Result<Parsed, HeadError>,
    Option<&'static str>,
);

#[test]
fn host_rules() {
    use HeadError::*;
    let complete = Ok(Parsed::Complete);
    let cases: &[HostCase] = &[
        ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", complete, Some("h")),
        (
            "GET / HTTP/1.1\r\nHOST: h:8080\r\n\r\n",
            complete,
            Some("h:8080"),
        ),
        ("GET / HTTP/1.1\r\nHost:\r\n\r\n", complete, Some("")),
        ("GET / HTTP/1.1\r\n\r\n", Err(MissingHost), None),
        (
            "GET / HTTP/1.1\r\nX-Host: h\r\n\r\n",
            Err(MissingHost),
            None,
        ),
        ("GET / HTTP/1.0\r\n\r\n", complete, None),
        ("GET / HTTP/1.0\r\nHost: h\r\n\r\n", complete, Some("h")),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            Err(DuplicateHost),
            None,
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
            Err(DuplicateHost),
            None,
        ),
        (
            "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            Err(DuplicateHost),
            None,
        ),
        // One field with a list is left to routing, which matches no revision with it.
        (
            "GET / HTTP/1.1\r\nHost: a, b\r\n\r\n",
            complete,
            Some("a, b"),
        ),
        // CONNECT carries its authority in the target; Go does not ask it for Host.
        ("CONNECT h:443 HTTP/1.1\r\n\r\n", complete, None),
        (
            "CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n",
            complete,
            Some("h:443"),
        ),
        ("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", complete, Some("h")),
        // Absolute form: the target's authority wins, and Host is still required.
        (
            "GET http://t.ns.svc/p HTTP/1.1\r\nHost: h\r\n\r\n",
            complete,
            Some("t.ns.svc"),
        ),
        (
            "GET HTTPS://t:8443?q HTTP/1.1\r\nHost: h\r\n\r\n",
            complete,
            Some("t:8443"),
        ),
        (
            "GET http://t HTTP/1.1\r\nHost: h\r\n\r\n",
            complete,
            Some("t"),
        ),
        ("GET http://t/ HTTP/1.1\r\n\r\n", Err(MissingHost), None),
        ("GET http://t/ HTTP/1.0\r\n\r\n", complete, Some("t")),
        (
            "GET http:///p HTTP/1.1\r\nHost: h\r\n\r\n",
            Err(Malformed("invalid request target")),
            None,
        ),
        (
            "GET http://u@t/ HTTP/1.1\r\nHost: h\r\n\r\n",
            Err(Malformed("invalid request target")),
            None,
        ),
    ];
    for (raw, expected, authority) in cases {
        let (result, head) = request(raw.as_bytes());
        assert_eq!(result, *expected, "{raw:?}");
        if result.is_ok() {
            let found = head.authority.map(|span| span.of(raw.as_bytes()));
            assert_eq!(found, authority.map(str::as_bytes), "{raw:?}");
        }
    }
    assert_eq!(
        HeadError::MissingHost.to_string(),
        "missing required Host header"
    );
    assert_eq!(
        HeadError::DuplicateHost.to_string(),
        "too many Host headers"
    );
}

#[test]
fn an_h2c_upgrade_offer_is_ignored() {
    let raw =
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
                HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.upgrade, None);
    assert!(head.h2c_offered);
    assert!(head.keep_alive());
    // Alongside another protocol, the upgrade stands; the proxy drops h2c from the list.
    let raw =
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: H2C, websocket\r\n\r\n";
    let (result, head) = request(raw);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(
        head.upgrade.map(|u| u.of(raw)),
        Some(&b"H2C, websocket"[..])
    );
    assert!(head.h2c_offered);
    let raw = b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let (_, head) = request(raw);
    assert!(!head.h2c_offered);
    assert!(head.upgrade.is_some());
}

#[test]
fn unsupported_versions() {
    let cases: &[&[u8]] = &[
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET / HTTP/0.9\r\n\r\n",
        b"GET / HTTP/3.0\r\nHost: h\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ];
    for raw in cases {
        let (result, _) = request(raw);
        assert_eq!(result, Err(HeadError::UnsupportedVersion), "{raw:?}");
        assert_eq!(result.unwrap_err().status(), 505);
        // The verdict must not depend on how the bytes arrived.
        for end in 0..raw.len() {
            let (prefix_result, _) = request(&raw[..end]);
            assert!(
                matches!(
                    prefix_result,
                    Ok(Parsed::Partial) | Err(HeadError::UnsupportedVersion)
                ),
                "{:?} gave {prefix_result:?}",
                String::from_utf8_lossy(&raw[..end])
            );
        }
    }
}

#[test]
fn response_framing() {
    use BodyKind::*;
    let cases: &[(Method, &str, Result<BodyKind, HeadError>)] = &[
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
            Ok(Length(5)),
        ),
        (
            Method::Head,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
            Ok(Empty),
        ),
        (
            Method::Head,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n",
            Ok(Empty),
        ),
        (Method::Head, "HTTP/1.1 200 OK\r\n", Ok(Empty)),
        (
            Method::Get,
            "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n",
            Ok(Empty),
        ),
        (
            Method::Get,
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n",
            Ok(Empty),
        ),
        (Method::Get, "HTTP/1.1 100 Continue\r\n", Ok(Empty)),
        (
            Method::Get,
            "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n",
            Ok(Empty),
        ),
        (
            Method::Get,
            "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n",
            Ok(Empty),
        ),
        (
            Method::Connect,
            "HTTP/1.1 200 Connection Established\r\n",
            Ok(Empty),
        ),
        (
            Method::Connect,
            "HTTP/1.1 407 Auth\r\nContent-Length: 2\r\n",
            Ok(Length(2)),
        ),
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n",
            Ok(Chunked),
        ),
        (
            Method::Post,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n",
            Ok(Chunked),
        ),
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n",
            Ok(UntilClose),
        ),
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n",
            Ok(UntilClose),
        ),
        (Method::Get, "HTTP/1.1 200 OK\r\n", Ok(UntilClose)),
        (Method::Get, "HTTP/1.0 200 OK\r\n", Ok(UntilClose)),
        (
            Method::Get,
            "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n",
            Ok(Length(1)),
        ),
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n",
            Err(HeadError::InvalidContentLength),
        ),
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n",
            Err(HeadError::InvalidContentLength),
        ),
        (
            Method::Get,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n",
            Err(HeadError::UnsupportedTransferEncoding),
        ),
        (
            Method::Get,
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n",
            Err(HeadError::UnsupportedTransferEncoding),
        ),
    ];
    for (method, status_and_fields, expected) in cases {
        let raw = format!("{status_and_fields}\r\n");
        let (result, head) = response(raw.as_bytes(), *method);
        let body = result.map(|parsed| {
            assert_eq!(parsed, Parsed::Complete);
            head.body
        });
        assert_eq!(body, *expected, "{method:?} {raw:?}");
    }
}

#[test]
fn response_with_both_framings_is_chunked_and_closes() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (result, head) = response(raw, Method::Get);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.body, BodyKind::Chunked);
    assert!(head.connection.close);
    assert!(!head.keep_alive());
}

#[test]
fn response_details() {
    let raw = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nX-A: 1\r\n\r\nnext";
    let (result, head) = response(raw, Method::Get);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.len, raw.len() - 4);
    assert_eq!(head.status, 404);
    assert_eq!(head.reason.of(raw), b"Not Found");
    assert_eq!(head.version, Version::Http11);
    assert_eq!(head.body, BodyKind::Length(0));
    assert!(head.keep_alive());
    assert!(!head.is_informational());
    assert_eq!(head.header(raw, "x-a"), Some(&b"1"[..]));
    assert_eq!(head.headers(raw).count(), 2);

    let raw =
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let (result, head) = response(raw, Method::Get);
    assert_eq!(result, Ok(Parsed::Complete));
    assert!(head.is_informational());
    assert!(head.connection.upgrade);
    assert_eq!(head.header(raw, "upgrade"), Some(&b"websocket"[..]));

    let raw = b"HTTP/1.1 200 caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n";
    let (result, head) = response(raw, Method::Get);
    assert_eq!(result, Ok(Parsed::Complete));
    assert_eq!(head.reason.of(raw), b"caf\xc3\xa9");

    let raw = b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n";
    let (result, head) = response(raw, Method::Get);
    assert_eq!(result, Ok(Parsed::Complete));
    assert!(head.reason.is_empty());
}

#[test]
fn response_keep_alive_rules() {
    let cases: &[(&str, bool)] = &[
        ("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", true),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n",
            false,
        ),
        ("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n", false),
        (
            "HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n",
            true,
        ),
        ("HTTP/1.1 200 OK\r\n", false),
        ("HTTP/1.1 204 No Content\r\n", true),
    ];
    for (status_and_fields, expected) in cases {
        let raw = format!("{status_and_fields}\r\n");
        let (result, head) = response(raw.as_bytes(), Method::Get);
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.keep_alive(), *expected, "{raw:?}");
    }
}

#[test]
fn malformed_responses() {
    let cases: &[&[u8]] = &[
        b"HTTP/1.1 099 Low\r\n\r\n",
        b"HTTP/1.1 000\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1  200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: v\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.10 200 OK\r\n\r\n",
    ];
    for raw in cases {
        let (result, _) = response(raw, Method::Get);
        assert!(
            is_malformed(&result),
            "{:?} gave {result:?}",
            String::from_utf8_lossy(raw)
        );
    }
    let (result, _) = response(b"HTTP/2.0 200 OK\r\n\r\n", Method::Get);
    assert_eq!(result, Err(HeadError::UnsupportedVersion));
}

#[test]
fn response_status_range() {
    for status in [100u16, 199, 200, 599, 999] {
        let raw = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
        let (result, head) = response(raw.as_bytes(), Method::Get);
        assert_eq!(result, Ok(Parsed::Complete), "{raw:?}");
        assert_eq!(head.status, status);
    }
}

#[test]
fn response_prefixes_are_partial() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\n";
    for end in 0..raw.len() {
        assert_eq!(
            response(&raw[..end], Method::Get).0,
            Ok(Parsed::Partial),
            "{end}"
        );
    }
    let over = {
        let mut raw = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        raw.resize(MAX_HEAD_BYTES + 10, b'v');
        raw
    };
    assert_eq!(response(&over, Method::Get).0, Err(HeadError::TooLarge));
}

// ---- properties -------------------------------------------------------------------------

/// Every span of a complete head must lie inside the head.
fn check_request_invariants(input: &[u8], head: &RequestHead) {
    assert!(head.len <= input.len());
    assert!(head.len <= MAX_HEAD_BYTES);
    let inside =
        |span: kactivator_h1::Span| span.end as usize <= head.len && span.start <= span.end;
    assert!(inside(head.method_span));
    assert!(inside(head.target));
    if let Some(authority) = head.authority {
        assert!(inside(authority));
    }
    for header in &head.headers {
        assert!(inside(header.name));
        assert!(inside(header.value));
    }
    assert!(head.headers.len() <= MAX_HEADERS);
    assert_ne!(head.body, BodyKind::UntilClose);
}

fn arbitrary_head_bytes() -> impl Strategy<Value = Vec<u8>> {
    let header_line = prop_oneof![
        "[A-Za-z-]{1,12}: [ -~]{0,16}\r\n",
        "(Content-Length|Transfer-Encoding|Connection|Upgrade|Expect|TE): [ -~]{0,16}\r\n",
        "[ -~]{0,16}\r?\n?",
        Just("\r\n".to_string()),
    ];
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        (
            "(GET|POST|HEAD|X)? ?[ -~]{0,10} ?(HTTP/1\\.[01]|HTTP/[0-9]\\.[0-9]|[ -~]{0,8})\r?\n",
            prop::collection::vec(header_line, 0..8),
            prop::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(|(line, headers, tail)| {
                let mut raw = line.into_bytes();
                for header in headers {
                    raw.extend_from_slice(header.as_bytes());
                }
                raw.extend_from_slice(&tail);
                raw
            }),
    ]
}

#[derive(Clone, Debug)]
struct GeneratedRequest {
    bytes: Vec<u8>,
    head_len: usize,
    method: Method,
    version: Version,
    body: BodyKind,
    keep_alive: bool,
    /// What parsing the whole head gives: every framing rule and Host rule applied.
    verdict: Result<Parsed, HeadError>,
}

fn generated_request() -> impl Strategy<Value = GeneratedRequest> {
    let method = prop::sample::select(vec![
        ("GET", Method::Get),
        ("POST", Method::Post),
        ("PUT", Method::Put),
        ("HEAD", Method::Head),
        ("DELETE", Method::Delete),
        ("PATCH", Method::Patch),
        ("MKCOL", Method::Other),
    ]);
    let version = prop::sample::select(vec![
        ("HTTP/1.0", Version::Http10),
        ("HTTP/1.1", Version::Http11),
        ("HTTP/1.1", Version::Http11),
        // Later minors are read as 1.1.
        ("HTTP/1.2", Version::Http11),
        ("HTTP/1.9", Version::Http11),
    ]);
    // Transfer codings; only a bare chunked is implemented.
    let coding = prop::sample::select(vec!["", "", "chunked", "chunked", "gzip", "gzip, chunked"]);
    // How many Host fields: most requests have one.
    let hosts = prop::sample::select(vec![1usize, 1, 1, 0, 2]);
    let extra_header = ("x-[a-z0-9-]{1,12}", "([!-~]([ !-~]{0,20}[!-~])?)?");
    (
        method,
        "/[a-zA-Z0-9/._~%-]{0,30}(\\?[a-z0-9=&]{0,12})?",
        version,
        prop::collection::vec(extra_header, 0..10),
        0..3usize,
        prop::option::of(0u64..100_000),
        coding,
        prop::sample::select(vec!["", "close", "keep-alive", "Keep-Alive, Upgrade"]),
        (any::<bool>(), hosts),
        prop::collection::vec(any::<u8>(), 0..20),
    )
        .prop_map(
            |(
                (method_text, method),
                target,
                (version_text, version),
                extra,
                leading_empty_lines,
                content_length,
                coding,
                connection,
                (bare_newlines, hosts),
                trailing,
            )| {
                let newline = if bare_newlines { "\n" } else { "\r\n" };
                let mut head = newline.repeat(leading_empty_lines);
                head.push_str(&format!("{method_text} {target} {version_text}{newline}"));
                for _ in 0..hosts {
                    head.push_str(&format!("Host: example.test{newline}"));
                }
                let mut fields: Vec<String> = extra
                    .into_iter()
                    .map(|(name, value)| format!("{name}: {value}{newline}"))
                    .collect();
                let coding = if version == Version::Http11 {
                    coding
                } else {
                    ""
                };
                let mut verdict = Ok(Parsed::Complete);
                let body = if !coding.is_empty() {
                    fields.push(format!("Transfer-Encoding: {coding}{newline}"));
                    // RFC 9112 §6.3: chunked not final is a 400; before chunked, a 501.
                    if !coding.ends_with("chunked") {
                        verdict = Err(HeadError::UnsupportedTransferEncoding);
                    } else if coding != "chunked" {
                        verdict = Err(HeadError::UnknownTransferCoding);
                    }
                    BodyKind::Chunked
                } else if let Some(length) = content_length {
                    fields.push(format!("Content-Length: {length}{newline}"));
                    BodyKind::Length(length)
                } else {
                    BodyKind::Empty
                };
                if !connection.is_empty() {
                    fields.push(format!("Connection: {connection}{newline}"));
                }
                for field in fields {
                    head.push_str(&field);
                }
                head.push_str(newline);
                let keep_alive = match (version, connection) {
                    (_, "close") => false,
                    (Version::Http11, _) => true,
                    (Version::Http10, other) => other.to_ascii_lowercase().contains("keep-alive"),
                };
                if verdict.is_ok() && hosts > 1 {
                    verdict = Err(HeadError::DuplicateHost);
                }
                if verdict.is_ok() && hosts == 0 && version == Version::Http11 {
                    verdict = Err(HeadError::MissingHost);
                }
                let head_len = head.len();
                let mut bytes = head.into_bytes();
                bytes.extend_from_slice(&trailing);
                GeneratedRequest {
                    bytes,
                    head_len,
                    method,
                    version,
                    body,
                    keep_alive,
                    verdict,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn parse_request_is_total(input in arbitrary_head_bytes()) {
        let mut head = RequestHead::default();
        if let Ok(Parsed::Complete) = parse_request(&input, &mut head) {
            check_request_invariants(&input, &head);
        }
    }

    #[test]
    fn parse_response_is_total(input in arbitrary_head_bytes(), head_method in any::<bool>()) {
        let method = if head_method { Method::Head } else { Method::Get };
        let mut head = ResponseHead::default();
        if let Ok(Parsed::Complete) = parse_response(&input, method, &mut head) {
            prop_assert!(head.len <= input.len());
            prop_assert!((100..=999).contains(&head.status));
            prop_assert!(head.reason.end as usize <= head.len);
            for header in &head.headers {
                prop_assert!(header.value.end as usize <= head.len);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn growing_prefixes_agree_with_the_whole(request in generated_request()) {
        let mut whole = RequestHead::default();
        let verdict = parse_request(&request.bytes, &mut whole);
        prop_assert_eq!(verdict, request.verdict);
        if verdict.is_err() {
            // Host and coding rules apply to a complete head only: no prefix is refused.
            let mut head = RequestHead::default();
            for end in 0..request.head_len {
                prop_assert_eq!(parse_request(&request.bytes[..end], &mut head), Ok(Parsed::Partial), "prefix {}", end);
            }
            for end in request.head_len..=request.bytes.len() {
                prop_assert_eq!(parse_request(&request.bytes[..end], &mut head), request.verdict);
            }
            return Ok(());
        }
        check_request_invariants(&request.bytes, &whole);
        prop_assert_eq!(whole.len, request.head_len);
        prop_assert_eq!(whole.method, request.method);
        prop_assert_eq!(whole.version, request.version);
        prop_assert_eq!(whole.body, request.body);
        prop_assert_eq!(whole.keep_alive(), request.keep_alive);
        // An HTTP/1.0 request may come without Host; then there is no authority.
        let host = whole.header(&request.bytes, "host");
        prop_assert!(host.is_none() || host == Some(&b"example.test"[..]));
        prop_assert_eq!(whole.authority.map(|span| span.of(&request.bytes)), host);

        // One head reused across every parse, as a connection would.
        let mut head = RequestHead::default();
        for end in 0..request.head_len {
            prop_assert_eq!(parse_request(&request.bytes[..end], &mut head), Ok(Parsed::Partial), "prefix {}", end);
        }
        for end in request.head_len..=request.bytes.len() {
            prop_assert_eq!(parse_request(&request.bytes[..end], &mut head), Ok(Parsed::Complete));
            prop_assert_eq!(format!("{head:?}"), format!("{whole:?}"));
        }
    }
}

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::*;

/// A connection reading `bytes` from memory, as from a peer that sent them and closed.
fn from(bytes: &[u8]) -> Connection<&[u8]> {
    Connection::new(bytes).unwrap()
}

/// A peer on loopback that runs `serve` on the one connection it accepts.
fn peer(serve: impl FnOnce(TcpStream) + Send + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        serve(stream);
    });
    addr
}

#[test]
fn content_length_responses_are_read_back_to_back() {
    let mut connection = from(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
    );
    let first = connection.read_response().unwrap();
    assert_eq!(
        (first.version, first.status, first.reason.as_str()),
        (1, 200, "OK")
    );
    assert_eq!(first.body, b"hello");
    assert_eq!(first.framing, Framing::Length(5));
    assert_eq!(
        first.raw_head,
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    );
    let second = connection.read_response().unwrap();
    assert_eq!(second.status, 404);
    assert!(second.body.is_empty());
    assert!(connection.buffered().is_empty());
}

#[test]
fn headers_keep_their_order_and_spelling() {
    let response = parse_response(
        b"HTTP/1.1 200 OK\r\nX-B: 2\r\nx-a: 1\r\nX-B: 3\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    let names: Vec<&str> = response
        .headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(names, ["X-B", "x-a", "X-B", "Content-Length"]);
    assert_eq!(response.header("x-b"), Some("2"));
    assert_eq!(response.header("X-A"), Some("1"));
}

#[test]
fn a_chunked_body_with_extensions_and_trailers_is_decoded() {
    let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
        5;name=value\r\nhello\r\n1 ; quoted=\"a;b\"\r\n \r\nA\r\n0123456789\r\n\
        0;last\r\nX-Checksum: abc\r\nx-final: yes\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
    let mut connection = from(raw);
    let response = connection.read_response().unwrap();
    assert!(response.chunked());
    assert_eq!(response.body, b"hello 0123456789");
    assert_eq!(
        response.trailers,
        [
            ("X-Checksum".to_string(), "abc".to_string()),
            ("x-final".to_string(), "yes".to_string())
        ]
    );
    assert_eq!(response.trailer("x-checksum"), Some("abc"));
    assert_eq!(connection.read_response().unwrap().status, 204);
}

#[test]
fn a_chunked_body_can_be_read_chunk_by_chunk() {
    let mut connection = from(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    );
    let head = connection.read_head().unwrap();
    assert_eq!(head.header("transfer-encoding"), Some("chunked"));
    assert_eq!(connection.read_chunk().unwrap().unwrap(), b"abc");
    assert_eq!(connection.read_chunk().unwrap().unwrap(), b"de");
    assert_eq!(connection.read_chunk().unwrap(), None);
    assert!(connection.read_trailers().unwrap().is_empty());
    assert!(connection.buffered().is_empty());
}

#[test]
fn without_a_length_the_body_runs_until_the_close() {
    let response = parse_response(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of this").unwrap();
    assert_eq!(response.version, 0);
    assert_eq!(response.framing, Framing::Close);
    assert_eq!(response.body, b"all of this");
    assert!(response.closes_connection());
    // A transfer coding other than chunked last is read to the close as well.
    let response =
        parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc")
            .unwrap();
    assert_eq!(response.framing, Framing::Close);
    assert_eq!(response.body, b"3\r\nabc");
}

#[test]
fn responses_to_head_and_204_and_304_have_no_body() {
    let mut connection = from(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n\
          HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    );
    let head = connection.read_response_to("HEAD").unwrap();
    assert_eq!((head.status, head.framing), (200, Framing::None));
    assert_eq!(head.header("content-length"), Some("1000"));
    assert_eq!(connection.read_response().unwrap().status, 204);
    assert_eq!(connection.read_response().unwrap().status, 304);
    assert_eq!(connection.read_response().unwrap().text(), "ok");
}

#[test]
fn interim_responses_are_kept_before_the_final_one() {
    let response = parse_response(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )
    .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "ok");
    let interim: Vec<u16> = response.interim.iter().map(|head| head.status).collect();
    assert_eq!(interim, [100, 103]);
    assert_eq!(response.interim[1].header("link"), Some("</a>"));
    // read_head sees an interim head by itself.
    let mut connection = from(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n");
    assert_eq!(connection.read_head().unwrap().status, 100);
}

#[test]
fn switching_protocols_is_final_and_leaves_the_new_protocol_unread() {
    let mut connection =
        from(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n\r\nnew protocol bytes");
    let response = connection.read_response().unwrap();
    assert_eq!((response.status, response.framing), (101, Framing::None));
    assert_eq!(connection.buffered(), b"new protocol bytes");
}

#[test]
fn a_head_read_alone_takes_nothing_after_it_off_the_socket() {
    let addr = peer(|mut stream| {
        stream
            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n\r\nafter")
            .unwrap();
    });
    let mut stream = TcpStream::connect(addr).unwrap();
    let mut connection = Connection::new(&mut stream).unwrap();
    let head = connection.read_head_alone().unwrap();
    assert_eq!(head.status, 101);
    assert!(connection.buffered().is_empty());
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"after");
}

#[test]
fn a_truncated_response_is_an_error_that_takes_nothing() {
    let cases: [(&[u8], Part); 5] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            Part::Body,
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Le", Part::Head),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            Part::ChunkData,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            Part::ChunkSize,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\r\n",
            Part::Trailers,
        ),
    ];
    for (raw, part) in cases {
        let mut connection = from(raw);
        let error = connection.read_response().unwrap_err();
        assert!(error.is_closed(), "{error}");
        assert_eq!(error.reading, part, "{error}");
        assert_eq!(error.received, raw.len(), "{error}");
        assert_eq!(connection.buffered(), raw, "a failed read takes nothing");
        assert!(error.to_string().contains("closed inside"), "{error}");
    }
    let error = from(b"").read_response().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the connection closed before any byte of a response"
    );
}

#[test]
fn malformed_responses_are_errors_that_say_what_is_wrong() {
    let cases: [(&[u8], Part, &str); 5] = [
        (
            b"GARBAGE\r\n\r\n",
            Part::Head,
            "not an HTTP/1 response head",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            Part::ChunkSize,
            "hex",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
            Part::ChunkSize,
            "hex digit",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
            Part::ChunkData,
            "CRLF",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            Part::Head,
            "disagree",
        ),
    ];
    for (raw, part, says) in cases {
        let error = parse_response(raw).unwrap_err();
        assert!(matches!(error.kind, ErrorKind::Malformed(_)), "{error}");
        assert_eq!(error.reading, part, "{error}");
        assert!(error.to_string().contains(says), "{error}");
    }
}

#[test]
fn a_silent_peer_is_a_timeout_not_a_hang() {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let addr = peer(move |mut stream| {
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\npart")
            .unwrap();
        let _ = released.recv();
    });
    let mut connection =
        Connection::connect_with_timeout(addr, Duration::from_millis(200)).unwrap();
    let started = Instant::now();
    let error = connection.read_response().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(error.is_timeout(), "{error}");
    assert_eq!(error.reading, Part::Body);
    assert!(
        error
            .to_string()
            .starts_with("no byte came for 200ms while reading the response body"),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("starting \"HTTP/1.1 200 OK\\r\\n"),
        "{error}"
    );
    drop(release);
}

#[test]
fn a_stream_without_a_read_timeout_gets_one() {
    let addr = peer(|_stream| {});
    let stream = TcpStream::connect(addr).unwrap();
    assert_eq!(stream.read_timeout().unwrap(), None);
    let connection = Connection::new(&stream).unwrap();
    assert_eq!(stream.read_timeout().unwrap(), Some(DEFAULT_IDLE_TIMEOUT));
    drop(connection);
    stream
        .set_read_timeout(Some(Duration::from_secs(7)))
        .unwrap();
    Connection::new(&stream).unwrap();
    assert_eq!(
        stream.read_timeout().unwrap(),
        Some(Duration::from_secs(7)),
        "kept"
    );
}

#[test]
fn what_is_sent_goes_out_byte_for_byte() {
    let (seen, receive) = std::sync::mpsc::channel();
    let addr = peer(move |mut stream| {
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\n\n") {
            stream.read_exact(&mut byte).unwrap();
            request.push(byte[0]);
        }
        seen.send(request).unwrap();
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
            .unwrap();
    });
    let raw = b"GET  /odd HTTP/1.1\nhost:\tx \r\nBad Header: y\n\n";
    let response = exchange(addr, raw).unwrap();
    assert_eq!(receive.recv().unwrap(), raw);
    assert_eq!(response.status, 400);
    assert!(response.closes_connection());
}

#[test]
fn connection_close_and_keep_alive_are_told_apart() {
    let keeps = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").unwrap();
    assert!(!keeps.closes_connection());
    let closes = parse_response(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    assert!(closes.closes_connection());
    let old_kept =
        parse_response(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
    assert!(!old_kept.closes_connection());
}

//! Header rewriting on the way through: the outbound request head the pod sees, the response head
//! the client sees, and heads of responses the activator makes itself. Pure functions writing into
//! a caller's buffer, so the steady state allocates nothing.

use std::io::Write;
use std::marker::PhantomData;

use kactivator_api::headers;
use kactivator_h1::{name_eq, BodyKind, HeaderSpan, RequestHead, ResponseHead, Version};

use crate::fields::RequestHeaders;
use crate::request::answer::Answer;
use crate::request::policy::{self, AddedField, Edits, WaitNote};
use crate::request::trace::Decider;

/// An HTTP/1 request head as the request path reads it. `S`, the client's stream, is only a
/// name: the helpers generic over the headers (the roles' hooks, the probe answers, the
/// priority class) get one copy per kind of client connection, so the plain path's copies keep
/// a single caller and LLVM keeps inlining them there (BENCHMARKS.md, issue 38).
pub(super) struct H1Headers<'a, S = ()> {
    pub(super) head: &'a RequestHead,
    pub(super) buf: &'a [u8],
    pub(super) stream: PhantomData<fn() -> S>,
}

impl<'a, S> H1Headers<'a, S> {
    #[inline]
    pub(super) fn new(head: &'a RequestHead, buf: &'a [u8]) -> H1Headers<'a, S> {
        H1Headers {
            head,
            buf,
            stream: PhantomData,
        }
    }
}

impl<S> RequestHeaders for H1Headers<'_, S> {
    #[inline]
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.head.header(self.buf, name)
    }

    /// The codec has already found it: an absolute-form target's authority, else Host.
    #[inline]
    fn authority(&self) -> Option<&[u8]> {
        self.head.authority.map(|authority| authority.of(self.buf))
    }

    #[inline]
    fn target(&self) -> &[u8] {
        self.head.target.of(self.buf)
    }

    fn has(&self, name: &str, value: Option<&[u8]>) -> bool {
        self.head.headers(self.buf).any(|(field, field_value)| {
            name_eq(field, name.as_bytes()) && value.is_none_or(|v| field_value == v)
        })
    }
}

/// `K-Proxy-Request: activator` as a head line (see its test).
const PROXY_REQUEST_LINE: &[u8] = b"K-Proxy-Request: activator\r\n";

/// Writes the head the pod receives under `edits` (`request::policy`). `out` is appended to.
///
/// * request line as received, always as HTTP/1.1;
/// * hop-by-hop headers and those named in `Connection` removed;
/// * framing re-declared: `Content-Length` kept, chunked declared, upgrade re-declared;
/// * the activator's edits: the revision headers, `K-Network-Hash` and inbound
///   `K-Proxy-Request` removed; the original Host kept in `K-Original-Host` (unless present);
///   `K-Proxy-Request: activator`; `X-Forwarded-For` with the client appended; `X-Run-Id`,
///   when present, replaces `X-Request-Id`. The pod is not known yet when the head is
///   rewritten (the request may wait for one), so the `Host` line is left out and its offset
///   returned; [`insert_host`] adds the pod's once one is picked.
/// * the queue-proxy's: the revision headers removed; `Host` the client's, or
///   `K-Original-Host`'s (which goes); `X-Forwarded-For` with the client appended; the
///   `Forwarded` shim. The head is whole: `None` is returned.
/// * KEDA's interceptor's: `Host` the client's; `Forwarded` removed; `X-Forwarded-For`
///   appended, `X-Forwarded-Host` and `-Proto` the client's or ours (`secure`: it came over
///   TLS). The head is whole: `None` is returned.
///
/// `S`: the client's stream, only a name (see [`H1Headers`]).
#[inline]
#[allow(clippy::extra_unused_type_parameters)] // a name per kind of client connection
pub fn write_request_head<S>(
    head: &RequestHead,
    buf: &[u8],
    client_ip: &[u8],
    secure: bool,
    edits: Edits,
    out: &mut Vec<u8>,
    trace: Option<&mut Decider<'_>>,
) -> Option<usize> {
    match edits {
        Edits::Activator => Some(write_head::<{ policy::ACTIVATOR }, S>(
            head, buf, client_ip, secure, out, trace,
        )),
        Edits::QueueProxy => {
            write_head::<{ policy::QUEUE_PROXY }, S>(head, buf, client_ip, secure, out, trace);
            None
        }
        Edits::Interceptor => {
            write_interceptor_head::<S>(head, buf, client_ip, secure, out, trace);
            None
        }
    }
}

/// [`write_head`] under KEDA's interceptor's edits, out of line: a third copy inlined into every
/// role's request path would push the whole writer out of line for the other two (callgrind:
/// +31 instructions per activator request).
#[inline(never)]
fn write_interceptor_head<S>(
    head: &RequestHead,
    buf: &[u8],
    client_ip: &[u8],
    secure: bool,
    out: &mut Vec<u8>,
    trace: Option<&mut Decider<'_>>,
) {
    write_head::<{ policy::INTERCEPTOR }, S>(head, buf, client_ip, secure, out, trace);
}

/// [`write_request_head`] under the edits `EDITS` (`policy::ACTIVATOR` and the others): the
/// request line, the fields by the one writer of the edits (`policy::write_fields`), then
/// HTTP/1's own framing.
#[inline]
fn write_head<const EDITS: u8, S>(
    head: &RequestHead,
    buf: &[u8],
    client_ip: &[u8],
    secure: bool,
    out: &mut Vec<u8>,
    trace: Option<&mut Decider<'_>>,
) -> usize {
    out.extend_from_slice(head.method_span.of(buf));
    out.push(b' ');
    push_origin_form(out, head.target.of(buf));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let host_at = out.len();
    // Its authority is the codec's: an absolute-form target's, else Host.
    let view = H1Headers::<S>::new(head, buf);
    let mut sink = HeadSink {
        out,
        connection_named: connection_tokens(head, buf),
        h2c_offered: head.h2c_offered,
    };
    let host = policy::write_fields::<_, _, _, EDITS>(
        &view,
        || head.headers(buf),
        client_ip,
        secure,
        &mut sink,
        trace,
    );
    if head.body == BodyKind::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if let Some(upgrade) = head.upgrade {
        out.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: ");
        if head.h2c_offered {
            push_without_h2c(out, upgrade.of(buf));
        } else {
            out.extend_from_slice(upgrade.of(buf));
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    // The queue-proxy's: the client's Host, or the activator's record of it: the app sees the
    // request as the client addressed it. (HTTP/1.1 requires a Host; an HTTP/1.0 request may
    // have none.)
    if let Some(host) = host {
        insert_host(out, host_at, host);
    }
    host_at
}

/// The edited fields as HTTP/1 head lines.
struct HeadSink<'o, 'b> {
    out: &'o mut Vec<u8>,
    /// Fields the client's `Connection` names: hop-by-hop too.
    connection_named: NamedTokens<'b>,
    /// The client offered an h2c upgrade, which is ignored: its `HTTP2-Settings` goes too.
    h2c_offered: bool,
}

impl<'b> policy::FieldSink<'b> for HeadSink<'_, 'b> {
    type Field = (&'b [u8], &'b [u8]);

    #[inline(always)]
    fn pass(&mut self, (name, value): (&'b [u8], &'b [u8])) {
        // HTTP/1's own: fields the client's `Connection` names are hop-by-hop too, and so is
        // the field of an h2c upgrade offer that is ignored (see `RequestHead::upgrade`).
        if self
            .connection_named
            .iter()
            .flatten()
            .any(|token| name.eq_ignore_ascii_case(token))
            || (self.h2c_offered && name.eq_ignore_ascii_case(b"http2-settings"))
        {
            return;
        }
        put_header(self.out, name, value);
    }

    #[inline(always)]
    fn add(&mut self, field: AddedField, value: &[u8]) {
        let name = match field {
            // Always `activator`: the line in one piece.
            AddedField::ProxyRequest => return self.out.extend_from_slice(PROXY_REQUEST_LINE),
            AddedField::OriginalHost => headers::ORIGINAL_HOST,
            AddedField::RequestId => headers::REQUEST_ID,
            AddedField::Forwarded => "Forwarded",
            AddedField::ForwardedHost => "X-Forwarded-Host",
            AddedField::ForwardedProto => "X-Forwarded-Proto",
            AddedField::Te => "TE",
            AddedField::Trace(field) => field.name(),
        };
        put_header(self.out, name.as_bytes(), value);
    }

    #[inline(always)]
    fn forwarded_for(&mut self, earlier: impl Iterator<Item = &'b [u8]>, client_ip: &[u8]) {
        self.out.extend_from_slice(b"X-Forwarded-For: ");
        for value in earlier {
            self.out.extend_from_slice(value);
            self.out.extend_from_slice(b", ");
        }
        self.out.extend_from_slice(client_ip);
        self.out.extend_from_slice(b"\r\n");
    }
}

/// The offered protocols but h2c, which the activator ignores (RFC 9113 §3.1), comma-separated.
#[cold]
fn push_without_h2c(out: &mut Vec<u8>, offered: &[u8]) {
    let mut first = true;
    for protocol in offered.split(|&byte| byte == b',') {
        let protocol = protocol.trim_ascii();
        if protocol.is_empty() || protocol.eq_ignore_ascii_case(b"h2c") {
            continue;
        }
        if !first {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(protocol);
        first = false;
    }
}

/// Inserts the pod's `Host: <authority>\r\n` line at the offset [`write_request_head`]
/// returned; returns its length, for [`remove_host`]. `authority` is the pod's address as text
/// (`routing::replica::LocalPod::authority`), written once per pod, not per request.
#[inline]
pub fn insert_host(out: &mut Vec<u8>, host_at: usize, authority: &[u8]) -> usize {
    const PREFIX: &[u8] = b"Host: ";
    let len = PREFIX.len() + authority.len() + 2;
    let tail = out.len() - host_at;
    // Room at the end, the part after `host_at` moved up once, the line written into the gap:
    // one move of the head's tail, no per-byte insertion.
    out.resize(out.len() + len, 0);
    out.copy_within(host_at..host_at + tail, host_at + len);
    let line = &mut out[host_at..host_at + len];
    line[..PREFIX.len()].copy_from_slice(PREFIX);
    line[PREFIX.len()..len - 2].copy_from_slice(authority);
    line[len - 2..].copy_from_slice(b"\r\n");
    len
}

/// Undoes [`insert_host`]: the head as it was before a pod's `Host` line went in, for the
/// request to go to another pod.
pub fn remove_host(out: &mut Vec<u8>, host_at: usize, len: usize) {
    out.drain(host_at..host_at + len);
}

/// Appends a status code as three ASCII digits without going through `core::fmt`.
fn push_status(out: &mut Vec<u8>, status: u16) {
    let status = status.min(999);
    out.extend_from_slice(&[
        b'0' + (status / 100) as u8,
        b'0' + (status / 10 % 10) as u8,
        b'0' + (status % 10) as u8,
    ]);
}

/// How the response body will be framed towards the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientFraming {
    /// No body (HEAD, 1xx, 204, 304) or a Content-Length body passed through.
    AsIs,
    /// Re-chunked (HTTP/1.1 client, body chunked or close-delimited upstream).
    Chunked,
    /// Raw bytes, the client connection closes at the end (HTTP/1.0 client, unknown length).
    UntilClose,
}

/// Picks the client framing for a response body.
pub fn client_framing(upstream: BodyKind, client_version: Version) -> ClientFraming {
    match (upstream, client_version) {
        (BodyKind::Empty | BodyKind::Length(_), _) => ClientFraming::AsIs,
        (BodyKind::Chunked | BodyKind::UntilClose, Version::Http11) => ClientFraming::Chunked,
        (BodyKind::Chunked | BodyKind::UntilClose, Version::Http10) => ClientFraming::UntilClose,
    }
}

/// Writes the response head the client receives: status line in the client's version,
/// hop-by-hop headers dropped, framing and connection management re-declared, and the
/// activator's note of the request's wait (`note`) added.
pub fn write_response_head(
    head: &ResponseHead,
    buf: &[u8],
    client_version: Version,
    framing: ClientFraming,
    keep_alive: bool,
    note: Option<&WaitNote>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(match client_version {
        Version::Http10 => b"HTTP/1.0 ",
        Version::Http11 => b"HTTP/1.1 ",
    });
    push_status(out, head.status);
    out.push(b' ');
    out.extend_from_slice(head.reason.of(buf));
    out.extend_from_slice(b"\r\n");
    let connection_named = response_connection_tokens(head, buf);
    let switching = head.status == 101;
    let mut lines = Lines::new(buf);
    for field in &head.headers {
        let name = field.name.of(buf);
        if switching && (name_eq(name, b"upgrade") || name_eq(name, b"connection")) {
            lines.keep(out, field);
            continue;
        }
        if name_eq(name, b"trailer") {
            // Announced trailers only make sense when we send a chunked body.
            if framing == ClientFraming::Chunked {
                lines.keep(out, field);
            }
            continue;
        }
        if policy::drops_response_field(name)
            || connection_named
                .iter()
                .flatten()
                .any(|token| name.eq_ignore_ascii_case(token))
        {
            continue;
        }
        if framing != ClientFraming::AsIs && name_eq(name, b"content-length") {
            continue;
        }
        lines.keep(out, field);
    }
    lines.flush(out);
    if let Some(note) = note {
        note.response_fields(|name, value| put_header(out, name.as_bytes(), value));
    }
    if framing == ClientFraming::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if !switching && !head.is_informational() {
        match (keep_alive, client_version) {
            (false, _) => out.extend_from_slice(b"Connection: close\r\n"),
            (true, Version::Http10) => out.extend_from_slice(b"Connection: keep-alive\r\n"),
            (true, Version::Http11) => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// What the client side of the connection needs to frame a response.
#[derive(Clone, Copy, Debug)]
pub struct ClientSide {
    pub version: Version,
    pub keep_alive: bool,
    /// The request was HEAD: headers only.
    pub head_only: bool,
}

/// Writes a response the activator makes itself.
pub fn write_local_response(response: &Answer<'_>, client: ClientSide, out: &mut Vec<u8>) {
    out.extend_from_slice(match client.version {
        Version::Http10 => b"HTTP/1.0 ",
        Version::Http11 => b"HTTP/1.1 ",
    });
    let _ = write!(
        out,
        "{} {}\r\n",
        response.status,
        reason_phrase(response.status)
    );
    if (!response.body.is_empty() || response.error_style) && !response.own_content_type() {
        out.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\n");
    }
    if response.error_style {
        out.extend_from_slice(b"X-Content-Type-Options: nosniff\r\n");
    }
    for (name, value) in response.extra_header.iter().chain(response.fields) {
        put_header(out, name.as_bytes(), value);
    }
    if let Some(revision) = response.identity {
        put_header(
            out,
            headers::SERVING_REVISION_NAMESPACE.as_bytes(),
            revision.namespace().as_bytes(),
        );
        put_header(
            out,
            headers::SERVING_REVISION_NAME.as_bytes(),
            revision.name().as_bytes(),
        );
    }
    if let Some(note) = response.wait {
        note.response_fields(|name, value| put_header(out, name.as_bytes(), value));
    }
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(&crate::http1::date::now());
    out.extend_from_slice(b"\r\n");
    let _ = write!(out, "Content-Length: {}\r\n", response.body.len());
    match (client.keep_alive, client.version) {
        (false, _) => out.extend_from_slice(b"Connection: close\r\n"),
        (true, Version::Http10) => out.extend_from_slice(b"Connection: keep-alive\r\n"),
        (true, Version::Http11) => {}
    }
    out.extend_from_slice(b"\r\n");
    if !client.head_only {
        out.extend_from_slice(response.body);
    }
}

/// Standard reason phrases for the codes the activator itself sends.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Writes the fields a head keeps, as the lines they were in the parsed buffer: consecutive
/// kept fields whose lines end in CRLF go out as one copy (a response's fields usually all do),
/// where writing each field's name, separator, value and line end cost four copies per field.
/// A field whose line does not end in CRLF right after its value (trailing whitespace, a bare
/// LF) is written anew as `name: value` CRLF.
struct Lines<'b> {
    buf: &'b [u8],
    /// Bytes of `buf` not yet copied out, from the first kept line to the end of the last.
    run: Option<(usize, usize)>,
}

impl<'b> Lines<'b> {
    fn new(buf: &'b [u8]) -> Lines<'b> {
        Lines { buf, run: None }
    }

    fn keep(&mut self, out: &mut Vec<u8>, field: &HeaderSpan) {
        let (start, value_start, end) = (
            field.name.start as usize,
            field.value.start as usize,
            field.value.end as usize,
        );
        // The value lies after the name (an empty value may be given as an empty span anywhere)
        // and CRLF follows it at once.
        let whole_line = value_start >= field.name.end as usize
            && end >= value_start
            && self.buf.get(end..end + 2) == Some(b"\r\n");
        if !whole_line {
            self.flush(out);
            put_header(out, field.name.of(self.buf), field.value.of(self.buf));
            return;
        }
        match &mut self.run {
            Some((_, run_end)) if *run_end == start => *run_end = end + 2,
            _ => {
                self.flush(out);
                self.run = Some((start, end + 2));
            }
        }
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        if let Some((start, end)) = self.run.take() {
            out.extend_from_slice(self.buf.get(start..end).unwrap_or_default());
        }
    }
}

fn put_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Up to eight extra header names listed in `Connection` (beyond the standard tokens).
type NamedTokens<'b> = [Option<&'b [u8]>; 8];

fn connection_tokens<'b>(head: &RequestHead, buf: &'b [u8]) -> NamedTokens<'b> {
    collect_tokens(
        head.headers(buf)
            .filter(|(name, _)| name_eq(name, b"connection"))
            .map(|(_, v)| v),
    )
}

fn response_connection_tokens<'b>(head: &ResponseHead, buf: &'b [u8]) -> NamedTokens<'b> {
    collect_tokens(
        head.headers(buf)
            .filter(|(name, _)| name_eq(name, b"connection"))
            .map(|(_, v)| v),
    )
}

fn collect_tokens<'b>(values: impl Iterator<Item = &'b [u8]>) -> NamedTokens<'b> {
    let mut tokens: NamedTokens<'b> = [None; 8];
    let mut count = 0;
    for value in values {
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            let standard = [&b"close"[..], b"keep-alive", b"upgrade"]
                .iter()
                .any(|s| token.eq_ignore_ascii_case(s));
            if token.is_empty() || standard || count == tokens.len() {
                continue;
            }
            tokens[count] = Some(token);
            count += 1;
        }
    }
    tokens
}

/// Appends a target in origin form: an absolute-form target (`http://host/path?q`) loses its
/// scheme and authority (`/path?q`), and an empty path becomes `/` (`http://host?q` → `/?q`);
/// other forms are appended as they are.
fn push_origin_form(out: &mut Vec<u8>, target: &[u8]) {
    if target.first() == Some(&b'/') {
        out.extend_from_slice(target);
        return;
    }
    let rest = if target.len() > 7 && target[..7].eq_ignore_ascii_case(b"http://") {
        &target[7..]
    } else if target.len() > 8 && target[..8].eq_ignore_ascii_case(b"https://") {
        &target[8..]
    } else {
        out.extend_from_slice(target);
        return;
    };
    match rest.iter().position(|&b| b == b'/' || b == b'?') {
        Some(at) if rest[at] == b'/' => out.extend_from_slice(&rest[at..]),
        Some(at) => {
            out.push(b'/');
            out.extend_from_slice(&rest[at..]);
        }
        None => out.push(b'/'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_request_line_written_in_one_piece_is_the_wire_names() {
        let expected = format!(
            "{}: {}\r\n",
            headers::PROXY_REQUEST,
            headers::PROXY_REQUEST_VALUE,
        );
        assert_eq!(PROXY_REQUEST_LINE, expected.as_bytes());
    }
    use kactivator_h1::{parse_request, parse_response, Method, Parsed};

    fn outbound(raw: &str) -> String {
        let mut head = RequestHead::default();
        assert!(matches!(
            parse_request(raw.as_bytes(), &mut head),
            Ok(Parsed::Complete)
        ));
        let mut out = Vec::new();
        let host_at = write_request_head::<()>(
            &head,
            raw.as_bytes(),
            b"192.168.1.9",
            false,
            Edits::Activator,
            &mut out,
            None,
        )
        .expect("the activator's edits leave the Host line to the pod");
        insert_host(&mut out, host_at, b"10.0.0.5:8012");
        String::from_utf8(out).unwrap()
    }

    /// The head a queue-proxy sends its user container, from the client `127.0.0.1`.
    fn to_user_container(raw: &str) -> String {
        let mut head = RequestHead::default();
        assert!(matches!(
            parse_request(raw.as_bytes(), &mut head),
            Ok(Parsed::Complete)
        ));
        let mut out = Vec::new();
        let host_at = write_request_head::<()>(
            &head,
            raw.as_bytes(),
            b"127.0.0.1",
            false,
            Edits::QueueProxy,
            &mut out,
            None,
        );
        assert_eq!(host_at, None, "the head is whole");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_queue_proxy_rewrites_as_upstreams_does() {
        // (what it shows, the client's head, the user container's)
        let table: &[(&str, &str, &str)] = &[
            (
                "from the activator: Host from K-Original-Host, K-Proxy-Request kept, revision \
                 headers pruned, X-Forwarded-For appended, the Forwarded shim",
                "GET /x HTTP/1.1\r\nHost: 10.1.2.3:8012\r\nK-Original-Host: hello.example.com\r\n\
                 Knative-Serving-Revision: hello-1\r\nKnative-Serving-Namespace: default\r\n\
                 K-Proxy-Request: activator\r\nX-Forwarded-For: 1.2.3.4, 10.0.0.9\r\n\
                 X-Forwarded-Proto: https\r\nX-Request-Id: r-1\r\nX-Run-Id: run-1\r\n\r\n",
                "GET /x HTTP/1.1\r\nHost: hello.example.com\r\nK-Proxy-Request: activator\r\n\
                 X-Forwarded-Proto: https\r\nX-Request-Id: r-1\r\nX-Run-Id: run-1\r\n\
                 Forwarded: for=1.2.3.4;proto=https, for=10.0.0.9\r\n\
                 X-Forwarded-For: 1.2.3.4, 10.0.0.9, 127.0.0.1\r\n\r\n",
            ),
            (
                "straight from an ingress: the client's Host, nothing added but X-Forwarded-For",
                "POST /y HTTP/1.1\r\nHost: hello.example.com\r\nContent-Length: 2\r\n\
                 Connection: keep-alive, X-Secret\r\nX-Secret: s\r\n\r\nok",
                "POST /y HTTP/1.1\r\nHost: hello.example.com\r\nContent-Length: 2\r\n\
                 X-Forwarded-For: 127.0.0.1\r\n\r\n",
            ),
            (
                "a Forwarded field of the client's: kept, no shim",
                "GET / HTTP/1.1\r\nHost: h\r\nForwarded: for=9.9.9.9\r\nX-Forwarded-For: 9.9.9.9\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: h\r\nForwarded: for=9.9.9.9\r\n\
                 X-Forwarded-For: 9.9.9.9, 127.0.0.1\r\n\r\n",
            ),
            (
                "an empty K-Original-Host leaves the client's Host",
                "GET / HTTP/1.1\r\nHost: h\r\nK-Original-Host: \r\n\r\n",
                "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n",
            ),
        ];
        for (what, client, expected) in table {
            assert_eq!(to_user_container(client), *expected, "{what}");
        }
    }

    #[test]
    fn outbound_request_is_rewritten_as_knative_does() {
        let out = outbound(
            "POST /api?x=1 HTTP/1.1\r\nHost: hello.default.svc.cluster.local\r\nKnative-Serving-Namespace: default\r\n\
             Knative-Serving-Revision: hello-1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: 5\r\n\
             K-Network-Hash: h\r\nK-Proxy-Request: evil\r\nContent-Length: 3\r\nUser-Agent: curl\r\n\r\nabc",
        );
        assert_eq!(
            out,
            "POST /api?x=1 HTTP/1.1\r\nHost: 10.0.0.5:8012\r\nContent-Length: 3\r\nUser-Agent: curl\r\n\
             K-Original-Host: hello.default.svc.cluster.local\r\nK-Proxy-Request: activator\r\n\
             X-Forwarded-For: 192.168.1.9\r\n\r\n"
        );
    }

    #[test]
    fn repeated_forwarded_for_headers_are_joined_before_the_client() {
        let out = outbound("GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2, 3.3.3.3\r\n\r\n");
        assert!(
            out.contains("X-Forwarded-For: 1.1.1.1, 2.2.2.2, 3.3.3.3, 192.168.1.9\r\n"),
            "{out}"
        );
        assert_eq!(out.matches("X-Forwarded-For").count(), 1, "{out}");
    }

    #[test]
    fn existing_original_host_and_forwarded_for_are_kept_and_extended() {
        let out = outbound("GET / HTTP/1.1\r\nHost: a\r\nK-Original-Host: first\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n");
        assert!(out.contains("K-Original-Host: first\r\n"), "{out}");
        assert!(!out.contains("K-Original-Host: a\r\n"), "{out}");
        assert!(
            out.contains("X-Forwarded-For: 1.2.3.4, 192.168.1.9\r\n"),
            "{out}"
        );
    }

    #[test]
    fn run_id_replaces_request_id() {
        let out =
            outbound("GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: old\r\nX-Run-Id: run-7\r\n\r\n");
        assert!(out.contains("X-Request-Id: run-7\r\n"), "{out}");
        assert!(!out.contains("old") && !out.contains("X-Run-Id"), "{out}");
    }

    #[test]
    fn chunked_and_upgrade_framing_is_redeclared() {
        let out = outbound(
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\n\r\n",
        );
        assert!(
            out.ends_with("TE: trailers\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "{out}"
        );
        let out = outbound("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n");
        assert!(out.contains("Sec-WebSocket-Key: k\r\n"), "{out}");
        assert!(
            out.ends_with("Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
            "{out}"
        );
    }

    #[test]
    fn absolute_form_targets_become_origin_form() {
        assert!(
            outbound("GET http://example.com/a/b?c HTTP/1.1\r\nHost: example.com\r\n\r\n")
                .starts_with("GET /a/b?c HTTP/1.1\r\n")
        );
        assert!(
            outbound("GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n")
                .starts_with("GET / HTTP/1.1\r\n")
        );
        // The query is kept, and the authority is the original host.
        let out =
            outbound("GET http://hello.ns.svc.cluster.local?x=1 HTTP/1.1\r\nHost: e.com\r\n\r\n");
        assert!(out.starts_with("GET /?x=1 HTTP/1.1\r\n"), "{out}");
        assert!(
            out.contains("K-Original-Host: hello.ns.svc.cluster.local\r\n"),
            "{out}"
        );
    }

    #[test]
    fn an_h2c_upgrade_offer_is_not_forwarded() {
        let out = outbound(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
             HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
        );
        let lower = out.to_ascii_lowercase();
        for gone in ["upgrade", "http2-settings", "connection"] {
            assert!(!lower.contains(gone), "{out}");
        }
        let out = outbound(
            "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c, websocket\r\n\
             HTTP2-Settings: x\r\n\r\n",
        );
        assert!(
            out.ends_with("Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
            "{out}"
        );
        assert!(!out.contains("HTTP2-Settings"), "{out}");
    }

    #[test]
    fn response_head_drops_hop_by_hop_and_rechunks_for_old_clients() {
        let raw = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nX-App: 1\r\n\r\n";
        let mut head = ResponseHead::default();
        assert!(matches!(
            parse_response(raw.as_bytes(), Method::Get, &mut head),
            Ok(Parsed::Complete)
        ));
        let framing = client_framing(head.body, Version::Http10);
        assert_eq!(framing, ClientFraming::UntilClose);
        let mut out = Vec::new();
        write_response_head(
            &head,
            raw.as_bytes(),
            Version::Http10,
            framing,
            false,
            None,
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.0 200 OK\r\nX-App: 1\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn response_fields_keep_their_order_and_every_line_ends_in_crlf() {
        // Kept fields in runs broken by dropped ones, a bare LF line, trailing whitespace and
        // an empty value: each comes out once, in order, as a CRLF line.
        let raw = "HTTP/1.1 200 OK\r\nServer: s\r\nDate: d\r\nKeep-Alive: timeout=5\r\n\
                   X-Bare: lf\nX-Trailing: ws  \r\nX-Empty:\r\nContent-Length: 2\r\n\
                   Connection: keep-alive\r\nX-Last:last\r\n\r\nok";
        let mut head = ResponseHead::default();
        assert!(matches!(
            parse_response(raw.as_bytes(), Method::Get, &mut head),
            Ok(Parsed::Complete)
        ));
        let mut out = Vec::new();
        write_response_head(
            &head,
            raw.as_bytes(),
            Version::Http11,
            ClientFraming::AsIs,
            true,
            None,
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nServer: s\r\nDate: d\r\nX-Bare: lf\r\nX-Trailing: ws\r\n\
             X-Empty:\r\nContent-Length: 2\r\nX-Last:last\r\n\r\n"
        );
    }

    #[test]
    fn local_error_responses_match_go_http_error() {
        let mut out = Vec::new();
        let response = Answer {
            status: 404,
            body: b"nope\n",
            extra_header: None,
            error_style: true,
            identity: None,
            fields: &[],
            wait: None,
        };
        let client = ClientSide {
            version: Version::Http11,
            keep_alive: true,
            head_only: false,
        };
        write_local_response(&response, client, &mut out);
        let text = String::from_utf8(out).unwrap();
        // Like Go's server, a Date header; its value is the current second.
        let date_line = text
            .lines()
            .find(|line| line.starts_with("Date: "))
            .expect("a Date header");
        assert_eq!(date_line.len(), "Date: ".len() + crate::http1::date::LEN);
        assert!(date_line.ends_with(" GMT"), "{date_line}");
        assert_eq!(
            text.replace(&format!("{date_line}\r\n"), ""),
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n\
             Content-Length: 5\r\n\r\nnope\n"
        );
    }

    #[test]
    fn a_local_response_with_its_own_content_type_has_only_that_one() {
        let mut out = Vec::new();
        let response = Answer {
            status: 200,
            body: b"{\"status\":\"accepted\"}\n",
            extra_header: Some(("Content-Type", b"application/json")),
            error_style: false,
            identity: None,
            fields: &[],
            wait: None,
        };
        let client = ClientSide {
            version: Version::Http11,
            keep_alive: true,
            head_only: false,
        };
        write_local_response(&response, client, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("Content-Type").count(), 1, "{text}");
        assert!(
            text.contains("Content-Type: application/json\r\n"),
            "{text}"
        );
    }
}

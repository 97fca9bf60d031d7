//! Knative's request log: one line per request, rendered from the operator's Go template
//! (`logging.request-log-template`, in the queue-proxy's `SERVING_REQUEST_LOG_TEMPLATE`) by
//! the `kactivator-template` crate, and written to stdout by the [`sink`]'s thread.
//!
//! As upstream's `RequestLogHandler` (`pkg/http/request_log.go`), the line is written when the
//! request has ended, with the status and body size the client got and the time from the head's
//! arrival to the end; probes (a kubelet's user agent or `K-Kubelet-Probe`, any
//! `K-Network-Probe`) are left out unless probe logs are on. What the template reads of the
//! request is copied when the request starts ([`RequestLog::capture`]), before the request is
//! rewritten for the app: the line shows the request as the client sent it.

pub mod sink;

use std::ops::Range;
use std::time::Duration;

use kactivator_template::{
    fallback_line, HeadersRead, Input, Proto, Request, Response, Revision, Template,
};

use self::sink::Sink;
use super::headers::RequestHeaders;
use super::peer::Peer;
use super::probes;
use crate::metrics::Counter;

/// The request log's settings and its way out, shared by every shard.
#[derive(Debug)]
pub struct RequestLog {
    format: LineFormat,
    revision: Revision,
    /// Probes are logged too (`SERVING_ENABLE_PROBE_REQUEST_LOG`).
    probes: bool,
    sink: Sink,
}

/// How a line is made.
#[derive(Debug)]
enum LineFormat {
    /// Knative's: the operator's template.
    Template(Template),
    /// KEDA's HTTP add-on's (`KEDA_HTTP_LOG_REQUESTS`, `interceptor/middleware/logging.go` at
    /// v0.15.0): the combined log format, `<remote> - - [<start>] "<method> <path> <proto>"
    /// <status> <bytes> "<referer>" "<user agent>"`, the start in UTC as
    /// `02/Jan/2006:15:04:05 +0000`, the path percent-decoded without its query (Go's
    /// `URL.Path`). The fields it reads of the head: [`COMBINED_HEADERS`].
    Combined(HeadersRead),
}

/// The fields the combined format reads of a request's head.
const COMBINED_HEADERS: [&str; 2] = ["Referer", "User-Agent"];

impl RequestLog {
    pub fn new(template: Template, revision: Revision, probes: bool, sink: Sink) -> RequestLog {
        RequestLog {
            format: LineFormat::Template(template),
            revision,
            probes,
            sink,
        }
    }

    /// KEDA's HTTP add-on's request log: every request (probes too), one combined-format line.
    pub fn combined(sink: Sink) -> RequestLog {
        RequestLog {
            format: LineFormat::Combined(HeadersRead::Names(
                COMBINED_HEADERS.map(str::to_owned).to_vec(),
            )),
            revision: Revision::default(),
            probes: true,
            sink,
        }
    }

    fn headers_read(&self) -> &HeadersRead {
        match &self.format {
            LineFormat::Template(template) => template.headers_read(),
            LineFormat::Combined(headers) => headers,
        }
    }

    /// What this request's line needs, copied from the request as it arrived; `None` for a
    /// request that is not logged (a probe, with probe logs off).
    pub(crate) fn capture<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
        line: RequestLine<'_>,
        each_header: impl FnOnce(&mut dyn FnMut(&[u8], &[u8])),
    ) -> Option<Captured> {
        if !self.probes && probes::is_probe(fields) {
            return None;
        }
        let mut captured = Captured {
            bytes: Vec::with_capacity(256),
            method: 0..0,
            target: 0..0,
            host: 0..0,
            remote: 0..0,
            headers: Vec::new(),
            proto: line.proto,
            content_length: line.content_length,
        };
        captured.method = captured.push(line.method);
        captured.target = captured.push(line.target);
        captured.host = captured.push(fields.authority().unwrap_or_default());
        let start = captured.bytes.len();
        line.peer.write_addr(&mut captured.bytes);
        captured.remote = span(start, captured.bytes.len());
        let wanted = self.headers_read();
        if !matches!(wanted, HeadersRead::None) {
            // As received: the template models what Go's server keeps of them.
            each_header(&mut |name, value| {
                if wanted.wants(name) {
                    let name = captured.push(name);
                    let value = captured.push(value);
                    captured.headers.push((name, value));
                }
            });
        }
        Some(captured)
    }

    /// Renders the line of a request that ended with `status`, `body_bytes` of response body,
    /// `latency` after its head arrived, and queues it; a line the full queue refuses is counted
    /// in `dropped`, the shard's `request_log_dropped`. A template that fails on this request
    /// gives upstream's "Invalid request log template" line instead.
    ///
    /// The counter comes in, not the shard: the shard's settings hold the log, so the log must
    /// not know the shard.
    pub(crate) fn write(
        &self,
        dropped: &Counter,
        captured: &Captured,
        status: u16,
        body_bytes: u64,
        latency: Duration,
    ) {
        let headers: Vec<(&[u8], &[u8])> = captured
            .headers
            .iter()
            .map(|(name, value)| (captured.slice(name), captured.slice(value)))
            .collect();
        let input = Input {
            request: Request {
                method: captured.slice(&captured.method),
                request_uri: captured.slice(&captured.target),
                proto: captured.proto,
                content_length: captured.content_length,
                host: captured.slice(&captured.host),
                remote_addr: captured.slice(&captured.remote),
                headers: &headers,
            },
            response: Response {
                code: status,
                size: body_bytes,
                latency_seconds: latency.as_secs_f64(),
            },
            revision: &self.revision,
        };
        let mut line = Vec::with_capacity(captured.bytes.len() + 256);
        match &self.format {
            LineFormat::Template(template) => {
                if template.render(&input, &mut line).is_err() {
                    line.clear();
                    fallback_line(&input, &mut line);
                }
            }
            LineFormat::Combined(_) => {
                let started = std::time::SystemTime::now()
                    .checked_sub(latency)
                    .unwrap_or(std::time::UNIX_EPOCH);
                combined_line(&input, started, &mut line);
            }
        }
        if !self.sink.send(line) {
            dropped.increment();
        }
    }
}

/// One combined-format line (see [`LineFormat::Combined`]).
fn combined_line(input: &Input<'_>, started: std::time::SystemTime, line: &mut Vec<u8>) {
    use std::io::Write;
    let request = &input.request;
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name.as_bytes()))
            .map_or(&[][..], |(_, value)| *value)
    };
    let proto = match request.proto {
        Proto::Http10 => "HTTP/1.0",
        Proto::Http11 => "HTTP/1.1",
        Proto::Http2 => "HTTP/2.0",
    };
    line.extend_from_slice(request.remote_addr);
    line.extend_from_slice(b" - - [");
    let seconds = started
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    write_clf_time(seconds, line);
    line.extend_from_slice(b"] \"");
    line.extend_from_slice(request.method);
    line.push(b' ');
    url_path(request.request_uri, request.method, line);
    let _ = write!(
        line,
        " {proto}\" {} {} \"",
        input.response.code, input.response.size
    );
    line.extend_from_slice(header("Referer"));
    line.extend_from_slice(b"\" \"");
    line.extend_from_slice(header("User-Agent"));
    line.push(b'"');
}

/// Go's `URL.Path` of a request-target (the template engine's parser,
/// [`kactivator_template::url_path`]); a target Go's server would have refused is written as
/// it came, without its query.
fn url_path(target: &[u8], method: &[u8], out: &mut Vec<u8>) {
    match kactivator_template::url_path(target, method) {
        Some(path) => out.extend_from_slice(&path),
        None => out.extend_from_slice(
            target
                .split(|&byte| byte == b'?')
                .next()
                .unwrap_or_default(),
        ),
    }
}

/// `seconds` since the epoch as the combined log format's time, in UTC:
/// `02/Jan/2006:15:04:05 +0000`.
fn write_clf_time(seconds: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (year, month, day) = kactivator_h1::date::civil_from_days(seconds / 86_400);
    let of_day = seconds % 86_400;
    let _ = write!(
        out,
        "{day:02}/{}/{year:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(month - 1) as usize],
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60
    );
}

/// The request line's part of a log line, as a front reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestLine<'a> {
    pub method: &'a [u8],
    /// As sent: HTTP/1's request-target, HTTP/2's `:path`.
    pub target: &'a [u8],
    pub proto: Proto,
    /// Go's `ContentLength`: the declared length, 0 without a body, -1 when unknown (chunked,
    /// or an HTTP/2 body without `content-length`).
    pub content_length: i64,
    pub peer: &'a Peer,
}

/// A request's fields for its log line, owned: the request is rewritten for the app before the
/// line is written.
#[derive(Debug)]
pub(crate) struct Captured {
    bytes: Vec<u8>,
    method: Range<u32>,
    target: Range<u32>,
    host: Range<u32>,
    remote: Range<u32>,
    headers: Vec<(Range<u32>, Range<u32>)>,
    proto: Proto,
    content_length: i64,
}

impl Captured {
    fn push(&mut self, data: &[u8]) -> Range<u32> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        span(start, self.bytes.len())
    }

    fn slice(&self, range: &Range<u32>) -> &[u8] {
        self.bytes
            .get(range.start as usize..range.end as usize)
            .unwrap_or_default()
    }
}

/// A request head is at most 64 KiB (HTTP/2's header list a few MiB), far below `u32`.
fn span(start: usize, end: usize) -> Range<u32> {
    let narrow = |at: usize| u32::try_from(at).unwrap_or(u32::MAX);
    narrow(start)..narrow(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clf(seconds: u64) -> String {
        let mut out = Vec::new();
        write_clf_time(seconds, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_combined_formats_time_is_gos_layout_in_utc() {
        assert_eq!(clf(0), "01/Jan/1970:00:00:00 +0000");
        assert_eq!(clf(1_700_000_000), "14/Nov/2023:22:13:20 +0000");
        // A leap day, and the last second of a year.
        assert_eq!(clf(951_782_400), "29/Feb/2000:00:00:00 +0000");
        assert_eq!(clf(1_798_761_599), "31/Dec/2026:23:59:59 +0000");
    }

    fn path(target: &str) -> String {
        let mut out = Vec::new();
        url_path(target.as_bytes(), b"GET", &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn the_path_is_gos_url_path() {
        assert_eq!(path("/a/b?c=d"), "/a/b");
        assert_eq!(path("/caf%C3%A9%20x"), "/café x");
        assert_eq!(path("/bad%zz%4"), "/bad%zz%4", "not escapes: as they came");
        assert_eq!(path("http://example.com/p?q"), "/p");
        assert_eq!(path("http://example.com"), "");
        assert_eq!(path("*"), "*");
    }

    #[test]
    fn a_combined_line_has_every_field_in_the_add_ons_order() {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b"user-agent", b"curl/8"),
            (b"Referer", b"https://from.example/"),
        ];
        let revision = Revision::default();
        let input = Input {
            request: Request {
                method: b"POST",
                request_uri: b"/x%2Fy?z",
                proto: Proto::Http11,
                content_length: 3,
                host: b"app.example.com",
                remote_addr: b"10.0.0.9:51000",
                headers: &headers,
            },
            response: Response {
                code: 201,
                size: 17,
                latency_seconds: 0.5,
            },
            revision: &revision,
        };
        let mut line = Vec::new();
        combined_line(
            &input,
            std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            &mut line,
        );
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "10.0.0.9:51000 - - [14/Nov/2023:22:13:20 +0000] \"POST /x/y HTTP/1.1\" 201 17 \
             \"https://from.example/\" \"curl/8\""
        );
    }
}

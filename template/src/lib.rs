//! Knative's request-log templates: a Go `text/template` parsed and type-checked once, then
//! rendered per request to the very bytes Knative's queue-proxy writes.
//!
//! A crate of its own because it is a pure engine: text in, bytes out, no I/O, no clock, no
//! `unsafe`, and nothing from the data plane that uses it (`kactivator-shards`' request log).
//! The dependency graph keeps it that way.
//!
//! What Knative does (`pkg/http/request_log.go`): it takes the template text from
//! `SERVING_REQUEST_LOG_TEMPLATE`, adds a newline when the text lacks one, parses it as
//! `template.New("requestLog").Parse(text)`, and executes it for every request with a
//! `RequestLogTemplateInput`, which holds the `*http.Request`, a `RequestLogResponse {Code,
//! Size, Latency}`, a `RequestLogRevision {Name, Namespace, Service, Configuration, PodName,
//! PodIP}` and, from Knative 1.21 on, a `TraceID`. If executing fails it writes one fixed line
//! instead ([`fallback_line`]).
//!
//! This crate covers the part of the template language and of that data model that request
//! logs use, and follows Go's semantics in everything it covers; [`Template::parse`] lists what
//! it refuses. Where Go only finds a misspelt field or a number compared with a string when a
//! request is rendered, this engine type-checks the whole template as it parses, so the mistake
//! is reported at start-up rather than as a fallback line per request.
//!
//! `.Request.URL` prints as Go's `URL.String()` of the target as Go's server parses it: in the
//! common case the request-target unchanged; otherwise re-escaped the way Go does it (a raw `"`
//! or a non-ASCII byte in the path becomes `%22` / `%C3%A9`; in an absolute target the scheme is
//! lower-cased while `Example.COM` keeps its case; and so on).
//!
//! Whether a non-ASCII rune is printable, for `js` and `printf %q`, comes from the Unicode
//! tables in `isprint.rs`, which `src/gen_isprint.go` generated from Go 1.19 (Unicode 13.0).
//! Go 1.21 and later use Unicode 15.0; the two differ only for runes assigned in Unicode 14
//! and 15.
//!
//! Rendering reads only the request headers the template needs ([`Template::headers_read`]),
//! borrows everything else from the [`Input`], and allocates only for values it must compute
//! (escaped strings, `printf`, a whole header map).
//!
//! Tests: unit tests in `src/tests.rs`; `tests/go_differential.rs` renders a corpus with Go's
//! own `text/template` (`tests/go/oracle.go`, needs `go` on PATH) and with this engine and
//! wants the same bytes; `tests/allocations.rs` checks that Knative's default templates render
//! without allocating.

#![forbid(unsafe_code)]

mod exec;
mod gofmt;
#[rustfmt::skip]
mod isprint;
mod input;
mod lex;
mod parse;
mod url;

#[cfg(test)]
mod tests;

use std::fmt;

pub use input::{HeadersRead, Input, Proto, RenderError, Request, Response, Revision};
pub use parse::Template;

/// Knative 1.18's default `logging.request-log-template` (the config-observability ConfigMap), as
/// the reconciler hands it to the queue-proxy: the trace ID from the `X-B3-Traceid` header.
pub const KNATIVE_1_18_DEFAULT: &str = r#"{"httpRequest": {"requestMethod": "{{.Request.Method}}", "requestUrl": "{{js .Request.RequestURI}}", "requestSize": "{{.Request.ContentLength}}", "status": {{.Response.Code}}, "responseSize": "{{.Response.Size}}", "userAgent": "{{js .Request.UserAgent}}", "remoteIp": "{{js .Request.RemoteAddr}}", "serverIp": "{{.Revision.PodIP}}", "referer": "{{js .Request.Referer}}", "latency": "{{.Response.Latency}}s", "protocol": "{{.Request.Proto}}"}, "traceId": "{{index .Request.Header "X-B3-Traceid"}}"}"#;

/// Knative 1.21's default, the same but for its `.TraceID` (from `traceparent`, else
/// `X-B3-TraceId`).
pub const KNATIVE_1_21_DEFAULT: &str = r#"{"httpRequest": {"requestMethod": "{{.Request.Method}}", "requestUrl": "{{js .Request.RequestURI}}", "requestSize": "{{.Request.ContentLength}}", "status": {{.Response.Code}}, "responseSize": "{{.Response.Size}}", "userAgent": "{{js .Request.UserAgent}}", "remoteIp": "{{js .Request.RemoteAddr}}", "serverIp": "{{.Revision.PodIP}}", "referer": "{{js .Request.Referer}}", "latency": "{{.Response.Latency}}s", "protocol": "{{.Request.Proto}}"}, "traceId": "{{.TraceID}}"}"#;

/// Why a template was refused: where (1-based line and byte column of the
/// template text) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateError {
    /// 1-based line of the offending text.
    pub line: usize,
    /// 1-based byte column of the offending text within its line.
    pub column: usize,
    /// What is wrong, in words meant for whoever wrote the template.
    pub message: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "request log template, line {} column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for TemplateError {}

impl Template {
    /// Parses `text` as Knative does (appending `"\n"` when it does not end
    /// with one) and type-checks it against the request-log data.
    ///
    /// Refuses, with a [`TemplateError`], everything Go's parser refuses, and
    /// also everything Go would accept but this engine does not implement or
    /// that could only fail or print something unpredictable (a pointer) when
    /// executed, among them: `define`, `template`, `block`, `call`; fields
    /// outside the request-log data (`.Request.Body`, `.Request.Form`, ...);
    /// functions called with argument types that Go's would reject (`len 3`,
    /// `eq .Response.Code "200"`); `printf` with a format that is not a
    /// literal or with verbs, flags or argument types outside the supported
    /// set; declarations inside parentheses; and number literals other than
    /// plain decimal, hexadecimal, octal and binary integers and decimal
    /// floats. An empty text is not special here: Knative turns logging off
    /// for it before parsing.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut owned;
        let text = if text.ends_with('\n') {
            text
        } else {
            owned = String::with_capacity(text.len() + 1);
            owned.push_str(text);
            owned.push('\n');
            &owned
        };
        parse::parse(text).map_err(|(offset, message)| {
            let before = &text.as_bytes()[..offset.min(text.len())];
            let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
            let line_start = before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |newline| newline + 1);
            TemplateError {
                line,
                column: offset.min(text.len()) - line_start + 1,
                message,
            }
        })
    }

    /// Which request headers rendering reads, so the caller copies only those.
    pub fn headers_read(&self) -> &HeadersRead {
        &self.headers_read
    }

    /// Renders one log line, appending it to `out`. On error `out` is left as
    /// it was (Knative buffers the line and discards it), and the caller
    /// writes [`fallback_line`] instead.
    pub fn render(&self, input: &Input<'_>, out: &mut Vec<u8>) -> Result<(), RenderError> {
        let start = out.len();
        let result = exec::render(self, input, out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }
}

/// Go's `URL.Path` of a request-target as its server parses it (`url.ParseRequestURI`, with
/// the `CONNECT` case): the path without its query, percent-decoded; `None` where Go's server
/// would have refused the request.
pub fn url_path(target: &[u8], method: &[u8]) -> Option<Vec<u8>> {
    url::parse_request_target(target, method).map(|url| url.path.into_owned())
}

/// Appends the line Knative writes when executing the template fails:
/// `Invalid request log template: method: %v, response code: %v, latency:
/// %v, url: %v` and a newline, with Go's formatting of each value.
pub fn fallback_line(input: &Input<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"Invalid request log template: method: ");
    out.extend_from_slice(input.request.method);
    out.extend_from_slice(b", response code: ");
    gofmt::push_int(out, i64::from(input.response.code));
    out.extend_from_slice(b", latency: ");
    gofmt::push_float_plain(out, input.response.latency_seconds);
    out.extend_from_slice(b", url: ");
    exec::push_url(&input.request, out);
    out.push(b'\n');
}

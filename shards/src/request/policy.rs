//! What the activator does to header fields on the way through, whatever protocol carries them:
//! one list of edits and one writer that applies it ([`write_fields`]), into a sink each front
//! implements for its own encoding (HTTP/1 head lines, HTTP/2 header maps). Pure.
//!
//! On the way to the pod, as upstream's activator (`reference/knative-activator.md` §2):
//! hop-by-hop fields and those the activator consumes are dropped; `X-Forwarded-For` is sent
//! once, the earlier values joined and the client appended; `TE` goes on only as `trailers`;
//! `X-Run-Id`, when present, replaces `X-Request-Id`; the client's authority is kept in
//! `K-Original-Host` unless the request has one; `K-Proxy-Request: activator` is added. The pod's
//! address as `Host` (or `:authority`) is the writer's, once a pod is picked. What only HTTP/1
//! has (fields named in `Connection`, an h2c upgrade offer, re-declared framing) stays in its
//! writer.

use kactivator_api::headers;
use kactivator_h1::name_eq;

use super::headers::RequestHeaders;
use super::trace::{propagation_field, Decider, Gathered, PropagationField};

/// Whose edits a request gets on its way out: the activator's, to a pod (above), or the
/// queue-proxy's, to its user container (upstream's `mainHandler` in
/// `pkg/queue/sharedmain/handlers.go`, release-1.18): the client's `Host` kept, or replaced by
/// `K-Original-Host` when the activator set one (`RewriteHostOut`), which then goes; the revision
/// headers pruned; `K-Proxy-Request` passed on (the autoscaler stats count it as proxied);
/// `X-Forwarded-For` with the client appended (Go's `ReverseProxy`); a `Forwarded` field made
/// from the `X-Forwarded-*` ones when the request has none (`ForwardedShimHandler`); hop-by-hop
/// fields dropped. Nothing else is added. Or KEDA's HTTP add-on's interceptor's, to a pod (Go's
/// `ReverseProxy` with the `Rewrite` of `interceptor/handler/upstream.go` at v0.15.0): the
/// client's `Host` kept; hop-by-hop fields and `Forwarded` dropped; `X-Forwarded-For` with the
/// client appended; `X-Forwarded-Host` and `X-Forwarded-Proto` the client's first non-empty
/// ones, else the request's `Host` and `http` (`https` over TLS); every other field as it came.
///
/// The discriminants are the writer's const parameter ([`write_fields`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Edits {
    Activator = 0,
    QueueProxy = 1,
    Interceptor = 2,
}

/// [`Edits`] as [`write_fields`]' const parameter.
pub const ACTIVATOR: u8 = Edits::Activator as u8;
pub const QUEUE_PROXY: u8 = Edits::QueueProxy as u8;
pub const INTERCEPTOR: u8 = Edits::Interceptor as u8;

/// What becomes of one field of the client's request on its way to the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestField {
    /// Passed on as it is.
    Keep,
    /// Dropped: hop-by-hop (RFC 9110 §7.6.1, and the legacy ones Go drops), or consumed or
    /// replaced by the activator (the revision headers, `Host`, `K-Network-Hash`, an inbound
    /// `K-Proxy-Request`, `X-Run-Id`).
    Drop,
    /// `X-Forwarded-For`: gathered and sent once, with the client appended.
    ForwardedFor,
    /// `TE`: goes on only as `trailers`.
    Te,
    /// `X-Request-Id`: dropped when the request has an `X-Run-Id` to replace it.
    RequestId,
    /// `K-Original-Host`: kept, and the activator adds none. (The queue-proxy's edits: the
    /// request's `Host`, and dropped as a field.)
    OriginalHost,
    /// The queue-proxy's edits: kept, and read for the `Forwarded` shim. `Forwarded` itself
    /// (no shim then), `X-Forwarded-Proto`, `X-Forwarded-Host`. The interceptor's: the last two
    /// read and written again, `Forwarded` dropped.
    Forwarded,
    ForwardedProto,
    ForwardedHost,
}

/// What becomes of the field `name` (any case) of a request on its way to the pod.
///
/// Runs for every field of every request, so it looks at the length first: almost every field
/// matches no length here and costs one comparison.
#[inline]
pub fn request_field(name: &[u8]) -> RequestField {
    let is = |known: &str| name_eq(name, known.as_bytes());
    match name.len() {
        2 if is("te") => RequestField::Te,
        4 if is(headers::HOST) => RequestField::Drop,
        7 if is("trailer") || is("upgrade") => RequestField::Drop,
        8 if is(headers::RUN_ID) => RequestField::Drop,
        10 if is("connection") || is("keep-alive") => RequestField::Drop,
        12 if is(headers::REQUEST_ID) => RequestField::RequestId,
        14 if is(headers::NETWORK_HASH) => RequestField::Drop,
        15 if is(headers::FORWARDED_FOR) => RequestField::ForwardedFor,
        15 if is(headers::ORIGINAL_HOST) => RequestField::OriginalHost,
        15 if is(headers::PROXY_REQUEST) => RequestField::Drop,
        16 if is("proxy-connection") => RequestField::Drop,
        17 if is("transfer-encoding") => RequestField::Drop,
        18 if is("proxy-authenticate") => RequestField::Drop,
        19 if is("proxy-authorization") => RequestField::Drop,
        24 if is(headers::REVISION) => RequestField::Drop,
        25 if is(headers::NAMESPACE) => RequestField::Drop,
        _ => RequestField::Keep,
    }
}

/// What becomes of the field `name` (any case) of a request on its way to the user container,
/// under the queue-proxy's edits ([`Edits::QueueProxy`]). `Host` and `K-Original-Host` are
/// dropped as fields: the writer writes the request's `Host` itself.
#[inline]
pub fn queue_proxy_field(name: &[u8]) -> RequestField {
    let is = |known: &str| name_eq(name, known.as_bytes());
    match name.len() {
        2 if is("te") => RequestField::Te,
        4 if is(headers::HOST) => RequestField::Drop,
        7 if is("trailer") || is("upgrade") => RequestField::Drop,
        9 if is("forwarded") => RequestField::Forwarded,
        10 if is("connection") || is("keep-alive") => RequestField::Drop,
        15 if is(headers::FORWARDED_FOR) => RequestField::ForwardedFor,
        15 if is(headers::ORIGINAL_HOST) => RequestField::OriginalHost,
        16 if is("proxy-connection") => RequestField::Drop,
        16 if is("x-forwarded-host") => RequestField::ForwardedHost,
        17 if is("transfer-encoding") => RequestField::Drop,
        17 if is("x-forwarded-proto") => RequestField::ForwardedProto,
        18 if is("proxy-authenticate") => RequestField::Drop,
        19 if is("proxy-authorization") => RequestField::Drop,
        24 if is(headers::REVISION) => RequestField::Drop,
        25 if is(headers::NAMESPACE) => RequestField::Drop,
        _ => RequestField::Keep,
    }
}

/// What becomes of the field `name` (any case) of a request on its way to a pod under KEDA's
/// HTTP add-on's edits ([`Edits::Interceptor`]): the queue-proxy's list, but for what Go's
/// `ReverseProxy` with a `Rewrite` does otherwise: `Forwarded` goes (the rewrite sets its own
/// `X-Forwarded-*` instead of a shim), and `K-Original-Host` and Knative's revision headers are
/// fields like any other. `Host` is dropped as a field: the writer writes the request's.
#[inline]
pub fn interceptor_field(name: &[u8]) -> RequestField {
    match queue_proxy_field(name) {
        RequestField::Forwarded => RequestField::Drop,
        RequestField::OriginalHost => RequestField::Keep,
        RequestField::Drop
            if name_eq(name, headers::REVISION.as_bytes())
                || name_eq(name, headers::NAMESPACE.as_bytes()) =>
        {
            RequestField::Keep
        }
        field => field,
    }
}

/// What [`queue_proxy_field`] finds while a writer goes through the fields, for what the
/// queue-proxy's edits add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueProxySeen<'a> {
    /// The first `K-Original-Host`: the request's `Host`.
    pub original_host: Option<&'a [u8]>,
    /// The request has a `Forwarded` field: no shim.
    pub forwarded: bool,
    /// The first value of each `X-Forwarded-*` field, as Go's `Header.Get` reads them.
    pub forwarded_for: Option<&'a [u8]>,
    pub forwarded_proto: Option<&'a [u8]>,
    pub forwarded_host: Option<&'a [u8]>,
}

impl<'a> QueueProxySeen<'a> {
    /// Notes field `field` with `value`.
    #[inline]
    pub fn note(&mut self, field: RequestField, value: &'a [u8]) {
        let first = |slot: &mut Option<&'a [u8]>| {
            slot.get_or_insert(value);
        };
        match field {
            RequestField::OriginalHost => first(&mut self.original_host),
            RequestField::Forwarded => self.forwarded = true,
            RequestField::ForwardedFor => first(&mut self.forwarded_for),
            RequestField::ForwardedProto => first(&mut self.forwarded_proto),
            RequestField::ForwardedHost => first(&mut self.forwarded_host),
            _ => {}
        }
    }

    /// The request's `Host` for the user container: `K-Original-Host` when the activator set a
    /// non-empty one, else the client's own.
    pub fn host<'h>(&self, client: Option<&'h [u8]>) -> Option<&'h [u8]>
    where
        'a: 'h,
    {
        self.original_host
            .filter(|host| !host.is_empty())
            .or(client)
    }

    /// The `Forwarded` field upstream's shim adds (`generateForwarded` in
    /// `pkg/queue/forwarded_shim.go`): none when the request has one or has no `X-Forwarded-*`;
    /// else `for=` each `X-Forwarded-For` node (an IPv6 one as `"[addr]"`), the first with
    /// `host=` and `proto=`.
    pub fn forwarded_shim(&self) -> Option<Vec<u8>> {
        let non_empty = |value: Option<&'a [u8]>| value.filter(|value| !value.is_empty());
        let (xff, xfp, xfh) = (
            non_empty(self.forwarded_for),
            non_empty(self.forwarded_proto),
            non_empty(self.forwarded_host),
        );
        if self.forwarded || (xff.is_none() && xfp.is_none() && xfh.is_none()) {
            return None;
        }
        let mut out = Vec::new();
        let mut nodes = xff.map(|xff| xff.split(|&byte| byte == b','));
        let first = nodes
            .as_mut()
            .and_then(|nodes| nodes.next())
            .map(<[u8]>::trim_ascii);
        let write_node = |out: &mut Vec<u8>, node: &[u8]| {
            out.extend_from_slice(b"for=");
            if node.contains(&b':') {
                out.extend_from_slice(b"\"[");
                out.extend_from_slice(node);
                out.extend_from_slice(b"]\"");
            } else {
                out.extend_from_slice(node);
            }
        };
        if let Some(node) = first {
            write_node(&mut out, node);
        }
        // Upstream separates `host=` and `proto=` from a node only when the node is not empty.
        let node_written = first.is_some_and(|node| !node.is_empty());
        if let Some(host) = xfh {
            if node_written {
                out.push(b';');
            }
            out.extend_from_slice(b"host=");
            out.extend_from_slice(host);
        }
        if let Some(proto) = xfp {
            if node_written || xfh.is_some() {
                out.push(b';');
            }
            out.extend_from_slice(b"proto=");
            out.extend_from_slice(proto);
        }
        for node in nodes.into_iter().flatten() {
            out.extend_from_slice(b", ");
            write_node(&mut out, node.trim_ascii());
        }
        Some(out)
    }
}

/// Whether a field of the pod's response is dropped on its way to the client: the hop-by-hop
/// ones, which describe the pod's connection, not the response.
#[inline]
pub fn drops_response_field(name: &[u8]) -> bool {
    let is = |known: &str| name_eq(name, known.as_bytes());
    match name.len() {
        2 => is("te"),
        7 => is("trailer") || is("upgrade"),
        10 => is("connection") || is("keep-alive"),
        16 => is("proxy-connection"),
        17 => is("transfer-encoding"),
        18 => is("proxy-authenticate"),
        19 => is("proxy-authorization"),
        _ => false,
    }
}

/// Whether a `TE` field lets `TE: trailers` go on (gRPC needs it): one of its elements is
/// `trailers` (parameters aside), as Go's `ReverseProxy` checks with
/// `httpguts.HeaderValuesContainsToken`.
pub fn keeps_te(value: &[u8]) -> bool {
    kactivator_h1::list_has_element(value, b"trailers")
}

/// A field the edits add to a request; each writer spells it in its own encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddedField {
    /// `K-Original-Host`: where the client addressed the request (the activator's edits).
    OriginalHost,
    /// `X-Request-Id`: the request's `X-Run-Id`, which replaces it (the activator's edits).
    RequestId,
    /// `K-Proxy-Request: activator` (the activator's edits).
    ProxyRequest,
    /// `Forwarded`, the shim made from the `X-Forwarded-*` fields (the queue-proxy's edits).
    Forwarded,
    /// `TE: trailers`, when the client's `TE` allows it.
    Te,
    /// `X-Forwarded-Host` and `X-Forwarded-Proto` (the interceptor's edits).
    ForwardedHost,
    ForwardedProto,
    /// A propagation header of the trace context going to the pod (`request::trace`); only
    /// while tracing is on.
    Trace(PropagationField),
}

/// One of the client's fields as a front holds it: HTTP/1 bytes, an `h2` header pair.
pub trait Field<'a>: Copy {
    fn name(self) -> &'a [u8];
    fn value(self) -> &'a [u8];
}

impl<'a> Field<'a> for (&'a [u8], &'a [u8]) {
    #[inline(always)]
    fn name(self) -> &'a [u8] {
        self.0
    }

    #[inline(always)]
    fn value(self) -> &'a [u8] {
        self.1
    }
}

/// Where [`write_fields`] puts the request the pod is sent: a front's own encoding.
pub trait FieldSink<'a> {
    type Field: Field<'a>;
    /// Passes one of the client's fields on as it is.
    fn pass(&mut self, field: Self::Field);
    /// Adds a field of the edits' own.
    fn add(&mut self, field: AddedField, value: &[u8]);
    /// Writes `X-Forwarded-For`: the `earlier` values joined with `, `, then the client.
    fn forwarded_for(&mut self, earlier: impl Iterator<Item = &'a [u8]>, client_ip: &[u8]);
}

/// The one writer of the header edits, for every front and every role: goes through the
/// client's `fields` in order, passes on what the edits' classifier ([`request_field`],
/// [`queue_proxy_field`], [`interceptor_field`]) keeps, and adds what the edits add, into
/// `sink`: the activator's `K-Original-Host` (the request's authority, unless it has one),
/// `X-Request-Id` from a non-empty `X-Run-Id`, and `K-Proxy-Request`; or the queue-proxy's
/// `Forwarded` shim; or the interceptor's `X-Forwarded-Host` and `-Proto` (`secure`: the client
/// came over TLS); then `X-Forwarded-For` with `client_ip` appended and `TE: trailers` when the
/// client's `TE` allows it. `view` is the front's own view of the same fields, for what is
/// looked up by name (`X-Run-Id`, the authority); `fields` is called again for the earlier
/// `X-Forwarded-For` values. With a `trace` (tracing on) every propagation header is taken out
/// and the trace context it decides goes in instead (`request::trace`); without one they pass
/// as they came. Returns the request's `Host` for the pod under the queue-proxy's edits
/// (`K-Original-Host`, else the authority) and the interceptor's (the authority); `None` under
/// the activator's, where the pod's address is the writer's once one is picked.
///
/// `EDITS` is an [`Edits`] as a const ([`ACTIVATOR`], [`QUEUE_PROXY`], [`INTERCEPTOR`]), so
/// that no role pays a branch per field for another.
#[inline(always)]
pub fn write_fields<'a, V, S, I, const EDITS: u8>(
    view: &'a V,
    fields: impl Fn() -> I,
    client_ip: &[u8],
    secure: bool,
    sink: &mut S,
    mut trace: Option<&mut Decider<'_>>,
) -> Option<&'a [u8]>
where
    V: RequestHeaders + ?Sized,
    S: FieldSink<'a>,
    I: Iterator<Item = S::Field>,
{
    let queue_proxy = EDITS == QUEUE_PROXY;
    let interceptor = EDITS == INTERCEPTOR;
    let activator = !queue_proxy && !interceptor;
    let run_id = if activator { run_id(view) } else { None };
    let mut forwarded_for = false;
    let mut has_original_host = false;
    let mut wants_trailers = false;
    let mut seen = QueueProxySeen::default();
    let mut gathered = Gathered::default();
    for field in fields() {
        let (name, value) = (field.name(), field.value());
        if trace.is_some() {
            if let Some(propagation) = propagation_field(name) {
                gathered.note(propagation, value);
                continue;
            }
        }
        let kind = if queue_proxy {
            queue_proxy_field(name)
        } else if interceptor {
            interceptor_field(name)
        } else {
            request_field(name)
        };
        match kind {
            RequestField::Keep => {}
            RequestField::Drop => continue,
            RequestField::ForwardedFor => {
                // Written below as one field with the client appended.
                forwarded_for = true;
                if queue_proxy {
                    seen.note(kind, value);
                }
                continue;
            }
            RequestField::Te => {
                wants_trailers |= keeps_te(value);
                continue;
            }
            RequestField::RequestId if run_id.is_some() => continue,
            RequestField::RequestId => {}
            RequestField::OriginalHost if queue_proxy => {
                // The request's Host, which the writer writes.
                seen.note(kind, value);
                continue;
            }
            RequestField::OriginalHost => has_original_host = true,
            RequestField::ForwardedProto | RequestField::ForwardedHost if interceptor => {
                // Written below, the client's or the interceptor's own.
                seen.note(kind, value);
                continue;
            }
            RequestField::Forwarded
            | RequestField::ForwardedProto
            | RequestField::ForwardedHost => seen.note(kind, value),
        }
        sink.pass(field);
    }
    let authority = view.authority().filter(|host| !host.is_empty());
    let host = if queue_proxy {
        if let Some(shim) = seen.forwarded_shim() {
            sink.add(AddedField::Forwarded, &shim);
        }
        seen.host(authority)
    } else if interceptor {
        // Go's `SetXForwarded`, then the add-on puts back the client's non-empty values.
        let client = |value: Option<&'a [u8]>| value.filter(|value| !value.is_empty());
        let host = client(seen.forwarded_host).unwrap_or(authority.unwrap_or_default());
        sink.add(AddedField::ForwardedHost, host);
        let proto: &[u8] = if secure { b"https" } else { b"http" };
        sink.add(
            AddedField::ForwardedProto,
            client(seen.forwarded_proto).unwrap_or(proto),
        );
        authority
    } else {
        if let Some(host) = authority.filter(|_| !has_original_host) {
            sink.add(AddedField::OriginalHost, host);
        }
        if let Some(run_id) = run_id {
            sink.add(AddedField::RequestId, run_id);
        }
        sink.add(
            AddedField::ProxyRequest,
            headers::PROXY_REQUEST_VALUE.as_bytes(),
        );
        None
    };
    // As Go's ReverseProxy: every earlier value, joined, then the client.
    let earlier = forwarded_for.then(|| {
        fields()
            .filter(|field| name_eq(field.name(), headers::FORWARDED_FOR.as_bytes()))
            .map(Field::value)
    });
    sink.forwarded_for(earlier.into_iter().flatten(), client_ip);
    if wants_trailers {
        sink.add(AddedField::Te, b"trailers");
    }
    if let Some(decider) = trace.as_mut() {
        decider.decide(&gathered, |name, value| {
            if let Some(field) = propagation_field(name.as_bytes()) {
                sink.add(AddedField::Trace(field), value);
            }
        });
    }
    host
}

/// A non-empty `X-Run-Id`, which replaces `X-Request-Id` on the way to the pod.
#[inline]
pub fn run_id<H: RequestHeaders + ?Sized>(request: &H) -> Option<&[u8]> {
    request
        .get(headers::RUN_ID)
        .filter(|value| !value.is_empty())
}

/// ★ What the activator says on a response about its own part in it (issue 27): a request that
/// waited for a slot gets `Server-Timing: activator;dur=<ms>`, and one that waited for a
/// revision with no routable pod (a cold start) also `X-Activator-Cold-Start: true`. Requests
/// that took a slot at once get neither, and neither does the queue-proxy role. In KEDA's HTTP
/// add-on's role (`keda_field`) the cold start is told in the add-on's own field instead,
/// `X-KEDA-HTTP-Cold-Start: true` or `false`, on every response from a pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitNote {
    /// Time spent waiting for a slot, summed over the request's admissions, in microseconds.
    pub waited_us: u64,
    /// Some wait found the revision without a routable pod.
    pub cold_start: bool,
    /// The request waited in the queue at least once.
    pub queued: bool,
    /// The cold start is told as KEDA's HTTP add-on tells it.
    pub keda_field: bool,
    /// The request went to its route's failover after waiting for a first pod: the add-on
    /// then sets no `X-KEDA-HTTP-Cold-Start`.
    pub failed_over: bool,
}

impl WaitNote {
    /// Adds one wait in the queue.
    pub fn add(&mut self, waited_us: u64, cold_start: bool) {
        self.waited_us = self.waited_us.saturating_add(waited_us);
        self.cold_start |= cold_start;
        self.queued = true;
    }

    /// What an answer of the proxy's own (an error) is told: the waits, but not the add-on's
    /// field, which it sets only on a response that reached a pod.
    pub fn for_error(self) -> Option<WaitNote> {
        if self.keda_field {
            Some(WaitNote {
                keda_field: false,
                cold_start: false,
                ..self
            })
            .filter(|note| note.queued)
        } else {
            Some(self)
        }
    }

    /// The fields a response gets, each handed to `put` as (name, value): the writer's own
    /// encoding does the rest. The wait is in milliseconds with three decimals (microseconds):
    /// a wait for a busy pod is often well under a millisecond.
    pub fn response_fields(&self, mut put: impl FnMut(&'static str, &[u8])) {
        use std::io::Write;
        let mut value = [0u8; 48];
        let mut cursor = std::io::Cursor::new(&mut value[..]);
        // At most 14 + 20 + 1 + 3 bytes: it always fits.
        let _ = write!(
            cursor,
            "{};dur={}.{:03}",
            headers::SERVER_TIMING_METRIC,
            self.waited_us / 1000,
            self.waited_us % 1000
        );
        let len = cursor.position() as usize;
        if self.queued {
            put(headers::SERVER_TIMING, &value[..len]);
        }
        if self.keda_field && !self.failed_over {
            let told: &[u8] = if self.cold_start { b"true" } else { b"false" };
            put(headers::KEDA_COLD_START, told);
        } else if self.cold_start {
            put(headers::COLD_START, b"true");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::headers::{CONSUMED_REQUEST_HEADERS, HOP_BY_HOP};

    #[test]
    fn every_hop_by_hop_and_consumed_field_is_dropped_in_any_case_and_others_kept() {
        for name in HOP_BY_HOP.iter().chain(CONSUMED_REQUEST_HEADERS.iter()) {
            let expected = match *name {
                "te" => RequestField::Te,
                "x-forwarded-for" | "X-Forwarded-For" => RequestField::ForwardedFor,
                _ => RequestField::Drop,
            };
            for spelled in [name.to_string(), name.to_ascii_uppercase()] {
                assert_eq!(request_field(spelled.as_bytes()), expected, "{spelled}");
            }
        }
        let rows: &[(&str, RequestField)] = &[
            ("X-Request-Id", RequestField::RequestId),
            ("k-original-host", RequestField::OriginalHost),
            ("Content-Type", RequestField::Keep),
            ("Content-Length", RequestField::Keep),
            ("Accept", RequestField::Keep),
            ("x-run-ie", RequestField::Keep),
            ("hostname", RequestField::Keep),
            ("", RequestField::Keep),
        ];
        for (name, expected) in rows {
            assert_eq!(request_field(name.as_bytes()), *expected, "{name}");
        }
    }

    #[test]
    fn hop_by_hop_response_fields_are_dropped_and_the_rest_kept() {
        for name in HOP_BY_HOP {
            assert!(drops_response_field(name.as_bytes()), "{name}");
            assert!(drops_response_field(name.to_ascii_uppercase().as_bytes()));
        }
        for name in [
            "content-type",
            "x-knative-revision-name",
            "grpc-status",
            "host",
        ] {
            assert!(!drops_response_field(name.as_bytes()), "{name}");
        }
    }

    /// What [`write_fields`] puts in a sink, as `name: value` lines in order.
    #[derive(Default)]
    struct Lines(Vec<String>);

    impl<'a> FieldSink<'a> for Lines {
        type Field = (&'a [u8], &'a [u8]);

        fn pass(&mut self, (name, value): (&'a [u8], &'a [u8])) {
            self.0.push(format!(
                "{}: {}",
                String::from_utf8_lossy(name),
                String::from_utf8_lossy(value)
            ));
        }

        fn add(&mut self, field: AddedField, value: &[u8]) {
            self.0
                .push(format!("+{field:?}: {}", String::from_utf8_lossy(value)));
        }

        fn forwarded_for(&mut self, earlier: impl Iterator<Item = &'a [u8]>, client_ip: &[u8]) {
            let mut value: Vec<u8> = earlier.flat_map(|v| [v, b", "].concat()).collect();
            value.extend_from_slice(client_ip);
            self.0
                .push(format!("+XFF: {}", String::from_utf8_lossy(&value)));
        }
    }

    /// What the writer makes of `fields` (their `Host` is the authority).
    fn written<const EDITS: u8>(fields: &[(&str, &str)]) -> (Vec<String>, Option<String>) {
        written_over::<EDITS>(fields, false)
    }

    /// [`written`], for a client that came over TLS (`secure`) or not.
    fn written_over<const EDITS: u8>(
        fields: &[(&str, &str)],
        secure: bool,
    ) -> (Vec<String>, Option<String>) {
        let pairs: Vec<(&[u8], &[u8])> = fields
            .iter()
            .map(|(name, value)| (name.as_bytes(), value.as_bytes()))
            .collect();
        let mut lines = Lines::default();
        let host = write_fields::<_, _, _, EDITS>(
            fields,
            || pairs.iter().copied(),
            b"10.0.0.9",
            secure,
            &mut lines,
            None,
        );
        (
            lines.0,
            host.map(|host| String::from_utf8_lossy(host).into_owned()),
        )
    }

    #[test]
    fn the_activators_edits_in_order() {
        let (lines, host) = written::<ACTIVATOR>(&[
            ("Host", "a.b.svc"),
            ("Accept", "*/*"),
            ("X-Request-Id", "old"),
            ("X-Run-Id", "run-7"),
            ("X-Forwarded-For", "1.1.1.1"),
            ("K-Proxy-Request", "forged"),
            ("TE", "gzip, Trailers;q=1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        assert_eq!(
            lines,
            [
                "Accept: */*",
                "+OriginalHost: a.b.svc",
                "+RequestId: run-7",
                "+ProxyRequest: activator",
                "+XFF: 1.1.1.1, 2.2.2.2, 10.0.0.9",
                "+Te: trailers",
            ]
        );
        assert_eq!(host, None, "the pod's address is the writer's");

        let (lines, _) = written::<ACTIVATOR>(&[
            ("Host", "a.b.svc"),
            ("K-Original-Host", "first.example"),
            ("X-Run-Id", ""),
            ("X-Request-Id", "kept"),
            ("TE", "gzip"),
        ]);
        assert_eq!(
            lines,
            [
                "K-Original-Host: first.example",
                "X-Request-Id: kept",
                "+ProxyRequest: activator",
                "+XFF: 10.0.0.9",
            ],
            "a request's own K-Original-Host stays; an empty X-Run-Id replaces nothing"
        );
        let (lines, _) = written::<ACTIVATOR>(&[("Host", "")]);
        assert_eq!(lines, ["+ProxyRequest: activator", "+XFF: 10.0.0.9"]);
    }

    #[test]
    fn the_queue_proxys_edits_in_order() {
        let (lines, host) = written::<QUEUE_PROXY>(&[
            ("Host", "hello.default.example.com"),
            ("K-Original-Host", "app.example.com"),
            ("K-Proxy-Request", "activator"),
            ("Knative-Serving-Revision", "hello-00001"),
            ("X-Forwarded-For", "1.1.1.1, 2.2.2.2"),
            ("X-Forwarded-Proto", "https"),
            ("X-Run-Id", "run-7"),
        ]);
        assert_eq!(
            lines,
            [
                "K-Proxy-Request: activator",
                "X-Forwarded-Proto: https",
                "X-Run-Id: run-7",
                "+Forwarded: for=1.1.1.1;proto=https, for=2.2.2.2",
                "+XFF: 1.1.1.1, 2.2.2.2, 10.0.0.9",
            ]
        );
        assert_eq!(
            host.as_deref(),
            Some("app.example.com"),
            "K-Original-Host wins"
        );
        let (_, host) =
            written::<QUEUE_PROXY>(&[("Host", "client.example"), ("K-Original-Host", "")]);
        assert_eq!(host.as_deref(), Some("client.example"));
        assert!(keeps_te(b"Trailers") && keeps_te(b"gzip, trailers") && !keeps_te(b"gzip"));
    }

    /// As the add-on's `Rewrite` (`interceptor/handler/upstream.go` at v0.15.0) over Go's
    /// `ReverseProxy`: every field but the hop-by-hop ones and `Forwarded` as it came, Knative's
    /// and kactivator's own included; `X-Forwarded-For` appended; the client's first non-empty
    /// `X-Forwarded-Host`/`-Proto` kept, else the request's `Host` and its scheme.
    #[test]
    fn the_interceptors_edits_in_order() {
        let (lines, host) = written::<INTERCEPTOR>(&[
            ("Host", "app.example.com"),
            ("K-Original-Host", "elsewhere.example"),
            ("Knative-Serving-Revision", "hello-00001"),
            ("K-Proxy-Request", "activator"),
            ("Forwarded", "for=6.6.6.6"),
            ("X-Forwarded-For", "1.1.1.1"),
            ("X-Forwarded-Host", ""),
            ("X-Forwarded-Host", "second.example"),
            ("X-Forwarded-Proto", "wss"),
            ("X-Run-Id", "run-7"),
            ("Connection", "keep-alive"),
            ("TE", "trailers"),
        ]);
        assert_eq!(
            lines,
            [
                "K-Original-Host: elsewhere.example",
                "Knative-Serving-Revision: hello-00001",
                "K-Proxy-Request: activator",
                "X-Run-Id: run-7",
                "+ForwardedHost: app.example.com",
                "+ForwardedProto: wss",
                "+XFF: 1.1.1.1, 10.0.0.9",
                "+Te: trailers",
            ],
            "Go's Header.Get reads the first X-Forwarded-Host, which is empty: the Host replaces it"
        );
        assert_eq!(
            host.as_deref(),
            Some("app.example.com"),
            "the client's Host, never K-Original-Host's"
        );
        let (lines, _) = written_over::<INTERCEPTOR>(
            &[
                ("Host", "app.example.com"),
                ("X-Forwarded-Host", "edge.example"),
            ],
            true,
        );
        assert_eq!(
            lines,
            [
                "+ForwardedHost: edge.example",
                "+ForwardedProto: https",
                "+XFF: 10.0.0.9",
            ]
        );
        let (lines, _) = written::<INTERCEPTOR>(&[("Host", "a.example")]);
        assert_eq!(
            lines,
            [
                "+ForwardedHost: a.example",
                "+ForwardedProto: http",
                "+XFF: 10.0.0.9",
            ]
        );
    }

    #[test]
    fn the_queue_proxy_keeps_what_the_activator_consumes_and_prunes_the_revision_headers() {
        let rows: &[(&str, RequestField)] = &[
            ("Host", RequestField::Drop),
            ("K-Original-Host", RequestField::OriginalHost),
            ("K-Proxy-Request", RequestField::Keep),
            ("K-Network-Hash", RequestField::Keep),
            ("X-Run-Id", RequestField::Keep),
            ("X-Request-Id", RequestField::Keep),
            ("Knative-Serving-Revision", RequestField::Drop),
            ("knative-serving-namespace", RequestField::Drop),
            ("X-Forwarded-For", RequestField::ForwardedFor),
            ("x-forwarded-proto", RequestField::ForwardedProto),
            ("X-Forwarded-Host", RequestField::ForwardedHost),
            ("Forwarded", RequestField::Forwarded),
            ("Connection", RequestField::Drop),
            ("Transfer-Encoding", RequestField::Drop),
            ("TE", RequestField::Te),
            ("Content-Type", RequestField::Keep),
        ];
        for (name, expected) in rows {
            assert_eq!(queue_proxy_field(name.as_bytes()), *expected, "{name}");
        }
    }

    #[test]
    fn the_forwarded_shim_is_upstreams() {
        // (X-Forwarded-For, -Proto, -Host, has Forwarded, the shim) — the cases of upstream's
        // forwarded_shim_test.go (release-1.18), and ours at the edges.
        type Row = (
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            bool,
            Option<&'static str>,
        );
        let table: &[Row] = &[
            (None, None, None, false, None),
            (Some("1.2.3.4"), None, None, true, None),
            (Some("1.2.3.4"), None, None, false, Some("for=1.2.3.4")),
            (
                Some("1.2.3.4, 5.6.7.8"),
                None,
                None,
                false,
                Some("for=1.2.3.4, for=5.6.7.8"),
            ),
            (
                Some("1.2.3.4,5.6.7.8"),
                Some("https"),
                Some("example.com"),
                false,
                Some("for=1.2.3.4;host=example.com;proto=https, for=5.6.7.8"),
            ),
            (
                Some("2001:db8::1, 1.2.3.4"),
                None,
                None,
                false,
                Some("for=\"[2001:db8::1]\", for=1.2.3.4"),
            ),
            (None, Some("http"), None, false, Some("proto=http")),
            (None, None, Some("h"), false, Some("host=h")),
            (
                None,
                Some("http"),
                Some("h"),
                false,
                Some("host=h;proto=http"),
            ),
        ];
        for &(xff, xfp, xfh, forwarded, expected) in table {
            let seen = QueueProxySeen {
                forwarded,
                forwarded_for: xff.map(str::as_bytes),
                forwarded_proto: xfp.map(str::as_bytes),
                forwarded_host: xfh.map(str::as_bytes),
                ..QueueProxySeen::default()
            };
            let shim = seen.forwarded_shim().map(|v| String::from_utf8(v).unwrap());
            assert_eq!(shim.as_deref(), expected, "{xff:?} {xfp:?} {xfh:?}");
        }
        let seen = QueueProxySeen {
            original_host: Some(b"app.example.com"),
            ..QueueProxySeen::default()
        };
        assert_eq!(
            seen.host(Some(b"10.0.0.1:8012")),
            Some(&b"app.example.com"[..])
        );
        assert_eq!(QueueProxySeen::default().host(Some(b"c")), Some(&b"c"[..]));
    }

    #[test]
    fn a_wait_is_told_in_milliseconds_and_a_cold_start_by_its_own_field() {
        // (waits as (µs, cold), the fields a response gets)
        type Row = (
            &'static [(u64, bool)],
            &'static [(&'static str, &'static str)],
        );
        let table: &[Row] = &[
            (&[(412, false)], &[("Server-Timing", "activator;dur=0.412")]),
            (
                &[(1_500_000, true)],
                &[
                    ("Server-Timing", "activator;dur=1500.000"),
                    ("X-Activator-Cold-Start", "true"),
                ],
            ),
            (
                &[(2_000, true), (30, false)],
                &[
                    ("Server-Timing", "activator;dur=2.030"),
                    ("X-Activator-Cold-Start", "true"),
                ],
            ),
            (
                &[(u64::MAX, false), (5, false)],
                &[("Server-Timing", "activator;dur=18446744073709551.615")],
            ),
        ];
        for (waits, expected) in table {
            let mut note = WaitNote::default();
            for &(us, cold) in *waits {
                note.add(us, cold);
            }
            let mut fields = Vec::new();
            note.response_fields(|name, value| {
                fields.push((name, String::from_utf8(value.to_vec()).unwrap()))
            });
            let expected: Vec<_> = expected.iter().map(|&(n, v)| (n, v.to_string())).collect();
            assert_eq!(fields, expected, "{waits:?}");
        }
    }

    /// What the writer makes of `fields` with tracing on (every trace sampled).
    fn written_traced<const EDITS: u8>(fields: &[(&str, &str)]) -> Vec<String> {
        use kactivator_api::trace::{IdGenerator, Sampler};
        let pairs: Vec<(&[u8], &[u8])> = fields
            .iter()
            .map(|(name, value)| (name.as_bytes(), value.as_bytes()))
            .collect();
        let mut lines = Lines::default();
        let mut ids = IdGenerator::new(1);
        let mut decider = Decider::new(&mut ids, Sampler::new(1.0).unwrap());
        write_fields::<_, _, _, EDITS>(
            fields,
            || pairs.iter().copied(),
            b"10.0.0.9",
            false,
            &mut lines,
            Some(&mut decider),
        );
        assert!(decider.decided.is_some());
        lines.0
    }

    #[test]
    fn with_tracing_on_every_propagation_header_is_replaced_in_both_roles_and_off_none_is() {
        let fields = [
            ("Host", "hello.example.com"),
            (
                "TraceParent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("tracestate", "vendor=1"),
            ("X-B3-TraceId", "ffffffffffffffffffffffffffffffff"),
            ("X-B3-SpanId", "not-hex"),
            ("x-b3-sampled", "1"),
            ("X-B3-Flags", "1"),
            ("x-b3-parentspanid", "0000000000000001"),
            ("b3", "garbage"),
            ("Accept", "*/*"),
        ];
        for lines in [
            written_traced::<ACTIVATOR>(&fields),
            written_traced::<QUEUE_PROXY>(&fields),
            written_traced::<INTERCEPTOR>(&fields),
        ] {
            let passed: Vec<&String> = lines.iter().filter(|l| !l.starts_with('+')).collect();
            assert_eq!(passed, ["Accept: */*"], "{lines:?}");
            let traceparent = lines
                .iter()
                .find_map(|l| l.strip_prefix("+Trace(TraceParent): "))
                .expect("a traceparent goes on");
            assert!(
                traceparent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
                "the client's trace continues: {traceparent}"
            );
            assert!(!traceparent.contains("b7ad6b7169203331"), "with a new span");
            assert!(lines.contains(&"+Trace(TraceState): vendor=1".to_string()));
            assert!(
                lines.contains(&"+Trace(B3TraceId): 0af7651916cd43dd8448eb211c80319c".to_string())
            );
            assert!(lines.contains(&"+Trace(B3Sampled): 1".to_string()));
            assert!(!lines.iter().any(|l| l.contains("Flags")
                || l.contains("ParentSpanId")
                || l.contains("garbage")));
        }
        let (untouched, _) = written::<ACTIVATOR>(&fields);
        for (name, value) in &fields[1..9] {
            assert!(
                untouched.contains(&format!("{name}: {value}")),
                "tracing off passes {name} as it came: {untouched:?}"
            );
        }
    }
}

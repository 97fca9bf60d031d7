//! Trace context on the way through (issue 39), protocol-neutral and pure: which of the
//! client's fields are propagation headers ([`propagation_field`]), what they say, gathered
//! while the one writer of the header edits (`policy::write_fields`) goes through the fields
//! ([`Gathered`]), the decision `kactivator_api::trace::decide` makes of them with the shard's
//! ids and sampler ([`Decider`]), and the spans a sampled request ends with ([`spans`]).
//!
//! Tracing off, none of this runs: the writer is handed no [`Decider`], and every propagation
//! header passes as it came.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

use kactivator_api::trace::span::{Attribute, FinishedSpan, SpanKind, SpanStatus};
use kactivator_api::trace::{
    self, B3Headers, Forward, IdGenerator, Incoming, Propagation, Sampler, Source, SpanContext,
    SpanId,
};
use kactivator_h1::name_eq;

/// One of the propagation headers `decide` replaces (`trace::PROPAGATION_HEADERS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PropagationField {
    TraceParent,
    TraceState,
    B3,
    B3TraceId,
    B3SpanId,
    B3ParentSpanId,
    B3Sampled,
    B3Flags,
}

impl PropagationField {
    /// The name as `kactivator_api::trace` spells it (what HTTP/1 heads carry).
    pub fn name(self) -> &'static str {
        match self {
            Self::TraceParent => trace::TRACEPARENT,
            Self::TraceState => trace::TRACESTATE,
            Self::B3 => trace::B3,
            Self::B3TraceId => trace::B3_TRACE_ID,
            Self::B3SpanId => trace::B3_SPAN_ID,
            Self::B3ParentSpanId => trace::B3_PARENT_SPAN_ID,
            Self::B3Sampled => trace::B3_SAMPLED,
            Self::B3Flags => trace::B3_FLAGS,
        }
    }
}

/// Which propagation header `name` (any case) is, if any. Only asked while tracing is on.
#[inline]
pub fn propagation_field(name: &[u8]) -> Option<PropagationField> {
    let is = |known: &str| name_eq(name, known.as_bytes());
    Some(match name.len() {
        2 if is(trace::B3) => PropagationField::B3,
        10 if is(trace::TRACESTATE) => PropagationField::TraceState,
        10 if is(trace::B3_FLAGS) => PropagationField::B3Flags,
        11 if is(trace::TRACEPARENT) => PropagationField::TraceParent,
        11 if is(trace::B3_SPAN_ID) => PropagationField::B3SpanId,
        12 if is(trace::B3_TRACE_ID) => PropagationField::B3TraceId,
        12 if is(trace::B3_SAMPLED) => PropagationField::B3Sampled,
        17 if is(trace::B3_PARENT_SPAN_ID) => PropagationField::B3ParentSpanId,
        _ => return None,
    })
}

/// A value no parser takes: what a field that came more than once stands for (RFC 9110 would
/// join them with `,`, which makes each of these formats invalid), so a repeated `traceparent`
/// starts a new trace as the W3C spec wants.
const REPEATED: &[u8] = b",";

/// The propagation headers of one request, as the writer meets them.
#[derive(Debug, Default)]
pub struct Gathered<'a> {
    traceparent: Option<&'a [u8]>,
    tracestate: Option<&'a [u8]>,
    /// Several `tracestate` fields, joined with `,` (the one list they make together).
    tracestate_joined: Option<Vec<u8>>,
    b3: Option<&'a [u8]>,
    x_b3: B3Headers<'a>,
}

impl<'a> Gathered<'a> {
    /// Notes one field.
    pub fn note(&mut self, field: PropagationField, value: &'a [u8]) {
        let once = |slot: &mut Option<&'a [u8]>| {
            *slot = Some(if slot.is_some() { REPEATED } else { value });
        };
        match field {
            PropagationField::TraceParent => once(&mut self.traceparent),
            PropagationField::TraceState => match (&mut self.tracestate_joined, self.tracestate) {
                (Some(joined), _) => {
                    joined.push(b',');
                    joined.extend_from_slice(value);
                }
                (None, Some(first)) => {
                    let mut joined = Vec::with_capacity(first.len() + 1 + value.len());
                    joined.extend_from_slice(first);
                    joined.push(b',');
                    joined.extend_from_slice(value);
                    self.tracestate_joined = Some(joined);
                }
                (None, None) => self.tracestate = Some(value),
            },
            PropagationField::B3 => once(&mut self.b3),
            PropagationField::B3TraceId => once(&mut self.x_b3.trace_id),
            PropagationField::B3SpanId => once(&mut self.x_b3.span_id),
            PropagationField::B3ParentSpanId => once(&mut self.x_b3.parent_span_id),
            PropagationField::B3Sampled => once(&mut self.x_b3.sampled),
            PropagationField::B3Flags => once(&mut self.x_b3.flags),
        }
    }

    /// What came, as `decide` reads it.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming {
            traceparent: self.traceparent,
            tracestate: self.tracestate_joined.as_deref().or(self.tracestate),
            b3: self.b3,
            x_b3: self.x_b3,
        }
    }
}

/// What the shard lends the writer of the header edits while tracing is on: its id generator
/// and sampler, and where the decision is left for the rest of the request. Or, for a request
/// sent again, the decision made the first time ([`Decider::again`]).
pub struct Decider<'t> {
    how: How<'t>,
    pub decided: Option<Decided>,
}

/// Whether a [`Decider`] decides anew or writes a decision again.
enum How<'t> {
    New {
        ids: &'t mut IdGenerator,
        sampler: Sampler,
    },
    Again(Decided),
}

impl<'t> Decider<'t> {
    pub fn new(ids: &'t mut IdGenerator, sampler: Sampler) -> Self {
        Self {
            how: How::New { ids, sampler },
            decided: None,
        }
    }

    /// Writes `decided` again: the same ids, the same sampling.
    pub fn again(decided: Decided) -> Decider<'static> {
        Decider {
            how: How::Again(decided),
            decided: Some(decided),
        }
    }

    /// Decides from what `gathered` saw, keeps the decision, and hands the fields to write to
    /// `put` (name, value).
    pub fn decide(&mut self, gathered: &Gathered<'_>, mut put: impl FnMut(&'static str, &[u8])) {
        let incoming = gathered.incoming();
        let forward = match &mut self.how {
            How::New { ids, sampler } => match trace::decide(&incoming, true, ids, sampler) {
                Propagation::Replace(forward) => forward,
                Propagation::Untouched => return,
            },
            How::Again(decided) => {
                Forward::again(&incoming, decided.context, decided.parent, decided.source)
            }
        };
        for (name, value) in forward.fields() {
            put(name, value);
        }
        self.decided = Some(Decided::of(&forward));
    }
}

/// The decision, kept once the request's fields are gone: the context the pod was sent (its
/// span id is the client span's, [`spans`]) and the caller's span, when the trace continues one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided {
    pub context: SpanContext,
    pub parent: Option<SpanId>,
    pub source: Source,
}

impl Decided {
    fn of(forward: &Forward<'_>) -> Self {
        Self {
            context: forward.context,
            parent: forward.parent_span_id,
            source: forward.source,
        }
    }
}

/// Which role's span names and nesting (upstream release-1.23): the activator's `otelhttp`
/// handler span `handle` (`cmd/activator/main.go:264`), its children `throttler_try` (the wait
/// for capacity) and `activator_proxy` (`pkg/activator/handler/handler.go:113,128`), under
/// which the transport's client span goes to the pod; the queue-proxy's handler span `queue`
/// (`pkg/queue/sharedmain/handlers.go:98`), its child `kn.queueproxy.proxy`, under which
/// `kn.queueproxy.wait` (the breaker) and the client span to the app
/// (`pkg/queue/handler.go:45,67`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanNames {
    Activator,
    QueueProxy,
    /// KEDA's HTTP add-on's interceptor: the activator's spans, under its own role name.
    Interceptor,
}

/// What a traced request did, measured as offsets from its arrival (the clock is the
/// caller's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// When the last admission gave the request a slot (the end of the wait span).
    pub admitted: Option<Duration>,
    /// When the first attempt on a pod began (the start of the client span).
    pub first_attempt: Option<Duration>,
    /// Attempts on pods made.
    pub attempts: u32,
    /// The pod of the last attempt.
    pub pod: Option<SocketAddr>,
    /// The request waited in the queue, and for how long in total (microseconds).
    pub waited_us: Option<u64>,
    /// A wait found no routable pod: a cold start.
    pub cold_start: bool,
}

/// What the spans say about the request itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described<'r> {
    pub method: &'r str,
    pub path: &'r str,
    pub namespace: &'r str,
    pub revision: &'r str,
    /// The status the client got.
    pub status: u16,
    /// Why the request failed, when the proxy answered it with an error of its own.
    pub error: Option<String>,
    pub shard: usize,
}

/// The request's spans, ids from `ids`, times as Unix nanoseconds: `arrival_unix_nanos` is the
/// wall clock at the arrival, `total` the time from the arrival to the end.
pub fn spans(
    names: SpanNames,
    decided: &Decided,
    ids: &mut IdGenerator,
    timeline: &Timeline,
    described: &Described<'_>,
    arrival_unix_nanos: u64,
    total: Duration,
) -> Vec<FinishedSpan> {
    let at = |offset: Duration| arrival_unix_nanos.saturating_add(offset.as_nanos() as u64);
    let end = at(total);
    let trace_id = decided.context.trace_id;
    let server_id = ids.span_id();
    let proxy_id = ids.span_id();
    let wait_id = ids.span_id();
    let failed = described
        .error
        .as_ref()
        .map(|error| SpanStatus::Error(error.clone().into()));
    let server_status = match (&failed, described.status) {
        (Some(status), _) => status.clone(),
        // otelhttp: a 5xx the server answered is an error.
        (None, status) if status >= 500 => SpanStatus::Error(Cow::Owned(format!("{status}"))),
        (None, _) => SpanStatus::Unset,
    };
    let mut server_attributes = vec![
        Attribute::str("http.request.method", described.method.to_owned()),
        Attribute::str("url.path", described.path.to_owned()),
        Attribute::int("http.response.status_code", described.status.into()),
        Attribute::str("k8s.namespace.name", described.namespace.to_owned()),
        Attribute::str("kn.revision.name", described.revision.to_owned()),
        Attribute::str(
            "kactivator.role",
            match names {
                SpanNames::Activator => "activator",
                SpanNames::QueueProxy => "queue-proxy",
                SpanNames::Interceptor => "keda-http",
            },
        ),
        Attribute::int("kactivator.shard", described.shard as i64),
        Attribute::int("kactivator.attempts", timeline.attempts.into()),
    ];
    if let Some(waited) = timeline.waited_us {
        server_attributes.push(Attribute::int("kactivator.wait_us", waited as i64));
    }
    if timeline.cold_start {
        server_attributes.push(Attribute::bool("kactivator.cold_start", true));
    }
    if let Some(pod) = timeline.pod {
        server_attributes.push(Attribute::str("kactivator.pod", pod.to_string()));
    }
    let span =
        |span_id, parent, name: &'static str, kind, start, end, status, attributes| FinishedSpan {
            trace_id,
            span_id,
            parent_span_id: parent,
            name: Cow::Borrowed(name),
            kind,
            start_unix_nanos: start,
            end_unix_nanos: end,
            status,
            attributes,
        };
    let admitted = timeline.admitted.map(at);
    let mut out = Vec::with_capacity(4);
    let (server_name, proxy_name, wait_name, wait_parent) = match names {
        SpanNames::Activator | SpanNames::Interceptor => {
            ("handle", "activator_proxy", "throttler_try", server_id)
        }
        SpanNames::QueueProxy => (
            "queue",
            "kn.queueproxy.proxy",
            "kn.queueproxy.wait",
            proxy_id,
        ),
    };
    out.push(span(
        server_id,
        decided.parent,
        server_name,
        SpanKind::Server,
        arrival_unix_nanos,
        end,
        server_status,
        server_attributes,
    ));
    // The wait: from the arrival to the slot, or to the end when none was had.
    let wait_status = match admitted {
        Some(_) => SpanStatus::Unset,
        None => failed.clone().unwrap_or(SpanStatus::Unset),
    };
    out.push(span(
        wait_id,
        Some(wait_parent),
        wait_name,
        SpanKind::Internal,
        arrival_unix_nanos,
        admitted.unwrap_or(end),
        wait_status,
        Vec::new(),
    ));
    // The proxy span: the activator's from the slot to the end; the queue-proxy's covers the
    // whole request but the probe check, as upstream's.
    let proxy_start = match names {
        SpanNames::Activator | SpanNames::Interceptor => admitted,
        SpanNames::QueueProxy => Some(arrival_unix_nanos),
    };
    if let Some(start) = proxy_start {
        out.push(span(
            proxy_id,
            Some(server_id),
            proxy_name,
            SpanKind::Internal,
            start,
            end,
            SpanStatus::Unset,
            Vec::new(),
        ));
    }
    if let (Some(first), Some(_)) = (timeline.first_attempt, proxy_start) {
        let mut attributes = vec![
            Attribute::str("http.request.method", described.method.to_owned()),
            Attribute::int("http.response.status_code", described.status.into()),
        ];
        if let Some(pod) = timeline.pod {
            attributes.push(Attribute::str("server.address", pod.ip().to_string()));
            attributes.push(Attribute::int("server.port", pod.port().into()));
        }
        let mut client = span(
            decided.context.span_id,
            Some(proxy_id),
            "",
            SpanKind::Client,
            at(first),
            end,
            failed.unwrap_or(SpanStatus::Unset),
            attributes,
        );
        // otelhttp's transport names its span after the method (semantic conventions).
        client.name = Cow::Owned(described.method.to_owned());
        out.push(client);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_propagation_header_is_known_in_any_case_and_nothing_else() {
        for name in trace::PROPAGATION_HEADERS {
            for spelled in [
                name.to_string(),
                name.to_ascii_uppercase(),
                name.to_ascii_lowercase(),
            ] {
                assert!(propagation_field(spelled.as_bytes()).is_some(), "{spelled}");
            }
        }
        for name in [
            "te",
            "x-b3",
            "traceparentx",
            "tracestat",
            "x-request-id",
            "host",
            "",
        ] {
            assert_eq!(propagation_field(name.as_bytes()), None, "{name}");
        }
    }

    #[test]
    fn repeated_fields_are_invalid_but_tracestates_join() {
        let mut gathered = Gathered::default();
        gathered.note(PropagationField::TraceParent, b"a");
        gathered.note(PropagationField::TraceParent, b"b");
        gathered.note(PropagationField::TraceState, b"x=1");
        gathered.note(PropagationField::TraceState, b"y=2");
        gathered.note(PropagationField::TraceState, b"z=3");
        gathered.note(PropagationField::B3, b"c");
        let incoming = gathered.incoming();
        assert_eq!(incoming.traceparent, Some(REPEATED));
        assert_eq!(incoming.tracestate, Some(&b"x=1,y=2,z=3"[..]));
        assert_eq!(incoming.b3, Some(&b"c"[..]));
    }

    const PARENT: &[u8] = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn decide(gathered: &Gathered<'_>, ratio: f64) -> (Option<Decided>, Vec<(String, Vec<u8>)>) {
        let mut ids = IdGenerator::new(7);
        let mut decider = Decider::new(&mut ids, Sampler::new(ratio).unwrap());
        let mut written = Vec::new();
        decider.decide(gathered, |name, value| {
            written.push((name.to_string(), value.to_vec()))
        });
        (decider.decided, written)
    }

    #[test]
    fn a_valid_parent_is_continued_with_a_new_span_and_its_decision() {
        let mut gathered = Gathered::default();
        gathered.note(PropagationField::TraceParent, PARENT);
        gathered.note(PropagationField::TraceState, b"vendor=1");
        let (decided, written) = decide(&gathered, 0.0);
        let decided = decided.unwrap();
        assert_eq!(decided.source, Source::TraceContext);
        assert_eq!(
            decided.context.trace_id.to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(decided.parent.unwrap().to_string(), "b7ad6b7169203331");
        assert!(
            decided.context.sampled,
            "the parent's decision wins over ratio 0"
        );
        let traceparent = &written.iter().find(|(n, _)| n == "traceparent").unwrap().1;
        assert_eq!(&traceparent[..36], &PARENT[..36]);
        assert_ne!(&traceparent[36..52], &PARENT[36..52]);
        assert_eq!(
            written.iter().find(|(n, _)| n == "tracestate").unwrap().1,
            b"vendor=1"
        );
    }

    #[test]
    fn a_repeated_traceparent_starts_a_new_trace() {
        let mut gathered = Gathered::default();
        gathered.note(PropagationField::TraceParent, PARENT);
        gathered.note(PropagationField::TraceParent, PARENT);
        let (decided, written) = decide(&gathered, 1.0);
        let decided = decided.unwrap();
        assert_eq!(decided.source, Source::Fresh);
        assert_eq!(decided.parent, None);
        assert!(!written.iter().any(|(n, _)| n == "tracestate"));
    }

    fn described(status: u16, error: Option<&str>) -> Described<'static> {
        Described {
            method: "GET",
            path: "/predict",
            namespace: "ns",
            revision: "rev-1",
            status,
            error: error.map(str::to_owned),
            shard: 1,
        }
    }

    #[test]
    fn the_activator_nests_its_spans_as_upstream_and_the_pod_sees_the_client_span() {
        let mut gathered = Gathered::default();
        gathered.note(PropagationField::TraceParent, PARENT);
        let (decided, _) = decide(&gathered, 1.0);
        let decided = decided.unwrap();
        let timeline = Timeline {
            admitted: Some(Duration::from_millis(5)),
            first_attempt: Some(Duration::from_millis(6)),
            attempts: 1,
            pod: Some("10.0.0.7:8012".parse().unwrap()),
            waited_us: Some(5_000),
            cold_start: true,
        };
        let mut ids = IdGenerator::new(9);
        let spans = spans(
            SpanNames::Activator,
            &decided,
            &mut ids,
            &timeline,
            &described(200, None),
            1_000_000_000,
            Duration::from_millis(10),
        );
        let by_name = |name: &str| spans.iter().find(|s| s.name == name).unwrap();
        let (server, wait, proxy, client) = (
            by_name("handle"),
            by_name("throttler_try"),
            by_name("activator_proxy"),
            by_name("GET"),
        );
        assert_eq!(server.parent_span_id, decided.parent);
        assert_eq!(wait.parent_span_id, Some(server.span_id));
        assert_eq!(proxy.parent_span_id, Some(server.span_id));
        assert_eq!(client.parent_span_id, Some(proxy.span_id));
        assert_eq!(client.span_id, decided.context.span_id);
        assert_eq!(client.kind, SpanKind::Client);
        assert_eq!(server.kind, SpanKind::Server);
        assert!(spans.iter().all(|s| s.trace_id == decided.context.trace_id));
        assert_eq!(wait.end_unix_nanos, 1_005_000_000);
        assert_eq!(proxy.start_unix_nanos, 1_005_000_000);
        assert_eq!(client.start_unix_nanos, 1_006_000_000);
        assert_eq!(server.end_unix_nanos, 1_010_000_000);
        assert!(server
            .attributes
            .contains(&Attribute::bool("kactivator.cold_start", true)));
        assert!(server
            .attributes
            .contains(&Attribute::str("kactivator.pod", "10.0.0.7:8012")));
    }

    #[test]
    fn a_request_never_admitted_has_a_failed_wait_and_no_proxy_span() {
        let (decided, _) = decide(&Gathered::default(), 1.0);
        let decided = decided.unwrap();
        let mut ids = IdGenerator::new(9);
        let spans = spans(
            SpanNames::Activator,
            &decided,
            &mut ids,
            &Timeline::default(),
            &described(503, Some("request timed out in the queue")),
            0,
            Duration::from_secs(1),
        );
        assert_eq!(
            spans.iter().map(|s| &*s.name).collect::<Vec<_>>(),
            ["handle", "throttler_try"]
        );
        assert_eq!(spans[0].parent_span_id, None);
        assert!(matches!(spans[1].status, SpanStatus::Error(_)));
    }

    #[test]
    fn the_queue_proxy_waits_inside_its_proxy_span() {
        let (decided, _) = decide(&Gathered::default(), 1.0);
        let decided = decided.unwrap();
        let timeline = Timeline {
            admitted: Some(Duration::from_millis(1)),
            first_attempt: Some(Duration::from_millis(1)),
            attempts: 1,
            ..Timeline::default()
        };
        let mut ids = IdGenerator::new(9);
        let spans = spans(
            SpanNames::QueueProxy,
            &decided,
            &mut ids,
            &timeline,
            &described(200, None),
            0,
            Duration::from_millis(3),
        );
        let by_name = |name: &str| spans.iter().find(|s| s.name == name).unwrap();
        let (server, proxy, wait, client) = (
            by_name("queue"),
            by_name("kn.queueproxy.proxy"),
            by_name("kn.queueproxy.wait"),
            by_name("GET"),
        );
        assert_eq!(proxy.parent_span_id, Some(server.span_id));
        assert_eq!(wait.parent_span_id, Some(proxy.span_id));
        assert_eq!(client.parent_span_id, Some(proxy.span_id));
        assert_eq!(client.span_id, decided.context.span_id);
    }
}

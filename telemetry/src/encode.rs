//! Finished spans and metric snapshots into what each protocol sends: pure functions, no I/O.
//!
//! * [`otlp`]: an `ExportTraceServiceRequest` (OTLP/HTTP's body, OTLP/gRPC's message);
//! * [`metrics`]: an `ExportMetricsServiceRequest`, from a [`crate::metrics::Snapshot`];
//! * [`zipkin`]: Zipkin's v2 JSON list of spans;
//! * [`stdout`]: one JSON object per span, one per line.

pub mod metrics;
pub mod otlp;
pub mod stdout;
pub mod zipkin;

/// Spans as a shard records one proxied request, for the encoders' tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::borrow::Cow;

    use kactivator_api::trace::span::{
        Attribute, AttributeValue, FinishedSpan, SpanKind, SpanStatus,
    };
    use kactivator_api::trace::{SpanId, TraceId};

    use crate::Resource;

    pub const TRACE: [u8; 16] = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    /// The caller's span, the parent of the server span (remote).
    pub const CALLER: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
    pub const SERVER: [u8; 8] = [0x11; 8];
    pub const WAIT: [u8; 8] = [0x22; 8];
    pub const CLIENT: [u8; 8] = [0x33; 8];
    /// 2024-01-02T03:04:05.678901234Z
    pub const START: u64 = 1_704_164_645_678_901_234;

    pub fn resource() -> Resource {
        Resource {
            service_name: "activator".into(),
            instance_id: Some("activator-5d4c7b9f8-x2x7q".into()),
            attributes: vec![("k8s.namespace.name".into(), "knative-serving".into())],
        }
    }

    /// A server span (child of the caller's), the wait for a slot inside it (an error), and
    /// the request to the pod (a client span).
    pub fn spans() -> Vec<FinishedSpan> {
        let trace_id = TraceId::new(TRACE).unwrap();
        let span = |id: [u8; 8]| SpanId::new(id).unwrap();
        vec![
            FinishedSpan {
                trace_id,
                span_id: span(SERVER),
                parent_span_id: Some(span(CALLER)),
                name: Cow::Borrowed("activator_proxy"),
                kind: SpanKind::Server,
                start_unix_nanos: START,
                end_unix_nanos: START + 2_500_000,
                status: SpanStatus::Unset,
                attributes: vec![
                    Attribute::str("http.request.method", "GET"),
                    Attribute::int("http.response.status_code", 200),
                    Attribute::bool("kactivator.cold_start", true),
                    Attribute {
                        key: "kactivator.wait_seconds",
                        value: AttributeValue::Double(0.25),
                    },
                ],
            },
            FinishedSpan {
                trace_id,
                span_id: span(WAIT),
                parent_span_id: Some(span(SERVER)),
                name: Cow::Borrowed("throttler_try"),
                kind: SpanKind::Internal,
                start_unix_nanos: START + 1_000,
                end_unix_nanos: START + 1_200,
                status: SpanStatus::Error(Cow::Borrowed("no capacity: queue full")),
                attributes: vec![Attribute::int("kactivator.attempts", 3)],
            },
            FinishedSpan {
                trace_id,
                span_id: span(CLIENT),
                parent_span_id: Some(span(SERVER)),
                name: Cow::Borrowed("HTTP GET"),
                kind: SpanKind::Client,
                start_unix_nanos: START + 2_000,
                end_unix_nanos: START + 2_000_000,
                status: SpanStatus::Unset,
                attributes: vec![Attribute::str("server.address", "10.0.3.7")],
            },
        ]
    }

    /// A root span: no parent.
    pub fn root() -> FinishedSpan {
        FinishedSpan {
            parent_span_id: None,
            ..spans().remove(0)
        }
    }
}

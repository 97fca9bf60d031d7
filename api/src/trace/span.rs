//! A finished span, as a shard records it and the control thread's exporters send it (issue 39).
//!
//! Plain data: a shard fills one in when a sampled request ends and hands a batch of them to the
//! control thread ([`SpanBatch`]); the exporters (`control::telemetry`) turn them into OTLP
//! protobuf, Zipkin v2 JSON or stdout lines. Times are Unix nanoseconds, read once per span from
//! the wall clock by the shard.

use std::borrow::Cow;

use super::{SpanId, TraceId};

/// OpenTelemetry's span kinds that kactivator records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// A step inside the proxy (`throttler_try`, `activator_proxy`, `kn.queueproxy.wait`).
    Internal,
    /// The request as the proxy received it (upstream's `otelhttp` handler span).
    Server,
    /// The request as the proxy sent it to the pod or the app (upstream's `otelhttp`
    /// transport span); its id is the parent the pod sees in `traceparent`.
    Client,
}

/// How a span ended, as OpenTelemetry's status codes say it (Ok is never set by a proxy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpanStatus {
    Unset,
    /// `Error`, with its description.
    Error(Cow<'static, str>),
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttributeValue {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
    Double(f64),
}

/// One attribute; keys are OpenTelemetry's semantic conventions or kactivator's own
/// (`kactivator.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct Attribute {
    pub key: &'static str,
    pub value: AttributeValue,
}

impl Attribute {
    pub fn str(key: &'static str, value: impl Into<Cow<'static, str>>) -> Self {
        Self {
            key,
            value: AttributeValue::Str(value.into()),
        }
    }

    pub fn int(key: &'static str, value: i64) -> Self {
        Self {
            key,
            value: AttributeValue::Int(value),
        }
    }

    pub fn bool(key: &'static str, value: bool) -> Self {
        Self {
            key,
            value: AttributeValue::Bool(value),
        }
    }
}

/// A span that has ended.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedSpan {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The span this one is a child of; `None` for a root.
    pub parent_span_id: Option<SpanId>,
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    /// Unix time in nanoseconds.
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub status: SpanStatus,
    pub attributes: Vec<Attribute>,
}

/// What a shard hands the control thread: the spans that ended since its last batch, and how
/// many it dropped because its buffer was full.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpanBatch {
    pub spans: Vec<FinishedSpan>,
    pub dropped: u64,
}

//! Spans into OTLP's `ExportTraceServiceRequest`: one `ResourceSpans` for this process, one
//! `ScopeSpans` for kactivator, as OpenTelemetry's trace data model maps each field.

use kactivator_api::trace::span::{Attribute, AttributeValue, FinishedSpan, SpanKind, SpanStatus};

use crate::proto::collector::ExportTraceServiceRequest;
use crate::proto::common::{any_value, AnyValue, InstrumentationScope, KeyValue};
use crate::proto::resource::Resource as ProtoResource;
use crate::proto::trace::{span, status, ResourceSpans, ScopeSpans, Span, Status};
use crate::{Resource, SCOPE_NAME, SCOPE_VERSION};

/// W3C Trace Context's `sampled` flag, the low byte of OTLP's `Span.flags`. Every span
/// exported was sampled: shards record no other.
pub const SAMPLED: u32 = 0x01;

/// The request that exports `spans` on behalf of `resource`.
pub fn request(spans: &[FinishedSpan], resource: &Resource) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource_of(resource)),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: spans.iter().map(span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The process's resource, as every OTLP message carries it: string attributes, `service.name`
/// first.
pub fn resource_of(resource: &Resource) -> ProtoResource {
    ProtoResource {
        attributes: resource
            .all_attributes()
            .map(|(key, value)| string_attribute(key, value))
            .collect(),
        ..Default::default()
    }
}

/// kactivator as the instrumentation scope.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE_NAME.to_owned(),
        version: SCOPE_VERSION.to_owned(),
        ..Default::default()
    }
}

/// One span. `parent_span_id` is empty for a root; `flags` carries the sampled bit and leaves
/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE` unset, since a finished span does not say whether its
/// parent came from another process.
pub fn span(span: &FinishedSpan) -> Span {
    Span {
        trace_id: span.trace_id.to_bytes().to_vec(),
        span_id: span.span_id.to_bytes().to_vec(),
        parent_span_id: span
            .parent_span_id
            .map_or_else(Vec::new, |parent| parent.to_bytes().to_vec()),
        flags: SAMPLED,
        name: span.name.clone().into_owned(),
        kind: kind(span.kind) as i32,
        start_time_unix_nano: span.start_unix_nanos,
        end_time_unix_nano: span.end_unix_nanos,
        attributes: span.attributes.iter().map(attribute).collect(),
        status: match &span.status {
            // An unset status is the message's default: leave it out.
            SpanStatus::Unset => None,
            SpanStatus::Error(description) => Some(Status {
                message: description.clone().into_owned(),
                code: status::StatusCode::Error as i32,
            }),
        },
        ..Default::default()
    }
}

pub fn kind(kind: SpanKind) -> span::SpanKind {
    match kind {
        SpanKind::Internal => span::SpanKind::Internal,
        SpanKind::Server => span::SpanKind::Server,
        SpanKind::Client => span::SpanKind::Client,
    }
}

pub fn attribute(attribute: &Attribute) -> KeyValue {
    let value = match &attribute.value {
        AttributeValue::Str(value) => any_value::Value::StringValue(value.clone().into_owned()),
        AttributeValue::Int(value) => any_value::Value::IntValue(*value),
        AttributeValue::Bool(value) => any_value::Value::BoolValue(*value),
        AttributeValue::Double(value) => any_value::Value::DoubleValue(*value),
    };
    KeyValue {
        key: attribute.key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::encode::fixtures::{self, CALLER, CLIENT, SERVER, START, TRACE, WAIT};

    /// Encodes and decodes again, as a collector would read the bytes.
    fn round_trip(spans: &[FinishedSpan]) -> ExportTraceServiceRequest {
        let bytes = request(spans, &fixtures::resource()).encode_to_vec();
        ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap()
    }

    fn value(attributes: &[KeyValue], key: &str) -> Option<any_value::Value> {
        let found = attributes.iter().find(|kv| kv.key == key)?;
        found.value.as_ref()?.value.clone()
    }

    #[test]
    fn one_resource_and_one_kactivator_scope_hold_every_span() {
        let decoded = round_trip(&fixtures::spans());
        assert_eq!(decoded.resource_spans.len(), 1);
        let resource_spans = &decoded.resource_spans[0];
        let resource = resource_spans.resource.as_ref().unwrap();
        let string = |s: &str| Some(any_value::Value::StringValue(s.into()));
        assert_eq!(
            value(&resource.attributes, "service.name"),
            string("activator")
        );
        assert_eq!(
            value(&resource.attributes, "service.instance.id"),
            string("activator-5d4c7b9f8-x2x7q")
        );
        assert_eq!(
            value(&resource.attributes, "k8s.namespace.name"),
            string("knative-serving")
        );
        assert_eq!(resource_spans.scope_spans.len(), 1);
        let scope = resource_spans.scope_spans[0].scope.as_ref().unwrap();
        assert_eq!(scope.name, "kactivator");
        assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(resource_spans.scope_spans[0].spans.len(), 3);
    }

    #[test]
    fn ids_parents_kinds_times_and_flags_are_as_recorded() {
        let decoded = round_trip(&fixtures::spans());
        let spans = &decoded.resource_spans[0].scope_spans[0].spans;
        let expected = [
            (
                SERVER,
                CALLER,
                "activator_proxy",
                span::SpanKind::Server,
                START,
                START + 2_500_000,
            ),
            (
                WAIT,
                SERVER,
                "throttler_try",
                span::SpanKind::Internal,
                START + 1_000,
                START + 1_200,
            ),
            (
                CLIENT,
                SERVER,
                "HTTP GET",
                span::SpanKind::Client,
                START + 2_000,
                START + 2_000_000,
            ),
        ];
        for (span, (id, parent, name, kind, start, end)) in spans.iter().zip(expected) {
            assert_eq!(span.trace_id, TRACE);
            assert_eq!(span.span_id, id);
            assert_eq!(span.parent_span_id, parent);
            assert_eq!(span.name, name);
            assert_eq!(span.kind(), kind);
            assert_eq!(span.start_time_unix_nano, start);
            assert_eq!(span.end_time_unix_nano, end);
            assert_eq!(span.flags, 0x01, "sampled, is-remote unknown");
            assert_eq!(span.trace_state, "");
        }
    }

    #[test]
    fn a_root_span_has_an_empty_parent_span_id() {
        let decoded = round_trip(&[fixtures::root()]);
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert!(span.parent_span_id.is_empty());
    }

    #[test]
    fn attributes_keep_their_types_and_errors_their_description() {
        let decoded = round_trip(&fixtures::spans());
        let spans = &decoded.resource_spans[0].scope_spans[0].spans;
        let server = &spans[0].attributes;
        assert_eq!(
            value(server, "http.request.method"),
            Some(any_value::Value::StringValue("GET".into()))
        );
        assert_eq!(
            value(server, "http.response.status_code"),
            Some(any_value::Value::IntValue(200))
        );
        assert_eq!(
            value(server, "kactivator.cold_start"),
            Some(any_value::Value::BoolValue(true))
        );
        assert_eq!(
            value(server, "kactivator.wait_seconds"),
            Some(any_value::Value::DoubleValue(0.25))
        );
        assert_eq!(spans[0].status, None, "unset");
        let error = spans[1].status.as_ref().unwrap();
        assert_eq!(error.code(), status::StatusCode::Error);
        assert_eq!(error.message, "no capacity: queue full");
    }
}

//! Spans into Zipkin's v2 JSON (`ListOfSpans` in openzipkin/zipkin-api's `zipkin2-api.yaml`),
//! mapped as OpenTelemetry's Go Zipkin exporter maps them (`exporters/zipkin/model.go`):
//!
//! * `traceId`: 32 lowercase hex digits; `id`, `parentId` (absent for a root): 16;
//! * `kind`: `SERVER` or `CLIENT`, absent for an internal span;
//! * `timestamp`, `duration`: microseconds (the start rounded down; the duration rounded to
//!   the nearest microsecond and at least 1, as the model requires);
//! * `localEndpoint.serviceName`: the resource's `service.name`;
//! * `tags`, all strings: the span's attributes, then the resource's, then for an Error status
//!   `otel.status_code` = `ERROR` and `error` = its description, then `otel.scope.name` and
//!   `otel.scope.version`.
//!
//! Not written: `remoteEndpoint` (the Go exporter derives it from peer attributes; the pod
//! chosen is a tag here), `annotations` (kactivator records no span events), `debug`, `shared`.

use std::collections::BTreeMap;

use kactivator_api::trace::span::{AttributeValue, FinishedSpan, SpanKind, SpanStatus};
use serde::Serialize;

use crate::{Resource, SCOPE_NAME, SCOPE_VERSION};

/// The tag OpenTelemetry's Zipkin exporter writes the status code to (`ERROR`).
pub const STATUS_CODE_TAG: &str = "otel.status_code";
/// The tag that holds an Error status's description.
pub const ERROR_TAG: &str = "error";

/// One span as Zipkin's v2 model has it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZipkinSpan<'a> {
    pub trace_id: String,
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub name: &'a str,
    pub timestamp: u64,
    pub duration: u64,
    pub local_endpoint: Endpoint<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<&'a str, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint<'a> {
    pub service_name: &'a str,
}

/// The JSON body that posts `spans`: an array of [`ZipkinSpan`]s.
pub fn body(spans: &[FinishedSpan], resource: &Resource) -> Vec<u8> {
    let spans: Vec<ZipkinSpan<'_>> = spans.iter().map(|s| span(s, resource)).collect();
    // Serializing plain strings and integers into a Vec cannot fail.
    serde_json::to_vec(&spans).expect("Zipkin spans serialize")
}

pub fn span<'a>(span: &'a FinishedSpan, resource: &'a Resource) -> ZipkinSpan<'a> {
    let mut tags: BTreeMap<&'a str, String> = span
        .attributes
        .iter()
        .map(|attribute| (attribute.key, tag_value(&attribute.value)))
        .collect();
    for (key, value) in resource.all_attributes() {
        tags.insert(key, value.to_owned());
    }
    if let SpanStatus::Error(description) = &span.status {
        tags.insert(STATUS_CODE_TAG, "ERROR".to_owned());
        tags.insert(ERROR_TAG, description.clone().into_owned());
    } else {
        // The Go exporter removes an `error` attribute unless the status is Error.
        tags.remove(ERROR_TAG);
    }
    tags.insert("otel.scope.name", SCOPE_NAME.to_owned());
    tags.insert("otel.scope.version", SCOPE_VERSION.to_owned());
    let nanos = span.end_unix_nanos.saturating_sub(span.start_unix_nanos);
    ZipkinSpan {
        trace_id: span.trace_id.to_string(),
        id: span.span_id.to_string(),
        parent_id: span.parent_span_id.map(|parent| parent.to_string()),
        kind: match span.kind {
            SpanKind::Server => Some("SERVER"),
            SpanKind::Client => Some("CLIENT"),
            SpanKind::Internal => None,
        },
        name: &span.name,
        timestamp: span.start_unix_nanos / 1_000,
        duration: ((nanos + 500) / 1_000).max(1),
        local_endpoint: Endpoint {
            service_name: &resource.service_name,
        },
        tags,
    }
}

fn tag_value(value: &AttributeValue) -> String {
    match value {
        AttributeValue::Str(value) => value.clone().into_owned(),
        AttributeValue::Int(value) => value.to_string(),
        AttributeValue::Bool(value) => value.to_string(),
        AttributeValue::Double(value) => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::encode::fixtures::{self, START};

    fn parsed(spans: &[FinishedSpan]) -> Vec<Value> {
        let body = body(spans, &fixtures::resource());
        match serde_json::from_slice(&body).unwrap() {
            Value::Array(spans) => spans,
            other => panic!("not a JSON array: {other}"),
        }
    }

    /// Zipkin v2's rules for a span's ids: lowercase hex of the right length, not all zeros.
    fn is_id(value: &Value, len: usize) -> bool {
        value.as_str().is_some_and(|id| {
            id.len() == len
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                && id.bytes().any(|b| b != b'0')
        })
    }

    #[test]
    fn every_span_follows_the_v2_model() {
        for span in parsed(&fixtures::spans()) {
            let object = span.as_object().unwrap();
            for key in object.keys() {
                assert!(
                    [
                        "traceId",
                        "id",
                        "parentId",
                        "kind",
                        "name",
                        "timestamp",
                        "duration",
                        "localEndpoint",
                        "tags"
                    ]
                    .contains(&key.as_str()),
                    "{key}"
                );
            }
            assert!(is_id(&span["traceId"], 32), "{span}");
            assert!(is_id(&span["id"], 16), "{span}");
            assert!(is_id(&span["parentId"], 16), "{span}");
            assert!(span["timestamp"].as_u64().unwrap() > 0);
            assert!(span["duration"].as_u64().unwrap() >= 1);
            assert!(span["tags"]
                .as_object()
                .unwrap()
                .values()
                .all(Value::is_string));
            assert_eq!(span["localEndpoint"], json!({"serviceName": "activator"}));
        }
    }

    #[test]
    fn fields_map_as_opentelemetrys_zipkin_exporter_maps_them() {
        let spans = parsed(&fixtures::spans());
        let server = &spans[0];
        assert_eq!(server["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(server["id"], "1111111111111111");
        assert_eq!(server["parentId"], "00f067aa0ba902b7");
        assert_eq!(server["kind"], "SERVER");
        assert_eq!(server["name"], "activator_proxy");
        assert_eq!(server["timestamp"], START / 1_000);
        assert_eq!(server["duration"], 2_500);
        assert_eq!(
            server["tags"],
            json!({
                "http.request.method": "GET",
                "http.response.status_code": "200",
                "kactivator.cold_start": "true",
                "kactivator.wait_seconds": "0.25",
                "service.name": "activator",
                "service.instance.id": "activator-5d4c7b9f8-x2x7q",
                "k8s.namespace.name": "knative-serving",
                "otel.scope.name": "kactivator",
                "otel.scope.version": env!("CARGO_PKG_VERSION"),
            })
        );
        assert_eq!(spans[2]["kind"], "CLIENT");
        assert_eq!(spans[2]["parentId"], "1111111111111111");
    }

    #[test]
    fn an_internal_span_has_no_kind_and_an_error_is_tagged() {
        let spans = parsed(&fixtures::spans());
        let wait = &spans[1];
        assert!(wait.get("kind").is_none());
        assert_eq!(wait["tags"]["error"], "no capacity: queue full");
        assert_eq!(wait["tags"]["otel.status_code"], "ERROR");
        assert!(spans[0]["tags"].get("otel.status_code").is_none());
        assert!(spans[0]["tags"].get("error").is_none());
    }

    #[test]
    fn a_root_has_no_parent_id_and_a_short_span_lasts_one_microsecond() {
        let mut root = fixtures::root();
        root.end_unix_nanos = root.start_unix_nanos + 200;
        let spans = parsed(&[root]);
        assert!(spans[0].get("parentId").is_none());
        assert_eq!(spans[0]["duration"], 1);
    }
}

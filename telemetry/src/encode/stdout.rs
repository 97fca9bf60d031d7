//! Spans as lines for `tracing-protocol: stdout`: one JSON object per span, each on its own
//! line, so `grep` and `jq` read them. (Knative's stdout exporter pretty-prints Go's span
//! structs over many lines; this is kactivator's own, smaller format.) The fields:
//!
//! | field | value |
//! |---|---|
//! | `trace_id` | 32 lowercase hex digits |
//! | `span_id` | 16 lowercase hex digits |
//! | `parent_span_id` | 16 lowercase hex digits; absent for a root span |
//! | `name` | the span's name |
//! | `kind` | `server`, `client` or `internal` |
//! | `start_unix_nanos`, `end_unix_nanos` | Unix time in nanoseconds |
//! | `duration_nanos` | their difference |
//! | `status` | `unset` or `error` |
//! | `status_description` | an error's description; absent unless `status` is `error` |
//! | `attributes` | an object: each attribute's key and its value as a JSON string, number or boolean |
//! | `resource` | an object: the resource's attributes (`service.name`, …), strings |

use std::collections::BTreeMap;

use kactivator_api::trace::span::{AttributeValue, FinishedSpan, SpanKind, SpanStatus};
use serde::Serialize;
use serde_json::Value;

use crate::Resource;

#[derive(Serialize)]
struct Line<'a> {
    trace_id: String,
    span_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_span_id: Option<String>,
    name: &'a str,
    kind: &'static str,
    start_unix_nanos: u64,
    end_unix_nanos: u64,
    duration_nanos: u64,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_description: Option<&'a str>,
    attributes: BTreeMap<&'a str, Value>,
    resource: BTreeMap<&'a str, &'a str>,
}

/// The lines for `spans`, each ended by `\n`.
pub fn lines(spans: &[FinishedSpan], resource: &Resource) -> Vec<u8> {
    let resource_attributes: BTreeMap<&str, &str> = resource.all_attributes().collect();
    let mut out = Vec::with_capacity(spans.len() * 512);
    for span in spans {
        let (status, status_description) = match &span.status {
            SpanStatus::Unset => ("unset", None),
            SpanStatus::Error(description) => ("error", Some(description.as_ref())),
        };
        let line = Line {
            trace_id: span.trace_id.to_string(),
            span_id: span.span_id.to_string(),
            parent_span_id: span.parent_span_id.map(|parent| parent.to_string()),
            name: &span.name,
            kind: match span.kind {
                SpanKind::Server => "server",
                SpanKind::Client => "client",
                SpanKind::Internal => "internal",
            },
            start_unix_nanos: span.start_unix_nanos,
            end_unix_nanos: span.end_unix_nanos,
            duration_nanos: span.end_unix_nanos.saturating_sub(span.start_unix_nanos),
            status,
            status_description,
            attributes: span
                .attributes
                .iter()
                .map(|attribute| (attribute.key, json_value(&attribute.value)))
                .collect(),
            resource: resource_attributes.clone(),
        };
        // Strings, numbers and maps of them into a Vec: serializing cannot fail.
        serde_json::to_writer(&mut out, &line).expect("span line serializes");
        out.push(b'\n');
    }
    out
}

fn json_value(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::Str(value) => Value::from(value.as_ref()),
        AttributeValue::Int(value) => Value::from(*value),
        AttributeValue::Bool(value) => Value::from(*value),
        // NaN and the infinities have no JSON number: they become null.
        AttributeValue::Double(value) => Value::from(*value),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::encode::fixtures::{self, START};

    #[test]
    fn one_json_object_per_span_per_line() {
        let out = lines(&fixtures::spans(), &fixtures::resource());
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n'));
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            json!({
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "span_id": "1111111111111111",
                "parent_span_id": "00f067aa0ba902b7",
                "name": "activator_proxy",
                "kind": "server",
                "start_unix_nanos": START,
                "end_unix_nanos": START + 2_500_000,
                "duration_nanos": 2_500_000,
                "status": "unset",
                "attributes": {
                    "http.request.method": "GET",
                    "http.response.status_code": 200,
                    "kactivator.cold_start": true,
                    "kactivator.wait_seconds": 0.25,
                },
                "resource": {
                    "service.name": "activator",
                    "service.instance.id": "activator-5d4c7b9f8-x2x7q",
                    "k8s.namespace.name": "knative-serving",
                },
            })
        );
        assert_eq!(lines[1]["kind"], "internal");
        assert_eq!(lines[1]["status"], "error");
        assert_eq!(lines[1]["status_description"], "no capacity: queue full");
        assert_eq!(lines[2]["kind"], "client");
    }

    #[test]
    fn a_root_line_has_no_parent() {
        let out = lines(&[fixtures::root()], &fixtures::resource());
        let line: Value = serde_json::from_slice(&out).unwrap();
        assert!(line.get("parent_span_id").is_none());
    }
}

//! The activator → autoscaler stat link: Knative's stat messages (`proto/stat.proto`, compiled
//! by prost at build time), how a batch travels (one binary websocket frame), and the link's
//! fixed facts (`reference/knative-activator.md` §5).

/// The generated types of `proto/stat.proto` (package `metrics`).
#[allow(clippy::all, missing_docs)]
mod wire {
    include!(concat!(env!("OUT_DIR"), "/metrics.rs"));
}

pub use prost::DecodeError;
pub use wire::{Stat, WireStatMessage, WireStatMessages};

use prost::Message;

/// The autoscaler's stat server port.
pub const PORT: u16 = 8080;

/// Close code an autoscaler sends when it shuts down to restart ("Service Restart").
pub const CLOSE_RESTARTING: u16 = 1012;

/// The stat server's address as upstream dials it:
/// `ws://autoscaler.<system namespace>.svc.<cluster domain>:8080` (empty path).
pub fn default_url(system_namespace: &str, cluster_domain: &str) -> String {
    format!("ws://autoscaler.{system_namespace}.svc.{cluster_domain}:{PORT}")
}

/// One revision's stat of one window, as the activator reports it: only `pod_name`, the
/// average concurrency and the request count are set (the autoscaler stamps the time).
pub fn stat_message(
    namespace: &str,
    revision: &str,
    pod_name: &str,
    average_concurrent_requests: f64,
    request_count: f64,
) -> WireStatMessage {
    WireStatMessage {
        namespace: namespace.to_string(),
        name: revision.to_string(),
        stat: Some(Stat {
            pod_name: pod_name.to_string(),
            average_concurrent_requests,
            request_count,
            ..Stat::default()
        }),
    }
}

/// A batch as the bytes of one binary frame.
pub fn encode(batch: &WireStatMessages) -> Vec<u8> {
    batch.encode_to_vec()
}

/// A frame's bytes as a batch (what the autoscaler does with them).
pub fn decode(frame: &[u8]) -> Result<WireStatMessages, DecodeError> {
    WireStatMessages::decode(frame)
}

/// A queue-proxy's stat as the bytes of its `:9090/metrics` body (served as
/// [`PROTOBUF_CONTENT_TYPE`]).
pub fn encode_stat(stat: &Stat) -> Vec<u8> {
    stat.encode_to_vec()
}

/// A `:9090/metrics` body as a stat (what the autoscaler's scraper does with it).
pub fn decode_stat(body: &[u8]) -> Result<Stat, DecodeError> {
    Stat::decode(body)
}

/// The Content-Type of a protobuf stat, exactly as the autoscaler's scraper requires it
/// (knative.dev/networking `header.ProtobufMIMEType`).
pub const PROTOBUF_CONTENT_TYPE: &str = "application/protobuf";

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes, worked out by hand from the protobuf encoding rules, so the test checks the
    /// generated code against the wire format rather than against itself.
    #[test]
    fn a_batch_has_the_wire_encoding_knative_decodes() {
        let batch = WireStatMessages {
            messages: vec![stat_message("ns", "rev", "act", 1.0, 2.0)],
        };
        let stat = [
            &[0x0a, 3][..],
            b"act",
            // average_concurrent_requests = 1.0: field 2, fixed64.
            &[0x11],
            &1.0f64.to_le_bytes(),
            // request_count = 2.0: field 4, fixed64. Zero fields are left out (proto3).
            &[0x21],
            &2.0f64.to_le_bytes(),
        ]
        .concat();
        let mut message = vec![0x0a, 2];
        message.extend_from_slice(b"ns");
        message.extend_from_slice(&[0x12, 3]);
        message.extend_from_slice(b"rev");
        message.extend_from_slice(&[0x1a, stat.len() as u8]);
        message.extend_from_slice(&stat);
        let mut expected = vec![0x0a, message.len() as u8];
        expected.extend_from_slice(&message);
        assert_eq!(encode(&batch), expected);
        assert_eq!(decode(&expected).unwrap(), batch);
    }

    #[test]
    fn the_default_url_is_the_autoscaler_service_on_port_8080() {
        assert_eq!(
            default_url("knative-serving", "cluster.local"),
            "ws://autoscaler.knative-serving.svc.cluster.local:8080"
        );
    }

    #[test]
    fn a_queue_proxy_stat_has_every_field_on_the_wire() {
        let stat = Stat {
            pod_name: "p".into(),
            average_concurrent_requests: 1.5,
            average_proxied_concurrent_requests: 0.5,
            request_count: 3.0,
            proxied_request_count: 1.0,
            process_uptime: 7.0,
            timestamp: 0,
        };
        let expected = [
            &[0x0a, 1][..],
            b"p",
            &[0x11],
            &1.5f64.to_le_bytes(),
            &[0x19],
            &0.5f64.to_le_bytes(),
            &[0x21],
            &3.0f64.to_le_bytes(),
            &[0x29],
            &1.0f64.to_le_bytes(),
            &[0x31],
            &7.0f64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(encode_stat(&stat), expected);
        assert_eq!(decode_stat(&expected).unwrap(), stat);
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(decode(&[0x0a, 0xff, 0x01]).is_err());
    }
}

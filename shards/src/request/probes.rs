//! Requests the activator answers itself: kubelet probes and Knative network probes. Pure.
//!
//! The order is upstream's handler chain: kubelet probe first, then `K-Network-Probe: probe`
//! (ingress hash echo), then any other `K-Network-Probe` value. Bodies and codes are Knative's,
//! byte for byte.

use kactivator_api::{headers, messages, probe};

use super::headers::RequestHeaders;
pub use crate::runtime::readiness::Health;

/// A response the shard writes without going upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAnswer {
    pub status: u16,
    pub body: Vec<u8>,
    /// Extra header to send, e.g. the echoed `K-Network-Hash`.
    pub extra_header: Option<(&'static str, Vec<u8>)>,
    /// Whether this is an error in Go's `http.Error` style (adds `X-Content-Type-Options`).
    pub error_style: bool,
}

impl LocalAnswer {
    /// As the fronts write it.
    pub fn as_answer(&self) -> super::answer::Answer<'_> {
        super::answer::Answer {
            status: self.status,
            body: &self.body,
            extra_header: self
                .extra_header
                .as_ref()
                .map(|(name, value)| (*name, value.as_slice())),
            error_style: self.error_style,
        }
    }
}

/// Decides whether the request is a probe and, if so, the answer.
pub fn answer<H: RequestHeaders + ?Sized>(request: &H, health: Health) -> Option<LocalAnswer> {
    if is_kubelet_probe(request) {
        return Some(match health {
            Health::Healthy => LocalAnswer {
                status: 200,
                body: Vec::new(),
                extra_header: None,
                error_style: false,
            },
            Health::Draining => error(500, messages::DRAINING.into()),
            Health::NotReady(reason) => error(500, format!("{reason}\n").into_bytes()),
        });
    }
    let value = request.get(headers::NETWORK_PROBE)?;
    if value == probe::NETWORK_PROBE_INGRESS.as_bytes() {
        return Some(match request.get(headers::NETWORK_HASH) {
            Some(hash) if !hash.is_empty() => LocalAnswer {
                status: 200,
                body: Vec::new(),
                extra_header: Some((headers::NETWORK_HASH, hash.to_vec())),
                error_style: false,
            },
            _ => error(400, messages::PROBE_WITHOUT_HASH.into()),
        });
    }
    if value.is_empty() {
        return None;
    }
    if value == probe::NETWORK_PROBE_ACTIVATOR.as_bytes() {
        return Some(LocalAnswer {
            status: 200,
            body: probe::NETWORK_PROBE_ACTIVATOR.into(),
            extra_header: None,
            error_style: false,
        });
    }
    Some(error(
        400,
        format!("unexpected probe header value: {}\n", go_quote(value)).into_bytes(),
    ))
}

/// `User-Agent: kube-probe/*` or a non-empty `K-Kubelet-Probe` header.
pub fn is_kubelet_probe<H: RequestHeaders + ?Sized>(request: &H) -> bool {
    request
        .get(headers::USER_AGENT)
        .is_some_and(|ua| ua.starts_with(probe::KUBE_PROBE_USER_AGENT_PREFIX.as_bytes()))
        || request
            .get(headers::KUBELET_PROBE)
            .is_some_and(|value| !value.is_empty())
}

fn error(status: u16, body: Vec<u8>) -> LocalAnswer {
    LocalAnswer {
        status,
        body,
        extra_header: None,
        error_style: true,
    }
}

/// Quotes like Go's `%q` after upstream's HTML escaping of the value: printable ASCII kept,
/// `"` and `\` escaped, everything else as `\xNN`. HTML-special characters are escaped first,
/// as `html.EscapeString` does.
fn go_quote(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for &byte in value {
        match byte {
            b'<' => out.push_str("&lt;"),
            b'>' => out.push_str("&gt;"),
            b'&' => out.push_str("&amp;"),
            b'\'' => out.push_str("&#39;"),
            b'"' => out.push_str("&#34;"),
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(byte as char),
            _ => out.push_str(&format!("\\x{byte:02x}")),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer to a request with these header lines (`Name: value`, one per line after the
    /// request line, as a client would send them).
    fn probe(raw: &str, health: Health) -> Option<LocalAnswer> {
        let fields: Vec<(&str, &str)> = raw
            .split("\r\n")
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name, value.trim()))
            .collect();
        answer(fields.as_slice(), health)
    }

    #[test]
    fn kubelet_probe_by_user_agent_or_header() {
        let ok = probe(
            "GET /any HTTP/1.1\r\nUser-Agent: kube-probe/1.30\r\n\r\n",
            Health::Healthy,
        )
        .unwrap();
        assert_eq!((ok.status, ok.body.as_slice()), (200, &b""[..]));
        let draining = probe(
            "GET / HTTP/1.1\r\nK-Kubelet-Probe: yes\r\n\r\n",
            Health::Draining,
        )
        .unwrap();
        assert_eq!(
            (draining.status, draining.body.as_slice()),
            (500, &b"received SIGTERM from kubelet\n"[..])
        );
        let not_ready = probe(
            "GET / HTTP/1.1\r\nUser-Agent: kube-probe/1\r\n\r\n",
            Health::NotReady("connection has not yet been established"),
        );
        assert_eq!(
            not_ready.unwrap().body,
            b"connection has not yet been established\n"
        );
    }

    #[test]
    fn network_probe_echoes_hash_or_rejects_missing_hash() {
        let echo = probe(
            "GET / HTTP/1.1\r\nK-Network-Probe: probe\r\nK-Network-Hash: abc\r\n\r\n",
            Health::Healthy,
        )
        .unwrap();
        assert_eq!(echo.status, 200);
        assert_eq!(echo.extra_header, Some(("K-Network-Hash", b"abc".to_vec())));
        let missing = probe(
            "GET / HTTP/1.1\r\nK-Network-Probe: probe\r\n\r\n",
            Health::Healthy,
        )
        .unwrap();
        assert_eq!(missing.status, 400);
        assert_eq!(
            missing.body,
            b"a probe request must contain a non-empty \"K-Network-Hash\" header\n"
        );
    }

    #[test]
    fn activator_probe_and_unexpected_values() {
        let activator = probe(
            "GET / HTTP/1.1\r\nK-Network-Probe: activator\r\n\r\n",
            Health::Healthy,
        )
        .unwrap();
        assert_eq!(
            (activator.status, activator.body.as_slice()),
            (200, &b"activator"[..])
        );
        let queue = probe(
            "GET / HTTP/1.1\r\nK-Network-Probe: queue\r\n\r\n",
            Health::Healthy,
        )
        .unwrap();
        assert_eq!(
            (queue.status, queue.body.as_slice()),
            (400, &b"unexpected probe header value: \"queue\"\n"[..])
        );
        let html = probe(
            "GET / HTTP/1.1\r\nK-Network-Probe: <b>\r\n\r\n",
            Health::Healthy,
        )
        .unwrap();
        assert_eq!(html.body, b"unexpected probe header value: \"&lt;b&gt;\"\n");
    }

    #[test]
    fn ordinary_requests_and_empty_probe_values_pass_through() {
        assert_eq!(
            probe("GET / HTTP/1.1\r\nHost: x\r\n\r\n", Health::Healthy),
            None
        );
        assert_eq!(
            probe(
                "GET / HTTP/1.1\r\nK-Network-Probe:\r\n\r\n",
                Health::Healthy
            ),
            None
        );
        assert_eq!(
            probe(
                "GET / HTTP/1.1\r\nUser-Agent: curl/8\r\n\r\n",
                Health::Draining
            ),
            None
        );
    }
}

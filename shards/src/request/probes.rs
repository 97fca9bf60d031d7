//! Requests the activator answers itself: kubelet probes and Knative network probes. Pure.
//!
//! The order is upstream's handler chain: kubelet probe first, then `K-Network-Probe: probe`
//! (ingress hash echo), then any other `K-Network-Probe` value. Bodies and codes are Knative's,
//! byte for byte.

use kactivator_api::{headers, messages, probe, RevisionKey};

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
    /// The revision that answers, as `X-Knative-Revision-Namespace` and `-Name`: a queue-proxy's
    /// health-check answers carry it, and they are the only evidence of which revision a pod
    /// serves that a user's app cannot forge (SPEC §4, IP reuse).
    pub identity: Option<RevisionKey>,
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
            identity: self.identity.as_ref(),
            fields: &[],
            wait: None,
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
                identity: None,
            },
            Health::Draining => error(500, messages::DRAINING.into()),
            Health::NotReady(reason) => error(500, format!("{reason}\n").into_bytes()),
        });
    }
    let value = request.get(headers::NETWORK_PROBE)?;
    if value == probe::NETWORK_PROBE_INGRESS.as_bytes() {
        return Some(ingress_probe(request));
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
            identity: None,
        });
    }
    Some(error(
        400,
        format!("unexpected probe header value: {}\n", go_quote(value)).into_bytes(),
    ))
}

/// The queue-proxy role's answer to a probe, as upstream's queue-proxy (`drain.go` then
/// `health/handler.go`, `reference/queue-proxy.md` §3.1-3.2), or `None` for a request to pass on.
///
/// A health check (user agent `kube-probe/*`, `Knative-Activator-Probe` or
/// `Knative-Autoscaling-Probe`, on any path) is 503 `shutting down` once draining; otherwise it
/// must carry `K-Network-Probe: queue` (else 400) and is 200 `queue` when the user container is
/// ready, 503 with an empty body when not. `K-Network-Probe: probe` is the ingress hash echo
/// (503 while draining). `user_ready` is read only for a health check. What the health handler
/// answers (200, 503 not ready, 400) names `revision`, as the fork's queue-proxy does: that is
/// how an activator's probe tells a pod of another revision at a reused IP.
pub fn queue_proxy_answer<H: RequestHeaders + ?Sized>(
    request: &H,
    revision: &RevisionKey,
    user_ready: impl FnOnce() -> bool,
    draining: bool,
) -> Option<LocalAnswer> {
    let health_check = request.get(headers::USER_AGENT).is_some_and(|ua| {
        ua.starts_with(probe::KUBE_PROBE_USER_AGENT_PREFIX.as_bytes())
            || ua.starts_with(probe::HEALTH_USER_AGENT.as_bytes())
            || ua.starts_with(probe::AUTOSCALING_PROBE_USER_AGENT.as_bytes())
    });
    let network_probe = request.get(headers::NETWORK_PROBE);
    if health_check {
        if draining {
            return Some(error(503, messages::SHUTTING_DOWN.into()));
        }
        let value = network_probe.unwrap_or_default();
        let answer = if value != probe::QUEUE.as_bytes() {
            // The queue-proxy's health handler writes the value as it came (`%s`), where the
            // activator's probe handler quotes it.
            let mut body = b"unexpected probe header value: ".to_vec();
            body.extend_from_slice(value);
            body.push(b'\n');
            error(400, body)
        } else if user_ready() {
            LocalAnswer {
                status: 200,
                body: probe::QUEUE.into(),
                extra_header: None,
                error_style: false,
                identity: None,
            }
        } else {
            LocalAnswer {
                status: 503,
                body: Vec::new(),
                extra_header: None,
                error_style: false,
                identity: None,
            }
        };
        return Some(LocalAnswer {
            identity: Some(revision.clone()),
            ..answer
        });
    }
    if network_probe? != probe::NETWORK_PROBE_INGRESS.as_bytes() {
        return None;
    }
    if draining {
        return Some(error(503, messages::SHUTTING_DOWN.into()));
    }
    Some(ingress_probe(request))
}

/// The answer to an ingress's `K-Network-Probe: probe`, the same in both roles: its
/// `K-Network-Hash` echoed, or 400 without one.
fn ingress_probe<H: RequestHeaders + ?Sized>(request: &H) -> LocalAnswer {
    match request.get(headers::NETWORK_HASH) {
        Some(hash) if !hash.is_empty() => LocalAnswer {
            status: 200,
            body: Vec::new(),
            extra_header: Some((headers::NETWORK_HASH, hash.to_vec())),
            error_style: false,
            identity: None,
        },
        _ => error(400, messages::PROBE_WITHOUT_HASH.into()),
    }
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

/// Upstream's `IsProbe` (knative.dev/networking `header.IsProbe`), what the request log leaves
/// out: a kubelet probe, or a non-empty `K-Network-Probe`.
pub fn is_probe<H: RequestHeaders + ?Sized>(request: &H) -> bool {
    is_kubelet_probe(request)
        || request
            .get(headers::NETWORK_PROBE)
            .is_some_and(|value| !value.is_empty())
}

fn error(status: u16, body: Vec<u8>) -> LocalAnswer {
    LocalAnswer {
        status,
        body,
        extra_header: None,
        error_style: true,
        identity: None,
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

    #[test]
    fn probes_are_what_upstream_calls_probes() {
        let probes: [&[(&str, &str)]; 4] = [
            &[("User-Agent", "kube-probe/1.31")],
            &[("K-Kubelet-Probe", "queue")],
            &[
                ("K-Network-Probe", "queue"),
                ("User-Agent", "Knative-Activator-Probe"),
            ],
            &[("k-network-probe", "probe")],
        ];
        for fields in probes {
            assert!(is_probe(fields), "{fields:?}");
        }
        let requests: [&[(&str, &str)]; 3] = [
            &[("User-Agent", "curl/8")],
            &[("K-Network-Probe", "")],
            &[("User-Agent", "Kube-Probe/1")],
        ];
        for fields in requests {
            assert!(!is_probe(fields), "{fields:?}");
        }
    }

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

    /// The queue-proxy role's answers, one row per case: (header lines, user container ready,
    /// draining) → (status, body), or pass on.
    #[test]
    fn the_queue_proxy_answers_health_checks_from_the_user_containers_readiness() {
        let revision = RevisionKey::new("ns", "hello-00001").unwrap();
        let kubelet = "User-Agent: kube-probe/1.30\r\nK-Network-Probe: queue";
        let activator = "User-Agent: Knative-Activator-Probe\r\nK-Network-Probe: queue";
        let autoscaler = "User-Agent: Knative-Autoscaling-Probe\r\nK-Network-Probe: queue";
        type Row<'a> = (&'a str, bool, bool, Option<(u16, &'a str)>);
        let rows: &[Row] = &[
            (kubelet, true, false, Some((200, "queue"))),
            (kubelet, false, false, Some((503, ""))),
            (kubelet, true, true, Some((503, "shutting down\n"))),
            (activator, true, false, Some((200, "queue"))),
            (autoscaler, false, false, Some((503, ""))),
            (
                "User-Agent: kube-probe/1.30",
                true,
                false,
                Some((400, "unexpected probe header value: \n")),
            ),
            (
                "User-Agent: kube-probe/1.30\r\nK-Network-Probe: activator",
                true,
                false,
                Some((400, "unexpected probe header value: activator\n")),
            ),
            (
                "K-Network-Probe: probe\r\nK-Network-Hash: h1",
                false,
                false,
                Some((200, "")),
            ),
            (
                "K-Network-Probe: probe\r\nK-Network-Hash: h1",
                true,
                true,
                Some((503, "shutting down\n")),
            ),
            (
                "K-Network-Probe: probe",
                true,
                false,
                Some((
                    400,
                    "a probe request must contain a non-empty \"K-Network-Hash\" header\n",
                )),
            ),
            // Not probes: the app gets them, draining or not.
            ("K-Network-Probe: activator", true, false, None),
            ("User-Agent: curl/8", false, true, None),
            ("K-Kubelet-Probe: yes", false, false, None),
        ];
        for (lines, ready, draining, expected) in rows {
            let raw = format!("GET /x HTTP/1.1\r\n{lines}\r\n\r\n");
            let fields: Vec<(&str, &str)> = raw
                .split("\r\n")
                .skip(1)
                .filter_map(|line| line.split_once(':'))
                .map(|(name, value)| (name, value.trim()))
                .collect();
            let answer = queue_proxy_answer(fields.as_slice(), &revision, || *ready, *draining);
            let got = answer.as_ref().map(|answer| {
                (
                    answer.status,
                    String::from_utf8_lossy(&answer.body).into_owned(),
                )
            });
            let expected = expected.map(|(status, body)| (status, body.to_string()));
            assert_eq!(got, expected, "{lines:?} ready={ready} draining={draining}");
            // The health handler's answers name the revision; the drainer's and the ingress
            // probe's do not.
            let health_handler = lines.contains("User-Agent") && !draining;
            assert_eq!(
                answer.and_then(|answer| answer.identity),
                health_handler.then(|| revision.clone()),
                "{lines:?} ready={ready} draining={draining}"
            );
        }
    }
}

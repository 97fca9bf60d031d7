//! Which revision a request is for: the Knative headers, or the cluster-local authority as a
//! fallback. Pure.

use kactivator_api::headers;

use super::headers::RequestHeaders;

/// Namespace and name of the revision a request targets, borrowed from the request buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevisionId<'b> {
    pub namespace: &'b str,
    pub name: &'b str,
}

/// Reads the revision from `Knative-Serving-Namespace` + `Knative-Serving-Revision`; when either
/// is empty, from an authority (Host) of the form `<rev>.<ns>.svc.<cluster_domain>[:port]`.
///
/// `None` means no revision could be named at all; upstream answers that with the same 404 as an
/// unknown revision (its lister misses on the empty name), and so do we.
pub fn revision_of<'b, H: RequestHeaders + ?Sized>(
    request: &'b H,
    cluster_domain: &str,
) -> Option<RevisionId<'b>> {
    let from_headers = (|| {
        // Field values carry only ASCII whitespace (RFC 9110 §5.6.3); trimming bytes spares
        // the per-character decoding of `str::trim` on every request.
        let namespace = std::str::from_utf8(request.get(headers::NAMESPACE)?.trim_ascii()).ok()?;
        let name = std::str::from_utf8(request.get(headers::REVISION)?.trim_ascii()).ok()?;
        (!namespace.is_empty() && !name.is_empty()).then_some(RevisionId { namespace, name })
    })();
    from_headers.or_else(|| {
        let host = std::str::from_utf8(request.authority()?).ok()?;
        revision_from_host(host, cluster_domain)
    })
}

/// `<rev>.<ns>.svc.<domain>[:port]` → (ns, rev). Mirrors upstream: split into at most four parts.
pub fn revision_from_host<'b>(host: &'b str, cluster_domain: &str) -> Option<RevisionId<'b>> {
    let mut parts = host.splitn(4, '.');
    let (name, namespace, svc, rest) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let domain = match rest.rsplit_once(':') {
        Some((domain, port)) if port.bytes().all(|b| b.is_ascii_digit()) => domain,
        _ => rest,
    };
    (svc == "svc" && domain == cluster_domain && !name.is_empty() && !namespace.is_empty())
        .then_some(RevisionId { namespace, name })
}

/// Cluster domain when neither resolv.conf nor `CLUSTER_DOMAIN` gives one (`cluster.local`).
pub use kactivator_api::DEFAULT_CLUSTER_DOMAIN;

/// The cluster domain: the `search` entry `svc.<domain>` of resolv.conf, else `CLUSTER_DOMAIN`,
/// else [`DEFAULT_CLUSTER_DOMAIN`] (the same order as knative.dev/pkg).
pub fn detect_cluster_domain(resolv_conf: Option<&str>, env: Option<&str>) -> String {
    if let Some(text) = resolv_conf {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("search") {
                continue;
            }
            if let Some(domain) = words.find_map(|word| word.strip_prefix("svc.")) {
                return domain.trim_end_matches('.').to_string();
            }
        }
    }
    match env {
        Some(domain) if !domain.is_empty() => domain.to_string(),
        _ => DEFAULT_CLUSTER_DOMAIN.to_string(),
    }
}

/// The revision a pod's answer names when it is not the expected one: its IP now serves another
/// revision. Queue-proxies name theirs in `X-Knative-Revision-Name`/`-Namespace`. If either is
/// present (and non-empty) both must equal the expected ones; an answer with neither says
/// nothing (a queue-proxy older than the fork). Returns `(namespace, name)` as sent. Read on
/// the queue-proxy's probe answers only (`control`'s prober): a user's response may carry any
/// header and is never taken as this evidence.
pub fn other_revision(
    name: Option<&[u8]>,
    namespace: Option<&[u8]>,
    expected_namespace: &str,
    expected_name: &str,
) -> Option<(String, String)> {
    let name = name.unwrap_or_default();
    let namespace = namespace.unwrap_or_default();
    if name.is_empty() && namespace.is_empty() {
        return None;
    }
    if name == expected_name.as_bytes() && namespace == expected_namespace.as_bytes() {
        return None;
    }
    Some((
        String::from_utf8_lossy(namespace).into_owned(),
        String::from_utf8_lossy(name).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knative_headers_win_and_the_authority_is_the_fallback() {
        let both: &[(&str, &str)] = &[
            ("Host", "other.elsewhere.svc.cluster.local"),
            ("knative-serving-namespace", " prod "),
            ("Knative-Serving-Revision", "hello-00001"),
        ];
        let id = revision_of(both, "cluster.local").unwrap();
        assert_eq!((id.namespace, id.name), ("prod", "hello-00001"));
        let host_only: &[(&str, &str)] = &[
            ("Host", "hello-00002.prod.svc.cluster.local:8080"),
            ("Knative-Serving-Revision", ""),
        ];
        let id = revision_of(host_only, "cluster.local").unwrap();
        assert_eq!((id.namespace, id.name), ("prod", "hello-00002"));
        let neither: &[(&str, &str)] = &[("Host", "example.com")];
        assert_eq!(revision_of(neither, "cluster.local"), None);
    }

    #[test]
    fn host_fallback_accepts_cluster_local_names_with_and_without_port() {
        let id = revision_from_host("hello-00001.prod.svc.cluster.local", "cluster.local").unwrap();
        assert_eq!((id.namespace, id.name), ("prod", "hello-00001"));
        let id =
            revision_from_host("hello-00001.prod.svc.cluster.local:80", "cluster.local").unwrap();
        assert_eq!((id.namespace, id.name), ("prod", "hello-00001"));
    }

    #[test]
    fn host_fallback_rejects_other_shapes() {
        for host in [
            "hello.prod.svc.example.com",
            "hello.prod.cluster.local",
            "hello",
            "example.com",
            ".prod.svc.cluster.local",
        ] {
            assert_eq!(revision_from_host(host, "cluster.local"), None, "{host}");
        }
    }

    #[test]
    fn cluster_domain_comes_from_resolv_conf_then_env_then_default() {
        let resolv = "nameserver 10.96.0.10\nsearch default.svc.corp.internal svc.corp.internal corp.internal\n";
        assert_eq!(
            detect_cluster_domain(Some(resolv), Some("x")),
            "corp.internal"
        );
        assert_eq!(
            detect_cluster_domain(Some("nameserver 1.1.1.1\n"), Some("example.org")),
            "example.org"
        );
        assert_eq!(detect_cluster_domain(None, None), "cluster.local");
    }

    #[test]
    fn a_pod_names_another_revision_only_when_its_identity_headers_disagree() {
        let check = |name: Option<&str>, namespace: Option<&str>| {
            other_revision(
                name.map(str::as_bytes),
                namespace.map(str::as_bytes),
                "ns",
                "rev",
            )
        };
        assert_eq!(check(None, None), None, "an old queue-proxy says nothing");
        assert_eq!(check(Some(""), Some("")), None, "empty counts as absent");
        assert_eq!(check(Some("rev"), Some("ns")), None);
        assert_eq!(
            check(Some("other"), Some("ns")),
            Some(("ns".into(), "other".into()))
        );
        // One header alone must still name us in full, as the fork's check requires.
        assert_eq!(
            check(Some("rev"), None),
            Some((String::new(), "rev".into()))
        );
    }
}

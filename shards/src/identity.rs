//! Which revision a request is for: the Knative headers, or the cluster-local Host as a fallback.

use kactivator_h1::RequestHead;

pub const REVISION_HEADER: &str = "knative-serving-revision";
pub const NAMESPACE_HEADER: &str = "knative-serving-namespace";

/// Namespace and name of the revision a request targets, borrowed from the request buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevisionId<'b> {
    pub namespace: &'b str,
    pub name: &'b str,
}

/// Reads the revision from `Knative-Serving-Namespace` + `Knative-Serving-Revision`; when either
/// is empty, from a Host of the form `<rev>.<ns>.svc.<cluster_domain>[:port]`.
///
/// `None` means no revision could be named at all; upstream answers that with the same 404 as an
/// unknown revision (its lister misses on the empty name), and so do we.
pub fn revision_of<'b>(
    head: &RequestHead,
    buf: &'b [u8],
    cluster_domain: &str,
) -> Option<RevisionId<'b>> {
    let from_headers = (|| {
        let namespace = std::str::from_utf8(head.header(buf, NAMESPACE_HEADER)?)
            .ok()?
            .trim();
        let name = std::str::from_utf8(head.header(buf, REVISION_HEADER)?)
            .ok()?
            .trim();
        (!namespace.is_empty() && !name.is_empty()).then_some(RevisionId { namespace, name })
    })();
    from_headers.or_else(|| {
        let host = std::str::from_utf8(head.header(buf, "host")?).ok()?;
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

/// The cluster domain: the `search` entry `svc.<domain>` of resolv.conf, else `CLUSTER_DOMAIN`,
/// else `cluster.local` (the same order as knative.dev/pkg).
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
        _ => "cluster.local".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

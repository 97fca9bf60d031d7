use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::tls::tests::{ca, client, handshake, Ca};
use crate::tls::{KNATIVE_POD_TLS_PORT, KNATIVE_SERVICE_TLS_PORT};

/// `routing-serving-certs` as cert-manager writes it: the activator's pair (SANs `kn-routing`
/// and `data-plane.knative.dev`) and the CA.
fn secret(ca: &Ca, ca_crt: &str) -> BTreeMap<String, Vec<u8>> {
    let (chain, key) = ca.issue(&["kn-routing", KNATIVE_SERVER_NAME]);
    BTreeMap::from([
        (TLS_CRT.to_string(), chain.into_bytes()),
        (TLS_KEY.to_string(), key.into_bytes()),
        (CA_CRT.to_string(), ca_crt.as_bytes().to_vec()),
    ])
}

/// A queue-proxy of `namespace` serving a certificate `ca` issued as Knative issues
/// `serving-certs`.
fn queue_proxy(ca: &Ca, names: &[&str]) -> Arc<ServerConfig> {
    let (chain, key) = ca.issue(names);
    let identity = Identity::from_pem("serving-certs", chain.as_bytes(), key.as_bytes()).unwrap();
    let alpn = SERVER_ALPN.map(str::to_string);
    server_config(
        &[identity],
        &ClientAuth::None,
        &alpn,
        &TlsSettings::default(),
    )
    .unwrap()
}

/// The activator dials a pod of `namespace` served by `server`: `Ok` or the error it gives.
fn dial(tls: &InternalTls, namespace: &str, server: Arc<ServerConfig>) -> Result<(), String> {
    let pod = tls.pod_tls(namespace);
    handshake((*pod.built.config).clone(), KNATIVE_SERVER_NAME, server).map(|_| ())
}

fn served(change: &Change) -> Arc<ServerConfig> {
    match &change.served {
        Served::New(config) => config.clone(),
        other => panic!("expected a new certificate, got {other:?}"),
    }
}

fn tls() -> InternalTls {
    InternalTls::new("knative-serving", TlsSettings::default())
}

#[test]
fn the_secret_gives_the_served_certificate_and_the_trust_for_queue_proxies() {
    let ca = ca("knative-selfsigned-ca");
    let mut tls = tls();
    assert!(!tls.serving());
    let change = tls.secret(Some(&secret(&ca, &ca.cert.pem())));
    assert!(change.retrusted, "{change:?}");
    assert!(change.warnings.is_empty(), "{:?}", change.warnings);
    assert!(tls.serving());
    // An ingress (Envoy: no SNI here, name kn-routing verified) reaches the served pair.
    let (_, connection) = handshake(client(ca.roots()), "kn-routing", served(&change)).unwrap();
    assert_eq!(connection.alpn_protocol(), None);
    // Queue-proxies: `kn-user-<namespace>`, lower-cased, and `data-plane.knative.dev`.
    let default = queue_proxy(&ca, &["kn-user-default", KNATIVE_SERVER_NAME]);
    dial(&tls, "default", default.clone()).unwrap();
    dial(&tls, "Default", default.clone()).unwrap();
    let refused = dial(&tls, "other", default).unwrap_err();
    assert!(
        refused.contains(
            "san \"kn-user-other\" does not have a matching name in [\"kn-user-default\", \"data-plane.knative.dev\"]"
        ),
        "{refused}"
    );
    let no_legacy_name = queue_proxy(&ca, &["kn-user-default"]);
    assert!(dial(&tls, "default", no_legacy_name).is_err());
    // Pods on 8112, the private Service on 443.
    let pod = tls.pod_tls("default");
    assert_eq!(pod.built.port, Some(KNATIVE_POD_TLS_PORT));
    assert_eq!(pod.built_for_service.port, Some(KNATIVE_SERVICE_TLS_PORT));
    assert_eq!(pod.require_name.as_deref(), Some("kn-user-default"));
}

#[test]
fn the_same_secret_again_changes_nothing_and_a_rotation_serves_the_new_pair() {
    let ca = ca("ca");
    let mut tls = tls();
    let first = secret(&ca, &ca.cert.pem());
    served(&tls.secret(Some(&first)));
    let again = tls.secret(Some(&first));
    assert!(matches!(again.served, Served::Unchanged) && !again.retrusted);
    // cert-manager rotates the key (rotationPolicy: Always); the CA stays.
    let rotated = tls.secret(Some(&secret(&ca, &ca.cert.pem())));
    assert!(!rotated.retrusted);
    served(&rotated);
}

#[test]
fn a_pair_that_does_not_load_keeps_what_was_served_and_says_whether_anything_is() {
    let ca = ca("ca");
    let mut tls = tls();
    let mut broken = secret(&ca, &ca.cert.pem());
    broken.insert(TLS_KEY.into(), b"not a key".to_vec());
    let change = tls.secret(Some(&broken));
    match &change.served {
        Served::Kept(problem) => {
            assert!(
                problem.contains("knative-serving/routing-serving-certs"),
                "{problem}"
            );
            assert!(problem.contains("no certificate is served"), "{problem}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!tls.serving());
    // Its CA is trusted all the same.
    assert!(change.retrusted);
    served(&tls.secret(Some(&secret(&ca, &ca.cert.pem()))));
    let mut missing = secret(&ca, &ca.cert.pem());
    missing.remove(TLS_CRT);
    match tls.secret(Some(&missing)).served {
        Served::Kept(problem) => {
            assert!(problem.contains("has no tls.crt and tls.key"), "{problem}");
            assert!(
                problem.contains("loaded before is still served"),
                "{problem}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(tls.serving());
    // Deleted: nothing changes (upstream has no delete handler).
    let deleted = tls.secret(None);
    assert!(matches!(deleted.served, Served::Unchanged) && !deleted.retrusted);
    assert!(tls.serving());
}

#[test]
fn only_the_first_pem_block_of_ca_crt_is_trusted_and_bundles_add_to_it() {
    let first = ca("first");
    let second = ca("second");
    let mut tls = tls();
    let both = format!("{}{}", first.cert.pem(), second.cert.pem());
    served(&tls.secret(Some(&secret(&first, &both))));
    let by_first = queue_proxy(&first, &["kn-user-default", KNATIVE_SERVER_NAME]);
    let by_second = queue_proxy(&second, &["kn-user-default", KNATIVE_SERVER_NAME]);
    dial(&tls, "default", by_first.clone()).unwrap();
    let refused = dial(&tls, "default", by_second.clone()).unwrap_err();
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    // A trust-bundle ConfigMap with the second CA (and a value that is not PEM, left out).
    let bundle = BTreeMap::from([
        ("new.pem".to_string(), second.cert.pem()),
        ("notes".to_string(), "rotated on Monday".to_string()),
    ]);
    let change = tls.bundles_listed(vec![("knative-bundle".into(), bundle.clone())]);
    assert!(change.retrusted);
    assert_eq!(change.warnings.len(), 1, "{:?}", change.warnings);
    assert!(
        change.warnings[0].contains("ConfigMap knative-serving/knative-bundle key notes"),
        "{:?}",
        change.warnings
    );
    dial(&tls, "default", by_second.clone()).unwrap();
    dial(&tls, "default", by_first.clone()).unwrap();
    assert!(!tls.bundle("knative-bundle", Some(&bundle)).retrusted);
    // Unlabelled or deleted: its CA is no longer trusted.
    assert!(tls.bundle("knative-bundle", None).retrusted);
    assert!(dial(&tls, "default", by_second).is_err());
}

#[test]
fn with_nothing_trusted_every_dial_fails_saying_why() {
    let ca = ca("ca");
    let mut tls = tls();
    let by_ca = queue_proxy(&ca, &["kn-user-default", KNATIVE_SERVER_NAME]);
    let refused = dial(&tls, "default", by_ca.clone()).unwrap_err();
    assert!(
        refused.contains("no CA to verify queue-proxies with"),
        "{refused}"
    );
    let change = tls.secret(Some(&secret(&ca, "not pem")));
    assert!(!change.retrusted, "still nothing trusted");
    assert!(
        change
            .warnings
            .iter()
            .any(|w| w.contains("ca.crt: no PEM block")),
        "{:?}",
        change.warnings
    );
    assert!(dial(&tls, "default", by_ca.clone()).is_err());
    let change = tls.bundle(
        "bundle",
        Some(&BTreeMap::from([("ca".to_string(), ca.cert.pem())])),
    );
    assert!(change.retrusted);
    dial(&tls, "default", by_ca).unwrap();
}

#[test]
fn a_namespace_that_is_no_dns_label_gets_a_client_that_refuses_rather_than_a_panic() {
    let ca = ca("ca");
    let mut tls = tls();
    served(&tls.secret(Some(&secret(&ca, &ca.cert.pem()))));
    let server = queue_proxy(&ca, &["kn-user-default", KNATIVE_SERVER_NAME]);
    let refused = dial(&tls, "not a label", server).unwrap_err();
    assert!(refused.contains("namespace \"not a label\""), "{refused}");
}

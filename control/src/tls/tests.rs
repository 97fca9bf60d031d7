use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConnection};

use super::*;

/// A CA (with a name of its own) and what it issues.
pub(crate) struct Ca {
    pub(crate) cert: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

pub(crate) fn ca(name: &str) -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        cert,
        issuer: rcgen::Issuer::new(params, key),
    }
}

impl Ca {
    /// A leaf for `names` as PEM chain and PEM (PKCS#8) key.
    pub(crate) fn issue(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let leaf = params.signed_by(&key, &self.issuer).unwrap();
        (leaf.pem(), key.serialize_pem())
    }

    pub(crate) fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        roots
    }
}

pub(crate) fn client(roots: RootCertStore) -> ClientConfig {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// Runs a handshake in memory; the client's view of the server's leaf, or the first error.
pub(crate) fn handshake(
    client: ClientConfig,
    name: &str,
    server: Arc<rustls::ServerConfig>,
) -> Result<(CertificateDer<'static>, ClientConnection), String> {
    let mut client = ClientConnection::new(
        Arc::new(client),
        ServerName::try_from(name.to_string()).unwrap(),
    )
    .unwrap();
    let mut server = ServerConnection::new(server).unwrap();
    for _ in 0..10 {
        pump(&mut client, &mut server, "server")?;
        pump(&mut server, &mut client, "client")?;
        if !client.is_handshaking() && !server.is_handshaking() {
            let leaf = client.peer_certificates().unwrap()[0].clone().into_owned();
            return Ok((leaf, client));
        }
    }
    Err("the handshake did not finish".into())
}

/// Moves what `from` has to send into `to`; an error is `to`'s, named `side`.
fn pump<A, B>(
    from: &mut rustls::ConnectionCommon<A>,
    to: &mut rustls::ConnectionCommon<B>,
    side: &str,
) -> Result<(), String> {
    let mut wire = Vec::new();
    from.write_tls(&mut wire).unwrap();
    to.read_tls(&mut &wire[..])
        .map_err(|e| format!("{side}: {e}"))?;
    to.process_new_packets()
        .map_err(|e| format!("{side}: {e}"))?;
    Ok(())
}

fn alpn() -> Vec<String> {
    SERVER_ALPN.map(str::to_string).to_vec()
}

const RSA_CERT: &[u8] = include_bytes!("fixtures/rsa-cert.pem");
const RSA_KEY_PKCS1: &[u8] = include_bytes!("fixtures/rsa-key.pkcs1.pem");

#[test]
fn an_rsa_key_in_pkcs1_as_cert_manager_writes_it_serves() {
    let identity = Identity::from_pem("serving-certs", RSA_CERT, RSA_KEY_PKCS1).unwrap();
    assert_eq!(
        identity.dns_names(),
        ["kn-user-demo", "data-plane.knative.dev"]
    );
    let server = server_config(
        &[identity],
        &ClientAuth::None,
        &alpn(),
        &TlsSettings::default(),
    )
    .unwrap();
    let mut roots = RootCertStore::empty();
    roots
        .add(certificates("fixture", RSA_CERT).unwrap().remove(0))
        .unwrap();
    let (_, client) = handshake(client(roots), "data-plane.knative.dev", server).unwrap();
    assert_eq!(
        client.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3),
        "TLS 1.3 by default, as upstream"
    );
}

#[test]
fn material_that_cannot_serve_is_named_with_its_source() {
    let ca = ca("material CA");
    let (chain, key) = ca.issue(&["a.test"]);
    let (_, other_key) = ca.issue(&["b.test"]);
    let cases: Vec<(&[u8], &[u8], TlsError)> = vec![
        (
            b"",
            key.as_bytes(),
            TlsError::NoCertificate { what: "src".into() },
        ),
        (
            chain.as_bytes(),
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            TlsError::NoKey { what: "src".into() },
        ),
        (
            chain.as_bytes(),
            other_key.as_bytes(),
            TlsError::KeyMismatch { what: "src".into() },
        ),
    ];
    for (chain, key, expected) in cases {
        assert_eq!(Identity::from_pem("src", chain, key).unwrap_err(), expected);
    }
    let garbage = Identity::from_pem("src", b"-----BEGIN CERTIFICATE-----\n!!\n", key.as_bytes());
    assert!(
        matches!(garbage, Err(TlsError::BadCertificate { .. })),
        "{garbage:?}"
    );
    assert!(
        server_config(&[], &ClientAuth::None, &alpn(), &TlsSettings::default()).is_err(),
        "no certificate is no server"
    );
}

#[test]
fn sni_chooses_the_certificate_valid_for_the_name_and_the_first_is_the_default() {
    let ca = ca("sni CA");
    let identities: Vec<Identity> = [&["default.test"][..], &["*.models.test"], &["api.test"]]
        .iter()
        .map(|names| {
            let (chain, key) = ca.issue(names);
            Identity::from_pem(names[0], chain.as_bytes(), key.as_bytes()).unwrap()
        })
        .collect();
    let server = server_config(
        &identities,
        &ClientAuth::None,
        &alpn(),
        &TlsSettings::default(),
    )
    .unwrap();
    for (asked, served) in [
        ("api.test", 2),
        ("llama.models.test", 1),
        ("default.test", 0),
        ("unknown.test", 0),
    ] {
        // The client verifies against the name it asked for: a fallback certificate fails
        // that check, so look at what was offered with a client that trusts it by name.
        let name = if served == 0 { "default.test" } else { asked };
        let (leaf, _) = handshake(client(ca.roots()), name, server.clone())
            .unwrap_or_else(|e| panic!("{asked}: {e}"));
        if asked == "unknown.test" {
            continue;
        }
        assert_eq!(&leaf, identities[served].leaf(), "{asked}");
    }
    // A name no certificate carries gets the default, which the client then refuses by name.
    let refused = handshake(client(ca.roots()), "unknown.test", server).unwrap_err();
    assert!(refused.contains("not valid for name"), "{refused}");
}

#[test]
fn client_certificates_are_required_or_optional_as_configured() {
    let clients = ca("clients CA");
    let ca = ca("server CA");
    let (chain, key) = ca.issue(&["svc.test"]);
    let identity = Identity::from_pem("svc", chain.as_bytes(), key.as_bytes()).unwrap();
    let (client_chain, client_key) = clients.issue(&["client.test"]);
    let with_cert = || {
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(ca.roots())
            .with_client_auth_cert(
                certificates("client", client_chain.as_bytes()).unwrap(),
                rustls::pki_types::PrivateKeyDer::from_pem_slice(client_key.as_bytes()).unwrap(),
            )
            .unwrap()
    };
    let required = server_config(
        std::slice::from_ref(&identity),
        &ClientAuth::Required(Arc::new(clients.roots())),
        &alpn(),
        &TlsSettings::default(),
    )
    .unwrap();
    handshake(with_cert(), "svc.test", required.clone()).unwrap();
    let refused = handshake(client(ca.roots()), "svc.test", required).unwrap_err();
    assert!(refused.starts_with("server:"), "{refused}");

    let optional = server_config(
        &[identity],
        &ClientAuth::Optional(Arc::new(clients.roots())),
        &alpn(),
        &TlsSettings::default(),
    )
    .unwrap();
    handshake(client(ca.roots()), "svc.test", optional.clone()).unwrap();
    handshake(with_cert(), "svc.test", optional).unwrap();
}

fn settings(pairs: &[(&str, &str)]) -> TlsSettings {
    let read = settings::read(settings::ACTIVATOR, |key| {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    });
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    read
}

#[test]
fn versions_suites_and_curves_are_applied_as_go_applies_them() {
    let ca = ca("settings CA");
    let (chain, key) = ca.issue(&["svc.test"]);
    let identity = Identity::from_pem("svc", chain.as_bytes(), key.as_bytes()).unwrap();
    let only_12 = |roots| {
        ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    };
    // The default minimum is 1.3: a 1.2-only client is refused.
    let default = server_config(
        std::slice::from_ref(&identity),
        &ClientAuth::None,
        &alpn(),
        &TlsSettings::default(),
    )
    .unwrap();
    let refused = handshake(only_12(ca.roots()), "svc.test", default).unwrap_err();
    assert!(refused.contains("incompatible"), "{refused}");

    // 1.2 allowed, one 1.2 suite named: a 1.2 client gets exactly it.
    let twelve = server_config(
        std::slice::from_ref(&identity),
        &ClientAuth::None,
        &alpn(),
        &settings(&[
            ("ACTIVATOR_TLS_MIN_VERSION", "1.2"),
            (
                "ACTIVATOR_TLS_CIPHER_SUITES",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            ),
        ]),
    )
    .unwrap();
    let (_, client12) = handshake(only_12(ca.roots()), "svc.test", twelve.clone()).unwrap();
    assert_eq!(
        client12.negotiated_cipher_suite().unwrap().suite(),
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
    );
    // TLS 1.3 suites are not narrowed by the list, as in Go.
    let (_, client13) = handshake(client(ca.roots()), "svc.test", twelve).unwrap();
    assert_eq!(
        client13.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );

    // The curve list decides the group.
    let p384 = server_config(
        std::slice::from_ref(&identity),
        &ClientAuth::None,
        &alpn(),
        &settings(&[("ACTIVATOR_TLS_CURVE_PREFERENCES", "CurveP384")]),
    )
    .unwrap();
    let (_, client) = handshake(client(ca.roots()), "svc.test", p384).unwrap();
    assert_eq!(
        client.negotiated_key_exchange_group().unwrap().name(),
        rustls::NamedGroup::secp384r1
    );

    // Names Go knows and rustls does not build are refused by name, not dropped.
    let cbc = server_config(
        &[identity],
        &ClientAuth::None,
        &alpn(),
        &settings(&[(
            "ACTIVATOR_TLS_CIPHER_SUITES",
            "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
        )]),
    )
    .unwrap_err();
    assert!(
        cbc.to_string()
            .contains("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"),
        "{cbc}"
    );
}

#[test]
fn a_trust_bundle_with_a_broken_certificate_names_its_source() {
    let ca = ca("bundle CA");
    let good = (String::from("ca.crt"), ca.cert.pem().into_bytes());
    let broken = (
        String::from("configmap knative-bundle/ca.pem"),
        b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_vec(),
    );
    assert_eq!(trust(std::slice::from_ref(&good)).unwrap().len(), 1);
    let error = trust(&[good, broken]).unwrap_err();
    assert!(error.to_string().contains("knative-bundle"), "{error}");
}

#[test]
fn pods_are_dialled_as_knatives_activator_dials_its_queue_proxies() {
    let other = ca("other CA");
    let ca = ca("pods CA");
    let ca_pem = ca.cert.pem();
    let (chain, key) = ca.issue(&["kn-user-default", "data-plane.knative.dev"]);
    let identity = Identity::from_pem("serving-certs", chain.as_bytes(), key.as_bytes()).unwrap();
    let server = server_config(
        &[identity],
        &ClientAuth::None,
        &alpn(),
        &TlsSettings::default(),
    )
    .unwrap();
    let dial = |require: Option<&str>, server_name: &str| {
        let pod = PodTls::new("ca.crt", ca_pem.as_bytes(), server_name, require).unwrap();
        handshake((*pod.built.config).clone(), server_name, server.clone())
    };
    let (_, client) = dial(Some("kn-user-default"), "data-plane.knative.dev").unwrap();
    assert_eq!(
        client.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(client.alpn_protocol(), None, "no ALPN, as upstream");
    let refused = dial(Some("kn-user-other"), "data-plane.knative.dev").unwrap_err();
    assert!(
        refused.contains(
            "san \"kn-user-other\" does not have a matching name in [\"kn-user-default\", \"data-plane.knative.dev\"]"
        ),
        "{refused}"
    );
    let refused = dial(None, "elsewhere.test").unwrap_err();
    assert!(refused.contains("not valid for name"), "{refused}");
    // Another CA's certificate is not trusted.
    let pod = PodTls::new(
        "ca.crt",
        other.cert.pem().as_bytes(),
        "data-plane.knative.dev",
        None,
    )
    .unwrap();
    let refused = handshake(
        (*pod.built.config).clone(),
        "data-plane.knative.dev",
        server,
    )
    .unwrap_err();
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    // Equal by what describes it, not by the configuration built.
    let a = PodTls::new("a", ca_pem.as_bytes(), "data-plane.knative.dev", None).unwrap();
    let b = PodTls::new("b", ca_pem.as_bytes(), "data-plane.knative.dev", None).unwrap();
    assert_eq!(a, b);
    assert!(PodTls::new("bad", b"not pem", "data-plane.knative.dev", None).is_err());
}

#[test]
fn system_internal_tls_is_read_as_knative_reads_it() {
    /// `system-internal-tls`, `internal-encryption`, and what they mean.
    type Row = (
        Option<&'static str>,
        Option<&'static str>,
        Result<bool, &'static str>,
    );
    let table: &[Row] = &[
        (None, None, Ok(false)),
        (Some(""), None, Ok(false)),
        (Some("Disabled"), None, Ok(false)),
        (Some("enabled"), None, Ok(true)),
        (Some("ENABLED"), Some("false"), Ok(true)),
        (Some(""), Some("true"), Ok(true)),
        (Some("disabled"), Some("1"), Ok(true)),
        (None, Some("False"), Ok(false)),
        (
            Some("on"),
            None,
            Err("system-internal-tls with value: \"on\" in config-network ConfigMap is not supported"),
        ),
        (
            None,
            Some("yes"),
            Err("failed to parse \"internal-encryption\""),
        ),
    ];
    for (tls, encryption, expected) in table {
        let got = system_internal_tls(*tls, *encryption);
        match expected {
            Ok(on) => assert_eq!(got, Ok(*on), "{tls:?} {encryption:?}"),
            Err(said) => {
                let error = got.expect_err(said);
                assert!(error.contains(said), "{error}");
            }
        }
    }
}

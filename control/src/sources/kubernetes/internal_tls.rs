//! Knative's `system-internal-tls` from the activator's side (`reference/tls.md` §2), sans-IO:
//! what the `routing-serving-certs` Secret and the trust-bundle ConfigMaps of
//! `SYSTEM_NAMESPACE` make of the TLS data port's certificate and of the trust queue-proxies'
//! certificates are verified with.
//!
//! * **Served**: the Secret's `tls.crt` and `tls.key`, with the `ACTIVATOR_TLS_*` settings and
//!   ALPN `h2`, `http/1.1`; a pair that does not load keeps the one served before (none at
//!   start: no handshake succeeds and readiness says so). A deleted Secret changes nothing, as
//!   upstream has no delete handler (`pkg/activator/certificate/cache.go`).
//! * **Trusted**: the first PEM block of the Secret's `ca.crt`, and every certificate in every
//!   `data` value of every ConfigMap labelled `networking.knative.dev/trust-bundle` (a value
//!   that is not PEM certificates is left out, with a warning). Nothing trusted: every dial
//!   fails, saying why; a pod is never dialled in plain instead.
//! * **Per revision**: TLS 1.3, no ALPN, SNI and name `data-plane.knative.dev`, DNS SAN
//!   `kn-user-<namespace>` required, to the pod's 8112 (the private Service's 443).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::CertificateDer;
use rustls::ServerConfig;

use crate::tls::{
    certificates, server_config, ClientAuth, Identity, PodTls, PodTrust, TlsSettings,
    KNATIVE_SERVER_NAME, KNATIVE_TLS_PORTS, KNATIVE_USER_NAME_PREFIX, SERVER_ALPN,
};

/// The Secret with the activator's certificate and the CA (`config.ServingRoutingCertName`).
pub const ROUTING_SERVING_CERTS: &str = "routing-serving-certs";
/// ConfigMaps with this label key (any value) hold more CA certificates to trust.
pub const TRUST_BUNDLE_LABEL: &str = "networking.knative.dev/trust-bundle";
const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";

/// What the TLS data port serves after a change.
#[derive(Debug)]
pub enum Served {
    Unchanged,
    /// A new certificate, for every handshake from now on.
    New(Arc<ServerConfig>),
    /// The Secret's pair does not load; what was served stays (maybe nothing).
    Kept(String),
}

/// One change's outcome.
#[derive(Debug)]
pub struct Change {
    pub served: Served,
    /// The trust changed: every revision's spec is made again.
    pub retrusted: bool,
    /// Problems to log (a bad `ca.crt`, a bundle value that is not certificates).
    pub warnings: Vec<String>,
}

impl Change {
    fn none() -> Change {
        Change {
            served: Served::Unchanged,
            retrusted: false,
            warnings: Vec::new(),
        }
    }
}

/// The activator's TLS, as the Secret and the bundles say.
pub struct InternalTls {
    system_namespace: String,
    settings: TlsSettings,
    /// `tls.crt` and `tls.key` as last loaded.
    served: Option<(Vec<u8>, Vec<u8>)>,
    /// The first PEM block of `ca.crt`, as last seen.
    secret_ca: Option<CertificateDer<'static>>,
    /// Each labelled ConfigMap's certificates, by name.
    bundles: BTreeMap<String, Vec<CertificateDer<'static>>>,
    trust: PodTrust,
    /// Each namespace's client, made when first asked for after the trust last changed (a
    /// mutex only because the model is read from a task that may move between threads; one
    /// thread uses it).
    by_namespace: Mutex<BTreeMap<String, Box<PodTls>>>,
}

impl InternalTls {
    /// `settings`: the `ACTIVATOR_TLS_*` ones, already checked.
    pub fn new(system_namespace: &str, settings: TlsSettings) -> InternalTls {
        let mut tls = InternalTls {
            system_namespace: system_namespace.to_string(),
            settings,
            served: None,
            secret_ca: None,
            bundles: BTreeMap::new(),
            trust: PodTrust::from_roots(&[], "").expect("an empty trust builds"),
            by_namespace: Mutex::default(),
        };
        tls.retrust();
        tls
    }

    /// Whether a certificate is served.
    pub fn serving(&self) -> bool {
        self.served.is_some()
    }

    fn secret_name(&self) -> String {
        format!("{}/{ROUTING_SERVING_CERTS}", self.system_namespace)
    }

    /// The Secret as listed or changed; `None`: deleted (the last certificate and trust stay).
    pub fn secret(&mut self, data: Option<&BTreeMap<String, Vec<u8>>>) -> Change {
        let name = self.secret_name();
        let Some(data) = data else {
            let mut change = Change::none();
            if self.served.is_some() {
                change.warnings.push(format!(
                    "{name} was deleted; the certificate and trust it gave stay in use"
                ));
            }
            return change;
        };
        let mut change = Change::none();
        // The trust first: a Secret whose pair does not load may still bring a new CA.
        let ca = match data.get(CA_CRT) {
            None => {
                change.warnings.push(format!(
                    "{name} has no {CA_CRT}: queue-proxies are verified against the \
                     {TRUST_BUNDLE_LABEL} ConfigMaps only"
                ));
                None
            }
            Some(pem) => match first_certificate(pem) {
                Ok(ca) => Some(ca),
                Err(reason) => {
                    change.warnings.push(format!("{name}: {CA_CRT}: {reason}"));
                    None
                }
            },
        };
        if ca != self.secret_ca {
            self.secret_ca = ca;
            change.retrusted = self.retrust();
        }
        let pair = match (data.get(TLS_CRT), data.get(TLS_KEY)) {
            (Some(chain), Some(key)) => (chain.clone(), key.clone()),
            _ => {
                change.served = Served::Kept(format!(
                    "{name} has no {TLS_CRT} and {TLS_KEY}; {}",
                    self.kept()
                ));
                return change;
            }
        };
        if self.served.as_ref() == Some(&pair) {
            return change;
        }
        let built =
            Identity::from_pem(&format!("{name} {TLS_CRT} and {TLS_KEY}"), &pair.0, &pair.1)
                .and_then(|identity| {
                    let alpn = SERVER_ALPN.map(str::to_string);
                    server_config(&[identity], &ClientAuth::None, &alpn, &self.settings)
                });
        change.served = match built {
            Ok(config) => {
                self.served = Some(pair);
                Served::New(config)
            }
            Err(error) => Served::Kept(format!("{error}; {}", self.kept())),
        };
        change
    }

    /// What stays served after a pair that does not load.
    fn kept(&self) -> &'static str {
        if self.served.is_some() {
            "the certificate loaded before is still served"
        } else {
            "no certificate is served: every TLS handshake fails and readiness says so"
        }
    }

    /// Every labelled ConfigMap, as (re)listed: `(name, data)`.
    pub fn bundles_listed(&mut self, all: Vec<(String, BTreeMap<String, String>)>) -> Change {
        let mut change = Change::none();
        let mut bundles = BTreeMap::new();
        for (name, data) in all {
            let certificates = self.read_bundle(&name, &data, &mut change.warnings);
            bundles.insert(name, certificates);
        }
        if bundles != self.bundles {
            self.bundles = bundles;
            change.retrusted = self.retrust();
        }
        change
    }

    /// One labelled ConfigMap added or changed (`Some`), or deleted or unlabelled (`None`).
    pub fn bundle(&mut self, name: &str, data: Option<&BTreeMap<String, String>>) -> Change {
        let mut change = Change::none();
        let read = data.map(|data| self.read_bundle(name, data, &mut change.warnings));
        let before = match read {
            Some(certificates) => {
                self.bundles.insert(name.to_string(), certificates.clone()) != Some(certificates)
            }
            None => self.bundles.remove(name).is_some(),
        };
        if before {
            change.retrusted = self.retrust();
        }
        change
    }

    fn read_bundle(
        &self,
        name: &str,
        data: &BTreeMap<String, String>,
        warnings: &mut Vec<String>,
    ) -> Vec<CertificateDer<'static>> {
        let mut found = Vec::new();
        for (key, value) in data {
            let source = format!("ConfigMap {}/{name} key {key}", self.system_namespace);
            match certificates(&source, value.as_bytes()) {
                Ok(certificates) => found.extend(certificates),
                Err(error) => warnings.push(format!("{error}; left out of the trust")),
            }
        }
        found
    }

    /// Builds the trust again from the Secret's CA and the bundles; whether it changed.
    fn retrust(&mut self) -> bool {
        let roots: Vec<CertificateDer<'static>> = self
            .secret_ca
            .iter()
            .chain(self.bundles.values().flatten())
            .cloned()
            .collect();
        let reason = format!(
            "no CA to verify queue-proxies with: {} has no usable {CA_CRT} and no ConfigMap \
             labelled {TRUST_BUNDLE_LABEL} holds a certificate",
            self.secret_name()
        );
        let trust = match PodTrust::from_roots(&roots, &reason) {
            Ok(trust) => trust,
            // A certificate rustls cannot take as a root: trust nothing rather than a part.
            Err(error) => PodTrust::from_roots(&[], &format!("{error}")).expect("empty trust"),
        };
        let changed = trust.id != self.trust.id || trust.untrusted() != self.trust.untrusted();
        self.trust = trust;
        self.by_namespace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
        changed
    }

    /// How pods of revisions in `namespace` are dialled.
    pub fn pod_tls(&self, namespace: &str) -> Box<PodTls> {
        self.by_namespace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(namespace.to_string())
            .or_insert_with(|| {
                let required = format!("{KNATIVE_USER_NAME_PREFIX}{}", namespace.to_lowercase());
                // A namespace is a DNS label, so the name builds; one that is not (no API
                // server lets it through) gets a client that refuses every dial, saying why.
                let tls = PodTls::trusting(&self.trust, KNATIVE_SERVER_NAME, Some(&required))
                    .or_else(|error| {
                        let refused = PodTrust::from_roots(
                            &[],
                            &format!("namespace {namespace:?}: {error}"),
                        )?;
                        PodTls::trusting(&refused, KNATIVE_SERVER_NAME, None)
                    })
                    .expect("data-plane.knative.dev is a DNS name");
                Box::new(tls.with_ports(KNATIVE_TLS_PORTS))
            })
            .clone()
    }
}

/// The first PEM block of `pem`, which must be a certificate (Go: `pem.Decode`, then
/// `x509.ParseCertificate`).
fn first_certificate(pem: &[u8]) -> Result<CertificateDer<'static>, String> {
    match <(SectionKind, Vec<u8>)>::from_pem_slice(pem) {
        Ok((SectionKind::Certificate, der)) => {
            let certificate = CertificateDer::from(der);
            webpki::EndEntityCert::try_from(&certificate)
                .map_err(|error| format!("not a certificate: {error:?}"))?;
            Ok(certificate)
        }
        Ok((kind, _)) => Err(format!(
            "its first PEM block is {kind:?}, not a certificate"
        )),
        Err(error) => Err(format!("no PEM block: {error}")),
    }
}

#[cfg(test)]
mod tests;

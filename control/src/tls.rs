//! TLS material and settings into rustls' configurations: the server side of the TLS data port
//! (certificates chosen by SNI, optional client certificates, versions, suites and groups in
//! Go's names as Knative's `*_TLS_*` settings spell them) and the client side to pods.
//!
//! Pure but for the clock rustls' verifiers read: bytes in (PEM as files or Secrets hold them),
//! a configuration or a clear error out. Who reads the bytes and when (the file watcher, the
//! Kubernetes Secret informer, the queue-proxy's mounted files) is the caller's business.

use std::fmt;
use std::sync::Arc;

use kactivator_shards::runtime::tls::provider;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};

pub mod files;
pub mod settings;

pub use settings::{Curve, TlsSettings, TlsVersion};

/// `config-network`'s `system-internal-tls`, as Knative reads it (`networking/pkg/config/config.go`,
/// `reference/tls.md` §1): `enabled` or `disabled` in any case, empty or absent for disabled,
/// anything else an error in upstream's words; the legacy `internal-encryption`, a Go boolean,
/// turns it on when `system-internal-tls` is empty or disabled.
pub fn system_internal_tls(
    system_internal_tls: Option<&str>,
    internal_encryption: Option<&str>,
) -> Result<bool, String> {
    let value = system_internal_tls.unwrap_or_default();
    let enabled = match value.to_ascii_lowercase().as_str() {
        "enabled" => true,
        "disabled" | "" => false,
        _ => {
            return Err(format!(
                "system-internal-tls with value: {value:?} in config-network ConfigMap is not supported"
            ))
        }
    };
    if enabled {
        return Ok(true);
    }
    match internal_encryption {
        None => Ok(false),
        // Go's strconv.ParseBool.
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(format!(
            "failed to parse \"internal-encryption\": strconv.ParseBool: parsing {other:?}: invalid syntax"
        )),
    }
}

/// ALPN protocols a TLS data port offers by default, in order of preference: HTTP/2, then
/// HTTP/1.1 (as Go's `net/http` server does). A client that offers neither, or none, gets
/// HTTP/1.1 or HTTP/2 by prior knowledge, as on a plain port.
pub const SERVER_ALPN: [&str; 2] = ["h2", "http/1.1"];

/// Why TLS material or settings cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TlsError {
    #[error("{what}: no PEM certificate in it")]
    NoCertificate { what: String },
    #[error("{what}: not PEM certificates: {reason}")]
    BadCertificate { what: String, reason: String },
    #[error("{what}: no private key in it (PKCS#1, PKCS#8 or SEC1 PEM)")]
    NoKey { what: String },
    #[error("{what}: {reason}")]
    BadKey { what: String, reason: String },
    #[error("{what}: the private key does not belong to the first certificate of the chain")]
    KeyMismatch { what: String },
    #[error("{what}: {reason}")]
    BadTrust { what: String, reason: String },
    #[error("{0}")]
    Settings(String),
}

/// A certificate chain and its key, parsed and checked, with where they came from (for errors
/// and logs).
#[derive(Clone)]
pub struct Identity {
    pub source: String,
    certified: Arc<CertifiedKey>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("source", &self.source)
            .field("certificates", &self.certified.cert.len())
            .finish()
    }
}

impl Identity {
    /// Parses a leaf-first PEM chain and a PEM key (PKCS#1 as cert-manager writes RSA keys,
    /// PKCS#8 or SEC1), and checks the key is the leaf's. `source` names them in errors.
    pub fn from_pem(source: &str, chain: &[u8], key: &[u8]) -> Result<Identity, TlsError> {
        let chain = certificates(source, chain)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|error| match error {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
                what: source.to_string(),
            },
            other => TlsError::BadKey {
                what: source.to_string(),
                reason: format!("not a PEM private key: {other}"),
            },
        })?;
        let signing = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|error| TlsError::BadKey {
                what: source.to_string(),
                reason: format!("unusable private key: {error}"),
            })?;
        let certified = CertifiedKey::new(chain, signing);
        match certified.keys_match() {
            Ok(()) => {}
            // A key type rustls cannot compare (none of the common ones) is let through: the
            // handshake would fail visibly.
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(_) => {
                return Err(TlsError::KeyMismatch {
                    what: source.to_string(),
                })
            }
        }
        Ok(Identity {
            source: source.to_string(),
            certified: Arc::new(certified),
        })
    }

    /// The leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.certified.cert[0]
    }

    /// The DNS names the leaf is valid for (its subject alternative names).
    pub fn dns_names(&self) -> Vec<String> {
        match webpki::EndEntityCert::try_from(self.leaf()) {
            Ok(cert) => cert.valid_dns_names().map(str::to_string).collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Every PEM certificate in `pem`, in order; at least one.
pub fn certificates(source: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|error| TlsError::BadCertificate {
            what: source.to_string(),
            reason: error.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            what: source.to_string(),
        });
    }
    Ok(chain)
}

/// A trust store from PEM bundles (each a source name and its bytes): every certificate in
/// them. A bundle with a certificate that does not parse is an error that names it.
pub fn trust(bundles: &[(String, Vec<u8>)]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for (source, pem) in bundles {
        for cert in certificates(source, pem)? {
            roots.add(cert).map_err(|error| TlsError::BadTrust {
                what: source.clone(),
                reason: format!("not a usable CA certificate: {error}"),
            })?;
        }
    }
    Ok(roots)
}

/// Whether (and how) a TLS data port asks clients for certificates.
#[derive(Clone, Debug, Default)]
pub enum ClientAuth {
    /// None asked (Knative's ports).
    #[default]
    None,
    /// Asked, and verified against these roots when given; a client without one is served.
    Optional(Arc<RootCertStore>),
    /// Required and verified against these roots.
    Required(Arc<RootCertStore>),
}

/// The server side of a TLS data port: `identities` chosen by the server name a client asks
/// for (the first for a client that names none, or one no certificate is valid for), `alpn`
/// offered in that order ([`SERVER_ALPN`] by default), `settings` applied as Go applies them.
pub fn server_config(
    identities: &[Identity],
    client_auth: &ClientAuth,
    alpn: &[String],
    settings: &TlsSettings,
) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with_default(identities, 0, client_auth, alpn, settings)
}

/// As [`server_config`], with `identities[default]` for a client that names none or a name no
/// certificate is valid for (names are still tried in the order given).
pub fn server_config_with_default(
    identities: &[Identity],
    default: usize,
    client_auth: &ClientAuth,
    alpn: &[String],
    settings: &TlsSettings,
) -> Result<Arc<ServerConfig>, TlsError> {
    if identities.len() <= default {
        return Err(TlsError::Settings("no certificate to serve".into()));
    }
    let provider = Arc::new(apply(&provider(), settings)?);
    let versions = versions(settings);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|error| TlsError::Settings(format!("TLS settings not usable: {error}")))?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional(roots) | ClientAuth::Required(roots) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
            let verifier = if matches!(client_auth, ClientAuth::Optional(_)) {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|error| {
                TlsError::BadTrust {
                    what: "client CA".into(),
                    reason: error.to_string(),
                }
            })?)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(BySni {
        identities: identities.to_vec(),
        default,
    }));
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    // No session resumption: rustls' session cache and ticket-key rotation sit behind locks that
    // every shard's handshakes would share (one configuration serves them all). A client that
    // comes back makes a full handshake.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The certificate for the server name a client asked for.
#[derive(Debug)]
struct BySni {
    identities: Vec<Identity>,
    /// Served when no identity is valid for the name asked, or none is asked.
    default: usize,
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let chosen = hello
            .server_name()
            .and_then(|name| ServerName::try_from(name).ok())
            .and_then(|name| {
                self.identities.iter().find(|identity| {
                    webpki::EndEntityCert::try_from(identity.leaf())
                        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
                })
            })
            .unwrap_or(&self.identities[self.default]);
        Some(chosen.certified.clone())
    }
}

/// The protocol versions `settings` leave (TLS 1.3 only by default, as upstream).
fn versions(settings: &TlsSettings) -> Vec<&'static SupportedProtocolVersion> {
    let min = settings.min_version.unwrap_or(TlsVersion::Tls13);
    let max = settings.max_version.unwrap_or(TlsVersion::Tls13);
    let mut versions = Vec::with_capacity(2);
    if max >= TlsVersion::Tls13 && min <= TlsVersion::Tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if min <= TlsVersion::Tls12 && max >= TlsVersion::Tls12 {
        versions.push(&rustls::version::TLS12);
    }
    versions
}

/// The provider narrowed to `settings`' suites and groups. As Go: a suite list names TLS 1.2
/// suites (TLS 1.3's are always on; their names in the list change nothing); a curve list sets
/// the key-exchange groups, in that order.
fn apply(base: &CryptoProvider, settings: &TlsSettings) -> Result<CryptoProvider, TlsError> {
    let mut provider = base.clone();
    if !settings.cipher_suites.is_empty() {
        let mut unsupported = Vec::new();
        let mut twelve: Vec<SupportedCipherSuite> = Vec::new();
        for name in &settings.cipher_suites {
            if name.starts_with("TLS_AES_") || name.starts_with("TLS_CHACHA20_") {
                continue;
            }
            match base
                .cipher_suites
                .iter()
                .find(|suite| suite.suite().as_str() == Some(name))
            {
                Some(suite) => twelve.push(*suite),
                None => unsupported.push(*name),
            }
        }
        if !unsupported.is_empty() {
            return Err(TlsError::Settings(format!(
                "cipher suites not built in (kactivator's TLS has no CBC suites): {}",
                unsupported.join(", ")
            )));
        }
        provider.cipher_suites = base
            .cipher_suites
            .iter()
            .filter(|suite| matches!(suite, SupportedCipherSuite::Tls13(_)))
            .copied()
            .chain(twelve)
            .collect();
    }
    if !settings.curve_preferences.is_empty() {
        let mut groups = Vec::new();
        let mut unsupported = Vec::new();
        for curve in &settings.curve_preferences {
            let named = match curve {
                Curve::X25519 => rustls::NamedGroup::X25519,
                Curve::P256 => rustls::NamedGroup::secp256r1,
                Curve::P384 => rustls::NamedGroup::secp384r1,
                Curve::P521 => rustls::NamedGroup::secp521r1,
                Curve::X25519Mlkem768 => rustls::NamedGroup::X25519MLKEM768,
            };
            match base.kx_groups.iter().find(|group| group.name() == named) {
                Some(group) => groups.push(*group),
                None => unsupported.push(curve.go_name()),
            }
        }
        if !unsupported.is_empty() {
            return Err(TlsError::Settings(format!(
                "curves not built in: {}",
                unsupported.join(", ")
            )));
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

#[cfg(test)]
pub(crate) mod tests;

/// Knative's queue-proxy TLS port (`networking.BackendHTTPSPort`), where its activator dials a
/// pod listed at its plain serving port (`reference/tls.md` §2.3).
pub const KNATIVE_POD_TLS_PORT: u16 = 8112;
/// Where Knative's activator dials a revision's private Service over TLS (its `https` port).
pub const KNATIVE_SERVICE_TLS_PORT: u16 = 443;
/// The name Knative's activator sends as SNI and verifies (`certificates.LegacyFakeDnsName`).
pub const KNATIVE_SERVER_NAME: &str = "data-plane.knative.dev";
/// The name a namespace's queue-proxy certificates carry besides: `kn-user-<namespace>`.
pub const KNATIVE_USER_NAME_PREFIX: &str = "kn-user-";

/// Ports TLS is dialled on instead of the listed ones (`None`: as listed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsPorts {
    /// For a pod.
    pub pod: Option<u16>,
    /// For a revision's private Service (cluster-IP mode).
    pub service: Option<u16>,
}

/// Knative's: pods on 8112, Services on 443.
pub const KNATIVE_TLS_PORTS: TlsPorts = TlsPorts {
    pod: Some(KNATIVE_POD_TLS_PORT),
    service: Some(KNATIVE_SERVICE_TLS_PORT),
};

/// How a revision's pods are dialled over TLS, as a source describes it (compared by that
/// description, so a source that says the same again changes nothing), with the client
/// configuration built from it.
#[derive(Clone, Debug)]
pub struct PodTls {
    /// The trust, as PEM (every certificate in it is a root); empty when nothing is trusted.
    pub ca_pem: Arc<[u8]>,
    /// Why nothing is trusted, said by every dial (then `ca_pem` is empty).
    pub untrusted: Option<String>,
    /// Sent as SNI and verified as the certificate's name.
    pub server_name: String,
    /// A DNS name the certificate must carry besides (Knative: `kn-user-<namespace>`).
    pub require_name: Option<String>,
    pub ports: TlsPorts,
    /// Versions, ALPN and verification beyond the trust and the names.
    pub profile: ClientProfile,
    /// For dialling a pod.
    pub built: Arc<kactivator_shards::runtime::tls::UpstreamTls>,
    /// For dialling the revision's private Service.
    pub built_for_service: Arc<kactivator_shards::runtime::tls::UpstreamTls>,
}

impl PartialEq for PodTls {
    fn eq(&self, other: &PodTls) -> bool {
        self.ca_pem == other.ca_pem
            && self.untrusted == other.untrusted
            && self.server_name == other.server_name
            && self.require_name == other.require_name
            && self.ports == other.ports
            && self.profile == other.profile
    }
}

impl Eq for PodTls {}

impl PodTls {
    /// TLS 1.3 (Knative's activator dials its queue-proxies with TLS 1.3 only), no ALPN (as
    /// upstream, which sends HTTP/2 by prior knowledge inside TLS), trusting only `ca_pem`,
    /// verifying `server_name` and, when given, `require_name` too; dialled at the listed
    /// address ([`PodTls::with_ports`] changes that).
    pub fn new(
        source: &str,
        ca_pem: &[u8],
        server_name: &str,
        require_name: Option<&str>,
    ) -> Result<PodTls, TlsError> {
        let trust = PodTrust::from_pem(source, ca_pem)?;
        PodTls::trusting(&trust, server_name, require_name)
    }

    /// As [`PodTls::new`], with a trust already built (shared by many revisions).
    pub fn trusting(
        trust: &PodTrust,
        server_name: &str,
        require_name: Option<&str>,
    ) -> Result<PodTls, TlsError> {
        PodTls::build(
            trust,
            server_name,
            require_name,
            TlsPorts::default(),
            ClientProfile::default(),
        )
    }

    /// As [`PodTls::trusting`], built as `profile` says (KEDA's HTTP add-on's dial).
    pub fn with_profile(
        trust: &PodTrust,
        server_name: &str,
        profile: ClientProfile,
    ) -> Result<PodTls, TlsError> {
        PodTls::build(trust, server_name, None, TlsPorts::default(), profile)
    }

    /// The same, dialled on `ports`.
    pub fn with_ports(self, ports: TlsPorts) -> PodTls {
        let at = |port: Option<u16>| {
            Arc::new(kactivator_shards::runtime::tls::UpstreamTls {
                config: self.built.config.clone(),
                config_h2: self.built.config_h2.clone(),
                server_name: self.built.server_name.clone(),
                port,
                clients_over_tls_only: self.profile.clients_over_tls_only,
            })
        };
        PodTls {
            built: at(ports.pod),
            built_for_service: at(ports.service),
            ports,
            ..self
        }
    }

    /// Whether the health prober speaks this TLS to a pod at its listed address: when the pods
    /// are dialled over TLS at that very address (standalone `[revisions.tls]`: nothing there
    /// speaks plain). Where TLS goes to another port (Knative's 8112, [`TlsPorts::pod`]) the
    /// listed port is the pod's plain one, probed plain, as upstream's activator probes it.
    /// A TLS only for clients that came over TLS (KEDA's HTTP add-on) is not the prober's: the
    /// pod is probed as a plain client's request reaches it.
    pub fn probes_over_tls(&self) -> bool {
        self.ports.pod.is_none() && !self.profile.clients_over_tls_only
    }

    /// What a route dials: the pods, or the revision's private Service.
    pub fn upstream(&self, to_service: bool) -> Arc<kactivator_shards::runtime::tls::UpstreamTls> {
        if to_service {
            self.built_for_service.clone()
        } else {
            self.built.clone()
        }
    }

    fn build(
        trust: &PodTrust,
        server_name: &str,
        require_name: Option<&str>,
        ports: TlsPorts,
        profile: ClientProfile,
    ) -> Result<PodTls, TlsError> {
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| TlsError::Settings(format!("{server_name:?} is not a server name")))?;
        let required = require_name
            .map(|required| {
                ServerName::try_from(required.to_string())
                    .map_err(|_| TlsError::Settings(format!("{required:?} is not a DNS name")))
            })
            .transpose()?;
        let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> =
            match (&trust.verifier, required) {
                _ if profile.skip_verify => Arc::new(AcceptAny {
                    algorithms: provider().signature_verification_algorithms,
                }),
                (Ok(webpki), None) => webpki.clone(),
                (Ok(webpki), Some(required)) => Arc::new(RequireName {
                    inner: webpki.clone(),
                    required,
                }),
                (Err(reason), _) => Arc::new(TrustNothing {
                    reason: reason.clone(),
                    schemes: provider()
                        .signature_verification_algorithms
                        .supported_schemes(),
                }),
            };
        let (provider, versions) = match &profile.settings {
            None => (provider(), vec![&rustls::version::TLS13]),
            Some(settings) => (Arc::new(apply(&provider(), settings)?), versions(settings)),
        };
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(|error| TlsError::Settings(error.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // With ALPN, HTTP/1.1 connections offer `http/1.1` and HTTP/2 ones `h2`: which
        // the pod speaks is then the connection's, not the server's choice.
        let mut config_h2 = None;
        if profile.alpn {
            let mut h2 = config.clone();
            h2.alpn_protocols = vec![b"h2".to_vec()];
            config_h2 = Some(Arc::new(h2));
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        let built = Arc::new(kactivator_shards::runtime::tls::UpstreamTls {
            config: Arc::new(config),
            config_h2,
            server_name: name,
            port: None,
            clients_over_tls_only: profile.clients_over_tls_only,
        });
        Ok(PodTls {
            ca_pem: trust.id.clone(),
            untrusted: trust.verifier.as_ref().err().cloned(),
            server_name: server_name.to_string(),
            require_name: require_name.map(str::to_string),
            ports: TlsPorts::default(),
            profile,
            built_for_service: built.clone(),
            built,
        }
        .with_ports(ports))
    }
}

/// How a client to pods is built beyond its trust and names. The default is Knative's activator's
/// dial: TLS 1.3 only, no ALPN (HTTP/2 by prior knowledge inside TLS), certificates verified,
/// every request over TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientProfile {
    /// Versions, suites and curves as Go's `tls.Config` takes them; `None`: the default above.
    pub settings: Option<TlsSettings>,
    /// ALPN offered: `http/1.1` by HTTP/1.1 connections, `h2` by HTTP/2 ones; `false`: none.
    pub alpn: bool,
    /// Any certificate is accepted (Go's `InsecureSkipVerify`); the handshake's signature is
    /// still checked against the certificate's key, as Go does.
    pub skip_verify: bool,
    /// Only a client that came over TLS is sent over TLS ([`UpstreamTls::clients_over_tls_only`]).
    ///
    /// [`UpstreamTls::clients_over_tls_only`]: kactivator_shards::runtime::tls::UpstreamTls
    pub clients_over_tls_only: bool,
}

/// What pods' certificates must chain to, built once and shared by every revision dialled
/// with it.
#[derive(Clone)]
pub struct PodTrust {
    /// What it was built from (PEM as a file holds it, or each root's DER), compared to tell a
    /// change.
    pub id: Arc<[u8]>,
    /// The standard verification, or why nothing is trusted.
    verifier: Result<Arc<rustls::client::WebPkiServerVerifier>, String>,
}

impl fmt::Debug for PodTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodTrust")
            .field("untrusted", &self.verifier.as_ref().err())
            .finish()
    }
}

impl PodTrust {
    /// Every certificate of a PEM bundle is a root; a bundle without one is an error.
    pub fn from_pem(source: &str, pem: &[u8]) -> Result<PodTrust, TlsError> {
        let roots = trust(&[(source.to_string(), pem.to_vec())])?;
        Ok(PodTrust {
            id: Arc::from(pem),
            verifier: Ok(webpki_verifier(source, roots)?),
        })
    }

    /// These roots; none at all trusts nothing, and every dial says `reason_if_none`.
    pub fn from_roots(
        roots: &[CertificateDer<'static>],
        reason_if_none: &str,
    ) -> Result<PodTrust, TlsError> {
        let id: Vec<u8> = roots
            .iter()
            .flat_map(|root| {
                let len = (root.len() as u32).to_be_bytes();
                len.into_iter().chain(root.iter().copied())
            })
            .collect();
        if roots.is_empty() {
            return Ok(PodTrust {
                id: Arc::from(id),
                verifier: Err(reason_if_none.to_string()),
            });
        }
        let mut store = RootCertStore::empty();
        for root in roots {
            store
                .add(root.clone())
                .map_err(|error| TlsError::BadTrust {
                    what: "a trusted certificate".into(),
                    reason: format!("not a usable CA certificate: {error}"),
                })?;
        }
        Ok(PodTrust {
            id: Arc::from(id),
            verifier: Ok(webpki_verifier("the trusted certificates", store)?),
        })
    }

    /// These roots, as Go's `CertPool.AppendCertsFromPEM` takes them: one that is not a usable
    /// anchor is passed over, not an error (a system bundle may hold such); at least one must be
    /// left.
    pub fn lenient(
        roots: Vec<CertificateDer<'static>>,
        source: &str,
    ) -> Result<PodTrust, TlsError> {
        let id: Vec<u8> = roots
            .iter()
            .flat_map(|root| {
                let len = (root.len() as u32).to_be_bytes();
                len.into_iter().chain(root.iter().copied())
            })
            .collect();
        let mut store = RootCertStore::empty();
        store.add_parsable_certificates(roots);
        if store.is_empty() {
            return Err(TlsError::BadTrust {
                what: source.to_string(),
                reason: "no usable CA certificate".into(),
            });
        }
        Ok(PodTrust {
            id: Arc::from(id),
            verifier: Ok(webpki_verifier(source, store)?),
        })
    }

    /// Why nothing is trusted, if nothing is.
    pub fn untrusted(&self) -> Option<&str> {
        self.verifier.as_ref().err().map(String::as_str)
    }
}

/// rustls' standard verification against `roots`.
fn webpki_verifier(
    source: &str,
    roots: RootCertStore,
) -> Result<Arc<rustls::client::WebPkiServerVerifier>, TlsError> {
    rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|error| TlsError::BadTrust {
            what: source.to_string(),
            reason: error.to_string(),
        })
}

/// Trusts no certificate, saying why.
#[derive(Debug)]
struct TrustNothing {
    reason: String,
    schemes: Vec<rustls::SignatureScheme>,
}

impl TrustNothing {
    fn refused(&self) -> rustls::Error {
        rustls::Error::General(self.reason.clone())
    }
}

impl rustls::client::danger::ServerCertVerifier for TrustNothing {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Err(self.refused())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(self.refused())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(self.refused())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.schemes.clone()
    }
}

/// Accepts every certificate, checking only that the handshake was signed by its key (Go's
/// `InsecureSkipVerify`, which KEDA's HTTP add-on offers as `KEDA_HTTP_TLS_SKIP_VERIFY`).
#[derive(Debug)]
struct AcceptAny {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The standard verification, then one more name the certificate must carry: Knative's
/// activator requires `kn-user-<namespace>` of a queue-proxy's certificate
/// (`pkg/activator/certificate/tls_context.go`, `verifySAN`), besides `data-plane.knative.dev`.
#[derive(Debug)]
struct RequireName {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    required: ServerName<'static>,
}

impl rustls::client::danger::ServerCertVerifier for RequireName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        if cert
            .verify_is_valid_for_subject_name(&self.required)
            .is_ok()
        {
            return Ok(verified);
        }
        // Upstream's words (`tls_context.go`).
        let names: Vec<&str> = cert.valid_dns_names().collect();
        Err(rustls::Error::General(format!(
            "san {:?} does not have a matching name in {names:?}",
            self.required.to_str()
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

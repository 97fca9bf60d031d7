//! The interceptor's TLS port as KEDA's HTTP add-on serves it, and the TLS its requests reach
//! pods with (`interceptor/tls_config.go`, `proxy.go` L53-71 and `middleware/routing.go`
//! L118-133 at v0.15.0):
//! * the port serves the main pair (`KEDA_HTTP_PROXY_TLS_CERT_PATH`/`_KEY_PATH`) and every
//!   pair found in the store directories (`_CERT_STORE_PATHS`: a certificate `<id>.crt` or
//!   `<id>.pem` beside its key `<id>.key` or `<id>-key.pem`, in any subdirectory); a client's
//!   server name picks a store pair, the main pair serves any other;
//! * a request that came in over TLS goes to its pod over TLS (the add-on's `https://`
//!   upstream), sending `<service>.<namespace>` as the server name and verifying the pod's
//!   certificate against the system's roots, every served certificate and (0.16) the
//!   certificates in `KEDA_HTTP_TLS_CA_DIRS`; a plain request goes in plain TCP.
//!
//! Differences, each for the better or for lack of a use: a store pair is chosen by what its
//! certificate is valid for (a wildcard name matches as clients match it; the add-on compares
//! names as strings, so a wildcard store certificate is never chosen); every served pair is
//! reloaded when its files change (the add-on reloads only the main pair); the kubelet's
//! `..<timestamp>` directories of a mounted Secret are passed over rather than read twice; no
//! client certificate is presented to pods (the add-on offers its store pairs).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;

use super::env::ProxyTls;
use crate::tls::files::ServerFiles;
use crate::tls::{certificates, ClientProfile, PodTrust, TlsError, TlsSettings, SERVER_ALPN};

/// How often the served files are looked at: controller-runtime's certificate watcher, which
/// the add-on's main pair is served by, reads its files every 10 s besides its file events.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The TLS port's files, and the TLS requests that came in over it reach pods with.
#[derive(Debug)]
pub struct InterceptorTls {
    pub files: ServerFiles,
    pub upstream: Arc<UpstreamSetting>,
}

/// What every route's TLS to its pods is built from.
#[derive(Debug)]
pub struct UpstreamSetting {
    pub trust: PodTrust,
    settings: TlsSettings,
    skip_verify: bool,
}

impl UpstreamSetting {
    /// How a route's pods are dialled: the port's versions, suites and curves, ALPN naming
    /// the protocol each connection speaks inside (a request goes on in the protocol it came
    /// in, or the route's), and only for clients that came over TLS.
    pub fn profile(&self) -> ClientProfile {
        ClientProfile {
            settings: Some(self.settings.clone()),
            alpn: true,
            skip_verify: self.skip_verify,
            clients_over_tls_only: true,
        }
    }
}

/// Finds the store's pairs, reads what pods' certificates may chain to, and describes the
/// port's files; the files themselves are loaded (and a bad one refused) when the port is
/// bound.
pub fn load(tls: &ProxyTls) -> Result<InterceptorTls, TlsError> {
    let mut certificates_files = store_pairs(&tls.store_dirs)?;
    certificates_files.push((tls.cert.clone(), tls.key.clone()));
    let default = certificates_files.len() - 1;
    let mut roots: Vec<CertificateDer<'static>> = Vec::new();
    let native = rustls_native_certs::load_native_certs();
    if !native.errors.is_empty() {
        tracing::warn!(
            errors = ?native.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "keda-http: some of the system's CA certificates could not be read"
        );
    }
    roots.extend(native.certs);
    for (chain, _) in &certificates_files {
        roots.extend(read_certificates(chain)?);
    }
    for dir in &tls.ca_dirs {
        roots.extend(ca_dir(dir)?);
    }
    let trust = PodTrust::lenient(roots, "the trust for pods' certificates")?;
    Ok(InterceptorTls {
        files: ServerFiles {
            certificates: certificates_files,
            default,
            client_ca: None,
            settings: tls.settings.clone(),
            // Go's server's.
            alpn: SERVER_ALPN.map(str::to_string).to_vec(),
            every: RELOAD_EVERY,
        },
        upstream: Arc::new(UpstreamSetting {
            trust,
            settings: tls.settings.clone(),
            skip_verify: tls.skip_verify,
        }),
    })
}

/// The pairs in `dirs`, in the order found (directories as given, then by path): a
/// certificate without its key is an error, as the add-on's; a key without a certificate is
/// passed over.
pub fn store_pairs(dirs: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf)>, TlsError> {
    let mut pairs = Vec::new();
    for dir in dirs {
        let mut files = Vec::new();
        walk(dir, &mut files)?;
        files.sort();
        let mut certs: Vec<(String, PathBuf)> = Vec::new();
        let mut keys: Vec<(String, PathBuf)> = Vec::new();
        for file in files {
            let Some(text) = file.to_str() else { continue };
            // The add-on's suffixes, in its order: `-key.pem` before `.pem`.
            if let Some(id) = text.strip_suffix("-key.pem") {
                keys.push((id.to_owned(), file.clone()));
            } else if let Some(id) = text.strip_suffix(".pem") {
                certs.push((id.to_owned(), file.clone()));
            } else if let Some(id) = text.strip_suffix(".key") {
                keys.push((id.to_owned(), file.clone()));
            } else if let Some(id) = text.strip_suffix(".crt") {
                certs.push((id.to_owned(), file.clone()));
            }
        }
        for (id, cert) in certs {
            let Some((_, key)) = keys.iter().find(|(key_id, _)| *key_id == id) else {
                return Err(TlsError::Settings(format!(
                    "KEDA_HTTP_PROXY_TLS_CERT_STORE_PATHS: no key found for certificate {}",
                    cert.display()
                )));
            };
            pairs.push((cert, key.clone()));
        }
    }
    Ok(pairs)
}

/// Every file under `dir`, passing over the kubelet's `..`-named entries of a mounted volume
/// (its timestamped copy and `..data`; the names themselves link into them).
fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), TlsError> {
    let entries = std::fs::read_dir(dir).map_err(unreadable("the directory ", dir))?;
    for entry in entries {
        let entry = entry.map_err(unreadable("the directory ", dir))?;
        if entry.file_name().to_string_lossy().starts_with("..") {
            continue;
        }
        let path = entry.path();
        // Followed, as a mounted volume's names are links.
        let metadata = std::fs::metadata(&path).map_err(unreadable("", &path))?;
        if metadata.is_dir() {
            walk(&path, files)?;
        } else if metadata.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(unreadable("", path))?;
    certificates(&path.display().to_string(), &pem)
}

/// The error of a file (or, `what` = `"the directory "`, a directory) that could not be read,
/// naming it.
fn unreadable<'a>(what: &'a str, path: &'a Path) -> impl Fn(std::io::Error) -> TlsError + 'a {
    move |error| TlsError::Settings(format!("cannot read {what}{}: {error}", path.display()))
}

/// The certificates in the files of a CA directory: every file that holds PEM certificates (a
/// ConfigMap's keys are any names); others are passed over.
fn ca_dir(dir: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let pem = std::fs::read(&file).map_err(unreadable("", &file))?;
        if let Ok(certs) = certificates(&file.display().to_string(), &pem) {
            found.extend(certs);
        }
    }
    if found.is_empty() {
        return Err(TlsError::Settings(format!(
            "KEDA_HTTP_TLS_CA_DIRS: no PEM certificate in {}",
            dir.display()
        )));
    }
    Ok(found)
}

#[cfg(test)]
mod tests;

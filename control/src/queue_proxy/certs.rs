//! Whether Knative asks this pod for TLS. Serving TLS is not built, so when it does, start-up
//! refuses with a clear error rather than serve plain HTTP while the activator and the ingress
//! knock on the TLS port.
//!
//! Upstream (release-1.18 `pkg/queue/sharedmain/main.go`, `reference/queue-proxy.md` §2 items 6
//! and 7): with `system-internal-tls` on, the reconciler mounts the `serving-certs` secret at
//! [`CERT_DIR`], and the queue-proxy serves TLS on `QUEUE_SERVING_TLS_PORT` exactly when both
//! [`CERT_FILE`] and [`KEY_FILE`] exist there. A look-up that fails other than with "not found"
//! is fatal upstream, and is here too: it cannot tell whether TLS is asked for.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Where Knative mounts the pod's certificate (`pkg/queue/constants.go`, `CertDirectory`).
pub const CERT_DIR: &str = "/var/lib/knative/certs";
/// The certificate chain in [`CERT_DIR`] (`certificates.CertName`).
pub const CERT_FILE: &str = "tls.crt";
/// The private key in [`CERT_DIR`] (`certificates.PrivateKeyName`).
pub const KEY_FILE: &str = "tls.key";

/// Why this queue-proxy cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error(
        "{cert} and {key} are mounted, so Knative's system-internal-tls is on and the activator \
         and the ingress will send TLS to QUEUE_SERVING_TLS_PORT; kactivator's queue-proxy does \
         not serve TLS (README: As Knative's queue-proxy): turn system-internal-tls off or use \
         Knative's queue-proxy for this revision",
        cert = .cert.display(),
        key = .key.display()
    )]
    TlsAsked { cert: PathBuf, key: PathBuf },
    #[error("cannot tell whether {} is mounted: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `Ok` when the pod asks for no TLS: at most one of the two files exists in `dir` (upstream
/// turns TLS on only with both).
pub fn refuse_tls_if_asked(dir: &Path) -> Result<(), CertsError> {
    if tls_asked(dir)? {
        return Err(CertsError::TlsAsked {
            cert: dir.join(CERT_FILE),
            key: dir.join(KEY_FILE),
        });
    }
    Ok(())
}

/// Whether both files exist in `dir`: upstream would serve TLS, and read its
/// `QUEUE_PROXY_TLS_*` settings (`tls::settings`).
pub fn tls_asked(dir: &Path) -> Result<bool, CertsError> {
    Ok(exists(&dir.join(CERT_FILE))? && exists(&dir.join(KEY_FILE))?)
}

fn exists(path: &Path) -> Result<bool, CertsError> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(true),
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CertsError::Unreadable {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(name: &str, files: &[&str]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kactivator-certs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for file in files {
            std::fs::write(dir.join(file), b"pem").unwrap();
        }
        dir
    }

    #[test]
    fn both_files_mounted_is_refused_naming_them() {
        let dir = dir_with("both", &[CERT_FILE, KEY_FILE]);
        let error = refuse_tls_if_asked(&dir).unwrap_err().to_string();
        assert!(
            error.contains(&dir.join(CERT_FILE).display().to_string())
                && error.contains("system-internal-tls")
                && error.contains("does not serve TLS"),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn no_directory_or_one_file_asks_for_no_tls() {
        assert!(refuse_tls_if_asked(Path::new("/nonexistent/kactivator/certs")).is_ok());
        for file in [CERT_FILE, KEY_FILE] {
            let dir = dir_with(file, &[file]);
            assert!(refuse_tls_if_asked(&dir).is_ok(), "only {file}");
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn a_look_up_that_fails_otherwise_is_an_error() {
        // A path through a regular file: ENOTDIR, neither "there" nor "not found".
        let dir = dir_with("notdir", &[CERT_FILE]);
        let error = refuse_tls_if_asked(&dir.join(CERT_FILE)).unwrap_err();
        assert!(matches!(error, CertsError::Unreadable { .. }), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

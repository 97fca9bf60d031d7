//! Whether Knative asks this pod for TLS, and the files it serves then.
//!
//! Upstream (release-1.18 to 1.23 `pkg/queue/sharedmain/main.go`, `reference/tls.md` §3): with
//! `system-internal-tls` on, the reconciler mounts the `serving-certs` secret at [`CERT_DIR`],
//! and the queue-proxy serves TLS on `QUEUE_SERVING_TLS_PORT` exactly when both [`CERT_FILE`]
//! and [`KEY_FILE`] exist there, beside the plain serving port; it looks at them again every
//! [`RELOAD_EVERY`] and serves a changed pair to new handshakes. A look-up that fails other than
//! with "not found" is fatal upstream, and is here too: it cannot tell whether TLS is asked for.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tls::files::ServerFiles;
use crate::tls::TlsSettings;

/// Where Knative mounts the pod's certificate (`pkg/queue/constants.go`, `CertDirectory`).
pub const CERT_DIR: &str = "/var/lib/knative/certs";
/// The certificate chain in [`CERT_DIR`] (`certificates.CertName`).
pub const CERT_FILE: &str = "tls.crt";
/// The private key in [`CERT_DIR`] (`certificates.PrivateKeyName`).
pub const KEY_FILE: &str = "tls.key";
/// How often the mounted pair is looked at again (`certificate/watcher.go`: one minute).
pub const RELOAD_EVERY: Duration = Duration::from_secs(60);

/// Why this queue-proxy cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("cannot tell whether {} is mounted: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Whether both files exist in `dir`: TLS is served, with the `QUEUE_PROXY_TLS_*` settings
/// (`tls::settings`).
pub fn tls_asked(dir: &Path) -> Result<bool, CertsError> {
    Ok(exists(&dir.join(CERT_FILE))? && exists(&dir.join(KEY_FILE))?)
}

/// The mounted pair in `dir`, served with `settings` and looked at every [`RELOAD_EVERY`].
pub fn server_files(dir: &Path, settings: TlsSettings) -> ServerFiles {
    ServerFiles {
        certificates: vec![(dir.join(CERT_FILE), dir.join(KEY_FILE))],
        default: 0,
        client_ca: None,
        settings,
        // Go's server, as upstream's queue-proxy.
        alpn: crate::tls::SERVER_ALPN.map(str::to_string).to_vec(),
        every: RELOAD_EVERY,
    }
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
    fn both_files_mounted_ask_for_tls() {
        let dir = dir_with("both", &[CERT_FILE, KEY_FILE]);
        assert!(tls_asked(&dir).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn no_directory_or_one_file_asks_for_no_tls() {
        assert!(!tls_asked(Path::new("/nonexistent/kactivator/certs")).unwrap());
        for file in [CERT_FILE, KEY_FILE] {
            let dir = dir_with(file, &[file]);
            assert!(!tls_asked(&dir).unwrap(), "only {file}");
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn a_look_up_that_fails_otherwise_is_an_error() {
        // A path through a regular file: ENOTDIR, neither "there" nor "not found".
        let dir = dir_with("notdir", &[CERT_FILE]);
        let error = tls_asked(&dir.join(CERT_FILE)).unwrap_err();
        assert!(matches!(error, CertsError::Unreadable { .. }), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

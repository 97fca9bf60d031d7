//! Certificates for tests: a CA of its own per test and what it issues, as PEM bytes or files,
//! with the names Knative issues (`kn-user-<namespace>`, `data-plane.knative.dev`, `kn-routing`)
//! or any other.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A certificate authority: its certificate (PEM) and the key it signs with.
pub struct TestCa {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A leaf certificate (PEM, leaf first) and its key (PEM, PKCS#8).
#[derive(Clone, Debug)]
pub struct Issued {
    pub chain: String,
    pub key: String,
}

impl TestCa {
    /// A new CA whose name includes `name` and a serial, so that no two CAs of a process share
    /// a name (a verifier finds an issuer by name).
    pub fn new(name: &str) -> TestCa {
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!(
                "{name} {} {}",
                std::process::id(),
                SERIAL.fetch_add(1, Ordering::Relaxed)
            ),
        );
        let cert = params.self_signed(&key).expect("a CA certificate");
        TestCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A leaf for these DNS names (the first is also its common name).
    pub fn issue(&self, names: &[&str]) -> Issued {
        self.issue_with(names, |_| {})
    }

    /// A leaf that expired yesterday.
    pub fn issue_expired(&self, names: &[&str]) -> Issued {
        self.issue_with(names, |params| {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        })
    }

    fn issue_with(
        &self,
        names: &[&str],
        edit: impl FnOnce(&mut rcgen::CertificateParams),
    ) -> Issued {
        let key = rcgen::KeyPair::generate().expect("a leaf key");
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, *first);
        }
        edit(&mut params);
        let leaf = params.signed_by(&key, &self.issuer).expect("a leaf");
        Issued {
            chain: leaf.pem(),
            key: key.serialize_pem(),
        }
    }

    /// Writes the CA certificate to `dir/<file>`; returns the path.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).expect("write the CA");
        path
    }
}

impl Issued {
    /// Writes chain and key to `dir/<stem>.crt` and `dir/<stem>.key`, each through a file
    /// renamed over the old one (a reader never sees half a file); returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let chain = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        for (path, text) in [(&chain, &self.chain), (&key, &self.key)] {
            let staging = path.with_extension("new");
            std::fs::write(&staging, text).expect("write PEM");
            std::fs::rename(&staging, path).expect("replace PEM");
        }
        (chain, key)
    }
}

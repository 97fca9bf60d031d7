//! Server certificates kept in files, looked at every so often: the file's `[listen.tls]`, and
//! the queue-proxy's mounted `serving-certs` (`tls.crt`, `tls.key`), which Knative's
//! queue-proxy reads the same way (`pkg/queue/certificate/watcher.go`: every minute, compared
//! by content, swapped on a change, the old pair kept when the new one does not load; only the
//! first load is fatal).
//!
//! A Secret volume changes by an atomic swap of a symbolic link, but the chain and the key are
//! two files read one after the other: a look that falls between two versions finds a pair that
//! does not match, keeps the old certificate, and the next look finds the new pair whole.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kactivator_shards::routing::ShardCommand;
use rustls::ServerConfig;

use super::{server_config_with_default, trust, ClientAuth, Identity, TlsError, TlsSettings};
use crate::publisher::Publisher;

/// Where the certificates are and how they are served.
#[derive(Clone, Debug)]
pub struct ServerFiles {
    /// Chain and key of each certificate, in the order a client's server name (SNI) tries them.
    pub certificates: Vec<(PathBuf, PathBuf)>,
    /// The index of the one served to a client that names none, or a name none is valid for
    /// (0 for the file's `[listen.tls]`; the last, the main pair, for KEDA's HTTP add-on).
    pub default: usize,
    /// CA certificates for clients' certificates, and whether one is required.
    pub client_ca: Option<(PathBuf, bool)>,
    pub settings: TlsSettings,
    /// ALPN protocols offered, in order.
    pub alpn: Vec<String>,
    /// Between looks.
    pub every: Duration,
}

/// The files' bytes, as last read: a look compares them, in the order of [`ServerFiles::paths`].
pub type Contents = Vec<Vec<u8>>;

impl ServerFiles {
    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        self.certificates
            .iter()
            .flat_map(|(chain, key)| [chain, key])
            .chain(self.client_ca.iter().map(|(ca, _)| ca))
    }

    /// Reads every file; an error names the one that failed.
    pub fn read(&self) -> Result<Contents, TlsError> {
        self.paths()
            .map(|path| {
                std::fs::read(path).map_err(|error| {
                    TlsError::Settings(format!("cannot read {}: {error}", path.display()))
                })
            })
            .collect()
    }

    /// The server configuration from bytes [`ServerFiles::read`] returned.
    pub fn build(&self, contents: &Contents) -> Result<Arc<ServerConfig>, TlsError> {
        let mut bytes = contents.iter();
        let mut identities = Vec::with_capacity(self.certificates.len());
        for (chain, key) in &self.certificates {
            let (Some(chain_pem), Some(key_pem)) = (bytes.next(), bytes.next()) else {
                return Err(TlsError::Settings("certificate files not read".into()));
            };
            let source = format!("{} and {}", chain.display(), key.display());
            identities.push(Identity::from_pem(&source, chain_pem, key_pem)?);
        }
        let client_auth = match (&self.client_ca, bytes.next()) {
            (Some((ca, required)), Some(pem)) => {
                let roots = Arc::new(trust(&[(ca.display().to_string(), pem.clone())])?);
                if *required {
                    ClientAuth::Required(roots)
                } else {
                    ClientAuth::Optional(roots)
                }
            }
            _ => ClientAuth::None,
        };
        server_config_with_default(
            &identities,
            self.default,
            &client_auth,
            &self.alpn,
            &self.settings,
        )
    }

    /// Reads and builds: the first load, whose failure stops start-up.
    pub fn load(&self) -> Result<(Arc<ServerConfig>, Contents), TlsError> {
        let contents = self.read()?;
        Ok((self.build(&contents)?, contents))
    }

    /// What one look decides, given what was read (or why it could not be) and what is served.
    pub fn look(&self, read: Result<Contents, TlsError>, served: &Contents) -> Look {
        match read {
            Ok(contents) if contents == *served => Look::Unchanged,
            Ok(contents) => match self.build(&contents) {
                Ok(config) => Look::Reloaded(config, contents),
                Err(error) => Look::Kept(error),
            },
            Err(error) => Look::Kept(error),
        }
    }
}

/// The outcome of one look at the files.
#[derive(Debug)]
pub enum Look {
    Unchanged,
    /// New certificates, to serve from now on.
    Reloaded(Arc<ServerConfig>, Contents),
    /// The files changed but do not load (or do not read): the served ones stay.
    Kept(TlsError),
}

/// Looks at the files every `files.every` and hands the shards what changed; runs on the
/// control thread until the process ends.
pub async fn watch(files: ServerFiles, mut served: Contents, publisher: Publisher) {
    let mut last_problem: Option<String> = None;
    loop {
        tokio::time::sleep(files.every).await;
        match files.look(files.read(), &served) {
            Look::Unchanged => {}
            Look::Reloaded(config, contents) => {
                publisher.broadcast(ShardCommand::ServerTls(Some(config)));
                served = contents;
                last_problem = None;
                // Upstream's queue-proxy's words, which its e2e tests wait for.
                tracing::info!("Certificate and/or key have changed on disk and were reloaded.");
            }
            Look::Kept(error) => {
                let problem = error.to_string();
                // Said once per distinct problem, not every look.
                if last_problem.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(
                        "TLS: {problem}; the certificates loaded before are still served"
                    );
                    last_problem = Some(problem);
                }
            }
        }
    }
}

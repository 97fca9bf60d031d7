//! TLS material as files and Secrets hold it: a certificate chain, a key and a server name
//! (input: `chain \0 key \0 name \0 settings`, missing parts empty; `settings` is four
//! `\n`-separated values for the `*_TLS_*` keys). What must hold besides "no panic":
//! * an error about the pair or the trust bundle names its source;
//! * a pair that loads has a chain, and serves: a client hello naming `name` (any bytes that
//!   are a DNS name) gets the server's first flight, whichever certificate SNI picks;
//! * settings that read without problems build a configuration, or are refused by name.

use std::sync::Arc;

use kactivator_control::tls::settings::{read, ACTIVATOR};
use kactivator_control::tls::{server_config, trust, ClientAuth, Identity, TlsSettings, SERVER_ALPN};
use rustls::pki_types::ServerName;

const SOURCE: &str = "fuzzed-source";

pub fn tls_material(data: &[u8]) {
    let mut parts = data.splitn(4, |byte| *byte == 0);
    let chain = parts.next().unwrap_or_default();
    let key = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    let settings = parts.next().unwrap_or_default();

    if let Err(error) = trust(&[(SOURCE.to_string(), chain.to_vec())]) {
        assert!(error.to_string().contains(SOURCE), "{error}");
    }
    let settings = settings_of(settings);
    let identity = match Identity::from_pem(SOURCE, chain, key) {
        Ok(identity) => identity,
        Err(error) => {
            assert!(error.to_string().contains(SOURCE), "{error}");
            return;
        }
    };
    let _ = identity.dns_names();
    let alpn: Vec<String> = SERVER_ALPN.map(str::to_string).to_vec();
    let config = match server_config(&[identity], &ClientAuth::None, &alpn, &settings) {
        Ok(config) => config,
        Err(error) => {
            // Only settings can refuse a pair that loaded.
            assert!(!settings.is_default(), "{error}");
            return;
        }
    };
    let Ok(name) = std::str::from_utf8(name) else {
        return;
    };
    let Ok(name) = ServerName::try_from(name.to_string()) else {
        return;
    };
    // A client that trusts nothing: the server still answers its hello with its flight.
    let client_config = rustls::ClientConfig::builder_with_provider(
        kactivator_shards::runtime::tls::provider(),
    )
    .with_safe_default_protocol_versions()
    .expect("the provider's versions")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).expect("a client");
    let mut server = rustls::ServerConnection::new(config).expect("a server");
    let mut hello = Vec::new();
    client.write_tls(&mut hello).expect("the hello");
    server.read_tls(&mut &hello[..]).expect("read the hello");
    if server.process_new_packets().is_ok() {
        assert!(server.wants_write(), "the server answers a hello it accepted");
    }
}

fn settings_of(bytes: &[u8]) -> TlsSettings {
    let text = String::from_utf8_lossy(bytes);
    let mut values = text.split('\n');
    let (min, max, suites, curves) = (
        values.next().map(str::to_string),
        values.next().map(str::to_string),
        values.next().map(str::to_string),
        values.next().map(str::to_string),
    );
    let settings = read(ACTIVATOR, |key| match key {
        _ if key == ACTIVATOR.min_version => min.clone(),
        _ if key == ACTIVATOR.max_version => max.clone(),
        _ if key == ACTIVATOR.cipher_suites => suites.clone(),
        _ if key == ACTIVATOR.curve_preferences => curves.clone(),
        _ => None,
    });
    if settings.problems.is_empty() {
        settings
    } else {
        for (key, _) in &settings.problems {
            assert!(key.starts_with("ACTIVATOR_TLS_"), "{key}");
        }
        TlsSettings::default()
    }
}

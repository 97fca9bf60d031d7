use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::tls::tests::{ca, client, handshake};
use crate::tls::{PodTls, TlsVersion};

/// A directory of its own under the system's temporary one, emptied.
fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kactivator-keda-tls-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The add-on's defaults, TLS on, with these files.
fn proxy_tls(cert: PathBuf, key: PathBuf, store_dirs: Vec<PathBuf>) -> ProxyTls {
    ProxyTls {
        port: 8443,
        cert,
        key,
        store_dirs,
        settings: TlsSettings {
            min_version: Some(TlsVersion::Tls12),
            ..TlsSettings::default()
        },
        skip_verify: false,
        ca_dirs: Vec::new(),
    }
}

#[test]
fn the_store_pairs_are_found_by_the_add_ons_suffixes_in_any_subdirectory() {
    let dir = scratch("store");
    for file in [
        "a.crt",
        "a.key",
        "b.pem",
        "b-key.pem",
        "nested/c.crt",
        "nested/c.key",
        // A key without its certificate is passed over, as the add-on passes it.
        "lonely.key",
        // A mounted Secret's timestamped copy is not read a second time.
        "..2026_11_30_00_00_00.1/a.crt",
        "..2026_11_30_00_00_00.1/a.key",
        "notes.txt",
    ] {
        write(&dir.join(file), "pem");
    }
    let pairs = store_pairs(std::slice::from_ref(&dir)).unwrap();
    let names: Vec<(String, String)> = pairs
        .iter()
        .map(|(cert, key)| {
            let relative = |path: &PathBuf| {
                path.strip_prefix(&dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            };
            (relative(cert), relative(key))
        })
        .collect();
    assert_eq!(
        names,
        [
            ("a.crt".to_owned(), "a.key".to_owned()),
            ("b.pem".to_owned(), "b-key.pem".to_owned()),
            ("nested/c.crt".to_owned(), "nested/c.key".to_owned()),
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_store_certificate_without_its_key_or_a_missing_store_stops_start_up() {
    let dir = scratch("keyless");
    write(&dir.join("site.crt"), "pem");
    let error = store_pairs(std::slice::from_ref(&dir))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no key found for certificate") && error.contains("site.crt"),
        "{error}"
    );
    let missing = dir.join("absent");
    let error = store_pairs(&[missing]).unwrap_err().to_string();
    assert!(error.contains("absent"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_store_pair_serves_the_names_it_is_valid_for_and_the_main_pair_every_other() {
    let dir = scratch("sni");
    let authority = ca("keda-sni");
    let (main_chain, main_key) = authority.issue(&["*.example.com"]);
    write(&dir.join("main/tls.crt"), &main_chain);
    write(&dir.join("main/tls.key"), &main_key);
    let (special_chain, special_key) = authority.issue(&["special.example.com"]);
    write(&dir.join("store/special.crt"), &special_chain);
    write(&dir.join("store/special.key"), &special_key);
    let tls = load(&proxy_tls(
        dir.join("main/tls.crt"),
        dir.join("main/tls.key"),
        vec![dir.join("store")],
    ))
    .unwrap();
    assert_eq!(tls.files.default, 1, "the main pair is tried last");
    let (server, _) = tls.files.load().unwrap();
    let leaf = |name: &str| {
        let (leaf, _) = handshake(client(authority.roots()), name, server.clone()).unwrap();
        leaf
    };
    let pem_leaf = |pem: &str| crate::tls::certificates("test", pem.as_bytes()).unwrap()[0].clone();
    // The main pair's wildcard is valid for this name too: the store pair wins, as in the add-on.
    assert_eq!(leaf("special.example.com"), pem_leaf(&special_chain));
    assert_eq!(leaf("other.example.com"), pem_leaf(&main_chain));
    // No pair is valid for this name: the main pair, which the client then refuses.
    let refused = handshake(client(authority.roots()), "elsewhere.test", server.clone());
    assert!(refused.is_err(), "the main pair is not valid for it");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pods_are_dialled_trusting_the_ca_dirs_and_the_served_certificates_or_not_verified() {
    let dir = scratch("upstream");
    let ours = ca("keda-listener");
    let (main_chain, main_key) = ours.issue(&["interceptor.example.com"]);
    write(&dir.join("tls.crt"), &main_chain);
    write(&dir.join("tls.key"), &main_key);
    let pods = ca("keda-pods");
    write(&dir.join("cas/ca-bundle"), ours.cert.pem().as_str());
    write(&dir.join("cas/pods.crt"), pods.cert.pem().as_str());
    write(&dir.join("cas/readme"), "not a certificate");
    let mut setting = proxy_tls(dir.join("tls.crt"), dir.join("tls.key"), Vec::new());
    setting.ca_dirs = vec![dir.join("cas")];
    let tls = load(&setting).unwrap();

    let profile = tls.upstream.profile();
    assert!(profile.alpn && profile.clients_over_tls_only);
    let dial = PodTls::with_profile(&tls.upstream.trust, "app.default", profile).unwrap();
    assert!(dial.built.clients_over_tls_only);
    assert_eq!(dial.built.config.alpn_protocols, [b"http/1.1".to_vec()]);
    let h2 = dial
        .built
        .config_h2
        .as_ref()
        .expect("HTTP/2 connections' own");
    assert_eq!(h2.alpn_protocols, [b"h2".to_vec()]);
    assert!(
        !dial.probes_over_tls(),
        "a plain client's request is not TLS"
    );
    let pod_server = |chain: String, key: String| {
        let identity =
            crate::tls::Identity::from_pem("pod", chain.as_bytes(), key.as_bytes()).unwrap();
        crate::tls::server_config(
            &[identity],
            &crate::tls::ClientAuth::None,
            &["http/1.1".to_owned()],
            &TlsSettings::default(),
        )
        .unwrap()
    };
    let (pod_chain, pod_key) = pods.issue(&["app.default"]);
    let (_, connection) = handshake(
        (*dial.built.config).clone(),
        "app.default",
        pod_server(pod_chain, pod_key),
    )
    .expect("a pod whose CA is in KEDA_HTTP_TLS_CA_DIRS");
    assert_eq!(connection.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (wrong_chain, wrong_key) = pods.issue(&["other.default"]);
    assert!(handshake(
        (*dial.built.config).clone(),
        "app.default",
        pod_server(wrong_chain.clone(), wrong_key.clone()),
    )
    .is_err());
    // The served certificate is trusted as the add-on's RootCAs hold it.
    let served = PodTls::with_profile(
        &tls.upstream.trust,
        "interceptor.example.com",
        tls.upstream.profile(),
    )
    .unwrap();
    handshake(
        (*served.built.config).clone(),
        "interceptor.example.com",
        pod_server(main_chain, main_key),
    )
    .expect("the served certificate");
    // KEDA_HTTP_TLS_SKIP_VERIFY: the wrong name is taken.
    let mut skipping = tls.upstream.profile();
    skipping.skip_verify = true;
    let blind = PodTls::with_profile(&tls.upstream.trust, "app.default", skipping).unwrap();
    handshake(
        (*blind.built.config).clone(),
        "app.default",
        pod_server(wrong_chain, wrong_key),
    )
    .expect("not verified");
    std::fs::remove_dir_all(&dir).unwrap();
}

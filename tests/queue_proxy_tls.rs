//! The queue-proxy under Knative's `system-internal-tls` (issue 38, `reference/tls.md` §3): with
//! `tls.crt` and `tls.key` mounted, TLS on `QUEUE_SERVING_TLS_PORT` beside the plain serving
//! port, with a certificate as Knative issues it (SANs `kn-user-<namespace>` and
//! `data-plane.knative.dev`); HTTP/2 with and without ALPN (Knative's activator sends h2 over TLS
//! without ALPN); the pair looked at again and a changed one served; a pair that does not load
//! stops start-up, as upstream's does. And the activator's side of it standalone
//! (`[revisions.tls]`): requests over TLS to such pods, and with quarantine on the health
//! prober dialling them with the same TLS client.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kactivator_testkit::backend::BackendConfig;
use kactivator_testkit::certs::TestCa;
use kactivator_testkit::grpc::{spawn_grpc_on, GrpcHandle};
use kactivator_testkit::ports::free_port;
use support::queue_proxy::{knative_env, start_with_certs, REVISION};
use support::{eventually, exit_within};

/// The name Knative's activator puts in SNI and verifies.
const SERVER_NAME: &str = "data-plane.knative.dev";

/// HTTP/1.1 and h2c on one port, as a user container may be.
fn user_container(port: u16) -> GrpcHandle {
    spawn_grpc_on(
        SocketAddr::from(([127, 0, 0, 1], port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container")
}

/// Knative's `serving-certs` for namespace `default`, written as mounted.
fn mount(ca: &TestCa, dir: &Path) {
    ca.issue(&["kn-user-default", SERVER_NAME])
        .write(dir, "tls");
}

/// curl to the TLS port as Knative's activator reaches it: name `data-plane.knative.dev`,
/// trusting `ca`; `(ok, stdout with headers, stderr)`.
fn curl_tls(port: u16, ca: &Path, extra: &[&str]) -> (bool, String, String) {
    support::curl_https(port, SERVER_NAME, "/", ca, &[&["-i"], extra].concat())
}

#[test]
fn with_the_certificate_mounted_the_tls_port_serves_beside_the_plain_one_and_follows_rotation() {
    let certs = support::scratch_dir();
    let ca = TestCa::new("serving-certs");
    let ca_file = ca.write(&certs, "ca.pem");
    mount(&ca, &certs);
    let user_port = free_port();
    let _user = user_container(user_port);
    let (proxy, port) = start_with_certs(user_port, &certs, &["--certs-reload-seconds", "1"]);
    // HTTP/1.1, h2 by ALPN, and h2 by prior knowledge without ALPN (Knative's activator).
    for (extra, reached_over) in [
        (&["--http1.1"][..], "HTTP/1.1"),
        (&["--http2"][..], "HTTP/2.0"),
        (&["--no-alpn", "--http2-prior-knowledge"][..], "HTTP/2.0"),
    ] {
        let (ok, out, err) = curl_tls(port, &ca_file, extra);
        assert!(ok, "{extra:?}: {err}\n{}", proxy.stderr());
        assert!(
            out.contains("x-backend: user-container"),
            "{extra:?}: {out}"
        );
        assert!(
            out.contains(&format!("x-http-version: {reached_over}")),
            "{extra:?}: {out}"
        );
    }
    // The plain serving port still serves (kubelet's probes and plain clients).
    assert_eq!(proxy.get("/").status, 200);

    // A renewed certificate from another CA (cert-manager's rotation): served within a look.
    let renewed = TestCa::new("renewed");
    let renewed_file = renewed.write(&certs, "renewed.pem");
    mount(&renewed, &certs);
    assert!(
        eventually(Duration::from_secs(10), || curl_tls(
            port,
            &renewed_file,
            &[]
        )
        .0),
        "the renewed certificate is served: {}",
        proxy.stderr()
    );
    assert!(proxy
        .stderr()
        .contains("Certificate and/or key have changed on disk and were reloaded."));
    std::fs::remove_dir_all(certs).unwrap();
}

#[test]
fn a_mounted_pair_that_does_not_load_stops_start_up_naming_it() {
    let certs = support::scratch_dir();
    let ca = TestCa::new("mismatch");
    let first = ca.issue(&["kn-user-default", SERVER_NAME]);
    let second = ca.issue(&["kn-user-default", SERVER_NAME]);
    // The chain of one and the key of another.
    std::fs::write(certs.join("tls.crt"), &first.chain).unwrap();
    std::fs::write(certs.join("tls.key"), &second.key).unwrap();
    let user_port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("queue-proxy")
        .args(["--certs-dir", certs.to_str().unwrap()])
        .env_clear()
        .envs(knative_env(user_port, free_port(), 0))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kactivator queue-proxy");
    let (exited, output) = exit_within(child, Duration::from_secs(10));
    assert!(exited, "it started with a pair that does not match");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tls.key") && stderr.contains("does not belong"),
        "{stderr}"
    );
    std::fs::remove_dir_all(certs).unwrap();
}

/// The whole path Knative's `system-internal-tls` sets up, both hops ours: a client → the
/// activator (plain port) → the queue-proxy's TLS port, dialled as Knative's activator dials it
/// (TLS 1.3, SNI `data-plane.knative.dev`, no ALPN, the certificate required to carry
/// `kn-user-<namespace>` and to chain to the trust given) → the user container. HTTP/1.1 and
/// HTTP/2 both cross TLS; a certificate without the namespace's name is refused with upstream's
/// words, and the activator answers 502 rather than fall back to plain.
#[test]
fn the_activator_reaches_a_queue_proxy_over_tls_as_knative_does() {
    let certs = support::scratch_dir();
    let ca = TestCa::new("serving-certs");
    let ca_file = ca.write(&certs, "ca.pem");
    mount(&ca, &certs);
    let user_port = free_port();
    let _user = user_container(user_port);
    let (_proxy, port) = start_with_certs(user_port, &certs, &[]);
    let pod: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let tls = |require: &str| {
        format!(
            "[revisions.tls]\nca = {:?}\nserver_name = \"{SERVER_NAME}\"\nrequire_name = \"{require}\"\n",
            ca_file.display().to_string()
        )
    };
    // Quarantine off: the pod is listed for revision `hello` while its queue-proxy serves
    // `hello-00001` (a probe would take it for a reused IP), and the wrong-named pod below
    // must stay routable for its request to show the 502. Probes over TLS with quarantine on:
    // `with_quarantine_on_tls_pods_are_probed_over_tls_and_a_wrong_named_one_is_quarantined`.
    let quarantine_off = "[features]\n\"activator.pod-quarantine\" = \"disabled\"\n";
    let activator = support::Activator::start(&format!(
        "{quarantine_off}{}{}",
        support::revision("default", "hello", &[pod], ""),
        tls("kn-user-default")
    ));
    let route = [
        "-H",
        "Knative-Serving-Namespace: default",
        "-H",
        "Knative-Serving-Revision: hello",
        "-i",
    ];
    let serves = |activator: &support::Activator| {
        for (flag, pod_saw) in [
            ("--http1.1", "HTTP/1.1"),
            ("--http2-prior-knowledge", "HTTP/2.0"),
        ] {
            let url = format!("http://{}/", activator.http);
            let mut args = route.to_vec();
            args.extend([flag, url.as_str()]);
            let (ok, out) = support::curl(&args);
            let out = String::from_utf8_lossy(&out);
            assert!(ok, "{flag}: {}", activator.stderr());
            assert!(
                out.contains("x-backend: user-container")
                    && out.contains(&format!("x-http-version: {pod_saw}")),
                "{flag}: {out}\n{}",
                activator.stderr()
            );
        }
    };
    serves(&activator);
    // The file is looked at again (every second) and, changed, read with each revision's TLS
    // built again: a look that dropped it removed the revision (404 from the first look on).
    std::thread::sleep(Duration::from_millis(2500));
    serves(&activator);
    activator.write_config(
        &format!(
            "{quarantine_off}{}{}{}",
            support::revision("default", "hello", &[pod], ""),
            tls("kn-user-default"),
            support::revision("default", "other", &[pod], ""),
        ),
        "",
    );
    assert!(
        support::eventually(Duration::from_secs(10), || activator
            .stderr()
            .contains("configuration reloaded path")),
        "{}",
        activator.stderr()
    );
    serves(&activator);

    // The same pod for another namespace: its certificate lacks `kn-user-elsewhere`.
    let strict = support::Activator::start(&format!(
        "{quarantine_off}{}{}",
        support::revision("default", "hello", &[pod], ""),
        tls("kn-user-elsewhere")
    ));
    let url = format!("http://{}/", strict.http);
    let mut args = route.to_vec();
    args.push(url.as_str());
    let (_, out) = support::curl(&args);
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(
        strict
            .stderr()
            .contains("san \"kn-user-elsewhere\" does not have a matching name in [\"kn-user-default\", \"data-plane.knative.dev\"]"),
        "{}",
        strict.stderr()
    );
    std::fs::remove_dir_all(certs).unwrap();
}

/// Issue 38's last gap: with quarantine on, a standalone `[revisions.tls]` revision (a file
/// refused before) loads, and the health prober dials its pods with the data plane's TLS client
/// for it, in the revision's protocol (HTTP/1.1, or HTTP/2 by prior knowledge inside TLS): a
/// queue-proxy whose certificate carries the names is probed healthy over TLS at its TLS port
/// (nothing plain listens there), stays routable and serves every request; one whose
/// certificate names another host fails its probes saying `TLS handshake: …` and why, is
/// quarantined, and no request goes to it.
#[test]
fn with_quarantine_on_tls_pods_are_probed_over_tls_and_a_wrong_named_one_is_quarantined() {
    let ca = TestCa::new("serving-certs");
    let good_certs = support::scratch_dir();
    let ca_file = ca.write(&good_certs, "ca.pem");
    mount(&ca, &good_certs);
    // Trusted, and `kn-user-default`, but not `data-plane.knative.dev`.
    let bad_certs = support::scratch_dir();
    ca.issue(&["kn-user-default", "wrong.example"])
        .write(&bad_certs, "tls");
    let good_user = free_port();
    let _good_user = user_container(good_user);
    let bad_user = free_port();
    let _bad_user = spawn_grpc_on(
        SocketAddr::from(([127, 0, 0, 1], bad_user)),
        BackendConfig::named("wrong-named-pod"),
    )
    .expect("user container");
    let (_good_proxy, good_port) = start_with_certs(good_user, &good_certs, &[]);
    let (_bad_proxy, bad_port) = start_with_certs(bad_user, &bad_certs, &[]);
    let good: SocketAddr = format!("127.0.0.1:{good_port}").parse().unwrap();
    let bad: SocketAddr = format!("127.0.0.1:{bad_port}").parse().unwrap();
    for protocol in ["http1", "h2c"] {
        // Quarantine on, said (it is also the default), and probes often.
        let config = format!(
            "[features]\n\"activator.pod-quarantine\" = \"enabled\"\n\n[health]\nprobe_interval_ms = 100\nsettled_probe_interval_ms = 100\n\n{}[revisions.tls]\nca = {:?}\nserver_name = \"{SERVER_NAME}\"\nrequire_name = \"kn-user-default\"\n",
            support::revision(
                "default",
                REVISION,
                &[good, bad],
                &format!("protocol = \"{protocol}\""),
            ),
            ca_file.display().to_string()
        );
        // (3) It loads: before, a TLS revision with quarantine on stopped start-up.
        let activator = support::Activator::start(&config);
        let quarantined =
            || activator.metric_sum("activator_pod_trackers", &["state=\"quarantined\""]) == 1.0;
        assert!(
            support::eventually(Duration::from_secs(10), quarantined),
            "{protocol}: the wrong-named pod is quarantined: {}\n{}",
            activator.metrics(),
            activator.stderr()
        );
        // (2) Its probe failed on the handshake, saying so and why.
        let log = activator.stderr();
        let failed: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("health check failed"))
            .collect();
        assert!(
            failed.iter().any(|line| line.contains(&bad.to_string())
                && line.contains("TLS handshake: invalid peer certificate: certificate not valid for name \"data-plane.knative.dev\"")),
            "{protocol}: {log}"
        );
        // (1) The good pod, probed over TLS at its TLS port, passed and stays routable.
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            activator.metric_sum("activator_pod_probes_total", &["result=\"healthy\""]) >= 2.0,
            "{protocol}: {}",
            activator.metrics()
        );
        assert_eq!(
            activator.metric_sum("activator_pod_trackers", &["state=\"ready\""]),
            1.0,
            "{protocol}: {}",
            activator.metrics()
        );
        let log = activator.stderr();
        assert!(
            !log.lines().any(
                |line| line.contains("health check failed") && line.contains(&good.to_string())
            ),
            "{protocol}: {log}"
        );
        // Every request goes to the good pod, in either protocol, over TLS.
        for _ in 0..5 {
            for (flag, pod_saw) in [
                ("--http1.1", "HTTP/1.1"),
                ("--http2-prior-knowledge", "HTTP/2.0"),
            ] {
                let url = format!("http://{}/", activator.http);
                let revision = format!("Knative-Serving-Revision: {REVISION}");
                let (ok, out) = support::curl(&[
                    "-i",
                    "-H",
                    "Knative-Serving-Namespace: default",
                    "-H",
                    &revision,
                    flag,
                    &url,
                ]);
                let out = String::from_utf8_lossy(&out);
                assert!(ok, "{protocol} {flag}: {}", activator.stderr());
                assert!(
                    out.contains(" 200")
                        && out.contains("x-backend: user-container")
                        && out.contains(&format!("x-http-version: {pod_saw}")),
                    "{protocol} {flag}: {out}\n{}",
                    activator.stderr()
                );
            }
        }
        assert!(quarantined(), "{protocol}: {}", activator.metrics());
    }
    std::fs::remove_dir_all(good_certs).unwrap();
    std::fs::remove_dir_all(bad_certs).unwrap();
}

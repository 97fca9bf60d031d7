//! TLS against Go's crypto/tls with Knative's own settings (issue 38; `tests/go/tls_peer.go`):
//! Go as Knative's activator dialling our queue-proxy's TLS port, and Go as Knative's
//! queue-proxy serving our activator's `[revisions.tls]` dial.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use kactivator_testkit::backend::BackendConfig;
use kactivator_testkit::certs::TestCa;
use kactivator_testkit::grpc::spawn_grpc_on;
use kactivator_testkit::ports::free_port;
use support::go::{go_peer, Killed};
use support::queue_proxy::{start_with_certs, QueueProxy};

/// Our queue-proxy with Knative's certificate for namespace `default` mounted; its TLS port.
fn queue_proxy(certs: &Path, ca: &TestCa) -> (QueueProxy, u16) {
    ca.issue(&["kn-user-default", "data-plane.knative.dev"])
        .write(certs, "tls");
    let user_port = free_port();
    std::mem::forget(
        spawn_grpc_on(
            SocketAddr::from(([127, 0, 0, 1], user_port)),
            BackendConfig::named("user-container"),
        )
        .expect("user container"),
    );
    start_with_certs(user_port, certs, &[])
}

#[test]
fn go_dialling_as_knatives_activator_is_served_by_our_queue_proxy_over_tls_1_3_only() {
    let dir = support::scratch_dir();
    let peer = go_peer(&dir);
    let ca = TestCa::new("serving-certs");
    let ca_file = ca.write(&dir, "ca.pem");
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (_proxy, port) = queue_proxy(&certs, &ca);
    let addr = format!("127.0.0.1:{port}");
    let run = |namespace: &str, extra: &[&str]| {
        let output = Command::new(&peer)
            .args(["client", &addr, ca_file.to_str().unwrap(), namespace])
            .args(extra)
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run("default", &[]);
    assert!(ok, "{err}");
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains("x-backend: user-container"), "{out}");
    // Upstream's check of the namespace's name, by Go, against our certificate's names.
    let (ok, _, err) = run("other", &[]);
    assert!(
        !ok && err.contains("san \"kn-user-other\" does not have a matching name"),
        "{err}"
    );
    // TLS 1.2 is refused, as upstream's queue-proxy refuses it by default.
    let (ok, _, err) = run("default", &["tls12"]);
    assert!(!ok && err.contains("protocol version"), "{err}");
}

#[test]
fn our_activator_dials_a_go_server_with_knatives_queue_proxy_settings() {
    let dir = support::scratch_dir();
    let peer = go_peer(&dir);
    let ca = TestCa::new("serving-certs");
    let ca_file = ca.write(&dir, "ca.pem");
    let (chain, key) = ca
        .issue(&["kn-user-default", "data-plane.knative.dev"])
        .write(&dir, "tls");
    let mut server = Killed(
        Command::new(&peer)
            .args(["server", chain.to_str().unwrap(), key.to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pod: SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .parse()
        .unwrap();
    let activator = support::Activator::start(&format!(
        "[features]\n\"activator.pod-quarantine\" = \"disabled\"\n{}[revisions.tls]\nca = {:?}\nserver_name = \"data-plane.knative.dev\"\nrequire_name = \"kn-user-default\"\n",
        support::revision("default", "hello", &[pod], ""),
        ca_file.display().to_string()
    ));
    let (ok, out) = support::curl(&[
        "-i",
        "-H",
        "Knative-Serving-Namespace: default",
        "-H",
        "Knative-Serving-Revision: hello",
        &format!("http://{}/", activator.http),
    ]);
    let out = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(ok, "{}", activator.stderr());
    assert!(
        out.contains("hello from go") && out.contains("x-http-version: http/1.1"),
        "{out}"
    );
}

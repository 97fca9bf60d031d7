//! The TLS data port in standalone mode (issue 38): `listen.https` with `[listen.tls]`, reached by
//! real clients (curl, `openssl s_client`), with certificates the test issues from a CA of its
//! own: HTTP/1.1 and HTTP/2 by ALPN, SNI, client certificates, version refusals, hostile input
//! bounded by the head timeout, and certificates replaced on disk under load.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::BackendConfig;
use kactivator_testkit::certs::TestCa;
use kactivator_testkit::grpc::{spawn_grpc, GrpcHandle};
use kactivator_testkit::ports::free_port;
use support::{eventually, scratch_dir, Activator};

/// The revision every test routes to, by Knative's headers.
const ROUTE: [&str; 4] = [
    "-H",
    "Knative-Serving-Namespace: default",
    "-H",
    "Knative-Serving-Revision: hello",
];

struct Tls {
    activator: Activator,
    https: SocketAddr,
    _pod: GrpcHandle,
}

/// An activator with a TLS port serving `[listen.tls]` = `tls` (after `certificates = …`).
fn start(certificates: &[(PathBuf, PathBuf)], tls: &str, proxy: &str) -> Tls {
    // HTTP/1.1 and h2c on one port, as a queue-proxy: a request that arrives over HTTP/2 goes
    // to the pod over HTTP/2, as upstream's activator sends it.
    let pod = spawn_grpc(BackendConfig::named("pod-a")).unwrap();
    let https: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let list = certificates
        .iter()
        .map(|(chain, key)| format!("{{ chain = {chain:?}, key = {key:?} }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let listen = format!("https = \"{https}\"\n[listen.tls]\ncertificates = [{list}]\n{tls}\n");
    let activator = Activator::prepare_listen(
        &support::revision("default", "hello", &[pod.addr()], ""),
        proxy,
        &listen,
    )
    .launch();
    Tls {
        activator,
        https,
        _pod: pod,
    }
}

/// curl to `https://<name>:<port>/` resolved to the TLS port, trusting `ca`, naming the
/// revision; `(ok, stdout, stderr)`.
fn curl_https(tls: &Tls, name: &str, ca: &Path, extra: &[&str]) -> (bool, String, String) {
    support::curl_https(
        tls.https.port(),
        name,
        "/",
        ca,
        &[&ROUTE[..], extra].concat(),
    )
}

/// `openssl s_client` against the TLS port with these flags; its whole output.
fn s_client(tls: &Tls, flags: &[&str]) -> String {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &tls.https.to_string(), "-brief"])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl is installed");
    drop(child.stdin.take());
    let output = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn https_serves_http1_and_http2_by_alpn_to_curl() {
    let dir = scratch_dir();
    let ca = TestCa::new("https");
    let ca_file = ca.write(&dir, "ca.pem");
    let pair = ca.issue(&["models.test"]).write(&dir, "models");
    let tls = start(&[pair], "", "");
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let (ok, out, err) = curl_https(
            &tls,
            "models.test",
            &ca_file,
            &[flag, "-i", "-w", "\nversion=%{http_version}"],
        );
        assert!(ok, "{flag}: {err}");
        assert!(out.contains("x-backend: pod-a"), "{flag}: {out}");
        assert!(
            out.ends_with(&format!("version={version}")),
            "{flag}: {out}"
        );
    }
    // The plain port still serves, and the scrape counts the handshakes.
    let (ok, _) = support::curl(&[
        "-H",
        "Knative-Serving-Namespace: default",
        "-H",
        "Knative-Serving-Revision: hello",
        &format!("http://{}/", tls.activator.http),
    ]);
    assert!(ok);
    assert!(
        tls.activator
            .metric_sum("kactivator_shard_tls_handshakes_total", &[])
            >= 2.0
    );
}

#[test]
fn sni_chooses_the_certificate_and_an_unknown_name_gets_the_first() {
    let dir = scratch_dir();
    let ca = TestCa::new("sni");
    let first = ca.issue(&["first.test"]).write(&dir, "first");
    let second = ca.issue(&["*.second.test"]).write(&dir, "second");
    let tls = start(&[first, second], "", "");
    let subject = |name: &str| {
        let out = s_client(&tls, &["-servername", name]);
        out.lines()
            .find(|line| line.starts_with("Peer certificate:"))
            .unwrap_or_else(|| panic!("no peer certificate for {name}: {out}"))
            .to_string()
    };
    assert!(subject("api.second.test").contains("second.test"));
    assert!(subject("first.test").contains("first.test"));
    assert!(subject("nobody.test").contains("first.test"));
}

#[test]
fn tls_1_2_is_refused_by_default_and_served_when_allowed() {
    let dir = scratch_dir();
    let ca = TestCa::new("versions");
    let ca_file = ca.write(&dir, "ca.pem");
    let pair = ca.issue(&["v.test"]).write(&dir, "v");
    let tls = start(std::slice::from_ref(&pair), "", "");
    let out = s_client(&tls, &["-tls1_2", "-servername", "v.test"]);
    assert!(
        out.contains("alert protocol version") || out.contains("protocol version"),
        "TLS 1.2 is refused with a protocol-version alert: {out}"
    );
    let (ok, _, err) = curl_https(&tls, "v.test", &ca_file, &["--tls-max", "1.2"]);
    assert!(!ok, "curl limited to TLS 1.2 is refused");
    assert!(err.contains("alert") || err.contains("version"), "{err}");

    let allowed = start(&[pair], "min_version = \"1.2\"", "");
    let (ok, _, err) = curl_https(&allowed, "v.test", &ca_file, &["--tls-max", "1.2"]);
    assert!(ok, "TLS 1.2 allowed: {err}");
}

#[test]
fn wrong_name_expired_and_untrusted_certificates_are_refused_by_the_client() {
    let dir = scratch_dir();
    let ca = TestCa::new("refusals");
    let ca_file = ca.write(&dir, "ca.pem");
    let other_ca = TestCa::new("other").write(&dir, "other.pem");
    let good = ca.issue(&["good.test"]).write(&dir, "good");
    let expired = ca.issue_expired(&["old.test"]).write(&dir, "old");
    let tls = start(&[good, expired], "", "");
    let (ok, _, err) = curl_https(&tls, "good.test", &other_ca, &[]);
    assert!(!ok && err.contains("certificate"), "untrusted CA: {err}");
    let (ok, _, err) = curl_https(&tls, "wrong.test", &ca_file, &[]);
    assert!(!ok && err.contains("wrong.test"), "wrong name: {err}");
    let (ok, _, err) = curl_https(&tls, "old.test", &ca_file, &[]);
    assert!(!ok && err.contains("expired"), "expired: {err}");
    let (ok, _, err) = curl_https(&tls, "good.test", &ca_file, &[]);
    assert!(ok, "and the good one serves: {err}");
}

#[test]
fn client_certificates_are_required_when_a_client_ca_is_set() {
    let dir = scratch_dir();
    let ca = TestCa::new("server");
    let ca_file = ca.write(&dir, "ca.pem");
    let clients = TestCa::new("clients");
    let clients_file = clients.write(&dir, "clients.pem");
    let (client_crt, client_key) = clients.issue(&["client.test"]).write(&dir, "client");
    let pair = ca.issue(&["mtls.test"]).write(&dir, "mtls");
    let tls = start(
        &[pair],
        &format!("client_ca = {:?}", clients_file.display().to_string()),
        "",
    );
    let (ok, out, err) = curl_https(
        &tls,
        "mtls.test",
        &ca_file,
        &[
            "--cert",
            client_crt.to_str().unwrap(),
            "--key",
            client_key.to_str().unwrap(),
            "-i",
        ],
    );
    assert!(ok && out.contains("x-backend: pod-a"), "{err}");
    let (ok, _, err) = curl_https(&tls, "mtls.test", &ca_file, &[]);
    assert!(!ok, "no client certificate, no answer: {err}");
}

#[test]
fn plaintext_garbage_and_a_stalled_handshake_end_without_harm() {
    let dir = scratch_dir();
    let ca = TestCa::new("hostile");
    let ca_file = ca.write(&dir, "ca.pem");
    let pair = ca.issue(&["h.test"]).write(&dir, "h");
    let tls = start(&[pair], "", "head_timeout_seconds = 1");
    // Plain HTTP on the TLS port: an alert, then the close.
    let mut plain = TcpStream::connect(tls.https).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: h.test\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert_eq!(answer.first(), Some(&0x15), "an alert record: {answer:?}");
    // Half a ClientHello, then silence: closed by the head timeout.
    let mut stalled = TcpStream::connect(tls.https).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let read = stalled.read(&mut byte);
    assert!(
        matches!(read, Ok(0)) || read.is_err() && started.elapsed() < Duration::from_secs(4),
        "closed: {read:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(800)
            && started.elapsed() < Duration::from_secs(4),
        "by the head timeout (1 s), not at once and not never: {:?}",
        started.elapsed()
    );
    // A client that connects and says nothing: closed by the same timer.
    let mut silent = TcpStream::connect(tls.https).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(matches!(silent.read(&mut byte), Ok(0)));
    // Still serving.
    let (ok, _, err) = curl_https(&tls, "h.test", &ca_file, &[]);
    assert!(ok, "{err}");
    assert!(
        tls.activator
            .metric_sum("kactivator_shard_tls_handshake_failures_total", &[])
            >= 3.0
    );
}

#[test]
fn certificates_replaced_on_disk_are_served_to_new_handshakes_with_no_request_lost() {
    let dir = scratch_dir();
    let old_ca = TestCa::new("before");
    let new_ca = TestCa::new("after");
    // Clients trust both, as a rotation's bundle does.
    let bundle = dir.join("bundle.pem");
    std::fs::write(&bundle, format!("{}{}", old_ca.pem(), new_ca.pem())).unwrap();
    let new_only = new_ca.write(&dir, "new.pem");
    let pair = old_ca.issue(&["rot.test"]).write(&dir, "rot");
    let tls = Arc::new(start(&[pair], "reload_seconds = 1", ""));
    // Load: new connections back to back, each its own handshake, for the whole rotation.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (tls, stop, done, failed, bundle) = (
            tls.clone(),
            stop.clone(),
            done.clone(),
            failed.clone(),
            bundle.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (ok, _, err) = curl_https(&tls, "rot.test", &bundle, &[]);
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    eprintln!("failed during rotation: {err}");
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    new_ca.issue(&["rot.test"]).write(&dir, "rot");
    assert!(
        eventually(Duration::from_secs(10), || curl_https(
            &tls,
            "rot.test",
            &new_only,
            &[]
        )
        .0),
        "the new certificate is served: {}",
        tls.activator.stderr()
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    assert!(tls
        .activator
        .stderr()
        .contains("Certificate and/or key have changed on disk and were reloaded."));
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed");
    assert!(done.load(Ordering::Relaxed) > 5, "the load ran");

    // A broken pair afterwards keeps the new certificate, and says why once.
    std::fs::write(dir.join("rot.key"), "not a key").unwrap();
    assert!(eventually(Duration::from_secs(5), || tls
        .activator
        .stderr()
        .contains("the certificates loaded before are still served")));
    let (ok, _, err) = curl_https(&tls, "rot.test", &new_only, &[]);
    assert!(ok, "{err}");
}

#[test]
fn a_certificate_that_does_not_load_stops_start_up_naming_the_file() {
    let dir = scratch_dir();
    let ca = TestCa::new("start");
    let (chain, key) = ca.issue(&["s.test"]).write(&dir, "s");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let https = format!("127.0.0.1:{}", free_port());
    let mut activator = Activator::prepare_listen(
        &support::revision("default", "hello", &["127.0.0.1:1".parse().unwrap()], ""),
        "",
        &format!(
            "https = \"{https}\"\n[listen.tls]\ncertificates = [{{ chain = {:?}, key = {:?} }}]\n",
            chain.display().to_string(),
            key.display().to_string()
        ),
    )
    .spawn();
    assert_eq!(activator.wait_exit(Duration::from_secs(10)), Some(2));
    let stderr = activator.stderr();
    assert!(stderr.contains("s.key"), "{stderr}");

    // `https` without `[listen.tls]` is refused before anything starts.
    let mut missing = Activator::prepare_listen(
        &support::revision("default", "hello", &["127.0.0.1:1".parse().unwrap()], ""),
        "",
        &format!("https = \"{https}\"\n"),
    )
    .spawn();
    assert_eq!(missing.wait_exit(Duration::from_secs(10)), Some(2));
    assert!(missing.stderr().contains("listen.https needs [listen.tls]"));
}

/// A request goes to its pod in the protocol it came in, so a port in front of HTTP/1.1 pods
/// offers only `http/1.1`: a client that prefers HTTP/2 speaks HTTP/1.1 then.
#[test]
fn a_port_that_offers_only_http1_serves_clients_that_prefer_http2_in_http1() {
    let dir = scratch_dir();
    let ca = TestCa::new("alpn");
    let ca_file = ca.write(&dir, "ca.pem");
    let pair = ca.issue(&["a.test"]).write(&dir, "a");
    let tls = start(&[pair], "alpn = [\"http/1.1\"]", "");
    let (ok, out, err) = curl_https(
        &tls,
        "a.test",
        &ca_file,
        &["--http2", "-i", "-w", "\nversion=%{http_version}"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("x-http-version: HTTP/1.1"), "{out}");
    assert!(out.ends_with("version=1.1"), "{out}");
}

/// The drain closes an idle TLS keep-alive connection as TLS closes: close_notify, then the
/// TCP close. Python's `ssl` tells a clean close (an empty read) from a ragged one (an error,
/// with `suppress_ragged_eofs` off).
#[test]
fn the_drain_closes_idle_tls_connections_with_close_notify() {
    let dir = scratch_dir();
    let ca = TestCa::new("drain");
    let ca_file = ca.write(&dir, "ca.pem");
    let pair = ca.issue(&["d.test"]).write(&dir, "d");
    let tls = start(&[pair], "", "");
    let script = r#"
import socket, ssl, sys
context = ssl.create_default_context(cafile=sys.argv[2])
raw = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s = context.wrap_socket(raw, server_hostname="d.test", suppress_ragged_eofs=False)
s.sendall(b"GET / HTTP/1.1\r\nHost: d\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello\r\n\r\n")
got = b""
while b"hello from pod-a" not in got:
    got += s.recv(4096)
print("answered", flush=True)
s.settimeout(30)
try:
    while s.recv(4096):
        pass
    print("clean")
except ssl.SSLEOFError as error:
    print("ragged", error)
"#;
    let mut client = Command::new("python3")
        .args(["-c", script, &tls.https.port().to_string()])
        .arg(&ca_file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdout = std::io::BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "answered");
    tls.activator.send_signal("TERM");
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "clean", "{}", tls.activator.stderr());
    let _ = client.wait();
}

/// Handshakes that stall give way at the connection cap, as idle connections do: with the cap
/// full of clients that connected and said nothing (or half a hello), a new client is served at
/// once, not after the head timeout.
#[test]
fn stalled_handshakes_give_way_at_the_connection_cap() {
    let dir = scratch_dir();
    let ca = TestCa::new("cap");
    let ca_file = ca.write(&dir, "ca.pem");
    let (chain, key) = ca.issue(&["cap.test"]).write(&dir, "cap");
    let pod = spawn_grpc(BackendConfig::named("pod-a")).unwrap();
    let https: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let activator = Activator::prepare_listen(
        &support::revision("default", "hello", &[pod.addr()], ""),
        "max_connections_per_shard = 3",
        &format!(
            "https = \"{https}\"\n[listen.tls]\ncertificates = [{{ chain = {:?}, key = {:?} }}]\n",
            chain.display().to_string(),
            key.display().to_string()
        ),
    )
    .spawn_args(&["--shards", "1"], &[])
    .until_ready();
    let tls = Tls {
        activator,
        https,
        _pod: pod,
    };
    let mut stalled: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(https).unwrap()).collect();
    stalled[0]
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (ok, _, err) = curl_https(&tls, "cap.test", &ca_file, &["--max-time", "10"]);
    assert!(
        ok,
        "a new client is served while the cap is full of stalled handshakes: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The longest-stalled gave way: its connection was closed.
    stalled[0]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(matches!(stalled[0].read(&mut byte), Ok(0) | Err(_)));
}

/// Large bodies both ways and a websocket cross the TLS port (HTTP/1.1 to an HTTP/1.1 pod):
/// reads of a body stream through rustls' record buffer a few KiB at a time, and an upgraded
/// connection copies both ways over TLS.
#[test]
fn large_bodies_and_a_websocket_cross_the_tls_port() {
    const SIZE: u64 = 24 * 1024 * 1024;
    let dir = scratch_dir();
    let ca = TestCa::new("https");
    let ca_file = ca.write(&dir, "ca.pem");
    let (chain, key) = ca.issue(&["models.test"]).write(&dir, "models");
    let pod = kactivator_testkit::backend::spawn(BackendConfig::named("big-pod")).unwrap();
    let https: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let listen = format!(
        "https = \"{https}\"\n[listen.tls]\ncertificates = [{{ chain = {chain:?}, key = {key:?} }}]\nalpn = [\"http/1.1\"]\n"
    );
    let activator = Activator::prepare_listen(
        &support::revision("default", "big", &[pod.addr()], ""),
        "",
        &listen,
    )
    .launch();
    let port = https.port();
    let curl = |extra: &[&str], path: &str| {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "60", "--http1.1", "--cacert"])
            .arg(&ca_file)
            .args(["--resolve", &format!("models.test:{port}:127.0.0.1")])
            .args(["-H", "Knative-Serving-Namespace: default"])
            .args(["-H", "Knative-Serving-Revision: big"])
            .args(extra)
            .arg(format!("https://models.test:{port}{path}"))
            .output()
            .expect("curl is installed");
        assert!(
            output.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&output.stderr),
            activator.stderr()
        );
        output.stdout
    };
    // Upload: the pod counts what arrived.
    let upload = dir.join("upload.bin");
    let body: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&upload, &body).unwrap();
    let sink = curl(
        &["--data-binary", &format!("@{}", upload.display())],
        "/sink",
    );
    let sink: serde_json::Value = serde_json::from_slice(&sink).unwrap();
    assert_eq!(sink["bytes"].as_u64(), Some(SIZE), "{sink}");
    // Download, whole.
    let downloaded = curl(&[], &format!("/bytes/{SIZE}"));
    assert_eq!(downloaded.len() as u64, SIZE);
    // A websocket over TLS: Python's `ssl` as the client, one masked text frame each way.
    let script = r#"
import base64, os, socket, ssl, sys
port, ca = int(sys.argv[1]), sys.argv[2]
context = ssl.create_default_context(cafile=ca)
s = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="models.test")
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws HTTP/1.1\r\nHost: models.test\r\nKnative-Serving-Namespace: default\r\n"
           "Knative-Serving-Revision: big\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + "\r\n\r\n").encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(4096)
    if not chunk: sys.exit("closed before the 101: " + repr(head))
    head += chunk
if not head.startswith(b"HTTP/1.1 101"): sys.exit("no 101: " + repr(head))
rest = head.split(b"\r\n\r\n", 1)[1]
payload = b"hello over tls " * 100
mask = os.urandom(4)
frame = bytes([0x81, 0xFE]) + len(payload).to_bytes(2, "big") + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
s.sendall(frame)
data = rest
while len(data) < 4 + len(payload):
    chunk = s.recv(65536)
    if not chunk: sys.exit("closed before the echo")
    data += chunk
if data[0] != 0x81 or data[1] != 126 or data[4:4 + len(payload)] != payload: sys.exit("bad echo: " + repr(data[:40]))
print("echoed")
"#;
    let output = Command::new("python3")
        .args(["-c", script, &port.to_string()])
        .arg(&ca_file)
        .output()
        .expect("python3 is installed");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("echoed"),
        "{}{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        activator.stderr()
    );
}
